"""States already checked against their parameters: the check is not run again.

`TorchOptimizer.check_state` compares every buffer of a state with its parameter
(keys, shapes, dtypes, devices): three passes over the entries of an Adam state,
about a tenth of a small model's step. Its verdict depends only on objects that
cannot change: a ParamDict is immutable, and so is a state (a NamedTuple of
ParamDicts and tensors). So once a pair has passed its check in `step_` (which
gets the same objects back on every call), the verdict is kept for that
optimizer, and the next call with the very same objects skips the buffer
comparisons. The pure `step` makes new objects every call: it checks in full.
Anything else (another ParamDict, a field `_replace`d, another
optimizer) is checked in full.

Identity is checked with weak references, never with `id` alone: an object that
is alive is the object it was, and one that died cannot be mistaken for a new
one at its address. A tensor's data can still be swapped under it
(`param.data = ...`, which `module.half()` or `module.to(device)` does to the
parameters `ParamDict.from_module` holds) or resized in place (`resize_`, after
which a fused kernel would write past its end): so the address of every
tensor's data and its size are kept too, and compared (two lists: about 0.3 µs
an entry, against about 1 µs for the comparisons they save). The counter, the schedule
slot and the gradients are checked on every call, as they change from step to
step. DTensors are always checked in full.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, cast

import torch
from torch import Tensor

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from ._strategy import traced

__all__ = ["checked_in_full", "vouch", "vouch_if_checked", "vouched"]

_Refs = tuple["weakref.ref[Any]", ...]
_Kept = tuple[_Refs, list[int], list[torch.Size]]

_KEPT: weakref.WeakKeyDictionary[object, _Kept] = weakref.WeakKeyDictionary()
_address = Tensor.data_ptr
_size = Tensor.size


def _members(params: ParamDict, state: tuple[object, ...]) -> list[object]:
    """The objects the verdict rests on: `params` and the state's ParamDicts."""
    found: list[object] = [params]
    found.extend(f for f in state if isinstance(f, (ParamDict, Tensor)))
    return found


def _tensors(members: list[object]) -> list[Tensor] | None:
    """Every tensor of `members`, in order; None if one is a DTensor."""
    tensors: list[Tensor] = []
    for member in members:
        if isinstance(member, ParamDict):
            tensors.extend(member._vals)  # pyright: ignore[reportPrivateUsage]
        else:
            tensors.append(cast(Tensor, member))
    return None if holds_dtensors(tensors) else tensors


def _eager() -> bool:
    """Whether no `torch.compile` or `torch.func` transform runs (real tensors)."""
    return not traced()


def _fingerprint(tensors: list[Tensor]) -> tuple[list[int], list[torch.Size]] | None:
    """Each tensor's data address and size; None for tensors without storage."""
    try:
        addresses = list(map(_address, tensors))
    except RuntimeError:  # a tensor subclass or wrapper with no data of its own
        return None
    return addresses, list(map(_size, tensors))


_checked_now = threading.local()


def checked_in_full(optimizer: object, params: ParamDict, state: object) -> None:
    """Note that a full check of `state` for `params` passed just now (eager)."""
    if _eager():  # traced, nothing is kept (a guard on it would recompile)
        _checked_now.ids = (id(optimizer), id(params), id(state))


def vouch_if_checked(optimizer: object, params: ParamDict, state: object) -> None:
    """`vouch` for the objects whose full check passed just now, if any.

    `step_` calls it after its checks: the same objects come back to the next
    call, which then compares addresses and sizes instead. A call whose check
    was already vouched for computes nothing here.
    """
    ids = getattr(_checked_now, "ids", None)
    _checked_now.ids = None
    if ids == (id(optimizer), id(params), id(state)):
        vouch(optimizer, params, cast("tuple[object, ...]", state))


def vouch(optimizer: object, params: ParamDict, state: tuple[object, ...]) -> None:
    """Keep that `state` is `optimizer`'s valid state for `params` (eager only)."""
    if not _eager():
        return
    members = _members(params, state)
    tensors = _tensors(members)
    seen = None if tensors is None else _fingerprint(tensors)
    if seen is None:
        _KEPT.pop(optimizer, None)
        return
    _KEPT[optimizer] = (tuple(map(weakref.ref, members)), *seen)


def vouched(optimizer: object, params: ParamDict, state: tuple[object, ...]) -> bool:
    """Whether `vouch(optimizer, params, state)` ran for these very objects.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adam()
        >>> params = ParamDict(w=torch.ones(2))
        >>> state = opt.init(params)
        >>> vouched(opt, params, state)
        False
        >>> params, state = opt.step_(params, params.ones_like(), state)
        >>> vouched(opt, params, state), vouched(opt, params.clone(), state)
        (True, False)
    """
    if not _eager():
        return False
    kept = _KEPT.get(optimizer)
    if kept is None:
        return False
    refs, addresses, sizes = kept
    members = _members(params, state)
    if len(refs) != len(members) or not all(
        ref() is member for ref, member in zip(refs, members)
    ):
        return False
    tensors = _tensors(members)
    return tensors is not None and _fingerprint(tensors) == (addresses, sizes)
