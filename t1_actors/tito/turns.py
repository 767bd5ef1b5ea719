"""Whole turn records from the log's stored ones: a ``SamplerTurn`` stores only what is new since its trial's
previous turn (schema 3); ``expand_turns`` puts the shared prompt prefix and the previous turn's routing rows back,
so a reader sees every turn as the sampler saw it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schemas import SamplerTurn
from t1_actors.tito._records import TitoError


def expand_turns(turns: Sequence[SamplerTurn]) -> list[SamplerTurn]:
    """The trial's turns, in order (a continuation's lineage included: ``turns[i - 1]`` is the turn ``turns[i]``
    extends), each with its whole prompt (``prefix_len`` 0) and every routing row (``routing_start`` 0). Turns
    stored whole (every record before schema 3) pass unchanged. O(total tokens) per turn, never quadratic in
    storage: only the reader pays for the copies."""
    out: list[SamplerTurn] = []
    for turn in turns:
        if turn.prefix_len == 0 and turn.routing_start == 0:
            out.append(turn)
            continue
        if not out:
            raise TitoError(f"trial {turn.trial_id} turn {turn.turn} extends a previous turn that is not given "
                            "(pass the trial's turns in order, its original's included for a continuation)")
        previous = out[-1]
        stream = np.concatenate([previous.prompt_ids, previous.sampled_ids])
        if turn.prefix_len > len(stream):
            raise TitoError(f"trial {turn.trial_id} turn {turn.turn} shares {turn.prefix_len} ids with a previous "
                            f"turn of {len(stream)} (turn {previous.turn} is not the turn it extends)")
        routing = turn.routing
        if routing is not None and turn.routing_start:
            if previous.routing is None or len(previous.routing) < turn.routing_start:
                raise TitoError(f"trial {turn.trial_id} turn {turn.turn} reuses {turn.routing_start} routing rows of "
                                f"turn {previous.turn}, which recorded fewer")
            routing = np.concatenate([previous.routing[: turn.routing_start], routing])
        prompt = np.concatenate([stream[: turn.prefix_len], turn.prompt_ids]).astype(np.int32)
        out.append(turn.model_copy(update={"prompt_ids": prompt, "routing": routing, "prefix_len": 0,
                                           "routing_start": 0}))
    return out
