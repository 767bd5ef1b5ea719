"""Schemas: every record type round-trips through the msgpack codec bit for bit, and bad input gets a
clear error naming the type and the field."""

from __future__ import annotations

import types
import typing

import annotated_types as at
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from pydantic import ValidationError

import schemas
from schemas import Record, SchemaError, decode, encode, known_kinds, lookup, pack
from schemas.codec import to_wire

INT64 = (-(2**63), 2**63 - 1)
ROUTING_LAYERS_K = st.tuples(st.integers(1, 3), st.integers(1, 3))


def scalar_strategy(annotation, metadata) -> st.SearchStrategy:
    """A hypothesis strategy for a non-array field, honouring its ge/gt/le bounds."""
    bounds = {}
    for m in metadata:
        for cls, attr in ((at.Ge, "ge"), (at.Gt, "gt"), (at.Le, "le"), (at.Lt, "lt")):
            if isinstance(m, cls):
                bounds[cls.__name__] = getattr(m, attr)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else scalar_strategy(a, metadata) for a in args))
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(scalar_strategy(args[0], []), max_size=4)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), scalar_strategy(args[1], []), max_size=3)
    if annotation is typing.Any:
        return st.one_of(st.none(), st.booleans(), st.integers(*INT64), st.text(max_size=8),
                         st.floats(allow_nan=False), st.lists(st.integers(-5, 5), max_size=3))
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        low = bounds.get("Ge", bounds["Gt"] + 1 if "Gt" in bounds else INT64[0])
        return st.integers(low, INT64[1])
    if annotation is float:
        return st.floats(min_value=bounds.get("Ge", bounds.get("Gt")), max_value=bounds.get("Le"),
                         exclude_min="Gt" in bounds, allow_nan=False, allow_infinity="Le" not in bounds)
    if annotation is str:
        return st.text(max_size=20)
    if annotation is bytes:
        return st.binary(max_size=20)
    raise AssertionError(f"no strategy for {annotation!r}; extend scalar_strategy for the new field type")


def array_lengths(cls: type[Record], draw) -> dict[str, int]:
    """Rows of each array field, consistent with the record's own length rules."""
    n, p = draw(st.integers(0, 40)), draw(st.integers(0, 40))
    if cls.kind == "sampler_turn":  # a stored turn: prefix_len ids shared, rows from routing_start on
        n = max(n, 1)
        shared = draw(st.integers(0, 8))
        start = draw(st.integers(0, shared))
        return {"prompt_ids": p, "sampled_ids": n, "sampler_logprobs": n, "token_versions": n,
                "routing": shared + p + n - 1 - start, "prefix_len": shared, "routing_start": start}
    if cls.kind == "trajectory":
        rows = draw(st.sampled_from([n, max(n - 1, 0)]))
        return {"token_ids": n, "loss_mask": n, "sampler_logprobs": n, "token_versions": n, "routing": rows}
    return {name: draw(st.integers(0, 40)) for name in cls.array_fields()}


@st.composite
def records(draw, cls: type[Record]) -> Record:
    lengths = array_lengths(cls, draw)
    layers, k = draw(ROUTING_LAYERS_K)
    fields = {}
    for name, info in cls.model_fields.items():
        spec = cls.array_fields().get(name)
        if name in lengths and spec is None:  # a length the arrays' rows depend on
            fields[name] = lengths[name]
            continue
        optional = type(None) in typing.get_args(info.annotation)
        if spec is not None:
            if optional and draw(st.booleans()):
                fields[name] = None
                continue
            dtype = np.dtype(draw(st.sampled_from(spec.dtypes)))
            shape = (lengths[name],) if spec.ndim == 1 else (lengths[name], layers, k)
            fields[name] = draw(hnp.arrays(dtype, shape))  # any bit pattern: NaNs, infinities, -0.0
        elif info.is_required() or draw(st.booleans()):
            fields[name] = draw(scalar_strategy(info.annotation, info.metadata))
    return cls(**fields)


@pytest.mark.parametrize("kind", known_kinds())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_record_type_round_trips_bit_exact(kind, data):
    cls = lookup(kind)
    record = data.draw(records(cls))
    back = decode(encode(record))
    assert type(back) is cls and back == record
    for name, array in record.arrays().items():
        got = getattr(back, name)
        assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes()
        assert not got.flags.writeable, "decoded arrays must be immutable like the record"


def test_all_kinds_are_covered_and_versioned():
    assert len(known_kinds()) >= 25
    for kind in known_kinds():
        cls = lookup(kind)
        assert cls.kind == kind and isinstance(cls.schema_version, int) and cls.schema_version >= 1


def _turn(**over):
    n = 3
    fields = dict(trial_id="t", turn=0, prompt_ids=np.arange(2, dtype=np.int32), sampled_ids=np.arange(n, dtype=np.int32),
                  sampler_logprobs=np.zeros(n, np.float32), routing=np.zeros((4, 2, 2), np.uint8),
                  policy_version=0, finish_reason="stop", temperature=1.0, top_p=1.0)
    fields.update(over)
    return fields


def _wire(record: Record, **field_changes):
    wire = to_wire(record)
    wire["f"].update(field_changes)
    return wire


def test_unknown_type_is_named():
    with pytest.raises(SchemaError, match=r"no_such_event: unknown record type \(known: .*sampler_turn"):
        decode(pack({"t": "no_such_event", "v": 1, "f": {}}))


def test_newer_version_is_refused_with_the_fix():
    wire = to_wire(schemas.Shutdown(reason="x"))
    wire["v"] = 99
    with pytest.raises(SchemaError, match=r"Shutdown: schema version 99 is newer .*upgrade t1"):
        decode(pack(wire))


def test_missing_field_is_named():
    wire = to_wire(schemas.SandboxClose(trial_id="a"))
    del wire["f"]["trial_id"]
    with pytest.raises(SchemaError, match=r"SandboxClose\.trial_id: missing required field"):
        decode(pack(wire))


def test_extra_field_is_named():
    with pytest.raises(SchemaError, match=r"SandboxClose\.colour: unknown field"):
        decode(pack(_wire(schemas.SandboxClose(trial_id="a"), colour="red")))
    with pytest.raises(SchemaError, match=r"SandboxClose\.colour: unknown field"):
        schemas.SandboxClose(trial_id="a", colour="red")


@pytest.mark.parametrize("field,value,dtype", [
    ("prompt_ids", np.arange(2, dtype=np.int64), "int64"),
    ("sampler_logprobs", np.zeros(3, np.float64), "float64"),
    ("routing", np.zeros((4, 2, 2), np.float32), "float32"),
])
def test_wrong_dtype_is_named_on_build_and_on_decode(field, value, dtype):
    with pytest.raises(SchemaError, match=rf"SamplerTurn\.{field}: wrong dtype {dtype}.*astype"):
        schemas.SamplerTurn(**_turn(**{field: value}))
    good = schemas.SamplerTurn(**_turn())
    with pytest.raises(SchemaError, match=rf"SamplerTurn\.{field}: wrong dtype {dtype}"):
        decode(pack(_wire(good, **{field: value})))


def test_list_instead_of_array_is_named():
    with pytest.raises(SchemaError, match=r"SamplerTurn\.prompt_ids: expected a numpy array"):
        schemas.SamplerTurn(**_turn(prompt_ids=[1, 2]))


def test_ragged_lengths_are_named():
    with pytest.raises(SchemaError, match=r"SamplerTurn\.sampler_logprobs: length 2 != len\(sampled_ids\) 3"):
        schemas.SamplerTurn(**_turn(sampler_logprobs=np.zeros(2, np.float32)))
    with pytest.raises(SchemaError, match=r"SamplerTurn\.routing: 5 rows, expected"):
        schemas.SamplerTurn(**_turn(routing=np.zeros((5, 2, 2), np.uint8)))
    n = 4
    with pytest.raises(SchemaError, match=r"TrajectoryAssembled\.loss_mask: length 3 != len\(token_ids\) 4 \(ragged"):
        schemas.TrajectoryAssembled(
            trial_id="t", chunk=0, task_id="x", token_ids=np.zeros(n, np.int32), loss_mask=np.zeros(3, np.uint8),
            sampler_logprobs=np.zeros(n, np.float32), token_versions=np.zeros(n, np.int32), boundary_cases=[],
            reward=0.0, policy_version=0, turns=1)


def test_garbage_and_malformed_envelopes_get_schema_errors():
    for blob in (b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"t": 1, "v": 1, "f": {}}),
                 msgpack.packb({"t": "ack", "v": 0, "f": {}}), msgpack.packb({"t": "ack", "v": 1, "f": []})):
        with pytest.raises(SchemaError):
            decode(blob)
    with pytest.raises(SchemaError, match="only registered t1 records"):
        encode({"t": "ack"})


def test_array_on_the_wire_with_lying_shape_is_refused():
    good = pack(to_wire(schemas.CriticValues(trial_id="t", chunk=0, values=np.zeros(4, np.float32), critic_version=0)))
    # shrink the byte payload so it no longer matches the declared shape
    ext_head = msgpack.packb(["<f4", [4]])
    bad = good.replace(ext_head + b"\x00" * 16, ext_head + b"\x00" * 12)
    assert bad != good
    with pytest.raises(SchemaError):
        decode(bad)


def test_records_are_immutable():
    rec = schemas.SamplerTurn(**_turn())
    with pytest.raises(ValidationError, match="frozen"):
        rec.turn = 3
    with pytest.raises(ValueError):
        rec.prompt_ids[0] = 7


def test_a_verify_request_written_before_sandbox_id_reads_as_the_trials_own_sandbox():
    old = pack({"t": "verify_request", "v": 1, "f": {"trial_id": "r3~c1", "task_id": "t"}})
    request = decode(old)
    assert isinstance(request, schemas.VerifyRequest) and request.sandbox_id is None
    assert request.trial_id == "r3~c1" and request.schema_version == 2
    new = schemas.VerifyRequest(trial_id="r3~c1", task_id="t", sandbox_id="r3")
    assert decode(encode(new)) == new
