"""The run's configuration: one TOML (or JSON) file per run, validated before any process starts.

Sections owned here: ``[run]`` (id, dir, HMAC key), ``[transport]`` (deadlines, heartbeats, message
age), ``[supervisor]`` (its address, restart backoff and limit, shutdown grace) and ``[[actors]]``
(name, role, address, host, options). Every other top-level section (``[model]``, ``[learner]``,
``[sampler]`` ...) is validated by the pydantic model its module registers::

    from t1_actors.config import section

    @section("learner")
    class LearnerConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")
        lr: float = 1e-4

or, so that a section validates without importing its module first, through ``KNOWN_SECTIONS``
(name -> "module:Class", imported only when the section is present or asked for). Read a section
with ``config.section("learner")`` (the section's defaults when the file has none).

Errors are ``ConfigError`` naming the file, the key path and the fix.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator

RUN_KEY_ENV = "T1_RUN_KEY"
MIN_KEY_CHARS = 16

# Sections whose models live in other modules: imported lazily, only when the section is used.
KNOWN_SECTIONS: dict[str, str] = {
    "model": "t1_actors.policy.config:ModelConfig",
    "storage": "storage.config:StorageConfig",
    "tasks": "t1_actors.tasks.config:TasksConfig",
    "sampler": "t1_actors.backends.sampler_backend:SamplerConfig",
    "sandbox": "t1_actors.sandbox:SandboxConfig",
    "verifier": "t1_actors.verification:VerifierConfig",
    "ppo": "t1_actors.ppo:PPOConfig",
    "learner": "t1_actors.learner:LearnerConfig",
    "critic": "t1_actors.critic:CriticConfig",
    "staleness": "t1_actors.rollout.admission:StalenessConfig",
    "campaign": "t1_actors.job.config:CampaignConfig",
    "eval": "t1_actors.evaluation:EvalConfig",
}
_REGISTERED: dict[str, type[BaseModel]] = {}
_OWN_SECTIONS = ("run", "transport", "supervisor", "actors")


class ConfigError(ValueError):
    """The run config is invalid; the message names the key and how to fix it."""


def section(name: str):
    """Class decorator: validate the top-level config section ``[name]`` with this pydantic model."""
    if name in _OWN_SECTIONS:
        raise ValueError(f"section name {name!r} is reserved by the runtime")

    def register(model: type[BaseModel]) -> type[BaseModel]:
        _REGISTERED[name] = model
        return model

    return register


def section_model(name: str) -> type[BaseModel]:
    """The model that validates section ``name``; a ConfigError when no module defines it."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    target = KNOWN_SECTIONS.get(name)
    if target is None:
        known = ", ".join(sorted({*_OWN_SECTIONS, *KNOWN_SECTIONS, *_REGISTERED}))
        raise ConfigError(f"unknown section [{name}] (known sections: {known}); remove it or fix its name")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"section [{name}] is defined by {module_name}, which is not available ({exc})") from None
    model = getattr(module, class_name, None)
    if model is None:
        raise ConfigError(f"section [{name}]: {module_name} has no class {class_name}")
    _REGISTERED[name] = model
    return model


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Strict):
    """Identity and place of the run."""

    id: str = Field("tiny", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    dir: Path = Field(Path("runs/tiny"), description="run directory: event log, weights, sockets, resolved config")
    hmac_key: SecretStr | None = Field(None, description=f"per-run message key; else the {RUN_KEY_ENV} environment "
                                       "variable; `t1-actor launch` makes a fresh one when neither is set")

    @field_validator("hmac_key")
    @classmethod
    def _key_long_enough(cls, key: SecretStr | None) -> SecretStr | None:
        if key is not None and len(key.get_secret_value()) < MIN_KEY_CHARS:
            raise ValueError(f"hmac_key must have at least {MIN_KEY_CHARS} characters "
                             "(make one with: python -c 'import secrets; print(secrets.token_hex(32))')")
        return key


class TransportSection(_Strict):
    """Control-plane deadlines and heartbeats. Bulk transfers have no deadline."""

    control_deadline_s: float = Field(5.0, gt=0, description="default deadline of a control-plane call")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(5.0, gt=0, description="a peer silent this long is reported by name")
    max_message_age_s: float = Field(120.0, gt=0, description="older (or further in the future) messages are "
                                     "rejected as replays; also bounds clock skew between hosts")
    bulk_max_bytes: int = Field(1 << 31, gt=0, description="largest accepted bulk message")
    control_max_bytes: int = Field(64 << 20, gt=0, description="largest accepted control message")
    poll_spin_us: float = Field(300.0, ge=0, le=100_000, description="a control-plane wait busy-polls this long "
                                "(yielding the CPU) before it parks; 0 parks at once (less CPU, slower round trips)")

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> "TransportSection":
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s ({self.heartbeat_timeout_s}) must exceed "
                             f"heartbeat_interval_s ({self.heartbeat_interval_s})")
        return self


class SupervisorSection(_Strict):
    """The supervisor: where heartbeats go, how dead actors come back, how a run stops."""

    address: str | None = Field(None, description="heartbeat address; default ipc://<run dir>/sock/supervisor")
    restart_backoff_s: float = Field(0.5, ge=0, description="first restart delay; doubles per restart")
    restart_backoff_max_s: float = Field(10.0, ge=0)
    restart_limit: int = Field(5, ge=0, description="restarts of one actor before the supervisor gives up on it")
    restart_window_s: float = Field(300.0, gt=0, description="restarts older than this no longer count")
    restart_unresponsive: bool = Field(True, description="kill and restart a local actor whose heartbeats stop")
    shutdown_grace_s: float = Field(5.0, gt=0, description="wait after Shutdown before SIGTERM, and again before SIGKILL")
    ready_timeout_s: float = Field(60.0, gt=0, description="time an actor has to send its first heartbeat")


class ActorSpec(_Strict):
    """One actor instance: a process."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    role: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_]*$")
    address: str | None = Field(None, description="control (request/reply) address; default ipc://<run dir>/sock/<name>")
    bulk_address: str | None = Field(None, description="bulk (push/pull) address; default: the control address "
                                     "with '.bulk' appended (ipc) or port + 1 (tcp)")
    host: str = Field("localhost", description="host that runs it; `t1-actor launch` starts only local ones")
    actor_class: str | None = Field(None, description="'module:Class' overriding the role table (plugins, tests)")
    options: dict[str, Any] = Field(default_factory=dict, description="actor-specific options (validated by the actor)")


class RunConfig(BaseModel):
    """The whole run. Build it with ``load_config(path)`` or ``RunConfig.model_validate(mapping)``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    run: RunSection = RunSection()
    transport: TransportSection = TransportSection()
    supervisor: SupervisorSection = SupervisorSection()
    actors: list[ActorSpec] = Field(default_factory=list)
    _sections: dict[str, BaseModel] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_sections(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in data:
                if name not in _OWN_SECTIONS:
                    section_model(name)  # raises a ConfigError naming the unknown section
        return data

    @model_validator(mode="after")
    def _check_actors(self) -> "RunConfig":
        names: set[str] = set()
        for spec in self.actors:
            if spec.name in names:
                raise ValueError(f"duplicate actor name {spec.name!r}; every [[actors]] entry needs its own name")
            names.add(spec.name)
        seen: dict[str, str] = {}

        def claim(owner: str, address: str) -> None:
            check_address(address, owner)
            key = _address_key(address)
            if key in seen:
                raise ValueError(f"duplicate address {address!r}: used by {seen[key]} and {owner}")
            seen[key] = owner

        claim("the supervisor", self.supervisor_address)
        for spec in self.actors:
            claim(f"actor {spec.name!r}", self.control_address(spec))
            claim(f"actor {spec.name!r} (bulk)", self.bulk_address(spec))
        extras = self.__pydantic_extra__ or {}
        for name, raw in extras.items():
            model = section_model(name)
            try:
                self._sections[name] = raw if isinstance(raw, model) else model.model_validate(raw)
            except ValidationError as exc:
                raise ValueError(f"[{name}] {_explain(exc)}") from None
        return self

    # ---- derived values -------------------------------------------------------------------------
    @property
    def socket_dir(self) -> Path:
        return self.run.dir / "sock"

    @property
    def supervisor_address(self) -> str:
        return self.supervisor.address or f"ipc://{(self.socket_dir / 'supervisor').resolve()}"

    def control_address(self, spec: ActorSpec) -> str:
        return spec.address or f"ipc://{(self.socket_dir / spec.name).resolve()}"

    def bulk_address(self, spec: ActorSpec) -> str:
        if spec.bulk_address:
            return spec.bulk_address
        address = self.control_address(spec)
        if address.startswith("ipc://"):
            return address + ".bulk"
        host, _, port = address.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"actor {spec.name!r}: tcp address {address!r} needs a port (tcp://HOST:PORT)")
        return f"{host}:{int(port) + 1}"

    def actor(self, name: str) -> ActorSpec:
        for spec in self.actors:
            if spec.name == name:
                return spec
        known = ", ".join(s.name for s in self.actors) or "none"
        raise ConfigError(f"no actor named {name!r} in the config (actors: {known})")

    def actors_of(self, role: str) -> list[ActorSpec]:
        return [spec for spec in self.actors if spec.role == role]

    def section(self, name: str) -> BaseModel:
        """Section ``[name]`` validated by its registered model (its defaults when the file has none)."""
        if name not in self._sections:
            self._sections[name] = section_model(name)()
        return self._sections[name]

    def hmac_key(self) -> bytes:
        """The run's message key: ``[run] hmac_key``, else $T1_RUN_KEY; a ConfigError when neither is set."""
        if self.run.hmac_key is not None:
            return self.run.hmac_key.get_secret_value().encode()
        env = os.environ.get(RUN_KEY_ENV)
        if env:
            if len(env) < MIN_KEY_CHARS:
                raise ConfigError(f"${RUN_KEY_ENV} must have at least {MIN_KEY_CHARS} characters")
            return env.encode()
        raise ConfigError(f"no message key: set [run] hmac_key or the {RUN_KEY_ENV} environment variable "
                          "(`t1-actor launch` makes one for the actors it starts)")

    def to_jsonable(self) -> dict[str, Any]:
        """Everything except the key (for the resolved config file the launcher hands to actors)."""
        data = self.model_dump(mode="json", exclude={"run": {"hmac_key"}})
        data["run"]["dir"] = str(self.run.dir.resolve())
        for name, model in self._sections.items():
            data[name] = model.model_dump(mode="json")
        return data


_SCHEMES = ("ipc", "tcp", "tcp4", "tcp6", "inproc")


def check_address(address: str, owner: str) -> None:
    """An nng address we can listen on: ipc:///abs/path, tcp://host:port, inproc://name."""
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in _SCHEMES:
        raise ValueError(f"{owner}: address {address!r} must start with one of "
                         f"{', '.join(s + '://' for s in _SCHEMES)}")
    if scheme == "ipc" and not rest:
        raise ValueError(f"{owner}: ipc address {address!r} needs a path (ipc:///run/t1/sampler-0)")
    if scheme.startswith("tcp"):
        if not re.match(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.*-]+):\d{1,5}$", rest):
            raise ValueError(f"{owner}: tcp address {address!r} must be tcp://HOST:PORT")
        port = int(rest.rsplit(":", 1)[1])
        if not 0 < port < 65535:
            raise ValueError(f"{owner}: tcp port {port} out of range")
    if scheme == "ipc" and len(rest.encode()) > 107:
        raise ValueError(f"{owner}: ipc path {rest!r} is longer than the 107 bytes a unix socket allows; "
                         "use a shorter run dir or set the address explicitly")


def _address_key(address: str) -> str:
    scheme, _, rest = address.partition("://")
    return f"{'tcp' if scheme.startswith('tcp') else scheme}://{rest}"


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            msg = "unknown key (remove it or fix its spelling)"
        elif kind == "missing":
            msg = "missing required key"
        else:
            msg = err.get("msg", "").removeprefix("Value error, ")
            if "input" in err and kind not in ("value_error", "assertion_error"):
                msg += f" (got {err['input']!r})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


QUICK_KEY = "quick"  # [quick.*] tables: overrides that --quick applies (the <= 5 min CI campaign)


def parse_config(data: dict[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a mapping: every section, then every rule across sections (``t1_actors.config_rules``);
    a ConfigError naming ``source`` and the problem."""
    from .job.rules import check_run

    try:
        config = RunConfig.model_validate(data)
        check_run(config)
        return config
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_explain(exc)}") from None
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_config(path: str | os.PathLike[str], *, quick: bool = False,
                run_dir: str | os.PathLike[str] | None = None) -> RunConfig:
    """Read and validate a run config (.toml, or the .json the launcher writes for its actors).

    The ``[quick.*]`` tables are applied over the rest with ``quick`` and ignored otherwise; ``run_dir``
    replaces ``[run] dir``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}") from None
    overrides = data.pop(QUICK_KEY, None)
    if quick and overrides is None:
        raise ConfigError(f"{path}: --quick asks for [quick.*] overrides and the config has none")
    if quick:
        data = _deep_merge(data, overrides)
    if run_dir is not None:
        data.setdefault("run", {})["dir"] = str(run_dir)
    return parse_config(data, str(path))


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_resolved(config: RunConfig, path: Path) -> Path:
    """Write the validated config (minus the key) as JSON, for actors started by the launcher."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config.to_jsonable(), indent=2))
    tmp.replace(path)
    return path

