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
those facts and compares them with the record `opt` kept from its last `step_`:
the tensors by `id` (the record holds each by a weak reference whose callback
marks the record stale when one is freed, so an `id` it holds is still that
tensor's), their data addresses by a `map`, and their sizes, strides, dtypes,
devices, dispatch keys (inference tensors, subclasses, conjugate views) and
`requires_grad` flags in one call of torch's own tensor check, the one
`torch.compile`'s guards use (where torch lacks it, `map`s of the same facts).
About 0.2 us a tensor, against about 1.3 us for the checks they spare (Adam at
160 x 64). Where all are the same, the verdicts the record holds are reused
(`kept`); anything else (another tensor, one resized, re-pointed by `.data =`
or `set_`, restrided, converted; another key or field; inference mode toggled)
starts a new record, in which every check runs in full, and refuses as it
always does. A tensor that autograd records (a `grad_fn`) is checked in full
on every call: one that gained it in place either requires grad now and did
not before (the facts differ) or belongs to a record holding a tensor that
requires grad, which reads every tensor's `is_leaf` on every call.

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
from collections.abc import Callable, Generator, Hashable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._paramdict import ParamDict

__all__ = ["EntryFacts", "kept", "kept_alike", "known_entries", "repeating"]

T = TypeVar("T")

_address = Tensor.data_ptr
_size = Tensor.size
_stride = Tensor.stride
_dtype = cast("Callable[[Tensor], torch.dtype]", operator.attrgetter("dtype"))
_device = cast("Callable[[Tensor], torch.device]", operator.attrgetter("device"))
_is_leaf = cast("Callable[[Tensor], bool]", operator.attrgetter("is_leaf"))
_requires_grad = cast("Callable[[Tensor], bool]", operator.attrgetter("requires_grad"))
_PLAIN = {Tensor, torch.nn.Parameter}


def _torch_check() -> Callable[..., _Layouts] | None:
    """Return torch's C++ check of tensors' facts (as `torch.compile`'s guards)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover - a torch without it: `_Listed`
        return None
    # Typed by torch as taking no tensors: they are positional.
    return cast("Callable[..., _Layouts]", TensorGuards)


class EntryFacts(NamedTuple):
    """The parameters' sizes, strides, dtypes and devices, in key order."""

    sizes: list[torch.Size]
    strides: list[tuple[int, ...]]
    dtypes: list[torch.dtype]
    devices: list[torch.device]


class _Layouts(Protocol):
    """The layout facts of some tensors, checked against tensors given later."""

    def check(self, *tensors: Tensor) -> bool:
        """Whether `tensors` have the facts, in order (False for another count)."""
        ...


class _Listed:
    """Layout facts as lists, read by `map`s (where torch's check is missing)."""

    __slots__ = ("facts",)

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.facts = _listed(tensors)

    def check(self, *tensors: Tensor) -> bool:
        return _listed(tensors) == self.facts


def _listed(tensors: Sequence[Tensor]) -> tuple[list[Any], ...]:
    return (
        list(map(type, tensors)),
        list(map(_size, tensors)),
        list(map(_stride, tensors)),
        list(map(_dtype, tensors)),
        list(map(_device, tensors)),
        list(map(_requires_grad, tensors)),
        list(map(Tensor.is_inference, tensors)),
    )


def _readable(tensors: Sequence[Tensor]) -> bool:
    """Whether torch's check can read `tensors`: plain, dense, not nested.

    It reads sizes and strides in C++, where a tensor without them (sparse,
    nested, a subclass of its own sizes) ends the process instead of raising.
    """
    if not set(map(type, tensors)) <= _PLAIN:
        return False
    try:  # sparse, nested and opaque tensors raise here, in Python
        list(map(_stride, tensors))
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _layouts(tensors: Sequence[Tensor]) -> _Layouts:
    """The layout facts of `tensors`: torch's own check where it can read them."""
    if _TORCH_CHECK is not None and _readable(tensors):
        try:
            return _TORCH_CHECK(
                *tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None
            )
        except (TypeError, RuntimeError):  # a tensor it cannot describe
            pass
    return _Listed(tensors)


_TORCH_CHECK = _torch_check()


class _Record:
    """The tensors a `step_` saw, their facts, and the verdicts reached on them."""

    __slots__ = (
        "addresses",
        "alive",
        "count",
        "entries",
        "ids",
        "inference_mode",
        "keys",
        "layouts",
        "recordable",
        "refs",
        "shape",
        "verdicts",
    )

    def __init__(
        self,
        tensors: list[Tensor],
        keys: list[tuple[str, ...]],
        shape: list[object],
        addresses: list[int] | None,
        count: int,
    ) -> None:
        alive = self.alive = [True]

        def freed(_: object) -> None:  # holds `alive` only: no cycle
            alive[0] = False

        # A record without addresses (`step`'s) vouches for the facts alone.
        addressed = addresses is not None
        self.refs = [weakref.ref(t, freed) for t in tensors] if addressed else []
        self.ids = list(map(id, tensors)) if addressed else None
        self.count = len(tensors)
        self.keys = keys
        self.shape = shape
        self.addresses = addresses
        self.inference_mode = torch.is_inference_mode_enabled()
        self.layouts = _layouts(tensors)
        self.recordable = any(map(_requires_grad, tensors))
        params = tensors[:count]
        self.entries = EntryFacts(
            list(map(_size, params)),
            list(map(_stride, params)),
            list(map(_dtype, params)),
            list(map(_device, params)),
        )
        self.verdicts: dict[Hashable, object] = {}

    def holds(
        self,
        tensors: list[Tensor],
        keys: list[tuple[str, ...]],
        shape: list[object],
        addresses: list[int] | None,
    ) -> bool:
        """Whether these are the record's tensors (or have their facts, `step`'s)."""
        return (
            self.alive[0]  # every tensor alive: equal `id`s are the same tensors
            and len(tensors) == self.count
            and (addresses is None or list(map(id, tensors)) == self.ids)
            and addresses == self.addresses
            and keys == self.keys
            and shape == self.shape
            and torch.is_inference_mode_enabled() == self.inference_mode
            # The same tensors are of the same kinds (`.data =` and `set_` keep
            # it); new ones (`step`'s) are read by torch's check if it can.
            and (self.ids is not None or _safe(self.layouts, tensors))
            and self.layouts.check(*tensors)
        )


def _safe(layouts: _Layouts, tensors: Sequence[Tensor]) -> bool:
    """Whether `layouts.check` may be handed `tensors` (see `_readable`)."""
    return isinstance(layouts, _Listed) or _readable(tensors)


class _Current(NamedTuple):
    """The record confirmed for the `step_` running, and the objects it was given."""

    params: ParamDict
    parts: dict[int, int]  # `id` of the state and of each tuple in it: its place
    record: _Record
    # `id` of a list of other tensors: the list (held, so that no other list
    # takes its `id` during the call) and whether its facts are the kept ones.
    same: dict[int, tuple[list[Tensor], bool]]


_KEPT: weakref.WeakKeyDictionary[object, _Record] = weakref.WeakKeyDictionary()
_KEPT_FACTS: weakref.WeakKeyDictionary[object, _Record] = weakref.WeakKeyDictionary()
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
        shape.append(Tensor)
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


def _confirmed(
    opt: object, params: ParamDict, state: object, addressed: bool
) -> _Current | None:
    """The record of `opt` for these tensors as they are now, kept or new.

    None where nothing is kept (DTensors, tensors without data of their own,
    an optimizer that cannot be weakly referenced; `params` not a ParamDict,
    refused next) or, `addressed`, where a tensor is recorded by autograd
    (checked in full). Not `addressed` (`step`'s), the record is of the
    facts alone.
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
    records = _KEPT if addressed else _KEPT_FACTS
    addresses: list[int] | None = None
    if addressed:
        try:
            addresses = list(map(_address, tensors))
        except (RuntimeError, NotImplementedError):  # sparse, or no own storage
            return None
    try:
        record = records.get(opt)
        if record is None or not record.holds(tensors, keys, shape, addresses):
            record = _Record(tensors, keys, shape, addresses, len(params._vals))
            records[opt] = record
    except TypeError:  # an optimizer of `__slots__` without `__weakref__`
        return None
    except (RuntimeError, NotImplementedError):  # a tensor without sizes or strides
        return None
    if addressed and record.recordable and not all(map(_is_leaf, tensors)):
        return None  # a `grad_fn` (appeared): refused in full
    return _Current(params, parts, record, {})


@contextlib.contextmanager
def repeating(
    opt: object, params: ParamDict, state: object, *, addressed: bool = True
) -> Generator[None, None, None]:
    """Let the checks of the block reuse what `opt`'s last `step_` found.

    `step_` enters it where no `torch.compile` or `torch.func` transform runs
    (`_strategy.traced`); compiled, it keeps nothing. `step` enters it, where
    no `torch.func` transform runs (`_strategy.transformed`), with
    `addressed=False`: a record of the facts alone (keys, structure, each
    tensor's layout facts), kept apart from `step_`'s, whose verdicts are
    those that depend on nothing else; `kept(..., by_address=True)` checks in
    full under it.

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
    token = _CURRENT.set(_confirmed(opt, params, state, addressed))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def kept(
    params: ParamDict,
    state: object,
    what: Hashable,
    check: Callable[[], T],
    *,
    by_address: bool = False,
) -> T:
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
        by_address: Whether the verdict depends on the tensors' identities
            and addresses too (what `step_` may write): then it is kept by
            `step_`'s records only.

    Returns:
        The verdict.
    """
    if torch.compiler.is_compiling():
        return check()
    current = _CURRENT.get()
    if current is None or current.params is not params:
        return check()
    if by_address and current.record.addresses is None:  # `step`'s: facts only
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


def kept_alike(
    params: ParamDict, values: list[Tensor], what: str, check: Callable[[], bool]
) -> bool:
    """Return `check()`, a test of `values` against `params`' entries, or its last True.

    For tests of other tensors than the record's (the gradients: their shapes,
    dtypes, devices, strides against the parameters'), that depend only on
    their facts and the record's: inside `repeating` for these `params`, a
    True is kept with the facts of the `values` it was found for, and returned
    while `values` have those facts (torch's check, about 0.05 us a tensor);
    anything else runs `check`.

    Args:
        params: The parameters the test compares with.
        values: The tensors tested, one per entry.
        what: The test's name.
        check: The test.

    Returns:
        Whether `values` pass.
    """
    if torch.compiler.is_compiling():
        return check()
    current = _CURRENT.get()
    if current is None or current.params is not params:
        return check()
    verdicts = current.record.verdicts
    nothing: tuple[_Layouts | None, set[str]] = (None, set())
    kept_facts, passed = cast(
        "tuple[_Layouts | None, set[str]]", verdicts.get(_OTHERS, nothing)
    )
    memo = current.same.get(id(values))
    if memo is not None:  # once a call: the tests share one record of `values`' facts
        same = memo[1]
    else:
        same = False
        with contextlib.suppress(RuntimeError, NotImplementedError):  # no strides
            same = (
                kept_facts is not None
                and len(values) == len(params._vals)
                and _safe(kept_facts, values)
                and kept_facts.check(*values)
            )
        current.same[id(values)] = (values, same)
    if same and what in passed:
        return True
    result = check()
    if result and same:
        passed.add(what)
    elif result:  # other facts: a new record of them, with this test passed
        with contextlib.suppress(RuntimeError, NotImplementedError):
            verdicts[_OTHERS] = (_layouts(values), {what})
            # What the call found for other lists was against the old facts.
            current.same.clear()
            current.same[id(values)] = (values, True)
    return result


_OTHERS = ("facts of other tensors",)
"""The verdicts' key of `kept_alike`'s record: their facts, the tests passed."""


def known_entries(params: ParamDict) -> EntryFacts | None:
    """The facts of `params`' entries, as `repeating` read them for this call."""
    if torch.compiler.is_compiling():
        return None
    current = _CURRENT.get()
    if current is None or current.params is not params:
        return None
    return current.record.entries
