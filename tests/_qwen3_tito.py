"""Multi-turn agent chats on Qwen3's real chat template, for TITO: oracle commands of synthetic tasks, short
<think> blocks, and the ways a Qwen3 sampler's text meets the template's re-render of it.

Scenarios (how the scripted sampler writes each assistant turn; the harness is t1's, ``assistant_message``):

- ``thinking``     ``<think>\\n{thought}\\n</think>\\n\\n<tool_call>...`` in canonical ids
- ``noncanonical`` the same text in a random valid non-canonical segmentation (what a policy may sample)
- ``padded_think`` the reasoning padded with blank lines, which the template strips (``reasoning.strip('\\n')``)
- ``empty_think``  ``<think>\\n\\n</think>\\n\\n`` with nothing in it, which the template drops from past turns
- ``no_thinking``  ``enable_thinking=False``: the generation prompt opens an empty think block history never shows
- ``follow_up``    ``thinking``, then a second user query: the template drops the reasoning of every turn before it

    python tests/_qwen3_tito.py          # prints the measured shares (needs .cache/qwen3-tokenizer)
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tito_harness import segment

from t1_actors import tito
from t1_actors.policy import ChatTokenizer
from t1_actors.policy.chat_tokenizer import BASH_TOOL
from t1_actors.rollout import assistant_message, first_messages, truncate_output
from tools._replay.boundaries import changed_tokens as boundary_changes

SCENARIOS = ("thinking", "noncanonical", "padded_think", "empty_think", "no_thinking", "follow_up")
THOUGHTS = ["Check the files first.", "Run the next step.", "Verify the result.", "This should do it."]
FOLLOW_UP = "Thanks. Now also print the word count."


def sampled_text(command: str | None, thought: str, scenario: str) -> str:
    """The assistant turn as the sampler writes it (stop token included); ``command`` None: the final answer."""
    body = "done" if command is None else "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}},
                                                                     ensure_ascii=False) + "\n</tool_call>"
    think = {"thinking": f"<think>\n{thought}\n</think>\n\n", "noncanonical": f"<think>\n{thought}\n</think>\n\n",
             "follow_up": f"<think>\n{thought}\n</think>\n\n", "padded_think": f"<think>\n\n{thought}\n\n</think>\n\n",
             "empty_think": "<think>\n\n</think>\n\n", "no_thinking": ""}[scenario]
    return think + body + "<|im_end|>"


def play(tok: ChatTokenizer, instruction: str, commands: list[str], scenario: str, seed: int = 0) -> list[tito.Turn]:
    """One trial: render (p_i), sample (a_i), parse with t1's harness, run (a fake output), repeat; then the
    final answer, and for ``follow_up`` a second query and its answer."""
    rng = random.Random(seed)
    options: dict[str, Any] = {"tools": [BASH_TOOL]}
    if scenario == "no_thinking":
        options["enable_thinking"] = False
    messages = first_messages(instruction)
    steps: list[str | None] = [*commands, None]
    turns = []
    for i, command in enumerate(steps + ([None] if scenario == "follow_up" else [])):
        if scenario == "follow_up" and i == len(steps):
            messages.append({"role": "user", "content": FOLLOW_UP})
        prompt = np.asarray(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, **options)), np.int64)
        text = sampled_text(command, THOUGHTS[i % len(THOUGHTS)], scenario)
        sampled = (segment(tok.backend_tokenizer, text, rng) if scenario == "noncanonical"
                   else np.asarray(tok.encode(text)))
        turns.append(tito.Turn(prompt, np.asarray(sampled, np.int64), np.zeros(len(sampled), np.float32)))
        messages.append(assistant_message(text.removesuffix("<|im_end|>")))
        if command is not None:
            messages.append({"role": "tool", "content": truncate_output(f"exit_code: 0\n{command.split()[0]} ran\n", 240)})
    return turns


def changed_tokens(prev: tito.Turn, next_prompt: np.ndarray) -> tuple[int, int]:
    """What the template's re-render changed at a boundary, in tokens of p_i ++ a_i (what the sampler saw):
    (past the point where p_{i+1} stops repeating it as a prefix, not matched by a diff against p_{i+1});
    the figure ``t1-replay drift`` reports per boundary of a run (``tools._replay.boundaries``)."""
    return boundary_changes(prev.prompt_ids, prev.sampled_ids, next_prompt)


def measure(tok: ChatTokenizer, tasks: list, oracle, repairs=tito.REPAIRS) -> dict[str, dict[str, Any]]:
    """Per scenario over ``tasks``: boundary case counts and shares, template-changed tokens (``changed_tokens``:
    totals, the largest diff at one boundary), the repaired context mismatch and the loss-region drift (0)."""
    out = {}
    for scenario in SCENARIOS:
        cases, changed, mismatch, drift, chunks_n, boundaries = Counter(), [], 0, 0, 0, 0
        for n, task in enumerate(tasks):
            turns = play(tok, task.instruction, oracle(task), scenario, seed=n)
            chunks = tito.assemble(turns, tok, reward=1.0, repairs=repairs)
            metrics = tito.tito_metrics(chunks)
            cases.update(c for chunk in chunks for c in chunk.boundary_cases)
            changed += [changed_tokens(turns[i], turns[i + 1].prompt_ids) for i in range(len(turns) - 1)]
            mismatch += metrics["context_mismatch_tokens"]
            drift += metrics["drift_tokens"]
            chunks_n += len(chunks)
            boundaries += len(turns) - 1
        out[scenario] = {"trials": len(tasks), "boundaries": boundaries, "chunks": chunks_n,
                         "cases": {c: cases[c] for c in tito.CASES},
                         "shares": {c: round(cases[c] / boundaries, 3) for c in tito.CASES},
                         "changed_boundaries": sum(1 for c, _ in changed if c),
                         "past_prefix_tokens": sum(c for c, _ in changed), "diff_tokens": sum(d for _, d in changed),
                         "max_diff_per_boundary": max(d for _, d in changed), "context_mismatch_tokens": mismatch,
                         "drift_tokens": drift}
    return out


if __name__ == "__main__":
    from _qwen3 import qwen3

    from t1_actors.tasks import generate, oracle_trajectory

    tasks = generate("train", int(sys.argv[1]) if len(sys.argv) > 1 else 24, seed=3)
    for repairs in (tito.REPAIRS, ()):
        print(f"repairs={repairs}")
        for scenario, row in measure(qwen3(), tasks, oracle_trajectory, repairs).items():
            print(f"  {scenario:13s} {json.dumps(row)}")
