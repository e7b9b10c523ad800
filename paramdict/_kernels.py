"""The operand -> kernel -> error pipeline behind ParamDict's arithmetic.

Every operator of `ParamDict` does three things: turn its other operand into a
foreach argument aligned with its own keys (`operand`), run one foreach kernel or a
short composition of them (`apply`), and, when a kernel refuses, explain which entry
is to blame (`explain`). These are plain functions of the ParamDict and its values, so
the operator methods read as one line each and none of this machinery lives in the
class's namespace.

Two fast paths live here, each kept for a measured gain
(`python -m benchmarks --only update`):

- `scalar_for`: on CPU, a Python number reaches the multiply and divide kernels as a
  cached 0-dim tensor of the entries' dtype: bitwise the same result, 1.4x to 1.8x
  faster on small entries.
- `add_paired`: `p.sub(g, alpha=lr)` with a number `lr` and a ParamDict `g` with the
  same keys goes to the kernel with no operand handling: 13% of the step at 8 entries.

Building results inline instead of through `_Container._from_parts` was measured at
about 1% (0.1 us of 10 us at 8 x 1,600) and is no longer done.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from ._checks import check_int_range, describe_kind, first_sentence, is_number
from ._container import _Container
from ._foreach import call

_PLAIN_NUMBERS = frozenset({int, float})

# Operands are typed `Any` once `operand` has turned them into foreach arguments
# (numbers, tensors or lists of either); narrowing them with `isinstance` gives element
# types pyright calls unknown.
# pyright: reportUnknownVariableType=false, reportUnknownArgumentType=false

__all__ = [
    "add_combined",
    "add_paired",
    "add_scaled",
    "apply",
    "check_scalar_device",
    "hoisted",
    "holds_tensors",
    "operand",
    "operand_or_raise",
    "rsub",
    "scalar_for",
    "where",
]

Kernel = Callable[..., Sequence[Tensor]]
Composition = Callable[..., list[Tensor]]

_broadcast_shapes = cast("Callable[..., torch.Size]", torch.broadcast_shapes)  # pyright: ignore[reportUnknownMemberType]


# ---------------------------------------------------------------- operands


def holds_tensors(arg: object) -> bool:
    """Whether a foreach argument from `operand` is a list of tensors."""
    # `len`, not `bool`: dynamo before torch 2.9 cannot trace `bool` of a list.
    return isinstance(arg, list) and len(arg) > 0 and isinstance(arg[0], Tensor)


def operand(p: _Container, other: object, what: str) -> Any:
    """Turn `other` into a foreach argument aligned with `p`, or `NotImplemented`.

    Returns a Python number, or a list (tensors or numbers) in `p`'s key order.
    """
    if type(other) is float:  # the common case: a float needs no check
        return other
    if isinstance(other, _Container):  # a ParamDict: tensors by construction
        return p._aligned(other, what=what)
    if isinstance(other, Tensor):
        if other.dim() != 0:
            msg = (
                f"{what} takes a number, a 0-dim tensor or a mapping with the same "
                f"keys, got a tensor of shape {tuple(other.shape)}. For per-entry "
                "values pass a mapping, e.g. `ParamDict.fromkeys(p, t)`."
            )
            raise TypeError(msg)
        check_scalar_device(p, other, what)
        # Repeat it per entry for the list overloads: the foreach `.Tensor`
        # overloads neither differentiate with respect to the scalar tensor
        # ("inconsistent range for TensorList output") nor have vmap batching
        # rules, in torch 2.13.
        return [hoisted(other)] * len(p._keys)
    if is_number(other):
        check_int_range(other, what)
        return other
    if isinstance(other, Mapping):
        values = p._aligned(other, what=what)
        kinds = set(map(type, values))  # read in C: no Python frame per key
        if (
            kinds <= _PLAIN_NUMBERS
            or all(issubclass(kind, Tensor) for kind in kinds)
            or all(isinstance(v, Tensor) for v in values)
            or all(map(is_number, values))
        ):
            return values
        bad = sorted(k for k, v in zip(p._keys, values) if not isinstance(v, Tensor))
        msg = (
            f"{what} takes a mapping of all tensors or all numbers; the entries "
            f"{bad!r} are not tensors. Convert them with `torch.as_tensor`."
        )
        raise TypeError(msg)
    if isinstance(other, list | tuple | str):
        msg = (
            f"{what} takes a number, a 0-dim tensor or a mapping with the same "
            f"keys, got {type(other).__name__}. For per-entry values pass a "
            "mapping, e.g. `{key: value for key, value in zip(p, values)}`."
        )
        raise TypeError(msg)
    if type(other).__module__ == "numpy":
        msg = (
            f"{what} takes a number, a 0-dim tensor or a mapping with the same "
            f"keys, got a numpy {type(other).__name__}. Convert it with "
            "`torch.as_tensor(...)` (and use a mapping for per-entry values)."
        )
        raise TypeError(msg)
    return NotImplemented


def hoisted(value: Tensor) -> Tensor:
    """`value` (0-dim), computed once per graph where `torch.compile` traces it.

    Inductor inlines a 0-dim expression into every loop that reads it and
    recomputes it at each vectorized iteration: an optimizer's bias
    corrections (a `pow` and a `sqrt` of the step) then cost more than the
    update itself (a compiled Adam step took 2.9x torch's fused kernel at 20M
    parameters). A reduction is computed into a buffer before the loops run;
    the maximum of two copies of `value` is `value` exactly (signed zeros, NaN
    and infinities included). Eagerly, `value` itself.
    """
    if value.dim() == 0 and torch.compiler.is_compiling():
        return value.reshape(1).expand(2).amax()
    return value


def check_scalar_device(p: _Container, scalar: Tensor, what: str) -> None:
    """Refuse a 0-dim tensor on a device the entries cannot meet it on.

    torch takes a CPU scalar with entries on any device, and a scalar on the
    entries' own device; anything else (a meta scalar with CPU entries, a CUDA
    scalar with CPU entries) it refuses per entry.
    """
    values = p._vals
    if not values or scalar.is_cpu:
        return
    device = values[0].device
    if scalar.device != device:
        msg = (
            f"{what} got a 0-dim tensor on {scalar.device}, but the entries are on "
            f"{device} (where {p._keys[0]!r} is). Move it first: "
            f"`.to({str(device)!r})`."
        )
        raise ValueError(msg)


def operand_or_raise(p: _Container, other: object, what: str) -> Any:
    """Like `operand`, raising `TypeError` where `operand` gives `NotImplemented`."""
    if type(other) is float:  # the common case: a float needs no check
        return other
    arg = operand(p, other, what)
    if arg is NotImplemented:
        msg = (
            f"{what} takes a number, a 0-dim tensor or a mapping with the same "
            f"keys, got {type(other).__name__}."
        )
        raise TypeError(msg)
    return arg


def scalar_for(values: list[Tensor], number: float) -> Any:
    """Return `number` as a 0-dim tensor where that is exact and faster, else as is.

    On CPU, torch multiplies (and divides) a float32 or float64 tensor by a Python
    number a few microseconds per tensor slower than by a 0-dim tensor of the
    tensor's own dtype (the number takes a casting loop), with bitwise the same
    result: 1.4x to 1.8x on small entries. Only CPU entries of one such dtype
    qualify, and only in plain eager mode: while compiling, under a dispatch mode
    (fake tensors, profilers, op counters) or in inference mode, the number is
    passed on as it is.
    """
    if (
        not values
        or torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch.is_inference_mode_enabled()
    ):
        return number
    first = values[0]
    dtype = first.dtype
    if not first.is_cpu or (dtype is not torch.float32 and dtype is not torch.float64):
        return number
    if abs(number) > torch.finfo(dtype).max:
        return number  # the entries' dtype cannot hold it; torch keeps it as double
    for value in values:
        if value.dtype is not dtype or not value.is_cpu:
            return number
    # The sign goes into the key: `-0.0 == 0.0`, but they scale differently.
    return _cpu_scalar(number, math.copysign(1.0, number), dtype)


@functools.lru_cache(maxsize=64)
def _cpu_scalar(number: float, sign: float, dtype: torch.dtype) -> Tensor:
    """A 0-dim CPU tensor holding `number`, made once per value (never written to).

    Creating one costs more than the multiplication it speeds up on small
    entries, and an optimizer reuses a handful of numbers step after step.
    """
    return torch.full((), number, dtype=dtype, device="cpu")


# ---------------------------------------------------------------- running kernels


def apply(p: _Container, fn: Composition, *args: Any, **kwargs: Any) -> list[Tensor]:
    """Return `fn(*args, **kwargs)`: the new values of `p`'s entries.

    `fn` is `call` (one foreach kernel: `apply(p, call, torch._foreach_add, ...)`)
    or a composition of kernels from this module. An empty `p` gives an empty
    list (foreach kernels refuse empty lists); a kernel's error is re-raised as
    a `ValueError` or `TypeError` naming the entries to blame (`explain`).

    A foreach kernel recorded by autograd marks every result as requiring grad
    when any operand does; torch's per-tensor functions mark only the results
    whose own operands do, and so does this (`_untracked`).
    """
    try:
        out = fn(*args, **kwargs)
    except (RuntimeError, OverflowError) as err:
        if not p._keys:
            return []
        raise explain(p._keys, err, args, fn, kwargs) from err
    if out and out[0].requires_grad and _eager_grad():
        _untracked(out, args, kwargs)
    return out


def _eager_grad() -> bool:
    """Grad mode is on, and not while `torch.compile` traces.

    Traced, an operand written in place by a recorded kernel does not show the
    `requires_grad` it took (torch 2.13's fake tensors keep the old flag), so
    `_untracked` would cut the graph there; the compiled graph's outputs take
    their flags from autograd instead.
    """
    return torch.is_grad_enabled() and not torch.compiler.is_compiling()


def _untracked(
    out: list[Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Detach, in `out`, the results of entries none of whose operands require grad."""
    n = len(out)
    columns = [a for a in (*args, *kwargs.values()) if isinstance(a, list)]
    shared = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    if any(t.requires_grad for t in shared):
        return  # one operand of every entry requires grad
    for column in columns:
        if len(column) == n and all(_requires_grad(t) for t in column):
            return  # the common case: every entry has an operand that requires grad
    for i in range(n):
        if not any(_requires_grad(c[i]) for c in columns if len(c) == n):
            out[i] = out[i].detach()


def _requires_grad(value: object) -> bool:
    return isinstance(value, Tensor) and value.requires_grad


def explain(
    keys: tuple[str, ...],
    err: BaseException,
    args: tuple[Any, ...],
    fn: Composition | None = None,
    kwargs: dict[str, Any] | None = None,
) -> Exception:
    """Find the entries whose operands torch refuses; name them.

    With `fn` given, the kernel is run again on each entry alone, and only the
    entries it fails on are considered (with their own errors). Shapes that do
    not broadcast, mixed devices or mixed dtypes are named as such; otherwise the
    failing entries are named with torch's reason: a `TypeError` for a kind of
    tensor the kernel does not take (sparse, boolean, integer, complex), a
    `ValueError` for anything else.
    """
    lists = [a for a in args if isinstance(a, list) and len(a) == len(keys)]
    shared = [a for a in args if isinstance(a, Tensor)]
    entries: list[tuple[str, list[Tensor]]] = [
        (key, [a[i] for a in lists if isinstance(a[i], Tensor)] + shared)
        for i, key in enumerate(keys)
    ]
    failures = _failing(keys, fn, args, kwargs or {}) if fn is not None else {}
    considered = sorted(failures) if failures else list(range(len(keys)))

    def reason(i: int) -> str:
        return first_sentence(failures.get(i, err))

    # Shapes first, then devices, then dtypes: a clash of the first kind anywhere
    # is a surer cause than one of the last kind.
    for i in considered:
        key, tensors = entries[i]
        try:
            _broadcast_shapes(*(t.shape for t in tensors))
        except RuntimeError:
            shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
            msg = (
                f"Entry {key!r}: shapes {shapes} do not broadcast together. "
                "Per-entry values must broadcast to the entry's shape."
            )
            return ValueError(msg)
    for i in considered:
        key, tensors = entries[i]
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            shown = ", ".join(sorted(str(d) for d in devices))
            msg = (
                f"Entry {key!r}: tensors are on different devices ({shown})"
                f"{_scalar_among(tensors, 'device')}. Move them first, e.g. with "
                "`.to(device)`."
            )
            return ValueError(msg)
    for i in considered:
        key, tensors = entries[i]
        dtypes = {t.dtype for t in tensors if t.dtype != torch.bool}
        if len(dtypes) > 1 and all(t.layout == torch.strided for t in tensors):
            shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
            msg = (
                f"Entry {key!r}: the dtypes {shown}{_scalar_among(tensors, 'dtype')} "
                f"do not work together here ({reason(i).rstrip('.')}). Convert "
                "first, e.g. with `.to(dtype)`."
            )
            return ValueError(msg)
    tensors = [t for i in considered for t in entries[i][1]]
    which = "entry" if len(considered) == 1 else "entries"
    kinds = ", ".join(
        f"{entries[i][0]!r} ({_kinds(entries[i][1])})"
        for i in sorted(considered, key=lambda i: keys[i])
    )
    first = reason(min(considered, key=lambda i: keys[i]))
    wrong_kind = isinstance(err, NotImplementedError) or any(
        t.layout != torch.strided or not t.is_floating_point() for t in tensors
    )
    if wrong_kind:
        msg = (
            f"torch refuses the {which} {kinds} here: {first} Convert first "
            "(`.to(dtype)`, `.to_dense()`), or leave them out with `.exclude(...)`."
        )
        return TypeError(msg)
    msg = f"torch refuses the {which} {kinds} here: {first}"
    return ValueError(msg)


def _scalar_among(tensors: list[Tensor], attribute: str) -> str:
    """`" (one a 0-dim operand)"` if a 0-dim operand differs from another there."""
    odd = [
        t
        for t in tensors
        if t.dim() == 0
        and any(getattr(u, attribute) != getattr(t, attribute) for u in tensors)
    ]
    return " (one a 0-dim operand)" if odd else ""


def _kinds(tensors: list[Tensor]) -> str:
    return ", ".join(dict.fromkeys(describe_kind(t) for t in tensors))


def _failing(
    keys: tuple[str, ...],
    fn: Composition,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> dict[int, BaseException]:
    """The entries on which `fn` fails when run on them alone, with their errors."""
    n = len(keys)

    def one(arg: Any, i: int) -> Any:
        return arg[i : i + 1] if isinstance(arg, list) and len(arg) == n else arg

    failing: dict[int, BaseException] = {}
    for i in range(n):
        try:
            fn(*(one(a, i) for a in args), **{k: one(v, i) for k, v in kwargs.items()})
        except (RuntimeError, OverflowError) as err:
            failing[i] = err
    return failing


def add_paired(
    p: _Container, other: object, alpha: float, kernel: Kernel = torch._foreach_add
) -> list[Tensor] | None:
    """Return the values of `p + alpha * other` in one kernel call, or `None`.

    The optimizer step `p.sub(g, alpha=lr)` comes here when `alpha` is a plain
    number (checked by the caller), with `kernel` `torch._foreach_sub` (which,
    as `torch.sub`, refuses boolean operands); with `other` a ParamDict with the
    same keys it goes straight to the kernel. In every other case, and when the
    kernel refuses (an error to explain, or batched tensors under vmap), it
    returns `None` for the general path.
    """
    if not isinstance(other, _Container):
        return None
    if other._keys is not p._keys and other._keys != p._keys:
        return None
    values = p._vals
    theirs = other._vals
    try:
        if (
            values
            and (values[0].requires_grad or theirs[0].requires_grad)
            and torch.is_grad_enabled()
        ):
            # Recorded: `call` may run per entry, to keep less memory alive.
            out = call(kernel, values, theirs, alpha=alpha)
        else:
            # Not recorded: the kernel itself. Going through `call` costs 0.5 to
            # 0.7 us more, 5% to 7% of the step on 8 x 1,600 entries.
            out = list(kernel(values, theirs, alpha=alpha))
    except (RuntimeError, OverflowError):  # explained by the general path
        return None
    if out and out[0].requires_grad and _eager_grad():
        _untracked(out, (values, theirs), {})
    return out


# ---------------------------------------------------------------- compositions


def add_scaled(
    values: list[Tensor], other: Any, alpha: Tensor, negate: bool = False
) -> list[Tensor]:
    """Return `values + alpha * other` for a 0-dim tensor `alpha`, kept in the graph.

    With `negate`, `values - alpha * other`, which, as `torch.sub`, refuses
    boolean entries. With tensor entries this is one `addcmul` per entry, which
    rounds as `torch.add(x, y, alpha=float(alpha))` does (a product then a sum
    rounds differently), so a tensor `alpha` gives the arithmetic of a number.
    """
    n = len(values)
    if holds_tensors(other):
        scale = -alpha if negate else alpha
        return call(torch._foreach_addcmul, values, other, _scales(values, scale))
    if isinstance(other, list):  # per-entry numbers
        scaled = call(torch._foreach_mul, [alpha] * n, other)
    else:
        scaled = [alpha * other] * n
    return call(torch._foreach_sub if negate else torch._foreach_add, values, scaled)


def _scales(values: list[Tensor], alpha: Tensor) -> list[Tensor]:
    """Return `alpha` in each entry's dtype, as type promotion reads a 0-dim tensor.

    Explicit because under `torch.func.vmap` a batched `alpha` is no longer
    0-dim to the kernel and would promote float32 entries to its float64.
    """
    cast: dict[torch.dtype, Tensor] = {alpha.dtype: alpha}
    scales: list[Tensor] = []
    for value in values:
        dtype = value.dtype
        if dtype not in cast:
            floating = value.is_floating_point() or value.is_complex()
            cast[dtype] = alpha.to(dtype) if floating else alpha
        scales.append(cast[dtype])
    return scales


def add_combined(
    combine: Kernel,
    values: list[Tensor],
    tensor1: list[Tensor],
    tensor2: list[Tensor],
    value: list[Tensor],
) -> list[Tensor]:
    """Return `values + value * combine(tensor1, tensor2)`, kept in the graph."""
    combined = call(combine, tensor1, tensor2)
    return call(torch._foreach_add, values, call(torch._foreach_mul, combined, value))


def rsub(values: list[Tensor], number: float) -> list[Tensor]:
    """Return `number - v` per entry (torch has no foreach kernel with it)."""
    return [torch.rsub(v, number) for v in values]


def where(conds: list[Tensor], values: list[Tensor], others: list[Any]) -> list[Tensor]:
    """Return `torch.where(c, v, o)` per entry (torch has no foreach `where`)."""
    return [torch.where(c, v, o) for c, v, o in zip(conds, values, others)]
