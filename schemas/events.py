"""Events: the immutable facts every actor appends to the run's log.

The log is the source of truth; any state (trials in flight, versions, rewards, metrics) is a fold
over these. Array fields are the numeric payload (stored in chunked Zarr arrays), everything else
is the msgpack header.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Float32Array, Int32Array, Record, RoutingArray, SchemaError, UInt8Array
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
    """One generation, stored once: what is new in the prompt the sampler saw, the ids it sampled, their
    logprobs and the routing rows of the positions it was the first of its version to compute.

    The prompt is ``P = S[:prefix_len] ++ prompt_ids``, where ``S = P' ++ sampled'`` is the stream of the trial's
    previous turn (the turn numbered one less in the trial's lineage: a continuation's previous turn may be
    its original's); ``prefix_len = 0`` (every record before schema 3) stores the whole prompt. ``routing``
    holds the rows of stream positions ``routing_start .. len(P) + len(sampled) - 2`` (the last sampled token
    is never fed back); the rows before ``routing_start`` are the previous turn's, computed under the same
    policy version (a turn of a new version records all its rows: its prefix was prefilled, and routed, anew).
    None when the backend did not capture routing, or when the turn belongs to a trial played to be trained: its
    ``TrajectoryAssembled`` chunks store the rows the learner replays, so the turn leaves them out (a dropped or
    cancelled training trial keeps none). ``t1_actors.tito.expand_turns`` rebuilds whole records, so a
    trajectory of N turns stores each position once instead of about N/2 times.

    ``token_versions`` gives the policy version per sampled token when a generation spans versions
    (partial-rollout continuation); None means all are ``policy_version``.
    ``engine``, ``engine_version``, ``engine_start_id``: which engine served the turn (torch, sglang), its
    version, and which start of it (None in logs written before version 2). ``error``: why a turn with
    ``finish_reason='error'`` failed (the engine was unreachable or died): an infrastructure failure.
    """

    kind = "sampler_turn"
    schema_version = 3  # 2 adds engine, engine_version, engine_start_id, error; 3 prefix_len, routing_start
    trial_id: str
    turn: int = Field(ge=0)
    prompt_ids: Int32Array
    prefix_len: int = Field(0, ge=0)
    routing_start: int = Field(0, ge=0)
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
        n = len(self.sampled_ids)
        if len(self.sampler_logprobs) != n:
            raise SchemaError(type(self).__name__, "sampler_logprobs",
                              f"length {len(self.sampler_logprobs)} != len(sampled_ids) {n} (one logprob per sampled token)")
        if self.token_versions is not None and len(self.token_versions) != n:
            raise SchemaError(type(self).__name__, "token_versions",
                              f"length {len(self.token_versions)} != len(sampled_ids) {n}")
        if self.routing is not None:
            rows = self.prefix_len + len(self.prompt_ids) + n - 1 - self.routing_start
            if self.routing.shape[0] != rows:
                raise SchemaError(type(self).__name__, "routing",
                                  f"{self.routing.shape[0]} rows, expected prefix_len + len(prompt) + len(sampled) "
                                  f"- 1 - routing_start = {rows}")


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
class WorkspaceRecovered(Event):
    """A restarted sandbox actor took over a trial's workspace that its killed predecessor left (by the sandbox's
    trial id: a continuation's original's): ``reattached`` as it was; ``rolled_back`` to the snapshot taken when
    ``command`` of ``turn`` started (it was running at the kill: it runs again); or ``lost`` (``reason``: it could
    not be recovered, and the trial is an infrastructure failure, never scored)."""

    kind = "workspace_recovered"
    trial_id: str
    outcome: Literal["reattached", "rolled_back", "lost"]
    turn: int | None = None
    command: str = ""
    reason: str = ""


@register
class VerifierResult(Event):
    """The task's own tests run against the trial's final workspace. reward = passed / S (S fixed) with
    ``reward_kind`` "dense" (the recipe), 1 if every test passed else 0 with "binary" (``[verifier] reward``)."""

    kind = "verifier_result"
    schema_version = 2  # 2 adds reward_kind
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
    reward_kind: Literal["dense", "binary"] = "dense"  # the equation of reward: t1_actors.train.ppo.task_reward

    @property
    def resolved(self) -> bool:
        """The trial resolved its task: verified without an infrastructure error, and every one of its tests
        passed. The one definition every count of resolved trials uses (evals, pass@k, summaries)."""
        return self.infra_error is None and self.total > 0 and self.passed == self.total


@register
class TrialEnded(Event):
    """How a trial's agent loop ended, before its verification: ``answered``, ``turn_tokens`` (its last turn was cut
    at ``max_new_tokens``, never an answer; the cut is also in ``truncations``), ``max_turns``, ``context``,
    ``timeout`` (the task's agent timeout), ``cancelled``, ``sampler_error`` or ``infra_error`` (the sandbox
    could not be built or failed: never the agent's fault), ``token_budget`` (its total of generated tokens was
    spent); its assistant turns, generated tokens and wall time, and every cut counted (nothing is cut silently)."""

    kind = "trial_ended"
    schema_version = 2  # 2 adds truncations, context_edits, tokens
    trial_id: str
    finish: str
    turns: int = Field(0, ge=0)
    duration_s: float = Field(0.0, ge=0)
    infra_error: str | None = None
    unhonoured: list[str] = []  # the task's environment steps its sandbox could not honour (Dockerfile replay)
    truncations: dict[str, int] = {}  # what was cut, counted: tool_output (an output over the limit), turn_tokens
    context_edits: int = Field(0, ge=0)  # ContextEdited events of the trial (the prompt edited to fit)
    tokens: int = Field(0, ge=0)  # tokens the trial's turns generated


@register
class ContextEdited(Event):
    """Before turn ``turn`` the trial's prompt would not fit the context, and ``strategy`` edited its chat
    (``t1_actors.rollout.context``): ``tokens_before`` -> ``tokens_after`` prompt tokens, ``messages_edited``
    tool outputs replaced (drop_old_outputs) or messages removed (window). The edited prompt opens a new TITO chunk."""

    kind = "context_edited"
    trial_id: str
    turn: int = Field(ge=0)
    strategy: str
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    messages_edited: int = Field(ge=0)


@register
class TrajectoryAssembled(Event):
    """A TITO trajectory chunk: token stream, loss mask, sampler logprobs and routing aligned to it.

    ``boundary_cases`` has one entry per turn boundary (strict/normalized/retokenized/split, or version: the
    policy version changed, so the chunk starts afresh with its own prefix routing).
    ``token_versions`` is the policy version per token (loss tokens; 0 elsewhere).
    """

    kind = "trajectory"
    schema_version = 2  # 2 adds the boundary case "version"
    trial_id: str
    chunk: int = Field(ge=0)
    task_id: str
    token_ids: Int32Array
    loss_mask: UInt8Array
    sampler_logprobs: Float32Array
    routing: RoutingArray | None = None
    token_versions: Int32Array
    boundary_cases: list[Literal["strict", "normalized", "retokenized", "split", "version"]]
    reward: float
    policy_version: int = Field(ge=0)  # the oldest version that produced a loss token
    turns: int = Field(ge=0)

    def model_post_init(self, _ctx: Any) -> None:
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
