"""TITO (token in, token out): train on the exact token ids the sampler produced.

A harness renders the chat so far with the template and tokenizes it; that is p_i, the prompt the sampler saw
at turn i. The sampler answers with ids a_i (plus their logprobs and routing). Next turn the harness renders
the chat again, now containing the *decoded and parsed* text of a_i, and tokenizes it into p_{i+1}. Nothing
guarantees that p_{i+1} contains a_i as ids: BPE may merge across the assistant/template boundary, the harness
may strip whitespace or re-serialise a tool call, the template may drop past reasoning, and a sampled
tokenization need not be the canonical one. Re-tokenizing the transcript for training would then train the
policy on ids it never sampled (drift). TITO instead builds the training stream T from the sampler's own ids:

    T = p_0 ++ a_0 ++ p_1[k_1:] ++ a_1 ++ p_2[k_2:] ++ a_2 ...      loss mask m_j = 1 iff T_j was sampled

where p_{i+1}[:k_{i+1}] is the part of the next prompt that repeats what T already holds. Finding k at each
turn boundary is the *repair*, tried strongest first, each case in one function below:

1. ``strict``       p_i ++ a_i is a prefix of p_{i+1}: the stream is exactly what the sampler saw.
2. ``normalized``   true after dropping s <= 96 tokens from the end of p_i and u <= 16 from the end of a_i
                    (template suffixes, whitespace the harness normalised); the smallest s + u wins.
3. ``retokenized``  the text of a_i equals the text of a span p_{i+1}[b:e], located by offset mapping; the
                    stream keeps the sampled ids a_i in place of that span.
4. ``split``        none of the above: a new chunk starts at p_{i+1}, same trial, same reward.

In 2 and 3, s is where p_i and p_{i+1} part (``_prompt_drops``): a_i is never aligned with older history
that merely repeats it. Under 2 and 3 later turns train on a context that differs from the sampler's by the
repaired tokens (``Repair.context_mismatch``, counted in ``tito_metrics``); the loss tokens never differ.
That is the invariant: inside the loss region the trained ids equal the sampled ids, drift 0.0000 %.
``assemble`` checks it on every chunk and raises ``TitoDriftError`` if broken.

For PPO the context matters too: the ratio pi/pi_sampler of a token trained on another context than the
sampler's is not a ratio of one policy at one state (a campaign log showed logprob gaps up to 8.8 nats after
normalized boundaries). ``assemble(..., repairs=())`` therefore splits wherever a boundary is not strict;
the campaign does this by default (``[campaign] tito_repairs``), paying for a repeated prompt per split.

Routing (R3) is aligned to T as well; see ``_align_routing`` for which turn's row each position takes.

    chunks = tito.assemble([tito.Turn(p, a, logprobs, routing, version), ...], tokenizer, reward=r)
    events = [tito.to_event(chunk, trial_id=..., task_id=...) for chunk in chunks]   # TrajectoryAssembled
    metrics = tito.tito_metrics(chunks)   # case counts, retokenized_share, drift_tokens (0), ...
"""

from t1_actors.tito._records import (
    CASES,
    MAX_PROMPT_DROP,
    MAX_SAMPLED_DROP,
    Case,
    LossSpan,
    Repair,
    TitoDriftError,
    TitoError,
    TrajectoryChunk,
    Turn,
    TurnLike,
)
from t1_actors.tito.assembly import assemble, to_event
from t1_actors.tito.drift import loss_region_drift, tito_metrics
from t1_actors.tito.repairs import REPAIRS, normalized, repair_boundary, retokenized, split, strict, version_split
from t1_actors.tito.turns import expand_turns

__all__ = ["CASES", "MAX_PROMPT_DROP", "MAX_SAMPLED_DROP", "REPAIRS", "Case", "LossSpan", "Repair", "TitoDriftError",
           "TitoError", "TrajectoryChunk", "Turn", "TurnLike", "assemble", "expand_turns", "loss_region_drift",
           "normalized", "repair_boundary", "retokenized", "split", "strict", "tito_metrics", "to_event",
           "version_split"]
