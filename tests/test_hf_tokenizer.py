"""HF tokenizer directories through ``t1_actors.policy.load_tokenizer``: Qwen3's real tokenizer.json and chat
template, checked against transformers (the reference) for rendering, ids and text; Qwen3 tool calls parsed into
sandbox commands; a scripted agent loop on the real template."""

from __future__ import annotations

import json
import shutil

import jinja2
import numpy as np
import pytest
import trio
from _qwen3 import qwen3, qwen3_dir
from transformers import AutoTokenizer

from t1_actors import tito
from t1_actors.policy import ChatTokenizer, load_tokenizer
from t1_actors.policy.chat_tokenizer import BASH_TOOL
from t1_actors.policy.generation import Generation
from t1_actors.policy.tokenizer import DEFAULT_TOKENIZER, special_token_ids
from t1_actors.rollout import ToolOutcome, assistant_message, run_trial

SYSTEM = {"role": "system", "content": "You are a shell agent. Run one bash command per turn."}
USER = {"role": "user", "content": "Count the words in /app/notes.txt and write it to /app/count.txt."}


def call(command: str) -> dict:
    return {"name": "bash", "arguments": {"command": command}}


CHATS = {
    "opening": [SYSTEM, USER],
    "no_system": [USER],
    "agent_loop": [
        SYSTEM, USER,
        {"role": "assistant", "content": "<think>\nList first.\n</think>\n\n", "tool_calls": [call("ls -la /app")]},
        {"role": "tool", "content": "notes.txt\n"},
        {"role": "assistant", "content": "", "tool_calls": [call("wc -w < /app/notes.txt > /app/count.txt")]},
        {"role": "tool", "content": ""}, {"role": "tool", "content": "exit_code: 0\n"},
        {"role": "assistant", "content": "<think>\nWritten.\n</think>\n\ndone"},
    ],
    "follow_up_query": [  # a later user query: Qwen3 drops the reasoning of the assistant turns before it
        SYSTEM, USER,
        {"role": "assistant", "content": "<think>\nCount.\n</think>\n\n", "tool_calls": [call("wc -w /app/notes.txt")]},
        {"role": "tool", "content": "12 /app/notes.txt"},
        {"role": "assistant", "content": "<think>\nTwelve.\n</think>\n\nThere are 12 words."},
        {"role": "user", "content": "Now the lines, please."},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "wc -l this time"},
    ],
    "odd_fields": [  # OpenAI-style calls, JSON-string arguments, quotes and unicode
        SYSTEM, USER,
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": "echo \"héllo <b> & 'x'\""}}},
            {"name": "bash", "arguments": json.dumps({"command": "printf '%s\\n' a\tb"})}]},
        {"role": "tool", "content": "héllo <b> & 'x'"}, {"role": "tool", "content": "a\tb"},
        {"role": "assistant", "content": "\n\nDone: 中文 😀", "reasoning": "both ran"},
    ],
}


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return qwen3()


@pytest.fixture(scope="module")
def ref():
    return AutoTokenizer.from_pretrained(str(qwen3_dir()))


@pytest.mark.parametrize("name", sorted(CHATS))
@pytest.mark.parametrize("options", [dict(add_generation_prompt=True), dict(add_generation_prompt=False),
                                     dict(add_generation_prompt=True, tools=[BASH_TOOL]),
                                     dict(add_generation_prompt=True, enable_thinking=False)],
                         ids=["gen", "no_gen", "tools", "no_thinking"])
def test_qwen3_template_renders_as_transformers_does(tok, ref, name, options):
    messages = CHATS[name]
    if not options["add_generation_prompt"] and messages[-1]["role"] != "assistant":
        messages = [*messages, {"role": "assistant", "content": "ok"}]
    ours = tok.apply_chat_template(messages, **options)
    assert ours == ref.apply_chat_template(messages, tokenize=False, **options)
    assert tok.encode(ours) == ref.encode(ours, add_special_tokens=False)


def test_qwen3_ids_and_text_match_transformers(tok, ref):
    texts = ["", "hello world", "  leading spaces\n\n\ttabs", "<think>\nplan\n</think>\n\n<tool_call>\n{}\n</tool_call>",
             "<|im_start|>assistant\n<|im_end|><|endoftext|>", "中文 😀 é \x00 \u200b", "a" * 500 + " b" * 50,
             *(tok.apply_chat_template(m, add_generation_prompt=True) for m in CHATS.values())]
    for text in texts:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == ref.decode(ids, skip_special_tokens=False) == text
    markers = special_token_ids(tok)
    assert {m: ref.convert_tokens_to_ids(m) for m in markers} == markers
    assert tok.encode("<think></think><tool_call>") == [markers["<think>"], markers["</think>"], markers["<tool_call>"]]
    assert tok.vocab_size == len(ref) and tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def test_an_hf_dir_with_a_custom_template_renders_as_transformers_does(tmp_path):
    """t1's own BPE in an HF dir: tojson without HTML escaping, loop controls, special-token variables, and
    raise_exception raising jinja2's TemplateError, as in transformers."""
    shutil.copyfile(DEFAULT_TOKENIZER, tmp_path / "tokenizer.json")
    template = ("{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
                "{{ raise_exception('bad role ' + m.role) }}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}"
                "{{ m.role }}: {{ (m.content if m.content is defined else 'dropped') | tojson }}\n"
                "  {{ m | tojson(indent=2, sort_keys=true) }}\n"
                "{% endfor %}{% if add_generation_prompt %}{{ bos_token }}{{ eos_token }}{% endif %}")
    config = {"chat_template": template, "eos_token": "<|im_end|>",
              "bos_token": {"__type": "AddedToken", "content": "<|im_start|>", "special": True},
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    chat = [{"role": "user", "content": "<b>&'\"é"}, {"role": "assistant", "content": None, "x": [1, {"y": "z"}]}] * 3
    for gen in (True, False):
        assert ours.apply_chat_template(chat, add_generation_prompt=gen) == \
            ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
    for bad in ([{"role": "tool", "content": "x"}], []):
        with pytest.raises((jinja2.TemplateError, ValueError)) as ours_error:
            ours.apply_chat_template(bad)
        with pytest.raises(type(ours_error.value)):
            ref.apply_chat_template(bad, tokenize=False)
    saved = ours.save(tmp_path / "copy")
    again = load_tokenizer(saved)
    assert again.apply_chat_template(chat) == ours.apply_chat_template(chat) and again.encode("a b") == ours.encode("a b")


def test_loader_errors_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    shutil.copyfile(DEFAULT_TOKENIZER, tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path).chat_template is None  # no tokenizer_config.json: t1's own
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(ValueError, match="no chat_template"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="takes no tools"):
        load_tokenizer(DEFAULT_TOKENIZER).apply_chat_template([USER], tools=[BASH_TOOL])


def test_qwen3_tool_calls_parse_into_the_sandbox_command(tok):
    """What Qwen3 emits (its template's own form, with or without reasoning) parses into the command, and the
    re-rendered history carries the same call text."""
    command = "grep -c 'a \"b\"' /app/x.txt | tee /app/n.txt"
    rendered = tok.apply_chat_template([USER, {"role": "assistant", "content": "", "tool_calls": [call(command)]}])
    sampled = rendered[rendered.index("<tool_call>"):]  # the last turn renders an empty think block before it
    for text in (sampled, "<think>\nI grep.\n</think>\n\n" + sampled,
                 '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call><|im_end|>'):
        message = assistant_message(text)
        assert [c["name"] for c in message["tool_calls"]] == ["bash"]
        assert message["tool_calls"][0]["arguments"]["command"] in (command, "ls")
    thinking = assistant_message("<think>\nI grep.\n</think>\n\n" + sampled)
    assert thinking["content"] == "<think>\nI grep.\n</think>"  # kept: the template splits reasoning out itself
    again = tok.apply_chat_template([USER, thinking, {"role": "tool", "content": "1"}], add_generation_prompt=True)
    assert "<think>\nI grep.\n</think>\n\n" + sampled in again


def test_an_agent_loop_on_the_qwen3_template_trains_on_the_sampled_ids(tok):
    """run_trial with Qwen3's template and bash tool schema; the scripted sampler emits reasoning and tool calls;
    TITO takes the tokenizer object directly and keeps every boundary strict (reasoning after the query stays)."""
    texts = ["<think>\nLook first.\n</think>\n\n<tool_call>\n" + json.dumps(call("ls /app")) + "\n</tool_call><|im_end|>",
             "<think>\nNow count.\n</think>\n\n<tool_call>\n" + json.dumps(call("wc -w /app/notes.txt"))
             + "\n</tool_call><|im_end|>",
             "<think>\nDone.\n</think>\n\n12 words.<|im_end|>"]
    commands = []

    async def sample(prompt_ids, turn):
        ids = np.asarray(tok.encode(texts[turn]), dtype=np.int32)
        return Generation(len(prompt_ids), ids, np.zeros(len(ids), np.float32), None, "stop", 0)

    async def execute(command, turn):
        commands.append(command)
        return ToolOutcome(0, f"out {turn}\n")

    render = lambda messages, add_generation_prompt: tok.apply_chat_template(  # noqa: E731
        messages, add_generation_prompt=add_generation_prompt, tools=[BASH_TOOL])
    rollout = trio.run(lambda: run_trial(USER["content"], sample=sample, execute=execute, encode=tok.encode,
                                         decode=tok.decode, render=render))
    assert commands == ["ls /app", "wc -w /app/notes.txt"] and rollout.finish == "answered"
    assert "<tools>" in tok.decode(rollout.turns[0].prompt_ids)
    assert tok.decode(rollout.turns[2].generation.output_ids) == texts[2]
    turns = [tito.Turn(t.prompt_ids, t.generation.output_ids, t.generation.logprobs) for t in rollout.turns]
    chunks = tito.assemble(turns, tok, reward=1.0, repairs=())
    assert len(chunks) == 1 and chunks[0].boundary_cases == ("strict", "strict")
    assert tito.tito_metrics(chunks)["drift_tokens"] == 0
