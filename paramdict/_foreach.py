"""Calling `torch._foreach_*` kernels, or the same operation one entry at a time.

`call` runs a foreach kernel, except in two cases where it runs the matching `torch`
function per entry instead (same values, same gradients):

- Under `torch.func.vmap`: torch 2.13 has no vmap batching rules for the foreach
  kernels, so inside vmap (where tensors are batched) a foreach call raises; `call`
  catches that and retries per entry, which vmap supports. Outside vmap this costs
  nothing.
- While autograd records an addition, a subtraction, or a multiplication or division
  by numbers, on CPU: for these, torch 2.13's foreach autograd nodes save every input
  list for the backward pass although the derivative needs only the numbers, whereas
  the per-tensor functions save no tensor. On CPU a foreach kernel is itself a loop
  over those functions, so looping in Python costs a little time and keeps much less
  memory alive (the inner step of MAML, `params - lr * grads`, keeps no copy of the
  gradients).
- On DTensors (`torch.distributed.tensor`, the parameters of FSDP2 and tensor
  parallelism), for the kernels torch 2.13 gives no sharding rule: out of place,
  `addcdiv` and `addcmul` with per-entry numbers run in place on fresh clones (the
  in-place kernels have rules, and are what `torch.optim` runs, so the rounding is
  theirs); `maximum` and `minimum` with a number run per entry. `call` learns this
  from the kernel's refusal, so plain tensors pay nothing for it.

One more form is chosen for speed alone: on an accelerator, a 0-dim tensor that
`operand` repeated per entry (`[t] * n`, the form autograd and vmap need) goes to
the `.Tensor` overload of `add`, `mul` and `div` as the one tensor it is, where
nothing records or batches (`_shared_scalar`). The list overloads' fast route wants
operands of the entries' sizes, so with 0-dim ones they launch a kernel per entry;
the `.Tensor` overloads launch one and read the scalar on the device (a CPU one
of the entries' dtype goes to `add` and `mul` as its number). Each computes
`entry op scalar` as the per-entry kernel does: the same values.
"""

# The foreach arguments are lists of tensors or numbers, typed `Any`; narrowing them
# with `isinstance` gives element types pyright calls unknown.
# pyright: reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor

__all__ = ["call", "call_", "copy_", "holds_dtensors"]

ForeachOp = Callable[..., Sequence[Tensor]]


def _max(x: Tensor, y: Any) -> Tensor:
    return torch.maximum(x, y) if isinstance(y, Tensor) else torch.clamp_min(x, y)


def _min(x: Tensor, y: Any) -> Tensor:
    return torch.minimum(x, y) if isinstance(y, Tensor) else torch.clamp_max(x, y)


def _addcmul(x: Tensor, a: Tensor, b: Tensor, value: Any = 1) -> Tensor:
    return torch.addcmul(x, a, b, value=value)


def _addcdiv(x: Tensor, a: Tensor, b: Tensor, value: Any = 1) -> Tensor:
    return torch.addcdiv(x, a, b, value=value)


def _norm(x: Tensor, order: Any = 2, dtype: Any = None) -> Tensor:
    # torch builds `vector_norm` with `_add_docstr`, which leaves it untyped.
    return cast(Tensor, torch.linalg.vector_norm(x, order, dtype=dtype))  # pyright: ignore[reportUnknownMemberType]


_ENTRYWISE: dict[str, Callable[..., Tensor]] = {
    "maximum": _max,
    "minimum": _min,
    "addcmul": _addcmul,
    "addcdiv": _addcdiv,
    "norm": _norm,
}


def holds_dtensors(values: Sequence[Tensor]) -> bool:
    """Whether any of `values` is a DTensor (`torch.distributed.tensor`).

    Free where DTensor was never imported (a `sys.modules` look-up): then none
    can exist.
    """
    dtensor = _dtensor_type()
    # The few distinct types, not every tensor: a fifth of the time of an
    # `isinstance` per tensor, which `step_` pays several times per call.
    return dtensor is not None and any(
        issubclass(kind, dtensor) for kind in set(map(type, values))
    )


def _dtensor_type() -> type[Tensor] | None:
    module = sys.modules.get("torch.distributed.tensor")
    found: type[Tensor] | None = getattr(module, "DTensor", None)
    return found


def _holds_dtensors(args: Sequence[Any]) -> bool:
    """Whether a list among `args` holds a DTensor (judged by its first entry)."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return False
    for arg in args:
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], dtensor):
            return True
    return False


def _is_batched(args: Sequence[Any]) -> bool:
    for arg in args:
        items = arg if isinstance(arg, (list, tuple)) else (arg,)
        for item in items:
            if isinstance(item, Tensor) and torch._C._functorch.is_batchedtensor(item):
                return True
    return False


def _per_entry(
    op: ForeachOp,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    fn: Callable[..., Tensor] | None = None,
) -> list[Tensor]:
    each: Callable[..., Tensor]
    if fn is None:
        name = op.__name__.removeprefix("_foreach_")
        each = _ENTRYWISE.get(name) or getattr(torch, name)
    else:
        each = fn
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))

    def pick(arg: Any, i: int) -> Any:
        return arg[i] if isinstance(arg, (list, tuple)) else arg

    return [
        each(*(pick(a, i) for a in args), **{k: pick(v, i) for k, v in kwargs.items()})
        for i in range(n)
    ]


def _sharded(
    op: ForeachOp, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[Tensor]:
    """Run `op` on DTensors through kernels that have sharding rules."""
    in_place = _IN_PLACE.get(op)
    if in_place is None:
        return _per_entry(op, args, kwargs)
    out = [t.clone() for t in args[0]]
    in_place(out, *args[1:], **kwargs)
    return out


# Out-of-place kernels whose in-place twins have DTensor sharding rules in torch 2.13
# (`torch/distributed/tensor/_ops/_pointwise_ops.py`) while they lack some.
_IN_PLACE: dict[ForeachOp, Callable[..., None]] = {
    torch._foreach_addcdiv: torch._foreach_addcdiv_,
    torch._foreach_addcmul: torch._foreach_addcmul_,
}

_LINEAR = frozenset({torch._foreach_add, torch._foreach_sub})
_BINARY: dict[ForeachOp, Callable[..., Tensor]] = {
    torch._foreach_add: torch.add,
    torch._foreach_sub: torch.sub,
    torch._foreach_mul: torch.mul,
    torch._foreach_div: torch.div,
}


def _recorded(args: tuple[Any, ...]) -> bool:
    """Whether autograd records a kernel on `args` (grad mode; an input requires it)."""
    if not torch.is_grad_enabled():
        return False
    for arg in args:
        if isinstance(arg, Tensor):
            if arg.requires_grad:
                return True
        elif isinstance(arg, list) and any(
            isinstance(t, Tensor) and t.requires_grad for t in arg
        ):
            return True
    return False


def _records_needlessly(
    op: ForeachOp, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether autograd would record `op` (one of `_BINARY`) on CPU, for nothing.

    True for `values (+|-) other` and `values (*|/) numbers` (or one shared 0-dim
    tensor that does not require grad, the form numbers take on CPU) on CPU tensors
    while grad mode is on and an operand requires grad, judged by the first entry of
    each list (either answer computes the same thing; this one only picks the cheaper
    way). False for anything `call`'s per-entry loop below does not handle.
    """
    if len(args) != 2:
        return False
    values, other = args
    if type(values) is not list or not values:
        return False
    first = values[0]
    if not isinstance(first, Tensor):
        return False
    head = other[0] if isinstance(other, list) and other else other
    other_records = isinstance(head, Tensor) and head.requires_grad
    if not (first.requires_grad or other_records) or not torch.is_grad_enabled():
        return False  # nothing is recorded: the common case, decided first
    if isinstance(other, list):
        if len(other) != len(values):
            return False  # let the kernel raise its error
        # mul and div by tensors save them per entry too: nothing to gain; with
        # per-entry numbers, the entry decides.
        records = op in _LINEAR if isinstance(head, Tensor) else first.requires_grad
    elif isinstance(other, Tensor) and other_records:
        records = op in _LINEAR
    else:
        # A number, or one shared 0-dim tensor that does not require grad (the
        # form numbers take on CPU).
        records = first.requires_grad
    return records and first.is_cpu and (not kwargs or list(kwargs) == ["alpha"])


_PLAIN = (Tensor, torch.nn.Parameter)
_TENSOR_OVERLOADS = frozenset(
    {torch._foreach_add, torch._foreach_mul, torch._foreach_div}
)


def _shared_scalar(op: ForeachOp, args: tuple[Any, ...]) -> Tensor | float | None:
    """The one 0-dim tensor `args[1]` repeats for every entry, as `op` may take it once.

    The tensor itself where it is on the entries' accelerator (for the `.Tensor`
    overload); its number where it is a CPU scalar of the entries' float dtype
    for `add` or `mul` (read on the host, free). None unless `op` has a
    `.Tensor` overload, the entries are plain tensors on an accelerator, and
    nothing records the scalar: not compiling, no dispatch mode, no `torch.func`
    transform, grad mode off or no operand requiring grad (the `.Tensor`
    overloads have neither a derivative for the scalar nor a vmap batching rule).
    """
    if op not in _TENSOR_OVERLOADS or len(args) != 2:
        return None
    values, other = args
    if type(other) is not list or not other or type(values) is not list:
        return None
    # Typed as tensors for what follows; the first test checks that they are.
    scalar = cast(Tensor, other[0])
    first = cast(Tensor, values[0])
    if (
        type(first) not in _PLAIN
        or type(scalar) not in _PLAIN
        or first.is_cpu
        or scalar.dim() != 0
        or not (scalar.is_cpu or scalar.device == first.device)
        or len(other) != len(values)
        or torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._functorch.is_functorch_wrapped_tensor(first)
        or torch._C._functorch.is_functorch_wrapped_tensor(scalar)
    ):
        return None
    if torch.is_grad_enabled() and (
        scalar.requires_grad or any(v.requires_grad for v in cast(list[Tensor], values))
    ):
        return None
    if not all(o is scalar for o in other):
        return None
    if not scalar.is_cpu:
        return scalar
    # A CPU scalar as a number only where that is the value the kernels would
    # use: of the entries' own float dtype (else they round it to the entries'
    # dtype first), and not for `div` (which multiplies by a CPU scalar's
    # reciprocal).
    if op is torch._foreach_div or scalar.dtype != first.dtype:
        return None
    if scalar.dtype not in (torch.float32, torch.float64):
        return None
    return scalar.item()


def call(op: ForeachOp, *args: Any, **kwargs: Any) -> list[Tensor]:
    """Run the foreach kernel `op`, or the same operation per entry (see above).

    Args:
        op: A `torch._foreach_*` function (out of place).
        *args: Its arguments: lists are split per entry, anything else is shared.
        **kwargs: Its keyword arguments, split the same way.

    Returns:
        The results, one tensor per entry.

    Raises:
        RuntimeError: Whatever the kernel raised, when not caused by vmap or by a
            missing DTensor sharding rule.
    """
    if op is torch._foreach_addcdiv and _recorded(args):
        # torch 2.13's derivative of this kernel pairs the entries' gradients
        # wrongly when their shapes differ (an `IndexError` in the backward
        # pass); per entry, `torch.addcdiv` has the right one.
        return _per_entry(op, args, kwargs, _addcdiv)
    fn = _BINARY.get(op)
    if fn is not None and _records_needlessly(op, args, kwargs):
        values, other = args  # two arguments, lists of equal length
        if type(other) is list:
            if kwargs:
                return [fn(v, o, **kwargs) for v, o in zip(values, other)]
            return [fn(v, o) for v, o in zip(values, other)]
        if kwargs:
            return [fn(v, other, **kwargs) for v in values]
        return [fn(v, other) for v in values]
    scalar = _shared_scalar(op, args)
    if scalar is not None:
        # `alpha` picks `add`'s `.Tensor` overload: without it a device tensor
        # would be read on the host as a number, waiting for the device.
        tensor = isinstance(scalar, Tensor) and op is torch._foreach_add
        extra = {"alpha": 1, **kwargs} if tensor else kwargs
        return list(op(args[0], scalar, **extra))
    try:
        return list(op(*args, **kwargs))
    except RuntimeError:
        # `NotImplementedError`, a `RuntimeError`, for a kernel without a sharding
        # rule; only DTensors get there.
        if _holds_dtensors(args):
            return _sharded(op, args, kwargs)
        if not _is_batched([*args, *kwargs.values()]):
            raise
    return _per_entry(op, args, kwargs)


def copy_(targets: list[Tensor], sources: list[Tensor]) -> None:
    """Copy `sources` into `targets` entry by entry, as `torch._foreach_copy_`.

    DTensors, for which torch 2.13's `_foreach_copy_` has no sharding rule, are
    copied one entry at a time (nothing is written before the kernel refuses).

    Raises:
        RuntimeError: Whatever the kernel raised, when not caused by DTensors.
    """
    try:
        torch._foreach_copy_(targets, sources)
    except RuntimeError:
        if not _holds_dtensors([targets, sources]):
            raise
        for target, source in zip(targets, sources):
            target.copy_(source)


def _per_entry_(
    op: Callable[..., object], args: Sequence[Any], kwargs: dict[str, Any]
) -> None:
    """Run the in-place foreach kernel `op` per entry: computed, then copied in.

    Out of place, then `copy_`: both have vmap batching rules (the in-place
    functions mostly do not) and DTensor sharding rules.
    """
    name = op.__name__.removeprefix("_foreach_").removesuffix("_")
    fn = _ENTRYWISE.get(name) or getattr(torch, name, None)
    n = len(args[0])

    def pick(arg: Any, i: int) -> Any:
        return arg[i] if isinstance(arg, (list, tuple)) else arg

    for i in range(n):
        target, *rest = (pick(a, i) for a in args)
        entry_kwargs = {k: pick(v, i) for k, v in kwargs.items()}
        if name == "copy":
            target.copy_(rest[0])
        elif name == "zero":
            target.copy_(torch.zeros_like(target))
        else:
            assert fn is not None  # every in-place foreach kernel has its function
            target.copy_(fn(target, *rest, **entry_kwargs))


_LEAF = "a leaf Variable that requires grad"


def call_(
    keys: Sequence[str], op: Callable[..., object], *args: Any, **kwargs: Any
) -> None:
    """Run the in-place foreach kernel `op`, or the same in-place call per entry.

    The in-place counterpart of `call`, for the `_`-suffixed methods of ParamDict:
    per entry under `torch.func.vmap` (no batching rule for the in-place foreach
    kernels) and on DTensors where the kernel has no sharding rule. A refusal
    to write into a leaf that requires grad is raised as a `ValueError` naming
    the entries (`keys`, in the order of `args[0]`).

    Raises:
        ValueError: If autograd refuses the write (leaves that require grad).
        RuntimeError: Whatever else the kernel raised.
    """
    try:
        op(*args, **kwargs)
        return
    except RuntimeError as err:
        if _LEAF in str(err):
            values = cast("list[Tensor]", args[0])
            leaves = sorted(
                k for k, v in zip(keys, values) if v.is_leaf and v.requires_grad
            )
            msg = (
                f"Cannot write in place into {leaves!r}: they are leaves that "
                "require grad, which autograd does not let an operation change. "
                "Write inside `torch.no_grad()`, or into a copy (`p.clone()`)."
            )
            raise ValueError(msg) from None
        # No vmap batching rule, no DTensor sharding rule, or no derivative
        # (`_foreach_copy_`): the same operation per entry has them.
        if not (
            _holds_dtensors(args)
            or _is_batched([*args, *kwargs.values()])
            or "derivative for" in str(err)
        ):
            raise
    _per_entry_(op, args, kwargs)
