"""Snapshots that tell whether a call changed anything it was given.

`state(obj)` records, recursively, every tensor's identity, metadata (dtype, shape,
strides, device, layout, `requires_grad`), version counter, `.grad` and exact bytes;
every mapping's keys and order; the fields of NamedTuples, dataclasses and attrs
classes (optimizer states and their counters; not the caches an object sets for
itself outside `__init__`); the value of every number and string; and every module's
parameters, buffers (objects and values), hooks, training flags, submodules and other
attributes. Two snapshots compare equal exactly when nothing observable changed, and
`difference` says where they first differ. `Case` and `check` drive the tables of bad
inputs: each case builds its operands fresh, runs one call that must raise, and the
snapshot of the operands taken before must equal the one taken after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import attrs
import pytest
import torch
from torch import Tensor, nn


def _tensor_state(t: Tensor) -> tuple[Any, ...]:
    meta = (
        id(t),
        type(t).__name__,
        t.dtype,
        tuple(t.shape),
        t.stride() if t.layout == torch.strided else None,
        str(t.device),
        t.layout,
        t.requires_grad,
        t._version if t.layout == torch.strided and not t.is_inference() else None,
        _tensor_state(t.grad) if t.is_leaf and t.grad is not None else None,
    )
    if t.is_meta:
        return (*meta, None)
    dense = t.detach().to_dense() if t.layout != torch.strided else t.detach()
    data = dense.cpu().contiguous().reshape(-1).view(torch.uint8).clone()
    return (*meta, data)


# A module's own bookkeeping, recorded by `_module_state` through its own fields.
_MODULE_FIELDS = frozenset({"_parameters", "_buffers", "_modules", "training"})
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _attribute(value: object) -> Any:
    """A module attribute, shallowly: tensors whole, scalars by value, else by id."""
    if isinstance(value, Tensor):
        return _tensor_state(value)
    if isinstance(value, _SCALARS):
        return (type(value), repr(value))
    if isinstance(value, dict | list | set | tuple):
        return (id(value), type(value), len(value))  # hook tables, caches
    return (id(value), type(value))


def _named_tensors(
    m: nn.Module, kind: str, prefix: str = "", above: frozenset[int] = frozenset()
) -> list[tuple[str, Tensor]]:
    """`named_parameters` or `named_buffers` with duplicates, safe on cycles.

    torch's own `remove_duplicate=False` walk never ends on a module that holds one
    of its ancestors; here a module is not entered again below itself.
    """
    held: dict[str, Tensor | None] = getattr(m, kind)
    out = [(prefix + n, t) for n, t in held.items() if t is not None]
    for name, sub in m._modules.items():
        if sub is not None and id(sub) not in above:
            out += _named_tensors(sub, kind, f"{prefix}{name}.", above | {id(m)})
    return out


def _module_state(m: nn.Module) -> tuple[Any, ...]:
    mods = list(m.named_modules(remove_duplicate=True))
    return (
        id(m),
        [(name, sub.training) for name, sub in mods],
        [
            (
                name,
                len(sub._forward_hooks),
                len(sub._forward_pre_hooks),
                len(sub._backward_hooks),
                len(sub._state_dict_hooks),
            )
            for name, sub in mods
        ],
        [(n, _tensor_state(t)) for n, t in _named_tensors(m, "_parameters")],
        [(n, _tensor_state(t)) for n, t in _named_tensors(m, "_buffers")],
        [
            (
                name,
                sorted(
                    (k, _attribute(v))
                    for k, v in vars(sub).items()
                    if k not in _MODULE_FIELDS
                ),
            )
            for name, sub in mods
        ],
        [(name, [(k, id(v)) for k, v in sub._modules.items()]) for name, sub in mods],
    )


def state(obj: object) -> Any:
    """Return a comparable snapshot of everything observable in `obj`."""
    return _state(obj, set())


def _state(obj: object, seen: set[int]) -> Any:
    if isinstance(obj, Tensor):
        return ("tensor", _tensor_state(obj))
    if isinstance(obj, nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
        return ("module", _module_state(obj))
    if isinstance(obj, _SCALARS):  # counters, flags, names: by value
        return ("scalar", type(obj), repr(obj))
    if type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):
        array: Any = obj
        return ("numpy", array.dtype, getattr(array, "shape", ()), array.tobytes())
    if id(obj) in seen:  # a container that holds itself
        return ("cycle", id(obj))
    seen = seen | {id(obj)}
    if isinstance(obj, Mapping):
        internal = None
        kept: Any = obj
        if hasattr(type(obj), "_keys"):  # a ParamDict: its kept keys and values too
            internal = (kept._keys, [id(v) for v in kept._vals])
        return (
            "mapping",
            type(obj),
            internal,
            [(repr(k), _state(v, seen)) for k, v in obj.items()],
        )
    if isinstance(obj, list | tuple):  # NamedTuples too, field by field
        return ("sequence", type(obj), [_state(v, seen) for v in obj])
    # The fields `__init__` sets; those it does not are the object's own caches.
    kind: Any = type(obj)  # an attrs class, once `attrs.has` says so
    if attrs.has(kind):
        fields = [f.name for f in attrs.fields(kind) if f.init]
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [f.name for f in dataclasses.fields(obj) if f.init]
    else:
        return ("other", id(obj), type(obj))
    return (
        "fields",
        id(obj),
        type(obj),
        [(name, _state(getattr(obj, name), seen)) for name in fields],
    )


def equal(a: Any, b: Any) -> bool:
    """Whether two snapshots from `state` are the same."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


@dataclass(frozen=True)
class Case:
    """One bad input: build operands, make the call, expect this error."""

    id: str
    build: Callable[[], tuple[Any, ...]]
    call: Callable[..., Any]
    error: type[BaseException] | tuple[type[BaseException], ...]
    match: str

    def param(self) -> Any:
        return pytest.param(self, id=self.id)


def check(case: Case) -> None:
    """Run `case`: it raises the expected error and changes none of its operands."""
    operands = case.build()
    before = state(operands)
    with pytest.raises(case.error, match=case.match):
        case.call(*operands)
    after = state(operands)
    assert equal(before, after), f"{case.id}: an operand changed"


def operands(build: Callable[[], Any]) -> Callable[[], tuple[Any, ...]]:
    """Return a builder of the one-operand tuple `(build(),)`."""
    return lambda: (build(),)


def unique_ids(cases: list[Case]) -> list[Case]:
    """Return `cases`, after checking that no two share an id."""
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    return cases


def difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two snapshots from `state` first differ, as a path; `None` if equal."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return None if equal(a, b) else f"{path}: bytes"
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return f"{path}: {len(a)} items, then {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if a == b else f"{path}: {a!r:.200} then {b!r:.200}"
