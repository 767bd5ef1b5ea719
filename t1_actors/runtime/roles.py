"""Which class plays each role. Imported lazily, so a role whose module is not written yet only
fails when it is used, with a clear error."""

from __future__ import annotations

import importlib

from ..config import ActorSpec, ConfigError

ROLES: dict[str, str] = {
    "sampler": "t1_actors.sampler:SamplerActor",
    "sandbox": "t1_actors.sandbox:SandboxActor",
    "verifier": "t1_actors.verifier:VerifierActor",
    "critic": "t1_actors.critic:CriticActor",
    "learner": "t1_actors.learner:LearnerActor",
    "staleness": "t1_actors.staleness:StalenessActor",
}


def import_class(target: str, what: str) -> type:
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(f"{what}: {target!r} is not 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"{what}: module {module_name} does not exist (yet); "
                              "write it or point actor_class at another 'module:Class'") from None
        raise
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"{what}: {module_name} has no class {class_name}")
    return cls


def resolve_role(role: str) -> type:
    """The Actor class registered for ``role``."""
    from .actor import Actor

    target = ROLES.get(role)
    if target is None:
        raise ConfigError(f"unknown role {role!r} (roles: {', '.join(sorted(ROLES))}); "
                          "or give the actor an actor_class = 'module:Class'")
    cls = import_class(target, f"role {role!r}")
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise ConfigError(f"role {role!r}: {target} is not a t1_actors.runtime.Actor subclass")
    return cls


def actor_class(spec: ActorSpec) -> type:
    """The class of one configured actor: its ``actor_class`` override, else the role table."""
    from .actor import Actor

    if spec.actor_class is None:
        cls = resolve_role(spec.role)
    else:
        cls = import_class(spec.actor_class, f"actor {spec.name!r} actor_class")
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise ConfigError(f"actor {spec.name!r}: {spec.actor_class} is not a t1_actors.runtime.Actor subclass")
    if cls.role and cls.role != spec.role:
        raise ConfigError(f"actor {spec.name!r} has role {spec.role!r} but {cls.__name__} plays {cls.role!r}")
    return cls
