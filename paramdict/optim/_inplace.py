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
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._paramdict import ParamDict

__all__ = ["check_writable", "write_back", "written_state"]

S = TypeVar("S")

_DIFFERENTIABLE = (
    "`step_` writes into the parameters, which cuts the autograd graph, so it "
    "needs `differentiable=False`. For differentiable steps use `step`, which "
    "returns new tensors."
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

    Called after the usual input checks and before anything is written.

    Raises:
        ValueError: If the optimizer is differentiable, or naming the entries that
            are meta tensors, that autograd is recording (they have a `grad_fn`),
            that are inference tensors outside inference mode, whose elements
            overlap (`expand`), or that share memory with another entry or with a
            gradient.
    """
    if differentiable:
        raise ValueError(_DIFFERENTIABLE)
    # One pass of cheap checks per tensor; names are built only for an error.
    tensors = [*params._vals, *_state_tensors(state)]
    inference_mode = torch.is_inference_mode_enabled()
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
    shared_grads: list[str] = []
    grad_storage = _storage if holds_dtensors(grads._vals) else _plain_storage
    for key, g in grads.items():
        if g.numel() and grad_storage(g) in owners:
            shared_grads.append(f"grads[{key!r}]")
            shared.append(owners[grad_storage(g)])
    if shared:
        _refuse(
            _names(params, state, shared) + shared_grads,
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


def write_back(params: ParamDict, new: ParamDict) -> None:
    """Copy each value of `new` that is not `params`' own tensor into it."""
    for key, old in params.items():
        value = new[key]
        if value is not old:
            old.copy_(value)


def written_state(state: S, new: S) -> S:
    """Return `state` with `new`'s values copied into its tensors.

    Leaves that a rule updated in place are already `state`'s own; any other
    tensor leaf (the step counter, a buffer made afresh) is copied into the one it
    replaces. A `new` state of another structure (a rule that adds or drops a
    buffer) cannot be written back and is returned as it is.
    """
    old_leaves, old_spec = pytree.tree_flatten(state)
    new_leaves, new_spec = pytree.tree_flatten(new)
    if old_spec != new_spec:
        return new
    pairs: list[tuple[Any, Any]] = list(zip(old_leaves, new_leaves))
    for old, value in pairs:
        if old is value:
            continue
        if not (
            isinstance(old, Tensor)
            and isinstance(value, Tensor)
            and old.shape == value.shape
        ):
            return new
    for old, value in pairs:
        if old is not value:
            old.copy_(value)
    return state


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
