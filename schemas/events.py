"""Events: the immutable facts every actor appends to the run's log.

The log is the source of truth; any state (trials in flight, versions, rewards, metrics) is a fold
over these. Array fields are the numeric payload (stored in chunked Zarr arrays), everything else
is the msgpack header.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Float32Array, Int32Array, Record, RoutingArray, UInt8Array
from schemas.registry import register


class Event(Record):
    """Base of records that are events (appendable to the log)."""


@register
class TrialIssued(Event):
    """The staleness controller launched a trial of a task, wanting a policy version."""

    kind = "trial_issued"
    schema_version = 2  # 2 adds label, sample, temperature (eval passes)
    trial_id: str
    task_id: str
    split: Literal["train", "eval", "warmup"] = "train"
    policy_version_wanted: int = Field(ge=0)
    group: str = ""  # trials of one prompt group (oversampling unit)
    resumed_from: str | None = None  # partial-rollout continuation: the cancelled trial it resumes
    label: str = ""  # the eval pass an eval trial belongs to (EvalResult.label); "" before labels existed
    sample: int = Field(0, ge=0)  # which of an eval pass's attempts at the task (pass@k draws 0..n-1)
    temperature: float | None = None  # the eval pass's sampling temperature; None: the run's


@register
class SamplerTurn(Event):
    """One generation: the ids the sampler saw, the ids it sampled, their logprobs and routing.

    ``routing`` covers every position of ``prompt_ids + sampled_ids`` except the last sampled token
    (which was never fed back), shape ``[len(prompt) + len(sampled) - 1, layers, k]``; None when the
    backend did not capture routing. ``token_versions`` gives the policy version per sampled token when
    a generation spans versions (partial-rollout continuation); None means all are ``policy_version``.
    ``engine``, ``engine_version``, ``engine_start_id``: which engine served the turn (torch, sglang), its
    version, and which start of it (None in logs written before version 2). ``error``: why a turn with
    ``finish_reason='error'`` failed (the engine was unreachable or died): an infrastructure failure.
    """

    kind = "sampler_turn"
    schema_version = 2  # 2 adds engine, engine_version, engine_start_id, error
    trial_id: str
    turn: int = Field(ge=0)
    prompt_ids: Int32Array
    sampled_ids: Int32Array
    sampler_logprobs: Float32Array
    routing: RoutingArray | None = None
    token_versions: Int32Array | None = None
    policy_version: int = Field(ge=0)
    finish_reason: Literal["stop", "length", "cancelled", "error"]
    temperature: float = Field(gt=0)
    top_p: float = Field(gt=0, le=1)
    sampler_id: str = ""
    engine: str | None = None
    engine_version: str | None = None
    engine_start_id: str | None = None
    error: str | None = None

    def model_post_init(self, _ctx: Any) -> None:
        from schemas.base import SchemaError

        n = len(self.sampled_ids)
        if len(self.sampler_logprobs) != n:
            raise SchemaError(type(self).__name__, "sampler_logprobs",
                              f"length {len(self.sampler_logprobs)} != len(sampled_ids) {n} (one logprob per sampled token)")
        if self.token_versions is not None and len(self.token_versions) != n:
            raise SchemaError(type(self).__name__, "token_versions",
                              f"length {len(self.token_versions)} != len(sampled_ids) {n}")
        if self.routing is not None:
            rows = len(self.prompt_ids) + n - 1
            if self.routing.shape[0] != rows:
                raise SchemaError(type(self).__name__, "routing",
                                  f"{self.routing.shape[0]} rows, expected len(prompt)+len(sampled)-1 = {rows}")


@register
class SandboxExec(Event):
    """One tool call executed in a trial's sandbox."""

    kind = "sandbox_exec"
    trial_id: str
    turn: int = Field(ge=0)
    command: str
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_s: float = Field(ge=0)
    timed_out: bool = False
    infra_error: str | None = None  # sandbox infrastructure failure, never a task failure


@register
class VerifierResult(Event):
    """The task's own tests run against the trial's final workspace. reward = passed / S (S fixed)."""

    kind = "verifier_result"
    trial_id: str
    task_id: str
    tests: dict[str, str]  # pytest node id -> outcome (passed/failed/error/skipped/xfailed/xpassed)
    passed: int = Field(ge=0)
    total: int = Field(ge=0)
    reward: float
    reward_scale: int = Field(gt=0)  # S
    verifier_sha256: str
    tamper_flags: list[str] = []
    infra_error: str | None = None
    duration_s: float = 0.0


@register
class TrialEnded(Event):
    """How a trial's agent loop ended, before its verification: ``answered``, ``max_turns``, ``context``,
    ``timeout`` (the task's agent timeout), ``cancelled``, ``sampler_error`` or ``infra_error`` (the sandbox
    could not be built or failed: never the agent's fault); its assistant turns and wall time."""

    kind = "trial_ended"
    trial_id: str
    finish: str
    turns: int = Field(0, ge=0)
    duration_s: float = Field(0.0, ge=0)
    infra_error: str | None = None
    unhonoured: list[str] = []  # the task's environment steps its sandbox could not honour (Dockerfile replay)


@register
class TrajectoryAssembled(Event):
    """A TITO trajectory chunk: token stream, loss mask, sampler logprobs and routing aligned to it.

    ``boundary_cases`` has one entry per turn boundary (strict/normalized/retokenized/split).
    ``token_versions`` is the policy version per token (loss tokens; 0 elsewhere).
    """

    kind = "trajectory"
    trial_id: str
    chunk: int = Field(ge=0)
    task_id: str
    token_ids: Int32Array
    loss_mask: UInt8Array
    sampler_logprobs: Float32Array
    routing: RoutingArray | None = None
    token_versions: Int32Array
    boundary_cases: list[Literal["strict", "normalized", "retokenized", "split"]]
    reward: float
    policy_version: int = Field(ge=0)  # the oldest version that produced a loss token
    turns: int = Field(ge=0)

    def model_post_init(self, _ctx: Any) -> None:
        from schemas.base import SchemaError

        n = len(self.token_ids)
        for name in ("loss_mask", "sampler_logprobs", "token_versions"):
            if len(getattr(self, name)) != n:
                raise SchemaError(type(self).__name__, name,
                                  f"length {len(getattr(self, name))} != len(token_ids) {n} (ragged trajectory)")
        if self.routing is not None and self.routing.shape[0] not in (n, n - 1):
            raise SchemaError(type(self).__name__, "routing",
                              f"{self.routing.shape[0]} rows for {n} tokens (expected {n} or {n - 1})")


@register
class CriticValues(Event):
    """V(s_j) per token of a trajectory chunk, from a critic version."""

    kind = "critic_values"
    trial_id: str
    chunk: int = Field(ge=0)
    values: Float32Array
    critic_version: int = Field(ge=0)


@register
class CriticWarmup(Event):
    """Critic warm-up finished: explained variance before and after, on offline trajectories."""

    kind = "critic_warmup"
    epochs: int
    trajectories: int
    explained_variance_before: float
    explained_variance_after: float
    metrics: dict[str, float] = {}


@register
class LearnerStep(Event):
    """One PPO step: metrics (policy/value loss, clip fraction, KL, entropy, EV, fidelity gaps, ...)."""

    kind = "learner_step"
    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)  # version produced by this step
    trials: list[str]
    metrics: dict[str, float]


@register
class WeightsPublished(Event):
    """A new policy version is on disk (safetensors) with its checksum."""

    kind = "weights_published"
    version: int = Field(ge=0)
    sha256: str
    location: str
    step: int = Field(ge=0)


@register
class StalenessDecision(Event):
    """The staleness controller admitted, dropped or cancelled a trial (lag = learner version - trial's)."""

    kind = "staleness_decision"
    trial_id: str
    decision: Literal["admit", "drop", "cancel", "resume"]
    lag: int
    policy_version: int = Field(ge=0)
    reason: str = ""
    turns: int = 0
    tokens: int = 0


@register
class EvalResult(Event):
    """An evaluation pass on a split: resolved rate, mean reward, counts and a binomial CI."""

    kind = "eval_result"
    schema_version = 2  # 2 adds temperature, samples, mean_turns, last
    label: str
    policy_version: int
    n: int
    resolved: int
    mean_reward: float
    ci_low: float
    ci_high: float
    per_family: dict[str, float] = {}
    temperature: float | None = None  # sampling temperature of the pass; None: the run's ([sampler])
    samples: int = Field(1, ge=1)  # attempts per task (n = tasks x samples trials)
    mean_turns: float = 0.0  # assistant turns per scored trial
    last: bool = False  # the policy's last pass of the eval protocol (after the RL policy's: the run is over)


@register
class ActorLifecycle(Event):
    """An actor started, stopped, died or was restarted (by the supervisor); or it stopped answering for
    longer than the heartbeat timeout (``unreachable``) and answers again (``reachable``), as seen by the
    writer of the event (the supervisor by heartbeats, another actor by pings: ``runtime.reachability``)."""

    kind = "actor_lifecycle"
    actor: str
    role: str
    state: Literal["started", "stopped", "died", "restarted", "gave_up", "unreachable", "reachable"]
    reason: str = ""
    pid: int = 0
