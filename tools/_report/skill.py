"""The report's side of the skill-vs-sharpening eval: KL(RL || SFT) on eval prompts and the pass@k plot.

KL(RL || SFT) = E_{x ~ RL}[log pi_RL(x) - log pi_SFT(x)], estimated per sampled token on the RL policy's
eval trials at the run's temperature (label ``after``): the sampler's own logprob is log pi_RL, the SFT
policy (version 0) is run on the same context for log pi_SFT. Reported per token and per trial (the sum
over its assistant tokens), with the k3 estimator (ratio - 1 - log ratio, unbiased and >= 0) beside k1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from schemas import SamplerTurn, TrialIssued
from t1_actors import tito
from tools._replay.drift import token_logprobs


def kl_rl_sft(view, *, max_trials: int = 48) -> dict | None:
    """KL(RL || SFT) over the first ``max_trials`` trials of the ``after`` eval pass; None without one."""
    trials = [e.trial_id for _, e in view.of_kind(TrialIssued) if e.split == "eval" and e.label == "after"]
    if not trials:
        return None
    trials = set(trials[:max_trials])
    by_trial: dict[str, list[SamplerTurn]] = {}
    for _, e in view.of_kind(SamplerTurn):
        if e.trial_id in trials:
            by_trial.setdefault(e.trial_id, []).append(e)
    turns = [t for trial_turns in by_trial.values() for t in tito.expand_turns(sorted(trial_turns, key=lambda t: t.turn))
             if len(t.sampled_ids)]  # eval trials are never continuations: each trial's own turns are whole
    versions = {t.policy_version for t in turns}
    if not turns or versions == {0}:
        return None
    sft = view.model(0)
    k1, k3, per_trial = [], [], {}
    for turn in turns:
        ids = np.concatenate([turn.prompt_ids, turn.sampled_ids]).astype(np.int64)
        logp_sft, _ = token_logprobs(sft, ids, temperature=turn.temperature)
        log_ratio = turn.sampler_logprobs.astype(np.float64) - logp_sft[len(turn.prompt_ids):]
        k1.extend(log_ratio.tolist())
        k3.extend((np.expm1(-log_ratio) + log_ratio).tolist())
        per_trial[turn.trial_id] = per_trial.get(turn.trial_id, 0.0) + float(log_ratio.sum())
    return {"per_token_k1": float(np.mean(k1)), "per_token_k3": float(np.mean(k3)),
            "per_trial_k1": float(np.mean(list(per_trial.values()))), "tokens": len(k1), "trials": len(per_trial),
            "rl_versions": sorted(versions)}


def plot_pass_at_k(pass_at_k: dict, out_dir: Path) -> Path | None:
    """pass@k of the SFT and RL policies (each at its best temperature), k on a log axis."""
    curves = {policy: curve for policy, curve in (pass_at_k or {}).items() if curve}
    if not curves:
        return None
    import matplotlib  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib only when plotting (pyplot: 0.6 s importtime)

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, curve in curves.items():
        ks = sorted(int(k) for k in curve)
        ax.plot(ks, [curve[k] if k in curve else curve[str(k)] for k in ks], marker="o", label=policy.upper())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (attempts)")
    ax.set_ylabel("pass@k (unbiased, 16 samples)")
    ax.set_title("pass@k at each policy's best temperature")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(out_dir) / "pass_at_k.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
