"""One deterministic event of every kind the log knows: event ``seq`` is a function of ``seq`` alone, so a
process that reads the log can check, bit for bit, what another process wrote (and was killed writing).

Kinds rotate with ``seq`` (``seq % len(EVENT_KINDS)``); arrays get random bit patterns of an allowed
dtype (routing: the writer's shape and dtype, ids below ``EXPERTS``, each (token, layer) selection
sorted when its ids are distinct, as the log stores sets), scalars a value inside their
bounds. A kind whose own validators refuse the generic values is built with fewer optional fields."""

from __future__ import annotations

import random
import types
import typing

import annotated_types as at
import numpy as np

from schemas import known_kinds, lookup
from schemas.events import Event
from storage import stored_routing

LAYERS, K, EXPERTS = 4, 2, 8  # the routing shape every chaos writer is opened with
ROUTING = dict(routing_shape=(LAYERS, K), num_experts=EXPERTS)
EVENT_KINDS: tuple[str, ...] = tuple(k for k in known_kinds() if issubclass(lookup(k), Event))


def _scalar(annotation, metadata, rng: random.Random):
    bounds = {}
    for m in metadata:
        for cls, attr in ((at.Ge, "ge"), (at.Gt, "gt"), (at.Le, "le"), (at.Lt, "lt")):
            if isinstance(m, cls):
                bounds[cls.__name__] = getattr(m, attr)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return _scalar(next(a for a in args if a is not type(None)), metadata, rng)
    if origin is typing.Literal:
        return rng.choice(args)
    if origin is list:
        return [_scalar(args[0], [], rng) for _ in range(rng.randint(0, 3))]
    if origin is dict:
        return {f"k{i}": _scalar(args[1], [], rng) for i in range(rng.randint(0, 2))}
    if annotation is typing.Any:
        return rng.choice([None, True, rng.randint(-5, 5), "x", [1, 2]])
    if annotation is bool:
        return rng.random() < 0.5
    if annotation is int:
        low = bounds.get("Ge", bounds["Gt"] + 1 if "Gt" in bounds else 0)
        high = bounds.get("Le", bounds["Lt"] - 1 if "Lt" in bounds else low + 1000)
        return rng.randint(low, max(low, high))
    if annotation is float:
        low = bounds.get("Ge", bounds.get("Gt", 0.0))
        high = bounds.get("Le", bounds.get("Lt", low + 100.0))
        return low + (high - low) * (0.5 + 0.4 * rng.random())  # strictly inside (gt/lt bounds too)
    if annotation is str:
        return "".join(rng.choice("abcdef-é0") for _ in range(rng.randint(1, 24)))
    if annotation is bytes:
        return rng.randbytes(rng.randint(0, 20))
    raise TypeError(f"no generic value for a field of type {annotation!r}; extend tools/chaos/_events.py")


def _lengths(kind: str, rng: random.Random, names) -> dict[str, int]:
    n, p = rng.randint(1, 120), rng.randint(0, 80)
    if kind == "sampler_turn":
        return {"prompt_ids": p, "sampled_ids": n, "sampler_logprobs": n, "token_versions": n, "routing": p + n - 1}
    if kind == "trajectory":
        return {"token_ids": n, "loss_mask": n, "sampler_logprobs": n, "token_versions": n,
                "routing": rng.choice([n, n - 1])}
    return {name: rng.randint(0, 120) for name in names}


def event_for(seq: int, writer: str = "w") -> Event:
    """Event ``seq`` of ``writer``'s segment: kind ``EVENT_KINDS[seq % len]``, content from (seq, writer)."""
    cls = lookup(EVENT_KINDS[seq % len(EVENT_KINDS)])
    for optional_rate in (0.5, 0.0):  # a kind whose validators refuse some optional values: fewer of them
        rng = random.Random(f"{writer}:{seq}:{optional_rate}")
        nprng = np.random.default_rng(rng.getrandbits(64))
        lengths = _lengths(cls.kind, rng, cls.array_fields())
        fields = {}
        for name, info in cls.model_fields.items():
            spec = cls.array_fields().get(name)
            if spec is not None:
                if spec.ndim == 3:  # in the form the log reads back (sets sorted), so reads compare bit for bit
                    fields[name] = stored_routing(nprng.integers(0, EXPERTS, (lengths[name], LAYERS, K), dtype=np.uint8))
                else:
                    dtype = np.dtype(rng.choice(spec.dtypes))
                    fields[name] = np.frombuffer(nprng.bytes(lengths[name] * dtype.itemsize), dtype).copy()
            elif info.is_required() or rng.random() < optional_rate:
                fields[name] = _scalar(info.annotation, info.metadata, rng)
        try:
            return cls(**fields)
        except Exception:
            if optional_rate == 0.0:
                raise
    raise AssertionError("unreachable")
