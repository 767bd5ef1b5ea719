"""A small real run directory for the t1-replay tests: real policy weights, real sampler, real TITO, real log.

``build_run(root, ...)`` writes RUN/log (storage.EventLog), RUN/weights/v0 and v1 (MoEPolicy.save),
RUN/tokenizer.json, and events for a few multi-turn trials sampled by ``t1_actors.policy.sampling``
and assembled by ``t1_actors.tito``. ``router_noise`` > 0 samples with perturbed router weights, the
way a sampler's kernels differ from the learner's: the recorded routing then differs from the
learner's live routing, which R3 replay removes.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np
import torch
from fixtures.models import tiny_model_config

from schemas import (
    CriticWarmup,
    EvalResult,
    LearnerStep,
    SamplerTurn,
    SandboxExec,
    StalenessDecision,
    TrialIssued,
    VerifierResult,
    WeightsPublished,
)
from storage import EventLog
from t1_actors import tito
from t1_actors.policy.chat_template import IM_END, render_chat
from t1_actors.policy.config import ModelConfig
from t1_actors.policy.model import MoEPolicy
from t1_actors.policy.sampling import SamplingParams, generate
from t1_actors.policy.tokenizer import default_tokenizer

SYSTEM = "You are a shell agent."
TASKS = ["List the files in /app.", "Write hello to /app/out.txt.", "Count lines of /app/data.txt."]


def tiny_config(vocab_size: int) -> ModelConfig:
    return tiny_model_config(wide=True, vocab_size=vocab_size, max_position=1024)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _noisy_router(model: MoEPolicy, noise: float, seed: int) -> MoEPolicy:
    sampler = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sampler.named_parameters():
            if name.endswith("mlp.gate.weight"):  # the router
                param.add_(torch.randn(param.shape, generator=gen) * noise)
    return sampler


def _valid_text(tokenizer, ids) -> bool:
    from tools._replay.align import token_bytes

    try:
        b"".join(token_bytes(tokenizer, np.asarray(ids))).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _sample_turn(sampler: MoEPolicy, tokenizer, prompt: list[int], seed: int, stop: int):
    """One real generation whose bytes are valid text (a trained model emits text; a random one may not)."""
    for attempt in range(50):
        params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(stop,), seed=seed + 1000 * attempt)
        g = generate(sampler, [prompt], params)[0]
        if len(g.output_ids) >= 2 and _valid_text(tokenizer, g.output_ids):
            return g
    raise RuntimeError("no decodable sample in 50 draws")


def build_run(root: Path, *, trials: int = 3, turns: int = 2, router_noise: float = 0.0, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    tokenizer = default_tokenizer().backend_tokenizer  # the bare tokenizers.Tokenizer
    root.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(root / "tokenizer.json"))
    config = tiny_config(tokenizer.get_vocab_size())
    v0 = MoEPolicy(config).eval()
    v1 = copy.deepcopy(v0)
    with torch.no_grad():
        for p in v1.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    stop = tokenizer.token_to_id(IM_END)
    log = EventLog.open(root / "log", create=True)
    shape = dict(routing_shape=(config.num_layers, config.top_k), num_experts=config.num_experts)
    with log.writer("learner-0") as learner, log.writer("sampler-0", **shape) as sampler_log, \
            log.writer("sandbox-0") as sandbox, log.writer("verifier-0") as verifier, \
            log.writer("staleness-0") as staleness, log.writer("trajectory-0", **shape) as assembler:
        for version, model in ((0, v0), (1, v1)):
            path = model.save(root / "weights" / f"v{version}")
            learner.append(WeightsPublished(version=version, sha256=_sha256(path / "model.safetensors"),
                                            location=f"weights/v{version}", step=version))
        learner.append(CriticWarmup(epochs=1, trajectories=8, explained_variance_before=-3.0,
                                    explained_variance_after=0.7))
        learner.commit()
        for t in range(trials):
            version = t % 2
            model = (v0, v1)[version]
            sampler = _noisy_router(model, router_noise, seed + t) if router_noise else model
            trial_id, task_id = f"trial-{t}", f"task-{t % len(TASKS)}"
            staleness.append(TrialIssued(trial_id=trial_id, task_id=task_id, policy_version_wanted=version))
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[t % len(TASKS)]}]
            recorded = []
            for turn in range(turns):
                prompt = tokenizer.encode(render_chat(messages, add_generation_prompt=True),
                                          add_special_tokens=False).ids
                g = _sample_turn(sampler, tokenizer, prompt, seed * 100 + t * 10 + turn, stop)
                event = SamplerTurn(trial_id=trial_id, turn=turn, prompt_ids=np.asarray(prompt, np.int32),
                                    sampled_ids=g.output_ids, sampler_logprobs=g.logprobs, routing=g.routing,
                                    policy_version=version, finish_reason=g.finish_reason, temperature=1.0, top_p=1.0)
                sampler_log.append(event)
                recorded.append(event)
                text = tokenizer.decode(g.output_ids.tolist(), skip_special_tokens=True)
                command = f"echo {turn}"
                sandbox.append(SandboxExec(trial_id=trial_id, turn=turn, command=command, exit_code=0,
                                           stdout=f"{turn}\n", stderr="", duration_s=0.01))
                messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": f"{turn}"}]
            passed = t % 3
            reward = passed / 20
            verifier.append(VerifierResult(trial_id=trial_id, task_id=task_id,
                                           tests={f"test_{i}": "passed" if i < passed else "failed" for i in range(3)},
                                           passed=passed, total=3, reward=reward, reward_scale=20,
                                           verifier_sha256="0" * 64))
            for chunk in tito.assemble(recorded, tokenizer, reward=reward):
                assembler.append(tito.to_event(chunk, trial_id=trial_id, task_id=task_id))
            staleness.append(StalenessDecision(trial_id=trial_id, decision="admit" if t < trials - 1 else "cancel",
                                               lag=version, policy_version=version))
            for w in (sampler_log, sandbox, verifier, assembler, staleness):
                w.commit()
        learner.append(LearnerStep(step=1, policy_version=1, trials=[f"trial-{t}" for t in range(trials)],
                                   metrics={"policy_loss": 0.1, "explained_variance": 0.5, "gap_r3": 0.01,
                                            "gap_no_r3": 0.02, "kl_sampler_learner": 0.003,
                                            "off_policy_masked_fraction": 0.25}))
        learner.append(EvalResult(label="final", policy_version=1, n=10, resolved=3, mean_reward=0.1,
                                  ci_low=0.1, ci_high=0.6))
        learner.commit()
    return root
