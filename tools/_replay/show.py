"""One trial made readable: its turns, loss region, logprobs, routing, commands, verdict and reward."""

from __future__ import annotations

import numpy as np

from schemas import (
    SamplerTurn,
    SandboxExec,
    StalenessDecision,
    TrajectoryAssembled,
    TrialIssued,
    VerifierResult,
)
from tools._replay.drift import loss_runs
from tools._replay.run import RunError, RunView

OUTPUT_CHARS = 2000  # of each command's stdout/stderr shown


def _decode(tokenizer, ids) -> str | None:
    """Text of ``ids``; ids the tokenizer lacks (a model vocabulary larger than the tokenizer's) show as
    ``⟨id N⟩`` instead of vanishing."""
    if tokenizer is None:
        return None
    size = tokenizer.get_vocab_size()
    parts, run = [], []
    for i in (int(x) for x in ids):
        if i < size:
            run.append(i)
            continue
        if run:
            parts.append(tokenizer.decode(run, skip_special_tokens=False))
            run = []
        parts.append(f"⟨id {i}⟩")
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts)


def routing_summary(routing: np.ndarray | None, num_experts: int | None = None, top: int = 3) -> dict | None:
    """Per MoE layer: how often each expert was selected, and the ``top`` most used."""
    if routing is None or not len(routing):
        return None
    ids = np.asarray(routing).astype(np.int64)
    experts = num_experts or int(ids.max()) + 1
    layers = []
    for layer in range(ids.shape[1]):
        counts = np.bincount(ids[:, layer].ravel(), minlength=experts)
        order = np.argsort(-counts, kind="stable")[:top]
        layers.append({"counts": counts.tolist(), "top": [[int(e), int(counts[e])] for e in order]})
    return {"rows": int(ids.shape[0]), "k": int(ids.shape[2]), "layers": layers}


def trial_view(view: RunView, trial_id: str, tokenizer=None) -> dict:
    """Everything the log holds about one trial, as a JSON-able dict."""
    events = view.by_trial(trial_id)
    if not events:
        known = view.trial_ids()
        raise RunError(f"trial {trial_id!r} is not in the log ({len(known)} trials"
                       + (f", e.g. {', '.join(known[:3])})" if known else ")"))
    out: dict = {"trial_id": trial_id, "task_id": None, "issued": None, "turns": [], "commands": [],
                 "verifier": None, "trajectory": [], "staleness": [], "reward": None, "continues": []}
    # a continuation (partial-rollout resumption) also shows the turns of the trials it continues
    parents = {e.trial_id: e.resumed_from for _, e in view.of_kind(TrialIssued)}
    ancestor, ancestors = parents.get(trial_id), []
    while ancestor is not None and ancestor not in ancestors:
        ancestors.append(ancestor)
        ancestor = parents.get(ancestor)
    out["continues"] = ancestors
    inherited = [(eid, e) for a in reversed(ancestors) for eid, e in view.by_trial(a) if isinstance(e, SamplerTurn)]
    for event_id, e in inherited + events:
        if isinstance(e, TrialIssued):
            out["task_id"] = e.task_id
            out["issued"] = {"event": event_id, "split": e.split, "policy_version_wanted": e.policy_version_wanted,
                             "group": e.group, "resumed_from": e.resumed_from}
        elif isinstance(e, SamplerTurn):
            lp = np.asarray(e.sampler_logprobs, dtype=np.float64)
            out["turns"].append({
                "event": event_id, "trial_id": e.trial_id, "turn": e.turn, "policy_version": e.policy_version,
                "finish_reason": e.finish_reason, "temperature": e.temperature,
                "prompt_tokens": e.prefix_len + len(e.prompt_ids), "sampled_tokens": len(e.sampled_ids),
                "sampled_ids": e.sampled_ids.tolist(), "sampled_text": _decode(tokenizer, e.sampled_ids),
                "logprobs": lp.tolist(),
                "logprob_mean": float(lp.mean()) if len(lp) else None,
                "logprob_min": float(lp.min()) if len(lp) else None,
                "routing": routing_summary(e.routing),
            })
        elif isinstance(e, SandboxExec):
            out["commands"].append({
                "event": event_id, "turn": e.turn, "command": e.command, "exit_code": e.exit_code,
                "stdout": e.stdout[:OUTPUT_CHARS], "stderr": e.stderr[:OUTPUT_CHARS],
                "truncated": e.stdout_truncated or e.stderr_truncated or len(e.stdout) > OUTPUT_CHARS,
                "duration_s": e.duration_s, "timed_out": e.timed_out, "infra_error": e.infra_error,
            })
        elif isinstance(e, VerifierResult):
            out["verifier"] = {"event": event_id, "tests": e.tests, "passed": e.passed, "total": e.total,
                               "reward": e.reward, "reward_scale": e.reward_scale,
                               "verifier_sha256": e.verifier_sha256, "tamper_flags": list(e.tamper_flags),
                               "infra_error": e.infra_error}
            out["reward"] = e.reward
        elif isinstance(e, TrajectoryAssembled):
            ids, mask = np.asarray(e.token_ids), np.asarray(e.loss_mask).astype(bool)
            segments, last = [], 0
            for start, end in loss_runs(mask):
                if start > last:
                    segments.append({"loss": False, "ids": ids[last:start].tolist(),
                                     "text": _decode(tokenizer, ids[last:start])})
                segments.append({"loss": True, "ids": ids[start:end].tolist(),
                                 "text": _decode(tokenizer, ids[start:end])})
                last = end
            if last < len(ids):
                segments.append({"loss": False, "ids": ids[last:].tolist(), "text": _decode(tokenizer, ids[last:])})
            out["trajectory"].append({
                "event": event_id, "chunk": e.chunk, "tokens": len(ids), "loss_tokens": int(mask.sum()),
                "boundary_cases": list(e.boundary_cases), "reward": e.reward, "policy_version": e.policy_version,
                "turns": e.turns, "segments": segments, "routing": routing_summary(e.routing),
            })
            if out["reward"] is None:
                out["reward"] = e.reward
        elif isinstance(e, StalenessDecision):
            out["staleness"].append({"event": event_id, "decision": e.decision, "lag": e.lag,
                                     "policy_version": e.policy_version, "reason": e.reason})
    return out
