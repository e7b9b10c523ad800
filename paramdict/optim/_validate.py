"""The checks an optimizer makes when it meets its inputs, with their messages.

Run once per binding (`_binding.py`); the gradients' whenever their facts change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._paramdict import ParamDict

__all__ = [
    "aligned_grads",
    "check_keyed",
    "check_params",
    "check_real",
    "check_writable",
    "named_tensors",
    "rebuilt",
    "refuse_shared_grads",
    "storage_keys",
    "transformed",
]

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


def transformed() -> bool:
    """Whether a `torch.func` transform (`vmap`, `grad`, ...) runs the caller."""
    # Annotated as never None, but None when no transform runs.
    return torch._C._functorch.peek_interpreter_stack() is not None  # pyright: ignore[reportUnnecessaryComparison]


def check_params(params: object, what: str) -> ParamDict:
    """Return `params` after checking that it is a ParamDict of real float tensors."""
    if not isinstance(params, ParamDict):
        msg = (
            f"`{what}` takes the parameters as a ParamDict, got "
            f"{type(params).__name__}. Wrap them: `ParamDict(params)`."
        )
        raise TypeError(msg)
    check_real(params)
    sparse = sorted(k for k, v in params.items() if v.layout != torch.strided)
    if sparse:
        msg = (
            f"The optimizers update dense tensors; {sparse!r} are not (their "
            "layouts have no in-place arithmetic). Give them as `.to_dense()`."
        )
        raise TypeError(msg)
    return params


def check_real(params: ParamDict, /) -> None:
    """Raise unless every value is a real floating-point tensor."""
    if all(d.is_floating_point for d in {v.dtype for v in params._vals}):
        return  # complex dtypes are not `is_floating_point`
    bad = sorted(
        k for k, v in params.items() if not v.is_floating_point() or v.is_complex()
    )
    msg = (
        f"The optimizers update real floating-point tensors; {bad!r} are not. "
        "Leave them out with `.exclude(...)` or convert them with `.to(dtype)`."
    )
    raise TypeError(msg)


def aligned_grads(params: ParamDict, grads: Mapping[str, Tensor], /) -> ParamDict:
    """Return `grads` as a ParamDict in `params`' key order (no tensor copied)."""
    if isinstance(grads, ParamDict) and (
        grads._keys is params._keys or grads._keys == params._keys
    ):
        return grads
    if not isinstance(cast(object, grads), Mapping):
        msg = (
            "`grads` must be a mapping from each parameter's key to its "
            f"gradient (a ParamDict or dict), got {type(grads).__name__}."
        )
        raise TypeError(msg)
    values = params._aligned(grads, what="`step` (params and grads)")
    bad = sorted(k for k, v in zip(params._keys, values) if not isinstance(v, Tensor))
    if bad:
        msg = (
            f"The gradients must be tensors; {bad!r} are not. Pass the gradients "
            "as a mapping of tensors (`params.grad(loss)` gives one)."
        )
        raise TypeError(msg)
    return ParamDict._from_parts(params._keys, values)


def check_keyed(params: ParamDict, values: list[Tensor], /, *, what: str) -> None:
    """Raise unless each of `values` (in key order) has its parameter's facts."""
    pvals = params._vals
    if all(
        v.shape == p.shape
        and v.dtype == p.dtype
        and v.device == p.device
        and v.layout == torch.strided
        for v, p in zip(values, pvals)
    ):
        return
    # The entries of another shape, else those of another dtype, device or layout.
    keys = params._keys
    bad = sorted(k for k, p, v in zip(keys, pvals, values) if v.shape != p.shape)
    bad = bad or sorted(
        k
        for k, p, v in zip(keys, pvals, values)
        if v.dtype != p.dtype or v.device != p.device or v.layout != torch.strided
    )
    described = ", ".join(
        f"{k!r}: {tuple(v.shape)} {v.dtype} {v.layout} on {v.device} for "
        f"{tuple(p.shape)} {p.dtype} on {p.device}"
        for k, p, v in zip(params._keys, pvals, values)
        if k in bad
    )
    msg = (
        f"{what} must match the parameters entry by entry (shape, dtype, device, "
        f"dense layout); {bad!r} do not ({described}). An optimizer step never "
        "changes a parameter's shape or dtype: convert them first, e.g. "
        "`grads.to(dtype)`, or build the state with `init`."
    )
    raise ValueError(msg)


# ---------------------------------------------------------------- writing in place


def named_tensors(params: ParamDict, state: object) -> list[tuple[str, Tensor]]:
    """The tensors `step_` writes, each with a name for error messages."""
    named = list(params.items())
    leaves, _ = pytree.tree_flatten_with_path(state)
    for path, leaf in leaves:
        if isinstance(leaf, Tensor):
            named.append((f"state{pytree.keystr(path)}", leaf))
    return named


def _refuse(names: list[str], why: str, fix: str) -> None:
    msg = f"`step_` cannot write into {sorted(set(names))!r}: {why}. {fix}."
    raise ValueError(msg)


def storage_keys(tensors: list[Tensor]) -> list[int]:
    """The identity of the memory each tensor reads: its address, else its storage."""
    keys: list[int] = []
    dtensors = holds_dtensors(tensors)
    for t in tensors:
        if dtensors and holds_dtensors([t]):
            t = cast("Tensor", t.to_local())  # type: ignore[attr-defined]  # a DTensor
        storage = t.untyped_storage()
        if t.is_meta or torch._C._dispatch_keys(t).has(torch._C.DispatchKey.Python):
            keys.append(storage._cdata)
        else:
            address: int = storage.data_ptr()
            keys.append(address if address else storage._cdata)
    return keys


def check_writable(differentiable: bool, params: ParamDict, state: object) -> None:
    """Raise unless `step_` can write an update into `params` and `state`."""
    if differentiable:
        raise ValueError(_DIFFERENTIABLE)
    if transformed():
        raise ValueError(_TRANSFORMED)
    named = named_tensors(params, state)
    inference_mode = torch.is_inference_mode_enabled()
    recorded = [n for n, t in named if t.grad_fn is not None]
    if recorded:
        _refuse(
            recorded,
            "autograd is recording them (they have a `grad_fn`), and writing "
            "into them would change the graph that produced them",
            "Pass leaves (`params.detach()`), or use `step`, which returns new tensors",
        )
    inference = [n for n, t in named if not inference_mode and t.is_inference()]
    if inference:
        _refuse(
            inference,
            "they are inference tensors, which can only be written inside "
            "`torch.inference_mode()`",
            "Clone them outside inference mode first (`params.clone()`)",
        )
    overlapping = [
        n
        for n, t in named
        if not t.is_meta and torch._debug_has_internal_overlap(t) == 1
    ]
    if overlapping:
        _refuse(
            overlapping,
            "several of their elements share one memory location (an `expand`ed view)",
            "Give each entry its own memory (`.clone()`)",
        )
    owners: dict[int, str] = {}
    shared: list[str] = []
    for (name, t), key in zip(named, storage_keys([t for _, t in named])):
        if t.numel() == 0:
            continue
        other = owners.setdefault(key, name)
        if other != name:
            shared += [other, name]
    if shared:
        _refuse_shared(shared)


def refuse_shared_grads(
    params: ParamDict,
    state: object,
    grads: ParamDict,
    owned: set[int],
    keys: list[int] | None = None,
) -> None:
    """Raise if a gradient (`keys`: its memory) shares memory with one `owned`."""
    if keys is None:
        keys = storage_keys(grads._vals)
    if owned.isdisjoint(keys):
        return
    named = named_tensors(params, state)
    by_key = dict(zip(storage_keys([t for _, t in named]), (n for n, _ in named)))
    shared: list[str] = []
    for name, g, key in zip(grads._keys, grads._vals, keys):
        if g.numel() and key in owned:
            shared += [f"grads[{name!r}]", by_key[key]]
    if shared:
        _refuse_shared(shared)


def _refuse_shared(names: list[str]) -> None:
    _refuse(
        names,
        "they share memory with another entry, a state buffer or a gradient, "
        "so one write would change the others",
        "Give each entry, buffer and gradient its own memory (`.clone()`)",
    )


def entries_agree(params: ParamDict, state: object) -> bool:
    """Whether every buffer entry of `state` has the dtype of its parameter."""
    dtypes = {k: v.dtype for k, v in zip(params._keys, params._vals)}
    containers: list[ParamDict] = []
    state_tensors(state, containers)
    return all(
        dtypes.get(key, value.dtype) == value.dtype
        for container in containers
        for key, value in zip(container._keys, container._vals)
    )


def state_tensors(
    state: Any, containers: list[ParamDict] | None = None
) -> list[Tensor]:
    """The tensors of a state in `pytree.tree_leaves` order.

    With `containers`, its ParamDicts are gathered there instead of their tensors.
    """
    found: list[Tensor] = []
    _gather(state, found, containers)
    return found


def _gather(node: Any, found: list[Tensor], containers: list[ParamDict] | None) -> None:
    if isinstance(node, Tensor):
        found.append(node)
    elif isinstance(node, ParamDict):
        if containers is None:
            found.extend(node._vals)
        else:
            containers.append(node)
    elif isinstance(node, tuple):
        for field in cast("tuple[object, ...]", node):
            _gather(field, found, containers)
    elif node is not None and not isinstance(node, (int, float, str)):
        found.extend(t for t in pytree.tree_leaves(node) if isinstance(t, Tensor))


def rebuilt(
    node: Any, new: Iterator[Tensor], containers: Iterator[ParamDict] | None = None
) -> Any:
    """`node` with its tensors (in `state_tensors` order) taken from `new`.

    With `containers`, its ParamDicts are taken from there whole.
    """
    if isinstance(node, Tensor):
        return next(new)
    if isinstance(node, ParamDict):
        if containers is not None:
            return next(containers)
        return node._derive([next(new) for _ in node._vals])
    if isinstance(node, tuple):
        given = cast("tuple[object, ...]", node)
        fields: list[object] = [rebuilt(field, new, containers) for field in given]
        make = cast("Callable[..., object]", type(given))
        if hasattr(given, "_fields"):  # a NamedTuple
            return make(*fields)
        return make(fields)
    if node is None or isinstance(node, (int, float, str)):
        return node
    leaves, spec = pytree.tree_flatten(node)
    return pytree.tree_unflatten(
        [next(new) if isinstance(x, Tensor) else x for x in leaves], spec
    )
