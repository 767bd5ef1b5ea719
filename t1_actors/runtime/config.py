"""The runtime's configuration: where a run lives, how its actors talk, how the supervisor keeps them alive.

Sections owned here: ``[run]`` (id, dir, message key), ``[transport]`` (deadlines, heartbeats, message age),
``[supervisor]`` (address, restart backoff and limit, shutdown grace), ``[[actors]]`` (name, role, address,
host, options) and ``[storage]`` (where the event log lives). ``RuntimeConfig`` is the part of a run config the
runtime reads; a whole campaign's config (``t1_actors.job.config.RunConfig``) extends it with a field per
section, and code below the job reads its own section by type::

    learner = config.section(LearnerConfig)   # typed: a LearnerConfig

Errors are ``ConfigError`` naming the file, the key path and the fix; nothing starts before a config validates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from storage.config import StorageConfig
from t1_actors.layout import log_location

RUN_KEY_ENV = "T1_RUN_KEY"
RUN_KEY_FILE_ENV = "T1_RUN_KEY_FILE"  # a path: the key reaches a Slurm step through a file, not its environment
MIN_KEY_CHARS = 16
UNIX_SOCKET_PATH_BYTES = 107  # sun_path holds 108 bytes, the last one a NUL
QUICK_KEY = "quick"  # [quick.*] tables: overrides that --quick applies (the <= 5 min CI campaign)

S = TypeVar("S", bound=BaseModel)
C = TypeVar("C", bound="RuntimeConfig")


class ConfigError(ValueError):
    """The run config is invalid; the message names the key and how to fix it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Strict):
    """Identity and place of the run."""

    id: str = Field("tiny", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                    description="the run's name: bound as run_id on every log line and the start of its trial ids")
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
    heartbeat_interval_s: float = Field(1.0, gt=0, description="each actor sends the supervisor a heartbeat this "
                                        "often, and the supervisor checks for silent actors as often; must be below "
                                        "heartbeat_timeout_s")
    heartbeat_timeout_s: float = Field(5.0, gt=0, description="a peer silent this long is reported by name")
    max_message_age_s: float = Field(120.0, gt=0, description="older (or further in the future) messages are "
                                     "rejected as replays; also bounds clock skew between hosts")
    bulk_max_bytes: int = Field(1 << 31, gt=0, description="largest accepted bulk message")
    control_max_bytes: int = Field(64 << 20, gt=0, description="largest accepted control message")
    poll_spin_us: float = Field(300.0, ge=0, le=100_000, description="a control-plane wait busy-polls this long "
                                "(yielding the CPU) before it parks; 0 parks at once (less CPU, slower round trips)")

    @model_validator(mode="after")
    def _timeout_after_interval(self) -> TransportSection:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s ({self.heartbeat_timeout_s}) must exceed "
                             f"heartbeat_interval_s ({self.heartbeat_interval_s})")
        return self


class SupervisorSection(_Strict):
    """The supervisor: where heartbeats go, how dead actors come back, how a run stops."""

    address: str | None = Field(None, description="heartbeat address; default ipc://<run dir>/sock/supervisor")
    restart_backoff_s: float = Field(0.5, ge=0, description="first restart delay; doubles per restart")
    restart_backoff_max_s: float = Field(10.0, ge=0, description="cap on the doubling restart delay")
    restart_limit: int = Field(5, ge=0, description="restarts of one actor before the supervisor gives up on it")
    restart_window_s: float = Field(300.0, gt=0, description="restarts older than this no longer count")
    restart_unresponsive: bool = Field(True, description="kill and restart a local actor whose heartbeats stop")
    shutdown_grace_s: float = Field(5.0, gt=0, description="wait after Shutdown before SIGTERM, and again before SIGKILL")
    ready_timeout_s: float = Field(60.0, gt=0, description="time an actor has to send its first heartbeat")
    join_timeout_s: float = Field(7200.0, gt=0, description="`t1-actor launch --join`: how long a host waits for "
                                  "the supervisor of the host that runs the job (its corpus, tokenizer and SFT first)")


class ActorSpec(_Strict):
    """One actor instance: a process."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="the actor's name, unique in the run (e.g. sampler-0): peers, logs and the "
                                  "supervisor know it by this name")
    role: str = Field(min_length=1, pattern=r"^[a-z][a-z0-9_]*$",
                      description="what it does: a role of the role table (sampler, sandbox, verifier, critic, "
                                  "learner, staleness), or any name with actor_class")
    address: str | None = Field(None, description="control (request/reply) address; default ipc://<run dir>/sock/<name>")
    bulk_address: str | None = Field(None, description="bulk (push/pull) address; default: the control address "
                                     "with '.bulk' appended (ipc) or port + 1 (tcp)")
    host: str = Field("localhost", description="host that runs it; `t1-actor launch` starts only local ones")
    actor_class: str | None = Field(None, description="'module:Class' overriding the role table (plugins, tests)")
    options: dict[str, Any] = Field(default_factory=dict, description="actor-specific options (validated by the actor)")


class RuntimeConfig(BaseModel):
    """What the runtime reads of a run config. Build one with ``load_config(path)`` or ``parse_config(mapping)``;
    a campaign's whole config subclasses it with one field per section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: RunSection = RunSection()
    transport: TransportSection = TransportSection()
    supervisor: SupervisorSection = SupervisorSection()
    actors: list[ActorSpec] = Field(default_factory=list)
    storage: StorageConfig = Field(default_factory=StorageConfig)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_sections(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in data:
                if name not in cls.model_fields:
                    known = ", ".join(sorted(cls.model_fields))
                    raise ConfigError(f"unknown section [{name}] (known sections: {known}); remove it or fix its name")
        return data

    @model_validator(mode="after")
    def _check_actors(self) -> RuntimeConfig:
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
        return self

    # ---- sections -------------------------------------------------------------------------------
    def section(self, model: type[S]) -> S:
        """The section this config validated with ``model`` (its defaults when the file has none)."""
        for name, field in type(self).model_fields.items():
            if field.annotation is model:
                value: S = getattr(self, name)
                return value
        raise ConfigError(f"{type(self).__name__} has no section validated by {model.__name__}; "
                          "load the run's whole config (t1_actors.job.config.load_config)")

    def routing_shape(self) -> tuple[int, int, int] | None:
        """(MoE layers, experts per token, experts) of the routing the log records; None: no routing."""
        return None

    # ---- derived values -------------------------------------------------------------------------
    def log_location(self) -> str | Path:
        """The run's event log: ``[storage] url`` when set, else ``RUN/log`` (``layout.log_location``)."""
        return log_location(self.run.dir, self.storage.url)

    @property
    def socket_dir(self) -> Path:
        """Where the default ipc sockets live: ``RUN/sock``, or, when a socket path there would pass the 107
        bytes a unix socket allows (a deep run dir), ``/tmp/t1-sock-UID/<hash of RUN/sock>``: the same path for
        every process on the host that reads this config, one directory per run."""
        here = (self.run.dir / "sock").resolve()
        longest = max([len(b"supervisor")] + [len(f"{spec.name}.bulk".encode()) for spec in self.actors])
        if len(str(here).encode()) + 1 + longest <= UNIX_SOCKET_PATH_BYTES:
            return here
        digest = hashlib.sha256(str(here).encode()).hexdigest()[:16]
        return Path("/tmp") / f"t1-sock-{os.getuid()}" / digest

    @property
    def supervisor_address(self) -> str:
        return self.supervisor.address or f"ipc://{self.socket_dir / 'supervisor'}"

    def control_address(self, spec: ActorSpec) -> str:
        return spec.address or f"ipc://{self.socket_dir / spec.name}"

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

    def hmac_key(self) -> bytes:
        """The run's message key: ``[run] hmac_key``, else $T1_RUN_KEY, else the file $T1_RUN_KEY_FILE names (mode
        0600 or stricter: a key others can read is refused); a ConfigError when none is set."""
        if self.run.hmac_key is not None:
            return self.run.hmac_key.get_secret_value().encode()
        env = os.environ.get(RUN_KEY_ENV)
        if not env and os.environ.get(RUN_KEY_FILE_ENV):
            env = read_key_file(Path(os.environ[RUN_KEY_FILE_ENV]))
        if env:
            if len(env) < MIN_KEY_CHARS:
                raise ConfigError(f"${RUN_KEY_ENV} must have at least {MIN_KEY_CHARS} characters")
            return env.encode()
        raise ConfigError(f"no message key: set [run] hmac_key, the {RUN_KEY_ENV} environment variable or "
                          f"{RUN_KEY_FILE_ENV} (a file of mode 0600 holding it); `t1-actor launch` makes one for the "
                          "actors it starts")

    def to_jsonable(self) -> dict[str, Any]:
        """Everything except the key (for the resolved config file the launcher hands to actors)."""
        data: dict[str, Any] = self.model_dump(mode="json", exclude={"run": {"hmac_key"}})
        data["run"]["dir"] = str(self.run.dir.resolve())
        return data


def read_key_file(path: Path) -> str:
    """The run key held in ``path`` (surrounding whitespace dropped); a ConfigError when the file cannot be read or
    is readable or writable by anyone but its owner."""
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"${RUN_KEY_FILE_ENV} = {str(path)!r}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"${RUN_KEY_FILE_ENV} = {str(path)!r} has mode {mode:04o}: the run key must be readable by "
                          f"its owner only (chmod 600 {path})")
    return text


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
    if scheme == "ipc" and len(rest.encode()) > UNIX_SOCKET_PATH_BYTES:
        raise ValueError(f"{owner}: ipc path {rest!r} is longer than the {UNIX_SOCKET_PATH_BYTES} bytes a unix "
                         "socket allows; set a shorter address")


def _address_key(address: str) -> str:
    scheme, _, rest = address.partition("://")
    return f"{'tcp' if scheme.startswith('tcp') else scheme}://{rest}"


_DOTTED_SECTIONS = ("run", "transport", "supervisor", "actors")  # their errors read run.id, actors.0.name


def explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        path = [str(p) for p in err.get("loc", ())]
        if len(path) > 1 and path[0] not in _DOTTED_SECTIONS:  # "[model] hidden", as the file spells it
            loc = f"[{path[0]}] " + ".".join(path[1:])
        else:
            loc = ".".join(path)
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


def parse_config(data: dict[str, Any], source: str = "<config>", model: type[C] = RuntimeConfig) -> C:  # type: ignore[assignment]
    """Validate a mapping with ``model`` (its sections, then its rules across sections); a ConfigError naming
    ``source`` and the problem."""
    try:
        return model.model_validate(data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except ValidationError as exc:
        raise ConfigError(f"{source}: {explain(exc)}") from None
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def read_config_data(path: str | os.PathLike[str], *, quick: bool = False,
                     run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """A run config file (.toml, or the .json the launcher writes for its actors) as a mapping, not validated.

    The ``[quick.*]`` tables are applied over the rest with ``quick`` and dropped otherwise; ``run_dir``
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
    return data


def load_config(path: str | os.PathLike[str], *, quick: bool = False, run_dir: str | os.PathLike[str] | None = None,
                model: type[C] = RuntimeConfig) -> C:  # type: ignore[assignment]
    """Read and validate a run config file with ``model`` (``read_config_data``, then ``parse_config``)."""
    return parse_config(read_config_data(path, quick=quick, run_dir=run_dir), str(path), model)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_resolved(config: RuntimeConfig, path: Path) -> Path:
    """Write the validated config (minus the key) as JSON, for actors started by the launcher."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config.to_jsonable(), indent=2))
    tmp.replace(path)
    return path
