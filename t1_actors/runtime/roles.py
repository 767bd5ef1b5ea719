"""Which class plays an actor: the role table the caller passes (``t1_actors.job.roles.ROLES``), or the
actor's own ``actor_class = 'module:Class'`` (a plugin: the one class loaded by name)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from t1_actors.runtime.actor import Actor
from t1_actors.runtime.config import ActorSpec, ConfigError


def import_class(target: str, what: str) -> object:
    """The attribute ``Class`` of module ``module`` named by ``target`` ('module:Class'); the caller checks
    what it is."""
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


def resolve_role(role: str, roles: Mapping[str, type[Actor]]) -> type[Actor]:
    """The Actor class that plays ``role`` in the table ``roles`` (``t1_actors.job.roles.ROLES``)."""
    cls = roles.get(role)
    if cls is None:
        raise ConfigError(f"unknown role {role!r} (roles: {', '.join(sorted(roles))}); "
                          "or give the actor an actor_class = 'module:Class'")
    return cls


def actor_class(spec: ActorSpec, roles: Mapping[str, type[Actor]]) -> type[Actor]:
    """The class of one configured actor: its ``actor_class`` override (a plugin, loaded by name), else the
    role table ``roles``."""
    if spec.actor_class is None:
        cls = resolve_role(spec.role, roles)
    else:
        loaded = import_class(spec.actor_class, f"actor {spec.name!r} actor_class")
        if not (isinstance(loaded, type) and issubclass(loaded, Actor)):
            raise ConfigError(f"actor {spec.name!r}: {spec.actor_class} is not a t1_actors.runtime.Actor subclass")
        cls = loaded
    if cls.role and cls.role != spec.role:
        raise ConfigError(f"actor {spec.name!r} has role {spec.role!r} but {cls.__name__} plays {cls.role!r}")
    return cls
