"""Tokenizer (byte-level BPE) and the Qwen-style chat template."""

from __future__ import annotations

import json

import pytest

from t1_actors.policy.chat_template import ToolCallError, parse_tool_calls, render_chat
from t1_actors.policy.tokenizer import (
    SPECIAL_TOKENS,
    default_tokenizer,
    generic_shell_chats,
    load_tokenizer,
    main,
    special_token_ids,
    train_tokenizer,
)

CHAT = [
    {"role": "system", "content": "You are a terminal agent."},
    {"role": "user", "content": "Make /app/a.txt say hi."},
    {"role": "assistant", "content": "I will write it.",
     "tool_calls": [{"name": "bash", "arguments": {"command": "echo hi > /app/a.txt"}}]},
    {"role": "tool", "content": "exit_code: 0"},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "bash", "arguments": {"command": "cat /app/a.txt"}},
                                                         {"name": "bash", "arguments": {"command": "ls"}}]},
    {"role": "tool", "content": "hi"},
    {"role": "tool", "content": "a.txt"},
    {"role": "assistant", "content": "Done."},
]


def test_render_chat_is_qwen_style():
    text = render_chat(CHAT, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a terminal agent.<|im_end|>\n<|im_start|>user\n")
    assert ('<|im_start|>assistant\nI will write it.\n<tool_call>\n'
            '{"name": "bash", "arguments": {"command": "echo hi > /app/a.txt"}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\nexit_code: 0\n</tool_response><|im_end|>\n" in text
    # consecutive tool results share one user turn
    assert ("<|im_start|>user\n<tool_response>\nhi\n</tool_response>\n"
            "<tool_response>\na.txt\n</tool_response><|im_end|>\n") in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat /app/a.txt"}}' in text
    assert text.endswith("<|im_start|>assistant\nDone.<|im_end|>\n<|im_start|>assistant\n")
    assert not render_chat(CHAT).endswith("<|im_start|>assistant\n")


def test_render_chat_names_bad_messages():
    with pytest.raises(ValueError, match="role 'robot'"):
        render_chat([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="only assistant"):
        render_chat([{"role": "user", "content": "x", "tool_calls": [{"name": "bash", "arguments": {}}]}])
    with pytest.raises(ValueError, match="must be a dict"):
        render_chat([{"role": "assistant", "content": "", "tool_calls": [{"name": "bash"}]}])


def test_parse_tool_calls_roundtrip_and_errors():
    calls = [{"name": "bash", "arguments": {"command": "grep -n \"x\" f | wc -l"}},
             {"name": "bash", "arguments": {"command": "echo ünïcode"}}]
    text = render_chat([{"role": "assistant", "content": "thinking", "tool_calls": calls}])
    assert parse_tool_calls(text) == calls
    assert parse_tool_calls("no calls here") == []
    double = '<tool_call>\n{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>'
    assert parse_tool_calls(double) == [{"name": "bash", "arguments": {"command": "ls"}}]
    with pytest.raises(ToolCallError, match="not valid JSON"):
        parse_tool_calls('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>')
    with pytest.raises(ToolCallError, match="unterminated"):
        parse_tool_calls('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}')
    with pytest.raises(ToolCallError, match="string 'name'"):
        parse_tool_calls('<tool_call>\n["bash"]\n</tool_call>')
    with pytest.raises(ToolCallError, match="must be an object"):
        parse_tool_calls('<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>')


def test_train_tokenizer_has_specials_first_and_roundtrips(tmp_path):
    tokenizer = train_tokenizer(generic_shell_chats(300), vocab_size=400)
    assert tokenizer.get_vocab_size() <= 400
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    text = render_chat(CHAT, add_generation_prompt=True) + "bytes never seen: \u00e9\u4e2d\U0001f600\t\x00"
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    encoded = tokenizer.encode("<|im_start|>assistant\n<tool_call>").ids
    assert encoded[0] == 1 and encoded[-1] == 3  # special tokens are atomic
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    again = load_tokenizer(tmp_path)
    assert again.encode(text) == ids and again.decode(ids) == text
    assert again.apply_chat_template(CHAT, add_generation_prompt=True) == render_chat(CHAT, add_generation_prompt=True)
    again.save(tmp_path / "copy.json")  # t1's own saves the same tokenizer.json bytes
    tokenizer.save(str(tmp_path / "direct.json"))
    assert (tmp_path / "copy.json").read_bytes() == (tmp_path / "direct.json").read_bytes()
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "missing")


def test_path_components_put_each_name_of_a_path_after_a_token_of_its_own():
    texts = [f"cat /app/{a}/{b}.txt && echo /app/{b}.txt" for a in ("lunar", "maple", "stone") for b in ("thorn", "reed")]
    for path_components, expected in [(True, ["Ġ/", "app", "/lunar", "/thorn", ".", "txt"]),
                                      (False, ["Ġ/", "app", "/", "lunar", "/", "thorn", ".", "txt"])]:
        tok = train_tokenizer(texts * 20, vocab_size=400, path_components=path_components)
        assert tok.encode(" /app/lunar/thorn.txt").tokens == expected
        for text in [" /app/lunar/thorn.txt", "a//b /x/y z/ ünï/cödé\n\tend", "/"]:
            assert tok.decode(tok.encode(text).ids) == text  # still byte-level: every text round-trips


def test_committed_default_fits_the_default_model():
    from t1_actors.policy import ModelConfig

    tokenizer = default_tokenizer()
    assert tokenizer.vocab_size <= ModelConfig().vocab_size
    assert set(special_token_ids(tokenizer)) == set(SPECIAL_TOKENS)
    text = render_chat(CHAT)
    assert len(tokenizer.encode(text)) < len(text) / 2.5  # BPE actually merges shell text


def test_cli_trains_from_jsonl(tmp_path):
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("\n".join(json.dumps(c) for c in [CHAT, {"text": "plain text line"}, "a string"]))
    main(["--out", str(tmp_path / "tok" / "tokenizer.json"), "--vocab-size", "300", "--texts", str(corpus)])
    tokenizer = load_tokenizer(tmp_path / "tok")
    assert tokenizer.token_to_id("<tool_call>") == 3
