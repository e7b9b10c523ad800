"""Arithmetic on ParamDicts: the Python operators and torch-named fused methods.

Each operation gathers the values once and makes one `torch._foreach_*` call where
torch has a matching kernel, so an update over hundreds of entries costs about what a
bare foreach call on lists costs. All results are new ParamDicts; operands are never
written to, and everything is differentiable (foreach kernels carry autograd formulas).
On CPU, additions and scalings that autograd records run per entry instead, to keep
less memory alive for the backward pass (see `_foreach.call`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Number
from typing import Any, TypeAlias, cast

import torch
from torch import Tensor
from typing_extensions import Self

from ._container import _Container
from ._foreach import call

__all__ = ["Operand"]

Operand: TypeAlias = float | Tensor | Mapping[str, Tensor] | Mapping[str, float]
"""A number, a 0-dim tensor, or a mapping with the same keys (tensors or numbers)."""


_broadcast_shapes = cast("Callable[..., torch.Size]", torch.broadcast_shapes)


def _is_number(value: object) -> bool:
    kind = type(value)
    if kind is float or kind is int:  # the common case, without the ABC check
        return True
    return isinstance(value, Number) and not isinstance(value, Tensor)


def _holds_tensors(arg: object) -> bool:
    """Whether a foreach argument from `_operand` is a list of tensors."""
    # `len`, not `bool`: dynamo before torch 2.9 cannot trace `bool` of a list.
    return isinstance(arg, list) and len(arg) > 0 and isinstance(arg[0], Tensor)


def _add_scaled(values: list[Tensor], other: Any, alpha: Tensor) -> list[Tensor]:
    """Return `values + alpha * other` for a 0-dim tensor `alpha`, kept in the graph."""
    n = len(values)
    if _holds_tensors(other):
        scaled = call(torch._foreach_mul, other, [alpha] * n)
    elif isinstance(other, list):  # per-entry numbers
        scaled = call(torch._foreach_mul, [alpha] * n, other)
    else:
        scaled = [alpha * other] * n
    return call(torch._foreach_add, values, scaled)


def _add_combined(
    combine: Callable[..., Sequence[Tensor]],
    values: list[Tensor],
    tensor1: list[Tensor],
    tensor2: list[Tensor],
    value: list[Tensor],
) -> list[Tensor]:
    """Return `values + value * combine(tensor1, tensor2)`, kept in the graph."""
    combined = call(combine, tensor1, tensor2)
    return call(torch._foreach_add, values, call(torch._foreach_mul, combined, value))


def _same_dtype_scalar(values: list[Tensor], number: float) -> Any:
    """Return `number` as a 0-dim tensor where that is exact and faster, else as is.

    On CPU, torch multiplies (and divides) a float32 or float64 tensor by a Python
    number a few microseconds per tensor slower than by a 0-dim tensor of the
    tensor's own dtype (the number takes a casting loop), with bitwise the same
    result. Only CPU entries of one such dtype qualify, and only in plain eager
    mode: while compiling, under a dispatch mode (fake tensors, profilers, op
    counters) or in inference mode, the number is passed on as it is.
    """
    if (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack()
        or torch.is_inference_mode_enabled()
    ):
        return number
    first = values[0]
    dtype = first.dtype
    if not first.is_cpu or (dtype is not torch.float32 and dtype is not torch.float64):
        return number
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


def _where(
    conds: list[Tensor], values: list[Tensor], others: list[Any]
) -> list[Tensor]:
    return [torch.where(c, v, o) for c, v, o in zip(conds, values, others)]


class _Operators(_Container):
    """Operators and fused arithmetic (see `ParamDict`)."""

    __slots__ = ()

    # ------------------------------------------------------------ operand handling

    def _operand(self, other: object, what: str) -> Any:
        """Turn `other` into a foreach argument, or `NotImplemented`.

        Returns a Python number, a 0-dim tensor, or a list (tensors or numbers) in
        `self`'s key order.
        """
        if isinstance(other, _Container):
            # A ParamDict holds tensors by construction: no need to scan them.
            return self._aligned(other, what=what)
        if isinstance(other, Tensor):
            if other.dim() != 0:
                msg = (
                    f"{what} takes a number, a 0-dim tensor or a mapping with the same "
                    f"keys, got a tensor of shape {tuple(other.shape)}. For per-entry "
                    "values pass a mapping, e.g. `ParamDict.fromkeys(p, t)`."
                )
                raise TypeError(msg)
            # Repeat it per entry for the list overloads: the foreach `.Tensor`
            # overloads neither differentiate with respect to the scalar tensor
            # ("inconsistent range for TensorList output") nor have vmap batching
            # rules, in torch 2.13.
            return [other] * len(self._keys)
        if _is_number(other):
            return other
        if isinstance(other, Mapping):
            values = self._aligned(other, what=what)
            if all(isinstance(v, Tensor) for v in values) or all(
                _is_number(v) for v in values
            ):
                return values
            bad = sorted(
                k for k, v in zip(self._keys, values) if not isinstance(v, Tensor)
            )
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

    def _operand_or_raise(self, other: object, what: str) -> Any:
        arg = self._operand(other, what)
        if arg is NotImplemented:
            msg = (
                f"{what} takes a number, a 0-dim tensor or a mapping with the same "
                f"keys, got {type(other).__name__}."
            )
            raise TypeError(msg)
        return arg

    def _run(
        self, op: Callable[..., Sequence[Tensor]], *args: Any, **kwargs: Any
    ) -> Self:
        """Call a foreach `op`, naming the entry if it fails, and wrap the result."""
        try:
            out = call(op, *args, **kwargs)
        except RuntimeError as err:
            return self._failed(err, args)
        return self._derive(out)

    def _compose(self, fn: Callable[..., Sequence[Tensor]], *args: Any) -> Self:
        """Like `_run`, for a function that makes several foreach calls itself."""
        try:
            out = fn(*args)
        except RuntimeError as err:
            return self._failed(err, args)
        return self._derive(out)

    def _failed(self, err: RuntimeError, args: tuple[Any, ...]) -> Self:
        """Handle a kernel's error: empty results, or an error naming the entry."""
        if not self._keys:  # foreach kernels refuse empty lists
            return self._derive(())
        explained = self._explain(err, args)
        if explained is err:
            raise err
        raise explained from err

    def _explain(self, err: RuntimeError, args: tuple[Any, ...]) -> Exception:
        """Find the entry whose operands do not fit together; name it.

        Returns `err` itself when no entry is to blame.
        """
        lists = [a for a in args if isinstance(a, list) and len(a) == len(self._keys)]
        shared = [a for a in args if isinstance(a, Tensor)]
        entries = [
            (key, [a[i] for a in lists if isinstance(a[i], Tensor)] + shared)
            for i, key in enumerate(self._keys)
        ]
        # Shapes first, then devices, then dtypes: a clash of the first kind
        # anywhere is a surer cause than one of the last kind.
        for key, tensors in entries:
            try:
                _broadcast_shapes(*(t.shape for t in tensors))
            except RuntimeError:
                shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
                msg = (
                    f"Entry {key!r}: shapes {shapes} do not broadcast together. "
                    "Per-entry values must broadcast to the entry's shape."
                )
                return ValueError(msg)
        for key, tensors in entries:
            devices = {t.device for t in tensors}
            if len(devices) > 1:
                shown = ", ".join(sorted(str(d) for d in devices))
                msg = (
                    f"Entry {key!r}: tensors are on different devices ({shown}). "
                    "Move them first, e.g. with `.to(device)`."
                )
                return ValueError(msg)
        for key, tensors in entries:
            dtypes = {t.dtype for t in tensors if t.dtype != torch.bool}
            if len(dtypes) > 1:
                shown = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
                msg = (
                    f"Entry {key!r}: the dtypes {shown} do not work together here "
                    f"({err}). Convert first, e.g. with `.to(dtype)`."
                )
                return ValueError(msg)
        return err

    # ------------------------------------------------------------ binary operators

    def __add__(self, other: Operand) -> Self:
        arg = self._operand(other, "`+`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_add, self._vals, arg)

    __radd__ = __add__

    def __sub__(self, other: Operand) -> Self:
        arg = self._operand(other, "`-`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_sub, self._vals, arg)

    def __rsub__(self, other: Operand) -> Self:
        arg = self._operand(other, "`-`")
        if arg is NotImplemented:
            return NotImplemented
        if _holds_tensors(arg):
            return self._run(torch._foreach_sub, arg, self._vals)
        # No foreach kernel takes numbers on the left: negate, then add.
        neg = self._unary(torch._foreach_neg)
        return neg._run(torch._foreach_add, neg._vals, arg)

    def _scale(self, op: Callable[..., Sequence[Tensor]], arg: Any) -> Self:
        """Run `_foreach_mul` or `_foreach_div` with an argument from `_operand`."""
        values = self._vals
        kind = type(arg)
        if (kind is float or kind is int) and values:
            arg = _same_dtype_scalar(values, arg)
        return self._run(op, values, arg)

    def __mul__(self, other: Operand) -> Self:
        arg = self._operand(other, "`*`")
        if arg is NotImplemented:
            return NotImplemented
        return self._scale(torch._foreach_mul, arg)

    __rmul__ = __mul__

    def __truediv__(self, other: Operand) -> Self:
        arg = self._operand(other, "`/`")
        if arg is NotImplemented:
            return NotImplemented
        return self._scale(torch._foreach_div, arg)

    def __rtruediv__(self, other: Operand) -> Self:
        arg = self._operand(other, "`/`")
        if arg is NotImplemented:
            return NotImplemented
        if _holds_tensors(arg):
            return self._run(torch._foreach_div, arg, self._vals)
        # No foreach kernel takes numbers on the left: invert, then scale.
        inv = self._unary(torch._foreach_reciprocal)
        return inv._run(torch._foreach_mul, inv._vals, arg)

    def __pow__(self, exponent: Operand) -> Self:
        arg = self._operand(exponent, "`**`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_pow, self._vals, arg)

    def __rpow__(self, base: Operand) -> Self:
        arg = self._operand(base, "`**`")
        if arg is NotImplemented:
            return NotImplemented
        if isinstance(arg, list) and not _holds_tensors(arg):
            arg = [torch.as_tensor(b) for b in arg]  # no kernel takes a number list
        return self._run(torch._foreach_pow, arg, self._vals)

    def __neg__(self) -> Self:
        return self._unary(torch._foreach_neg)

    def __pos__(self) -> Self:
        return self

    def __abs__(self) -> Self:
        return self._unary(torch._foreach_abs)

    # ------------------------------------------------------------ fused, torch-named

    def add(self, other: Operand, /, *, alpha: float | Tensor = 1) -> Self:
        """Return `self + alpha * other`, like `torch.add`; `self` is unchanged.

        One `torch._foreach_add` call when `alpha` is a number. A tensor `alpha`
        (e.g. a learnable learning rate) stays differentiable.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.
            alpha: The multiplier for `other`: a number or a 0-dim tensor.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> p.add(p, alpha=0.5)["w"]
            tensor([1.5000, 3.0000])
        """
        if type(alpha) is float or type(alpha) is int:
            out = self._add_paired(other, alpha)
            if out is not None:
                return out
        return self._axpy(other, alpha, "`add`")

    def sub(self, other: Operand, /, *, alpha: float | Tensor = 1) -> Self:
        """Return `self - alpha * other`, like `torch.sub`; `self` is unchanged.

        The fused SGD step `params.sub(grads, alpha=lr)` is one
        `torch._foreach_add` call when `lr` is a number; a 0-dim tensor `lr`
        (Meta-SGD) stays differentiable.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.
            alpha: The multiplier for `other`: a number or a 0-dim tensor.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> g = ParamDict(w=torch.tensor([4.0, 4.0]))
            >>> p.sub(g, alpha=0.25)["w"]
            tensor([0., 1.])
        """
        if type(alpha) is float or type(alpha) is int:
            out = self._add_paired(other, -alpha)
            if out is not None:
                return out
        return self._axpy(other, alpha, "`sub`", negate=True)

    def _add_paired(self, other: object, alpha: float) -> Self | None:
        """Return `self + alpha * other` in one kernel call, or `None`.

        The optimizer step `p.sub(g, alpha=lr)` goes straight to the kernel when
        `alpha` is a plain number (checked by the caller) and `other` a ParamDict
        with the same keys; with few, large tensors this path is most of the cost
        beyond the kernel, so it stays short. In every other case, and when the
        kernel refuses (an error to explain, or batched tensors under vmap), it
        returns `None` for `_axpy` to handle.
        """
        if not isinstance(other, _Container):
            return None
        keys = self._keys
        if other._keys is not keys and other._keys != keys:
            return None
        values = self._vals
        theirs = other._vals
        out: Sequence[Tensor]
        try:
            if (
                values
                and (values[0].requires_grad or theirs[0].requires_grad)
                and torch.is_grad_enabled()
            ):
                # Recorded: `call` may run per entry, to keep less memory alive.
                out = call(torch._foreach_add, values, theirs, alpha=alpha)
            else:
                out = torch._foreach_add(values, theirs, alpha=alpha)
        except RuntimeError:
            return None
        # `_derive`, inlined: on this path the extra call measured about 1% of a
        # step on 8 x 1,600 entries (`python -m benchmarks --only update`).
        obj = dict.__new__(type(self))
        dict.update(obj, zip(keys, out))
        obj._keys = keys
        obj._vals = list(out)
        return obj

    def _axpy(
        self, other: object, alpha: object, what: str, *, negate: bool = False
    ) -> Self:
        arg = self._operand_or_raise(other, what)
        values = self._vals
        if isinstance(alpha, Tensor):
            # A tensor `alpha` must stay in the graph, so scale first, then add.
            if alpha.dim() != 0:
                msg = (
                    f"{what}: `alpha` must be a number or a 0-dim tensor, got a "
                    f"tensor of shape {tuple(alpha.shape)}."
                )
                raise TypeError(msg)
            return self._compose(_add_scaled, values, arg, -alpha if negate else alpha)
        if not _is_number(alpha):
            msg = (
                f"{what}: `alpha` must be a number or a 0-dim tensor, got "
                f"{type(alpha).__name__}."
            )
            raise TypeError(msg)
        if negate:
            alpha = -alpha  # type: ignore[operator]  # a number, checked above
        if _holds_tensors(arg):
            return self._run(torch._foreach_add, values, arg, alpha=alpha)
        if isinstance(arg, list):
            return self._run(torch._foreach_add, values, [alpha * a for a in arg])
        return self._run(torch._foreach_add, values, alpha * arg)

    def mul(self, other: Operand, /) -> Self:
        """Return `self * other`, like `torch.mul`; `self` is unchanged.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).mul(3)["w"]
            tensor([3., 6.])
        """
        return self._scale(torch._foreach_mul, self._operand_or_raise(other, "`mul`"))

    def div(self, other: Operand, /) -> Self:
        """Return `self / other`, like `torch.div`; `self` is unchanged.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).div(2)["w"]
            tensor([0.5000, 1.0000])
        """
        return self._scale(torch._foreach_div, self._operand_or_raise(other, "`div`"))

    def pow(self, exponent: Operand, /) -> Self:
        """Return `self ** exponent`, like `torch.pow`; `self` is unchanged.

        Args:
            exponent: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `exponent` is not a number, 0-dim tensor or mapping.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).pow(2)["w"]
            tensor([1., 4.])
        """
        arg = self._operand_or_raise(exponent, "`pow`")
        return self._run(torch._foreach_pow, self._vals, arg)

    def lerp(self, end: Mapping[str, Tensor], /, weight: Operand) -> Self:
        """Return `self + weight * (end - self)`, like `torch.lerp`.

        Used for exponential moving averages: `m.lerp(g, 1 - beta1)`.

        Args:
            end: A mapping with the same keys.
            weight: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.
            TypeError: If `weight` is not a number, 0-dim tensor or mapping.

        Example:
            >>> m = ParamDict(w=torch.tensor([0.0, 0.0]))
            >>> m.lerp({"w": torch.tensor([1.0, 2.0])}, 0.1)["w"]
            tensor([0.1000, 0.2000])
        """
        ends = self._aligned(end, what="`lerp`")
        w = self._operand_or_raise(weight, "`lerp`")
        values = self._vals
        if isinstance(w, list) and not _holds_tensors(w):
            # Per-key numbers become 0-dim tensors: every supported torch has the
            # tensor-list kernel, the number-list one exists from torch 2.6 on.
            w = [
                torch.as_tensor(x, dtype=v.dtype, device=v.device)
                for x, v in zip(w, values)
            ]
        return self._run(torch._foreach_lerp, values, ends, w)

    def _addc(
        self,
        op: Callable[..., Sequence[Tensor]],
        t1: Mapping[str, Tensor],
        t2: Mapping[str, Tensor],
        value: float | Tensor | Mapping[str, float],
        what: str,
    ) -> Self:
        a = self._aligned(t1, what=what)
        b = self._aligned(t2, what=what)
        v = self._operand_or_raise(value, what)
        values = self._vals
        if _holds_tensors(v):
            # A tensor `value` stays differentiable: form the product, then scale.
            combine = (
                torch._foreach_mul
                if op is torch._foreach_addcmul
                else torch._foreach_div
            )
            return self._compose(_add_combined, combine, values, a, b, v)
        return self._run(op, values, a, b, v)

    def addcmul(
        self,
        tensor1: Mapping[str, Tensor],
        tensor2: Mapping[str, Tensor],
        /,
        *,
        value: float | Tensor | Mapping[str, float] = 1,
    ) -> Self:
        """Return `self + value * tensor1 * tensor2`, like `torch.addcmul`.

        Args:
            tensor1: A mapping with the same keys.
            tensor2: A mapping with the same keys.
            value: A number, a 0-dim tensor (kept differentiable), or per-key numbers.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> v = ParamDict(w=torch.tensor([1.0]))
            >>> g = ParamDict(w=torch.tensor([3.0]))
            >>> v.addcmul(g, g, value=0.5)["w"]
            tensor([5.5000])
        """
        return self._addc(torch._foreach_addcmul, tensor1, tensor2, value, "`addcmul`")

    def addcdiv(
        self,
        tensor1: Mapping[str, Tensor],
        tensor2: Mapping[str, Tensor],
        /,
        *,
        value: float | Tensor | Mapping[str, float] = 1,
    ) -> Self:
        """Return `self + value * tensor1 / tensor2`, like `torch.addcdiv`.

        Args:
            tensor1: A mapping with the same keys.
            tensor2: A mapping with the same keys.
            value: A number, a 0-dim tensor (kept differentiable), or per-key numbers.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> m = ParamDict(w=torch.tensor([2.0]))
            >>> d = ParamDict(w=torch.tensor([4.0]))
            >>> p.addcdiv(m, d, value=-0.1)["w"]
            tensor([0.9500])
        """
        return self._addc(torch._foreach_addcdiv, tensor1, tensor2, value, "`addcdiv`")

    def _unary(self, op: Callable[[list[Tensor]], Sequence[Tensor]]) -> Self:
        return self._run(op, self._vals)

    def sqrt(self) -> Self:
        """Return the elementwise square root (`torch.sqrt`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([4.0, 9.0])).sqrt()["w"]
            tensor([2., 3.])
        """
        return self._unary(torch._foreach_sqrt)

    def rsqrt(self) -> Self:
        """Return the elementwise reciprocal square root (`torch.rsqrt`).

        One `torch._foreach_pow` call with exponent `-0.5`, which every supported
        torch has (`torch._foreach_rsqrt` exists from torch 2.6 on).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([4.0])).rsqrt()["w"]
            tensor([0.5000])
        """
        return self._run(torch._foreach_pow, self._vals, -0.5)

    def exp(self) -> Self:
        """Return the elementwise exponential (`torch.exp`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([0.0])).exp()["w"]
            tensor([1.])
        """
        return self._unary(torch._foreach_exp)

    def log(self) -> Self:
        """Return the elementwise natural logarithm (`torch.log`).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([1.0])).log()["w"]
            tensor([0.])
        """
        return self._unary(torch._foreach_log)

    def sign(self) -> Self:
        """Return the elementwise sign (`torch.sign`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 0.0, 3.0])).sign()["w"]
            tensor([-1.,  0.,  1.])
        """
        return self._unary(torch._foreach_sign)

    def abs(self) -> Self:
        """Return the elementwise absolute value (`torch.abs`); same as `abs(p)`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 3.0])).abs()["w"]
            tensor([2., 3.])
        """
        return self._unary(torch._foreach_abs)

    def neg(self) -> Self:
        """Return the elementwise negation (`torch.neg`); same as `-p`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([1.0])).neg()["w"]
            tensor([-1.])
        """
        return self._unary(torch._foreach_neg)

    def reciprocal(self) -> Self:
        """Return the elementwise reciprocal `1 / p` (`torch.reciprocal`).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Example:
            >>> ParamDict(w=torch.tensor([4.0])).reciprocal()["w"]
            tensor([0.2500])
        """
        return self._unary(torch._foreach_reciprocal)

    def clamp(
        self,
        min: Operand | None = None,  # torch.clamp's argument name
        max: Operand | None = None,  # torch.clamp's argument name
    ) -> Self:
        """Return the values clamped to `[min, max]`, like `torch.clamp`.

        Args:
            min: Lower bound: a number, a 0-dim tensor or per-key values; or `None`.
            max: Upper bound: a number, a 0-dim tensor or per-key values; or `None`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If neither bound is given, or a mapping's keys differ.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 0.5, 3.0])).clamp(-1, 1)["w"]
            tensor([-1.0000,  0.5000,  1.0000])
        """
        if min is None and max is None:
            msg = "`clamp` needs at least one of `min` and `max`."
            raise ValueError(msg)
        out: Self = self
        if min is not None:
            out = out._bound(torch._foreach_clamp_min, min, "`clamp`")
        if max is not None:
            out = out._bound(torch._foreach_clamp_max, max, "`clamp`")
        return out

    def _bound(
        self, op: Callable[..., Sequence[Tensor]], other: object, what: str
    ) -> Self:
        return self._run(op, self._vals, self._operand_or_raise(other, what))

    def maximum(self, other: Operand, /) -> Self:
        """Return the elementwise maximum with `other`, like `torch.maximum`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).maximum(2)["w"]
            tensor([2., 5.])
        """
        return self._bound(torch._foreach_maximum, other, "`maximum`")

    def minimum(self, other: Operand, /) -> Self:
        """Return the elementwise minimum with `other`, like `torch.minimum`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is not a number, 0-dim tensor or mapping.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).minimum(2)["w"]
            tensor([1., 2.])
        """
        return self._bound(torch._foreach_minimum, other, "`minimum`")

    def where(self, condition: Mapping[str, Tensor], /, other: Operand) -> Self:
        """Return `self` where `condition` holds and `other` elsewhere (`torch.where`).

        Torch has no foreach `where`, so this is one `torch.where` per entry.

        Args:
            condition: A mapping of boolean tensors with the same keys.
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, -1.0]))
            >>> p.where({"w": torch.tensor([True, False])}, 0.0)["w"]
            tensor([1., 0.])
        """
        conds = self._aligned(condition, what="`where`")
        not_bool = sorted(
            k
            for k, c in zip(self._keys, conds)
            if not (isinstance(c, Tensor) and c.dtype == torch.bool)
        )
        if not_bool:
            msg = (
                "`where` takes a mapping of boolean tensors as `condition`; the "
                f"entries {not_bool!r} are not. Compare first, e.g. `p.map(lambda v: "
                "v > 0)`."
            )
            raise TypeError(msg)
        arg = self._operand_or_raise(other, "`where`")
        others = arg if isinstance(arg, list) else [arg] * len(self)
        return self._compose(_where, conds, self._vals, others)
