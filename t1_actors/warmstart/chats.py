"""SFT examples on a model's own chat template (Qwen3's): multi-turn oracle chats with a short reasoning block per
assistant turn, trained on exactly the ids the sampler will see and produce at each turn.

A template like Qwen3's is not append-only: it renders an assistant turn's ``<think>`` block only while no later
user query follows, and strips padding around it, so the render of a whole chat need not contain, as a prefix,
the prompt the sampler saw at an earlier turn. ``warmstart.assistant_spans`` therefore cannot mark the loss on one
render of the whole chat. Here each assistant turn i is taken *as it was produced*:

    p_i = encode(render(messages[:i], add_generation_prompt=True))          the sampler's prompt at turn i
    a_i = encode(render(messages[:i + 1])[len(render of p_i):] up to <|im_end|>)   the turn, as the template
                                                                            renders it while it is the last one

and the turns are assembled by TITO (``tito.assemble``, no repairs): where p_{i+1} extends p_i ++ a_i (strict)
the turns share one training sequence; where the template re-renders history (a stripped reasoning block) the
sequence splits, and the next one starts at p_{i+1}. Why TITO-style and not one sequence per assistant turn: the
two agree on every loss token's context (each a_i sits right after exactly p_i), but one sequence per turn repeats
the ~200-token system prompt and the whole history for every turn, 2-4x the tokens on these chats; TITO pays that
only at boundaries the template actually changes. The SFT examples are thereby built exactly as RL's trajectories
are (``[campaign] tito_repairs = []``), so SFT and RL train the policy on the same kind of sequence.

The reasoning is derived from the task's oracle, not drawn at random: the step number, the program and the path it
acts on (``Step 1 of 2: chmod on /app/berry.sh.``), and for the final answer how many commands ran.
"""

from __future__ import annotations

import shlex
from typing import Any

import numpy as np

from t1_actors import tito
from t1_actors.policy.chat_template import IM_END
from t1_actors.policy.chat_tokenizer import BASH_TOOL, ChatTokenizer
from t1_actors.rollout import first_messages, truncate_output

Example = tuple[np.ndarray, np.ndarray]  # token ids, assistant-token mask (as warmstart.Example)
DONE_TEXT = "done"


def step_reasoning(command: str, step: int, steps: int) -> str:
    """One line of reasoning for oracle command ``step`` (0-based) of ``steps``: its program and the last absolute
    path it names. Deterministic: the same command always gives the same line."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the plain words still name the program
        words = command.split()
    program = words[0] if words else "the command"
    paths = [w for w in words[1:] if w.startswith("/")]
    target = f" on {paths[-1]}" if paths else ""
    return f"Step {step + 1} of {steps}: {program}{target}."


def final_reasoning(steps: int) -> str:
    return f"All {steps} command{'s' if steps != 1 else ''} ran; the task is done."


def oracle_chat(instruction: str, commands: list[str], outputs: list[str], tool_output_chars: int) -> list[dict[str, Any]]:
    """The chat of an agent that runs the oracle with reasoning: per command an assistant turn (``reasoning_content``
    + one bash tool call) and the tool's output, then the final answer ``done`` with its own reasoning."""
    messages = first_messages(instruction)
    for step, (command, output) in enumerate(zip(commands, outputs, strict=True)):
        messages.append({"role": "assistant", "content": "",
                         "reasoning_content": step_reasoning(command, step, len(commands)),
                         "tool_calls": [{"name": "bash", "arguments": {"command": command}}]})
        messages.append({"role": "tool", "content": truncate_output(output, tool_output_chars)})
    messages.append({"role": "assistant", "content": DONE_TEXT, "reasoning_content": final_reasoning(len(commands))})
    return messages


def produced_turns(messages: list[dict[str, Any]], tokenizer: ChatTokenizer,
                   tools: list[dict[str, Any]] | None = (BASH_TOOL,)) -> list[tito.Turn]:
    """Each assistant turn as the sampler meets it: (p_i, a_i) of the module docstring, ``tools`` in the system
    prompt as the rollout harness puts them (``TrialRunner``). Raises ``ValueError`` when the template renders
    turn i, at the moment it is the last message, differently from the prompt before it (no a_i is defined)."""
    tools = list(tools) if tools else None
    turns = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tools=tools)
        whole = tokenizer.apply_chat_template(messages[: i + 1], tools=tools)
        end = whole.rfind(IM_END)
        if not whole.startswith(prompt) or end < len(prompt):
            raise ValueError(f"message {i}: the template's render of the chat up to this assistant turn does not "
                             f"extend its generation prompt with a turn closed by {IM_END}")
        sampled = tokenizer.encode(whole[len(prompt): end + len(IM_END)])
        turns.append(tito.Turn(np.asarray(tokenizer.encode(prompt), np.int64), np.asarray(sampled, np.int64),
                               np.zeros(len(sampled), np.float32)))
    if not turns:
        raise ValueError("the chat has no assistant turn to train on")
    return turns


def turn_examples(messages: list[dict[str, Any]], tokenizer: ChatTokenizer,
                  tools: list[dict[str, Any]] | None = (BASH_TOOL,)) -> list[Example]:
    """SFT examples of one chat: the TITO chunks of its produced turns (no repairs), ids and loss mask each.
    One example when every boundary is strict; one more per boundary the template re-renders."""
    chunks = tito.assemble(produced_turns(messages, tokenizer, tools), tokenizer, reward=0.0, repairs=())
    return [(chunk.token_ids.astype(np.int64), chunk.loss_mask.astype(np.float32)) for chunk in chunks]
