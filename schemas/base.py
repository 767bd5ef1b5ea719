"""Base of every typed, immutable, versioned record that flows through t1.

A record is a frozen pydantic model with ``extra='forbid'``. Each concrete type has a registry
name (``kind``) and a ``schema_version``; the codec writes both and refuses what it cannot read.
Numeric payloads are numpy arrays with an exact dtype and rank (no silent casts): they travel as
typed binary (dtype + shape + bytes) and are stored by the event log in chunked Zarr arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, TypeAlias, get_args

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, ValidationError, WithJsonSchema
from pydantic.functional_validators import PlainValidator


class SchemaError(ValueError):
    """A record could not be built, encoded or decoded. The message names the type and the field."""

    def __init__(self, type_name: str, field: str | None, problem: str):
        self.type_name = type_name
        self.field = field
        self.problem = problem
        where = f"{type_name}.{field}" if field else type_name
        super().__init__(f"{where}: {problem}")


_DTYPE_NAMES: dict[np.dtype, str] = {}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached: numpy computes it anew on every access (~3 us, on every array of
    every record validated)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


@dataclass(frozen=True)
class ArraySpec:
    """Allowed dtypes and rank of an array field. ``dtypes`` are numpy dtype names."""

    dtypes: tuple[str, ...]
    ndim: int

    def __call__(self, value: object) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise ValueError(
                f"expected a numpy array of dtype {'/'.join(self.dtypes)} and rank {self.ndim}, "
                f"got {type(value).__name__}; build it with np.asarray(..., dtype=np.{self.dtypes[0]})"
            )
        if dtype_name(value.dtype) not in self.dtypes:
            raise ValueError(
                f"wrong dtype {value.dtype.name}; expected {'/'.join(self.dtypes)} "
                f"(convert explicitly with .astype(np.{self.dtypes[0]}))"
            )
        if value.ndim != self.ndim:
            raise ValueError(f"wrong rank {value.ndim} (shape {value.shape}); expected rank {self.ndim}")
        if value.flags.writeable:
            value = value.view()
            value.flags.writeable = False  # records are immutable, their arrays too
        return value


def Array(*dtypes: str, ndim: int = 1) -> Any:  # reads like a type
    """Annotated numpy array field: ``ids: Array("int32")`` (pydantic validates the dtype and rank).

    A type checker cannot evaluate a call in an annotation: the records' fields use the named aliases below,
    which are these annotations at run time and the arrays they hold to a type checker."""
    spec = ArraySpec(tuple(dtypes), ndim)
    return Annotated[
        np.ndarray,
        PlainValidator(spec),
        WithJsonSchema({"type": "array", "dtype": list(dtypes), "ndim": ndim}),
        spec,
    ]


if TYPE_CHECKING:
    Int32Array: TypeAlias = npt.NDArray[np.int32]
    Float32Array: TypeAlias = npt.NDArray[np.float32]
    UInt8Array: TypeAlias = npt.NDArray[np.uint8]
    RoutingArray: TypeAlias = npt.NDArray[np.uint8 | np.uint16 | np.int32]
else:
    Int32Array = Array("int32")
    Float32Array = Array("float32")
    UInt8Array = Array("uint8")
    # Routing records are expert ids: one byte when the model has <= 256 experts, wider only when needed.
    RoutingArray = Array("uint8", "uint16", "int32", ndim=3)


def routing_dtype(num_experts: int) -> np.dtype:
    """Smallest unsigned dtype that holds an expert id of a model with ``num_experts`` experts."""
    if num_experts <= 0:
        raise ValueError(f"num_experts must be positive, got {num_experts}")
    if num_experts <= 256:
        return np.dtype(np.uint8)
    if num_experts <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


class Record(BaseModel):
    """A typed, immutable record. Subclasses set ``kind`` and ``schema_version``."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, strict=False)

    kind: ClassVar[str] = ""
    schema_version: ClassVar[int] = 1
    _array_fields_cache: ClassVar[dict[str, ArraySpec]]  # set per class by array_fields(), on first use

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise _schema_error(type(self).__name__, exc) from None

    @classmethod
    def array_fields(cls) -> dict[str, ArraySpec]:
        """Names of the numpy-array fields and their specs (the numeric payload of an event)."""
        cached = cls.__dict__.get("_array_fields_cache")
        if cached is None:
            cached = {name: spec for name, info in cls.model_fields.items()
                      if (spec := _find_spec(info.annotation, info.metadata)) is not None}
            cls._array_fields_cache = cached
        return cached

    def header(self) -> dict[str, Any]:
        """All non-array fields as plain Python values (what the log stores as the msgpack header)."""
        arrays = self.array_fields()
        return {k: getattr(self, k) for k in type(self).model_fields if k not in arrays}

    def arrays(self) -> dict[str, np.ndarray]:
        """The array fields that are set (optional arrays may be None)."""
        return {k: getattr(self, k) for k in self.array_fields() if getattr(self, k) is not None}

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name in type(self).model_fields:
            a, b = getattr(self, name), getattr(other, name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
                    return False
                if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]


def _find_spec(annotation: Any, metadata: list[Any]) -> ArraySpec | None:
    for meta in metadata:
        if isinstance(meta, ArraySpec):
            return meta
    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(meta, ArraySpec):
            return meta
    for arg in get_args(annotation):
        if (spec := _find_spec(arg, [])) is not None:
            return spec
    return None


def _schema_error(type_name: str, exc: ValidationError) -> SchemaError:
    first = exc.errors()[0]
    inner = (first.get("ctx") or {}).get("error")
    if isinstance(inner, SchemaError):
        return inner
    loc = ".".join(str(p) for p in first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "missing":
        problem = "missing required field"
    elif kind == "extra_forbidden":
        problem = "unknown field (not part of this schema version; remove it or upgrade t1)"
    else:
        problem = first.get("msg", str(exc)).removeprefix("Value error, ")
    more = len(exc.errors()) - 1
    if more:
        problem += f" (and {more} more problem{'s' if more > 1 else ''})"
    return SchemaError(type_name, loc or None, problem)
