"""Rollout logic: one trial of a terminal task, as an agent loop, apart from any orchestration.

The loop is the harness a user would write: render the chat so far with the template, tokenize it (this is
p_i, what the sampler sees; only the text after the last turn boundary it shares with p_{i-1} is tokenized
again, ``rollout.prompt``), sample an assistant turn (a_i, with logprobs and routing), parse
its tool call, run the command in the trial's sandbox, append the (truncated) output as a tool turn,
repeat until the agent answers without a tool call, runs out of turns, or out of context. The harness
re-renders parsed tool calls rather than echoing sampled text, exactly like real harnesses do, which is
why TITO (``t1_actors.tito``) must repair turn boundaries afterwards.

Engines are reached through two narrow async ports, so the same loop runs against the in-process torch
policy, the sampler actor over pynng, or an SGLang server.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from t1_actors.policy.chat_template import parse_tool_calls, render_chat
from t1_actors.policy.generation import Generation, RoutingRows
from t1_actors.rollout.context import ContextEdit, Strategy, fit_context
from t1_actors.rollout.prompt import IncrementalPrompt

Render = Callable[..., str]  # (messages, add_generation_prompt=...) -> text, e.g. ChatTokenizer.apply_chat_template

SYSTEM_PROMPT = "You are a shell agent. Run one bash command per turn with a tool call. Answer done when finished."


@dataclass(frozen=True)
class ToolOutcome:
    exit_code: int
    output: str  # stdout + stderr, as the agent will see it
    infra_error: str | None = None


class SamplePort(Protocol):
    def __call__(self, prompt_ids: np.ndarray, turn: int) -> Awaitable[Generation]: ...


class ExecPort(Protocol):
    def __call__(self, command: str, turn: int) -> Awaitable[ToolOutcome]: ...


@dataclass(frozen=True)
class RolloutLimits:
    """A trial's budgets. ``max_new_tokens`` per turn; ``max_total_new_tokens`` over the trial (checked between
    turns: None, no total); ``max_context`` bounds prompt + a turn's new tokens, kept by ``context_strategy``
    (``rollout.context``); tool outputs longer than ``tool_output_chars`` are cut. Every finish, cut and edit
    is counted on the rollout (``finish``, ``truncations``, ``context_edits``) and logged with the trial."""

    max_turns: int = 4
    max_new_tokens: int = 64
    max_context: int = 768
    tool_output_chars: int = 240
    max_total_new_tokens: int | None = None
    context_strategy: Strategy = "end"
    keep_last_turns: int = 2


@dataclass
class TurnRecord:
    """One played turn: what the sampler saw and returned, the text it decodes to, the commands parsed.

    It is the turn TITO assembles (``tito.TurnLike``): ``sampled_ids``, ``sampler_logprobs``, ``routing``
    and ``policy_version`` are the generation's own arrays, never copies under other names.
    """

    prompt_ids: np.ndarray
    generation: Generation
    text: str
    commands: list[str]
    token_versions = None  # one policy version for the whole turn (a continuation starts a new turn)

    @property
    def sampled_ids(self) -> np.ndarray:
        return self.generation.output_ids

    @property
    def sampler_logprobs(self) -> np.ndarray:
        return self.generation.logprobs

    @property
    def routing(self) -> np.ndarray | None:
        return self.generation.routing

    @property
    def policy_version(self) -> int:
        return self.generation.policy_version


@dataclass
class TrialRollout:
    """Everything a finished (or cancelled) trial produced, ready for the verifier and for TITO."""

    turns: list[TurnRecord] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # answered | turn_tokens (the last turn cut at max_new_tokens) | max_turns | context | token_budget | cancelled
    # | sampler_error | infra_error
    finish: str = "answered"
    infra_error: str | None = None
    started: float = field(default_factory=time.monotonic)  # a continuation keeps its original's start
    truncations: Counter[str] = field(default_factory=Counter)  # tool_output | turn_tokens -> cuts
    context_edits: list[ContextEdit] = field(default_factory=list)
    routing_rows: RoutingRows = field(default_factory=RoutingRows)  # the turns' rows: views of one buffer
    # outputs of the last turn's first commands, already run (a trial rebuilt from the log mid-turn,
    # rollout.resume): a continuation runs only the turn's other commands
    outputs_so_far: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return int(sum(len(t.generation.output_ids) for t in self.turns))


def first_messages(instruction: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": instruction}]


def truncate_output(text: str, limit: int) -> str:
    """Keep the head of a long tool output and say it was cut (the model must learn what cut means)."""
    return text if len(text) <= limit else text[:limit] + "\n[truncated]"


def assistant_message(text: str) -> dict[str, Any]:
    """Parse a sampled assistant text into the message the harness keeps (content + parsed tool calls).

    Tool calls are ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` JSON, the form of t1's template
    and of Qwen3's (newlines around the JSON optional, ``arguments`` may be JSON-encoded twice). The content is
    the text before the first call, stripped; a ``<think>...</think>`` block stays in it, so a template that
    splits reasoning out (Qwen3's) sees it. The sampled ids themselves are never altered (TITO trains on them).
    """
    calls = parse_tool_calls(text) or []
    content = text.split("<tool_call>", 1)[0].strip()
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


async def run_trial(
    instruction: str,
    *,
    sample: SamplePort,
    execute: ExecPort,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    limits: RolloutLimits = RolloutLimits(),
    rollout: TrialRollout | None = None,
    render: Render = render_chat,
) -> TrialRollout:
    """Play one trial, appending to ``rollout`` in place as turns complete.

    Passing the caller's ``rollout`` keeps the partial trial reachable when the caller cancels it, and
    continues a cancelled trial later with its turns (and their policy versions) kept: commands of an
    assistant turn whose output never arrived are run first (but those in ``rollout.outputs_so_far``).
    ``render`` is the chat template (t1's own by default; ``ChatTokenizer.apply_chat_template`` for an HF
    tokenizer's).
    """
    rollout = rollout if rollout is not None else TrialRollout()
    if not rollout.messages:
        rollout.messages.extend(first_messages(instruction))
    rollout.finish = "answered"
    if rollout.turns and rollout.messages[-1]["role"] == "assistant" and rollout.turns[-1].commands:
        done = rollout.outputs_so_far
        commands = rollout.turns[-1].commands[len(done):]
        if not await _run_commands(rollout, commands, len(rollout.turns) - 1, execute, limits, done=done):
            return rollout
        rollout.outputs_so_far = []
    prompt_of = IncrementalPrompt(render, encode)  # renders and tokenizes what each turn adds: linear in the trial

    for turn in range(len(rollout.turns), limits.max_turns):
        if limits.max_total_new_tokens is not None and rollout.tokens >= limits.max_total_new_tokens:
            rollout.finish = "token_budget"
            return rollout
        fitted = fit_context(rollout.messages, prompt_of, budget=limits.max_context - limits.max_new_tokens,
                             strategy=limits.context_strategy, keep_last_turns=limits.keep_last_turns, turn=turn)
        if fitted is None:
            rollout.finish = "context"
            return rollout
        messages, prompt_ids, edit = fitted
        if edit is not None:
            rollout.messages[:] = messages
            rollout.context_edits.append(edit)
        generation = await sample(prompt_ids, turn)
        if generation.finish_reason in ("cancelled", "error"):
            rollout.finish = "cancelled" if generation.finish_reason == "cancelled" else "sampler_error"
            if generation.finish_reason == "error":  # the engine failed, not the policy: never scored
                rollout.infra_error = f"sampler: {generation.error or 'the engine failed'}"
            return rollout
        text = decode(generation.output_ids.tolist())
        try:
            message = assistant_message(text)
        except ValueError:  # a malformed tool call is the policy's mistake: the trial ends, the verifier judges
            message = {"role": "assistant", "content": text}
        commands = [c.get("arguments", {}).get("command", "") for c in message.get("tool_calls", [])]
        commands = [c for c in commands if isinstance(c, str) and c.strip()]
        if generation.finish_reason == "length":  # cut at max_new_tokens: counted, never silent
            rollout.truncations["turn_tokens"] += 1
            rollout.finish = "turn_tokens"  # the trial ends below: a cut turn is no answer
        rollout.turns.append(TurnRecord(prompt_ids, generation, text, commands))
        rollout.messages.append(message)
        if not commands or generation.finish_reason != "stop":
            return rollout
        if not await _run_commands(rollout, commands, turn, execute, limits):
            return rollout
    rollout.finish = "max_turns"
    return rollout


async def _run_commands(rollout: TrialRollout, commands: list[str], turn: int, execute: ExecPort,
                        limits: RolloutLimits, done: Sequence[str] = ()) -> bool:
    outputs = list(done)  # the outputs of the turn's commands run before (a rebuilt trial's)
    for command in commands:
        outcome = await execute(command, turn)
        if outcome.infra_error is not None:
            rollout.finish, rollout.infra_error = "infra_error", outcome.infra_error
            return False
        outputs.append(outcome.output)
    for output in outputs:  # appended together, so a cancelled turn never leaves half its outputs behind
        if len(output) > limits.tool_output_chars:
            rollout.truncations["tool_output"] += 1
        rollout.messages.append({"role": "tool", "content": truncate_output(output, limits.tool_output_chars)})
    return True
