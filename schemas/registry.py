"""Registry of record types by their ``kind`` name, for the codec and the log."""

from __future__ import annotations

from typing import TypeVar

from schemas.base import Record, SchemaError

_REGISTRY: dict[str, type[Record]] = {}

R = TypeVar("R", bound=type[Record])


def register(cls: R) -> R:
    """Class decorator: make a record type known to the codec under ``cls.kind``."""
    if not cls.kind:
        raise TypeError(f"{cls.__name__} must set a non-empty class attribute `kind`")
    other = _REGISTRY.get(cls.kind)
    if other is not None and other is not cls and other.__qualname__ != cls.__qualname__:
        raise TypeError(f"record kind {cls.kind!r} is used by both {other.__name__} and {cls.__name__}")
    _REGISTRY[cls.kind] = cls
    return cls


def lookup(kind: str) -> type[Record]:
    """The record type registered as ``kind``; a clear error if unknown."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise SchemaError(str(kind), None, f"unknown record type (known: {known})") from None


def known_kinds() -> list[str]:
    return sorted(_REGISTRY)
