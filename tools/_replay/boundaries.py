"""Turn boundaries of a run's logged trials, from the events alone (no model): how TITO repaired each, which
trials were multi-turn and carried reasoning blocks, and how many tokens the chat template changed between turns.

- ``repair_cases`` / ``repair_case_shares``: the case of every boundary of every assembled trial (``strict`` /
  ``normalized`` / ``retokenized`` / ``split``, from ``TrajectoryAssembled.boundary_cases``), over all boundaries:
  what the run trained on (a run with ``[campaign] tito_repairs = []`` knows strict and split only);
- ``classified`` / ``classified_shares``: the strongest case that holds at each of those boundaries with every
  repair allowed (``tito.repair_boundary`` on the logged sampler turns; needs the tokenizer for ``retokenized``):
  how often the template's re-render could be repaired, whatever the run chose;
- ``trials`` / ``multi_turn``: assembled trials, those with >= 2 sampler turns;
  ``multi_turn_with_reasoning``: multi-turn trials where every turn the template re-renders (each but the last)
  holds a complete ``<think>`` ... ``</think>`` block in its sampled ids (ids from the tokenizer): the trials
  whose every boundary exercises how the template re-renders reasoning. ``multi_turn_reasoning_every_turn``
  also asks it of the last turn (which no boundary re-renders); ``turns_with_reasoning`` counts turns;
- ``template_changes``: per boundary i -> i+1 of a trial's sampler turns, ``changed_tokens``: tokens of
  p_i ++ a_i (what the sampler saw) past the point where p_{i+1} stops repeating them, and tokens of it that a
  diff against p_{i+1} does not match (what the re-render changed); mean and max per boundary, the mean over the
  boundaries that changed, how many changed at all, and of those how many changed the *text* (the decoded
  p_i ++ a_i is not a prefix of the decoded p_{i+1}) rather than only the ids (a non-canonical sampled
  segmentation that the re-render's tokenization undoes).

Counted over every assembled trial of the log, whatever ``--limit`` says: no logprob is computed here.
"""

from __future__ import annotations

import difflib
from collections import Counter

import numpy as np

from t1_actors import tito

CASES = ("strict", "normalized", "retokenized", "split", "version")


def changed_tokens(prompt: np.ndarray, sampled: np.ndarray, next_prompt: np.ndarray) -> tuple[int, int]:
    """What the template's re-render changed at one boundary, in tokens of p_i ++ a_i: (past the longest common
    prefix with p_{i+1}, not matched by a diff against p_{i+1}). (0, 0) exactly when the boundary is strict."""
    seen = np.concatenate([np.asarray(prompt), np.asarray(sampled)]).tolist()
    following = np.asarray(next_prompt).tolist()
    common = 0
    for a, b in zip(seen, following):
        if a != b:
            break
        common += 1
    if common == len(seen):
        return 0, 0
    matcher = difflib.SequenceMatcher(None, seen, following, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return len(seen) - common, len(seen) - matched


def has_reasoning(sampled: np.ndarray, think_open: int | None, think_close: int | None) -> bool:
    """The sampled ids hold a ``<think>`` id followed later by a ``</think>`` id."""
    if think_open is None or think_close is None:
        return False
    ids = np.asarray(sampled)
    opened = np.flatnonzero(ids == think_open)
    return bool(len(opened)) and bool(np.any(ids[opened[0] + 1:] == think_close))


def boundary_report(chunks_by_trial: dict[str, list], turns_by_trial: dict[str, list], tokenizer=None) -> dict:
    """The module docstring's figures over the assembled trials (``chunks_by_trial``: their
    ``TrajectoryAssembled`` events; ``turns_by_trial``: their ``SamplerTurn`` events, continuations included)."""
    think = (None, None)
    if tokenizer is not None:
        think = (tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>"))
    cases: Counter = Counter()
    classified: Counter = Counter()
    past_prefix, diffs = [], []
    text_changed = 0
    multi = with_reasoning = every_turn = turns_total = turns_reasoned = 0
    for trial_id, chunks in chunks_by_trial.items():
        cases.update(case for chunk in chunks for case in chunk.boundary_cases)
        turns = sorted(turns_by_trial.get(trial_id, []), key=lambda t: t.turn)
        reasoned = [has_reasoning(t.sampled_ids, *think) for t in turns]
        turns_total, turns_reasoned = turns_total + len(turns), turns_reasoned + sum(reasoned)
        if len(turns) >= 2:
            multi += 1
            with_reasoning += all(reasoned[:-1])
            every_turn += all(reasoned)
        for prev, nxt in zip(turns, turns[1:]):
            beyond, diff = changed_tokens(prev.prompt_ids, prev.sampled_ids, nxt.prompt_ids)
            past_prefix.append(beyond)
            diffs.append(diff)
            if tokenizer is not None and beyond:
                seen = [int(x) for x in np.concatenate([prev.prompt_ids, prev.sampled_ids])]
                decode = lambda ids: tokenizer.decode([int(x) for x in ids], skip_special_tokens=False)  # noqa: E731
                text_changed += not decode(nxt.prompt_ids).startswith(decode(seen))
            if tokenizer is not None:
                logged = tito.Turn(np.asarray(prev.prompt_ids, np.int64), np.asarray(prev.sampled_ids, np.int64),
                                   np.zeros(len(prev.sampled_ids), np.float32))
                classified[tito.repair_boundary(logged, np.asarray(nxt.prompt_ids, np.int64), tokenizer).case] += 1
    boundaries = sum(cases.values())
    stats = lambda xs: {"mean": float(np.mean(xs)) if xs else None, "max": int(max(xs)) if xs else None}  # noqa: E731
    return {
        "trials": len(chunks_by_trial),
        "multi_turn": multi,
        "multi_turn_with_reasoning": with_reasoning,
        "multi_turn_reasoning_every_turn": every_turn,
        "turns_with_reasoning": {"turns": turns_total, "with_reasoning": turns_reasoned},
        "boundaries": boundaries,
        "repair_cases": {case: cases[case] for case in CASES},
        "repair_case_shares": {case: (cases[case] / boundaries if boundaries else None) for case in CASES},
        "classified": {case: classified[case] for case in CASES} if tokenizer is not None else None,
        "classified_shares": ({case: classified[case] / sum(classified.values()) for case in CASES}
                              if tokenizer is not None and classified else None),
        "template_changes": {"boundaries": len(diffs), "changed": int(sum(1 for d in past_prefix if d)),
                             "text_changed": text_changed if tokenizer is not None else None,
                             "past_prefix_tokens": stats(past_prefix), "diff_tokens": stats(diffs),
                             "diff_tokens_mean_where_changed": (float(np.mean([d for d, b in zip(diffs, past_prefix) if b]))
                                                                if any(past_prefix) else None)},
    }
