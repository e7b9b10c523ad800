"""The in-place step's plumbing: what it refuses, and writing results back.

`Optimizer.step_` writes into the tensors of the parameters and the state. Before
anything is written, `check_writable` refuses what an in-place update would get
wrong or could not finish: a differentiable optimizer, tensors autograd is
recording, inference tensors outside inference mode, tensors whose elements
overlap, meta tensors (which hold no data), and tensors shared between entries or
with the gradients. After a rule has run, `write_back` and `written_state` copy any
value the rule produced out of place (the step counter, a buffer it rebuilt) into
the tensor it replaces, so the caller's ParamDicts and state keep holding the same
tensors.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false, reportPrivateImportUsage=false
# (torch's overlap check has a private name only)
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from ._repeat import kept
from ._strategy import transformed

__all__ = ["check_writable", "twinned", "write_back", "written_state"]

S = TypeVar("S")

_DIFFERENTIABLE = (
    "`step_` writes into the parameters, which cuts the autograd graph, so it "
    "needs `differentiable=False`. For differentiable steps use `step`, which "
    "returns new tensors."
)
_TRANSFORMED = (
    "`step_` cannot run under a `torch.func` transform (`vmap`, `grad`, ...): it "
    "writes into its inputs, which a transform sees as wrapped values. Call `step` "
    "inside the transform: it returns new tensors."
)


def _named_tensors(params: ParamDict, state: object) -> list[tuple[str, Tensor]]:
    """The tensors `step_` may write, each with a name for error messages."""
    named = list(params.items())
    leaves, _ = pytree.tree_flatten_with_path(state)
    for path, leaf in leaves:
        if isinstance(leaf, Tensor):
            named.append((f"state{pytree.keystr(path)}", leaf))
    return named


def _refuse(names: list[str], why: str, fix: str) -> None:
    msg = f"`step_` cannot write into {sorted(set(names))!r}: {why}. {fix}."
    raise ValueError(msg)


def check_writable(
    differentiable: bool, params: ParamDict, grads: ParamDict, state: object
) -> None:
    """Raise unless `step_` can write the update into `params` and `state`.

    Called after the usual input checks and before anything is written. The
    verdict on `params` and `state` is kept while `step_` gets the same
    tensors back and none of them changed (`_repeat`); the gradients are
    checked on every call.

    Raises:
        ValueError: If the optimizer is differentiable or a `torch.func` transform
            runs the step, or naming the entries that
            are meta tensors, that autograd is recording (they have a `grad_fn`),
            that are inference tensors outside inference mode, whose elements
            overlap (`expand`), or that share memory with another entry or with a
            gradient.
    """
    if differentiable:
        raise ValueError(_DIFFERENTIABLE)
    if transformed():
        raise ValueError(_TRANSFORMED)
    check = partial(_check_tensors, params, state)
    owners = kept(params, state, "writable", check, by_address=True)
    if grads:
        _check_grads(params, state, grads, owners)


def _check_tensors(params: ParamDict, state: object) -> dict[int, int]:
    """Refuse what `step_` cannot write; return each memory's first tensor index."""
    tensors = [*params._vals, *_state_tensors(state)]
    inference_mode = torch.is_inference_mode_enabled()
    # One pass of cheap checks per tensor; names are built only for an error.
    recorded: list[int] = []
    inference: list[int] = []
    overlapping: list[int] = []
    meta: list[int] = []
    for i, t in enumerate(tensors):
        if t.is_meta:
            meta.append(i)
        if t.grad_fn is not None:
            recorded.append(i)
        if not inference_mode and t.is_inference():
            inference.append(i)
        if torch._debug_has_internal_overlap(t) == 1:  # 1: overlap is certain
            overlapping.append(i)
    if meta:
        _refuse(
            _names(params, state, meta),
            "they are meta tensors, which have shapes and dtypes but no memory, "
            "so there is nothing to write an update into",
            "Step tensors on a real device: move the parameters there "
            "(`params.to(device)`) and `init` the state from them",
        )
    if recorded:
        _refuse(
            _names(params, state, recorded),
            "autograd is recording them (they have a `grad_fn`), and writing "
            "into them would change the graph that produced them",
            "Pass leaves (`params.detach()`), or use `step`, which returns new tensors",
        )
    if inference:
        _refuse(
            _names(params, state, inference),
            "they are inference tensors, which can only be written inside "
            "`torch.inference_mode()`",
            "Clone them outside inference mode first (`params.clone()`)",
        )
    if overlapping:
        _refuse(
            _names(params, state, overlapping),
            "several of their elements share one memory location (an `expand`ed view)",
            "Give each entry its own memory (`.clone()`)",
        )
    storage = _storage if holds_dtensors(tensors) else _plain_storage
    owners: dict[int, int] = {}
    shared: list[int] = []
    for i, t in enumerate(tensors):
        if t.numel() == 0:
            continue
        other = owners.setdefault(storage(t), i)
        if other != i:
            shared += [other, i]
    if shared:
        _refuse_shared(_names(params, state, shared))
    return owners


def _check_grads(
    params: ParamDict, state: object, grads: ParamDict, owners: dict[int, int]
) -> None:
    """Refuse gradients that share memory with a tensor `step_` writes."""
    values = grads._vals
    if holds_dtensors(values):
        addresses = list(map(_storage, values))
    elif torch.compiler.is_compiling():  # dynamo traces no unbound `data_ptr`
        addresses = [_plain_storage(g) for g in values]
    else:  # two `map`s: under half the time of a loop over the gradients
        addresses = list(map(_storage_address, map(_untyped_storage, values)))
    if owners.keys().isdisjoint(addresses):
        return
    shared: list[int] = []
    shared_grads: list[str] = []
    for key, g, address in zip(grads._keys, values, addresses):
        if g.numel() and address in owners:
            shared_grads.append(f"grads[{key!r}]")
            shared.append(owners[address])
    if shared:
        _refuse_shared(_names(params, state, shared) + shared_grads)


def _refuse_shared(names: list[str]) -> None:
    _refuse(
        names,
        "they share memory with another entry, a state buffer or a gradient, "
        "so one write would change the others",
        "Give each entry, buffer and gradient its own memory (`.clone()`)",
    )


def _state_tensors(leaf: Any) -> list[Tensor]:
    """The tensors of a state in `pytree.tree_leaves` order (the names' order)."""
    if isinstance(leaf, ParamDict):
        return list(leaf._vals)
    if isinstance(leaf, Tensor):
        return [leaf]
    if hasattr(leaf, "_fields") and isinstance(leaf, tuple):  # a NamedTuple state
        fields = cast("tuple[object, ...]", leaf)
        return [t for field in fields for t in _state_tensors(field)]
    return [t for t in pytree.tree_leaves(leaf) if isinstance(t, Tensor)]


def _names(params: ParamDict, state: object, indices: list[int]) -> list[str]:
    """The names of the tensors at `indices` of `params` and then `state`."""
    named = _named_tensors(params, state)
    return [named[i][0] for i in indices]


def twinned(state: S) -> S:
    """`state` in new containers holding its very tensors (`ParamDict._twin`).

    NamedTuples, tuples and ParamDicts are rebuilt, anything else kept as it
    is; a write into a twin's tensor is a write into `state`'s.
    """
    if isinstance(state, ParamDict):
        return cast(S, state._twin())
    given: object = state
    if isinstance(given, tuple):
        items = cast("tuple[object, ...]", given)
        fields: list[object] = [twinned(field) for field in items]
        rebuild = cast("Callable[..., S]", type(items))
        if hasattr(items, "_fields"):  # a NamedTuple
            return rebuild(*fields)
        return rebuild(fields)
    return state


def write_back(params: ParamDict, new: ParamDict) -> None:
    """Copy each value of `new` that is not `params`' own tensor into it.

    `new` has `params`' keys in their order (a rule's result); both are read
    through their value lists, which under `torch.compile` keeps each tensor at
    one source (a dict lookup beside the list would add a guard per entry).
    """
    for old, value in zip(params._vals, params._aligned(new, what="`write_back`")):
        if value is not old:
            old.copy_(value)


def _leaf_pairs(old: object, new: object, pairs: list[tuple[Any, Any]]) -> bool:
    """Add the leaves of `old` and `new` to `pairs`, in `tree_flatten`'s order.

    For the states' own structure only (NamedTuples and tuples of ParamDicts
    and tensors), without `tree_flatten`'s walk (a sixth of RMSprop's `step_`
    at 8 entries): a field that is the very same object is skipped, its leaves
    being equal.
    Returns False, leaving `pairs` partly filled, where the structures differ
    or hold anything else (`tree_flatten` decides).
    """
    if old is new:
        return True
    if isinstance(old, Tensor):
        pairs.append((old, new))
        return isinstance(new, Tensor)
    if type(new) is not type(old):
        return False
    if isinstance(old, ParamDict):
        other = cast(ParamDict, new)
        if old._keys != other._keys:
            return False
        pairs.extend(zip(old._vals, other._vals))
        return True
    if isinstance(old, tuple):
        fields = cast("tuple[object, ...]", old)
        others = cast("tuple[object, ...]", new)
        return len(fields) == len(others) and all(
            _leaf_pairs(o, n, pairs) for o, n in zip(fields, others)
        )
    return False


def written_state(state: S, new: S) -> S:
    """Return `state` with `new`'s values copied into its tensors.

    Leaves that a rule updated in place are already `state`'s own; any other
    tensor leaf (the step counter, a buffer made afresh) is copied into the one it
    replaces. A `new` state of another structure (a rule that adds or drops a
    buffer) cannot be written back and is returned as it is.
    """
    pairs: list[tuple[Any, Any]] = []
    if not _leaf_pairs(state, new, pairs):
        old_leaves, old_spec = pytree.tree_flatten(state)
        new_leaves, new_spec = pytree.tree_flatten(new)
        if old_spec != new_spec:
            return new
        pairs = list(zip(old_leaves, new_leaves))
    for old, value in pairs:
        if old is value:
            continue
        if not (
            isinstance(old, Tensor)
            and isinstance(value, Tensor)
            and old.shape == value.shape
        ):
            return new
    traced = torch.compiler.is_compiling()
    for old, value in pairs:
        if old is value:
            continue
        if traced and old.dim() == 0:
            # Through a view: traced, `copy_` into a 0-dim float64 input (the
            # step counter) is dropped by torch 2.13's functionalization.
            old.view(1).copy_(value.view(1))
        else:
            old.copy_(value)
    return state


_untyped_storage = Tensor.untyped_storage
_storage_address = torch.UntypedStorage.data_ptr


def _plain_storage(t: Tensor) -> int:
    """The address of the memory `t` reads (no DTensors among the tensors)."""
    address: int = t.untyped_storage().data_ptr()
    return address


def _storage(t: Tensor) -> int:
    """The address of the memory `t` reads (a DTensor's: its local shard's)."""
    if holds_dtensors([t]):
        t = cast("Tensor", t.to_local())  # type: ignore[attr-defined]  # a DTensor, checked above
    address: int = t.untyped_storage().data_ptr()
    return address
