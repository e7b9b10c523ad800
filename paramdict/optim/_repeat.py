"""What a repeated `step_` need not check again: one kept record per optimizer.

Before its first write, `step_` checks the state against the parameters
(`check_state`: keys, shapes, dtypes, devices of every buffer), what it may
write (`_writable.check_writable`: no meta, inference or overlapping tensors,
none sharing memory with another), and the conditions of its path
(`_strategy.choose`: one dtype and device for the fused kernel, every buffer
laid out as its parameter). A training loop hands the same tensors back on
every call, and every one of those verdicts depends only on facts that the
step's own writes leave as they are:

- which tensors the parameters and the state hold, under which keys, in which
  structure of fields;
- each tensor's data address, size, strides, dtype and device;
- whether inference mode is on.

So `repeating(opt, params, state)`, entered by `step_` before its checks, reads
those facts in one pass (a few `map`s over the tensors: about 0.5 us a tensor,
against about 1.3 us for the checks they spare, Adam at 160 x 64) and compares
them with the record `opt` kept from its last `step_`. Where all are the same, the
verdicts the record holds are reused (`kept`); anything else (another tensor,
one resized, re-pointed by `.data =` or `set_`, restrided, converted; another
key or field; inference mode toggled) starts a new record, in which every check
runs in full, and refuses as it always does. A tensor that autograd records (it
gained a `grad_fn` in place) is checked in full on every call. Tensors are held
by weak references, never by `id` alone: a tensor alive is the tensor it was.

What changes from step to step is read on every call by its own check: the
gradients, the step counter's value, the schedule slot, the rates. Traced code
(`torch.compile`, `torch.func`) and DTensors keep nothing.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamDict's package-internal storage)
import contextlib
import contextvars
import operator
import weakref
from collections.abc import Callable, Generator, Hashable
from typing import Any, NamedTuple, TypeVar, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._paramdict import ParamDict

__all__ = ["EntryFacts", "kept", "known_entries", "repeating"]

T = TypeVar("T")

_address = Tensor.data_ptr
_size = Tensor.size
_stride = Tensor.stride
_dtype = cast("Callable[[Tensor], torch.dtype]", operator.attrgetter("dtype"))
_device = cast("Callable[[Tensor], torch.device]", operator.attrgetter("device"))
_is_leaf = cast("Callable[[Tensor], bool]", operator.attrgetter("is_leaf"))
# typeshed leaves the referent of the unbound `ref.__call__` unknown:
_deref = cast(
    "Callable[[weakref.ref[Tensor]], Tensor | None]",
    weakref.ref.__call__,  # pyright: ignore[reportUnknownMemberType]
)


class EntryFacts(NamedTuple):
    """The parameters' sizes, strides, dtypes and devices, in key order."""

    sizes: list[torch.Size]
    strides: list[tuple[int, ...]]
    dtypes: list[torch.dtype]
    devices: list[torch.device]


class _Facts(NamedTuple):
    """What the verdicts depend on, read afresh on every call."""

    keys: list[tuple[str, ...]]  # of the parameters, then of each ParamDict field
    shape: list[object]  # the state's structure: node types, lengths, treespecs
    addresses: list[int]
    sizes: list[torch.Size]
    strides: list[tuple[int, ...]]
    dtypes: list[torch.dtype]
    devices: list[torch.device]
    inference_mode: bool


class _Record:
    """The tensors a `step_` saw, their facts, and the verdicts reached on them."""

    __slots__ = ("entries", "facts", "refs", "verdicts")

    def __init__(self, tensors: list[Tensor], facts: _Facts, count: int) -> None:
        self.refs = list(map(weakref.ref, tensors))
        self.facts = facts
        self.entries = EntryFacts(
            facts.sizes[:count],
            facts.strides[:count],
            facts.dtypes[:count],
            facts.devices[:count],
        )
        self.verdicts: dict[Hashable, object] = {}

    def holds(self, tensors: list[Tensor], facts: _Facts) -> bool:
        """Whether these are the record's tensors, with the record's facts."""
        return (
            facts == self.facts
            and len(tensors) == len(self.refs)
            and all(map(operator.is_, map(_deref, self.refs), tensors))
        )


class _Current(NamedTuple):
    """The record confirmed for the `step_` running, and the objects it was given."""

    params: ParamDict
    parts: dict[int, int]  # `id` of the state and of each tuple in it: its place
    record: _Record


_KEPT: weakref.WeakKeyDictionary[object, _Record] = weakref.WeakKeyDictionary()
_CURRENT: contextvars.ContextVar[_Current | None] = contextvars.ContextVar(
    "paramdict_optim_repeat", default=None
)
_MISSING = object()


def _walk(
    node: object,
    tensors: list[Tensor],
    keys: list[tuple[str, ...]],
    shape: list[object],
    parts: dict[int, int],
) -> None:
    """Add the tensors, ParamDict keys, structure and tuples of a state's `node`."""
    if isinstance(node, Tensor):
        tensors.append(node)
    elif isinstance(node, ParamDict):
        shape.append(type(node))
        keys.append(node._keys)
        tensors.extend(node._vals)
    elif isinstance(node, tuple):  # the states' own structure: NamedTuples
        fields = cast("tuple[object, ...]", node)
        parts[id(fields)] = len(shape)
        shape.append((type(fields), len(fields)))
        for field in fields:
            _walk(field, tensors, keys, shape, parts)
    else:  # anything else (a number, a dict), generically
        leaves, spec = pytree.tree_flatten(node)
        shape.append(spec)
        tensors.extend(t for t in leaves if isinstance(t, Tensor))


def _confirmed(opt: object, params: ParamDict, state: object) -> _Current | None:
    """The record of `opt` for these tensors as they are now, kept or new.

    None where nothing is kept (DTensors, tensors without data of their own,
    an optimizer that cannot be weakly referenced; `params` not a ParamDict,
    refused next) or where a tensor is recorded by autograd (checked in full).
    """
    if not isinstance(cast(object, params), ParamDict):
        return None
    tensors = list(params._vals)
    keys = [params._keys]
    shape: list[object] = []
    parts: dict[int, int] = {}
    _walk(state, tensors, keys, shape, parts)
    if holds_dtensors(tensors):
        return None
    try:
        facts = _Facts(
            keys,
            shape,
            list(map(_address, tensors)),
            list(map(_size, tensors)),
            list(map(_stride, tensors)),
            list(map(_dtype, tensors)),
            list(map(_device, tensors)),
            torch.is_inference_mode_enabled(),
        )
    except (RuntimeError, NotImplementedError):  # sparse, or no storage of its own
        return None
    try:
        record = _KEPT.get(opt)
        if record is None or not record.holds(tensors, facts):
            record = _Record(tensors, facts, len(params._vals))
            _KEPT[opt] = record
    except TypeError:  # an optimizer of `__slots__` without `__weakref__`
        return None
    if not all(map(_is_leaf, tensors)):  # a `grad_fn` appeared: refused in full
        return None
    return _Current(params, parts, record)


@contextlib.contextmanager
def repeating(
    opt: object, params: ParamDict, state: object
) -> Generator[None, None, None]:
    """Let the checks of the block reuse what `opt`'s last `step_` found.

    `step_` enters it where no `torch.compile` or `torch.func` transform runs
    (`_strategy.traced`); compiled, it keeps nothing.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adam()
        >>> params = ParamDict(w=torch.ones(2))
        >>> state = opt.init(params)
        >>> def check() -> str:
        ...     print("checked")
        ...     return "fine"
        >>> for _ in range(2):
        ...     with repeating(opt, params, state):
        ...         kept(params, state, "example", check)
        checked
        'fine'
        'fine'
    """
    if torch.compiler.is_compiling():  # traced: nothing is kept (see above)
        yield
        return
    token = _CURRENT.set(_confirmed(opt, params, state))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def kept(params: ParamDict, state: object, what: Hashable, check: Callable[[], T]) -> T:
    """Return `check()`, or what it returned on an earlier call with the same facts.

    Inside `repeating(opt, params, state)` for these very `params`, a verdict
    on them and on `state` or a state within it (a wrapper's `inner_state`)
    that depends only on the facts the record holds is computed once per
    record; elsewhere `check` runs every time. A check that raises keeps
    nothing, so a refusal is repeated in full.

    Args:
        params: The parameters the verdict is about.
        state: The state it is about too (a tuple), or None for a verdict on
            `params` alone.
        what: The verdict's name; with the optimizer's weak reference where
            the verdict depends on the optimizer's options.
        check: Computes the verdict.

    Returns:
        The verdict.
    """
    if torch.compiler.is_compiling():
        return check()
    current = _CURRENT.get()
    if current is None or current.params is not params:
        return check()
    if state is not None:
        place = current.parts.get(id(state))
        if place is None:
            return check()
        what = (what, place)
    verdicts = current.record.verdicts
    found: Any = verdicts.get(what, _MISSING)
    if found is _MISSING:
        found = verdicts[what] = check()
    return cast(T, found)


def known_entries(params: ParamDict) -> EntryFacts | None:
    """The facts of `params`' entries, as `repeating` read them for this call."""
    if torch.compiler.is_compiling():
        return None
    current = _CURRENT.get()
    if current is None or current.params is not params:
        return None
    return current.record.entries
