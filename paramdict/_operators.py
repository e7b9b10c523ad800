"""Arithmetic on ParamDicts: the Python operators and torch-named fused methods.

Each operation gathers the values once and makes one `torch._foreach_*` call where
torch has a matching kernel, so an update over hundreds of entries costs about what
a bare foreach call on lists costs. Operand handling, kernel calls and error
messages are the plain functions of `_kernels`. All results are new ParamDicts;
operands are never written to, and everything is differentiable (foreach kernels
carry autograd formulas). On CPU, additions and scalings that autograd records run
per entry instead, to keep less memory alive for the backward pass (see
`_foreach.call`).
"""

# Operands are typed `Any` once `operand` has turned them into foreach arguments
# (numbers, tensors or lists of either); narrowing them with `isinstance` gives element
# types pyright calls unknown.
# pyright: reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import check_fits, is_number
from ._kernels import (
    Kernel,
    add_combined,
    add_paired,
    add_scaled,
    apply,
    check_scalar_device,
    holds_tensors,
    operand,
    operand_or_raise,
    rsub,
    scalar_for,
)
from ._pointwise import Operand, _Pointwise

__all__ = ["Operand"]


def _no_bool_sub(p: _Pointwise, arg: Any) -> None:
    """Refuse boolean operands of a subtraction, naming them, as `torch.sub` does."""
    theirs = arg if holds_tensors(arg) else [None] * len(p._keys)
    flags = sorted(
        k
        for k, v, o in zip(p._keys, p._vals, theirs)
        if v.dtype == torch.bool or (o is not None and o.dtype == torch.bool)
    )
    if flags:
        msg = (
            f"`sub` is not defined for the boolean entries {flags!r}, as torch "
            "refuses `-` with a bool tensor. Use `^` / `logical_xor()` for masks, or "
            "convert them first (`.to(dtype)`)."
        )
        raise TypeError(msg)


def _no_float_alpha(p: _Pointwise, numbers: Any, what: str) -> None:
    """Refuse a float `alpha` for entries whose result stays integral, as torch does.

    The numbers are folded into `alpha * number` before the kernel runs, so the
    kernel never sees `alpha` to refuse it.
    """
    per_key = numbers if isinstance(numbers, list) else [numbers] * len(p._keys)
    integral = sorted(
        k
        for k, v, x in zip(p._keys, p._vals, per_key)
        if not torch.result_type(v, x).is_floating_point
        and not torch.result_type(v, x).is_complex
    )
    if integral:
        msg = (
            f"{what}'s `alpha` is a float, but the entries {integral!r} stay "
            "integral, and torch refuses a float `alpha` for them. Pass an int "
            "`alpha`, or convert them first (`.to(dtype)`)."
        )
        raise TypeError(msg)


class _Operators(_Pointwise):
    """Operators and fused arithmetic (see `ParamDict`)."""

    __slots__ = ()

    # ------------------------------------------------------------ binary operators

    def __add__(self, other: Operand) -> Self:
        arg = operand(self, other, "`+`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_add, self._vals, arg)

    __radd__ = __add__

    def __sub__(self, other: Operand) -> Self:
        arg = operand(self, other, "`-`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_sub, self._vals, arg)

    def __rsub__(self, other: Operand) -> Self:
        arg = operand(self, other, "`-`")
        if arg is NotImplemented:
            return NotImplemented
        if holds_tensors(arg):
            return self._run(torch._foreach_sub, arg, self._vals)
        values = self._vals
        if isinstance(arg, list) or (
            math.isfinite(arg) and not any(v.is_complex() for v in values)
        ):
            # No foreach kernel takes numbers on the left: negate, then add (the
            # same values as `number - v` for real entries).
            neg = self._run(torch._foreach_neg, values)
            return neg._run(torch._foreach_add, neg._vals, arg)
        # Complex entries or a non-finite number: `-v + c` can make imaginary
        # parts NaN (or -0.0) where `c - v` does not; one `torch.rsub` per entry.
        return self._derive(apply(self, rsub, values, arg))

    def _scale(self, op: Kernel, arg: Any) -> Self:
        """Run `_foreach_mul` or `_foreach_div` with an argument from `_operand`."""
        values = self._vals
        kind = type(arg)
        if (kind is float or kind is int) and values:
            arg = scalar_for(values, arg)
        return self._run(op, values, arg)

    def __mul__(self, other: Operand) -> Self:
        arg = operand(self, other, "`*`")
        if arg is NotImplemented:
            return NotImplemented
        return self._scale(torch._foreach_mul, arg)

    __rmul__ = __mul__

    def __truediv__(self, other: Operand) -> Self:
        arg = operand(self, other, "`/`")
        if arg is NotImplemented:
            return NotImplemented
        return self._scale(torch._foreach_div, arg)

    def __rtruediv__(self, other: Operand) -> Self:
        arg = operand(self, other, "`/`")
        if arg is NotImplemented:
            return NotImplemented
        if holds_tensors(arg):
            return self._run(torch._foreach_div, arg, self._vals)
        # No foreach kernel takes numbers on the left: invert, then scale.
        inv = self._run(torch._foreach_reciprocal, self._vals)
        return inv._run(torch._foreach_mul, inv._vals, arg)

    def __pow__(self, exponent: Operand) -> Self:
        arg = operand(self, exponent, "`**`")
        if arg is NotImplemented:
            return NotImplemented
        return self._run(torch._foreach_pow, self._vals, arg)

    def __rpow__(self, base: Operand) -> Self:
        arg = operand(self, base, "`**`")
        if arg is NotImplemented:
            return NotImplemented
        if isinstance(arg, list) and not holds_tensors(arg):
            arg = [torch.as_tensor(b) for b in arg]  # no kernel takes a number list
        return self._run(torch._foreach_pow, arg, self._vals)

    def __neg__(self) -> Self:
        return self._run(torch._foreach_neg, self._vals)

    def __pos__(self) -> Self:
        flags = sorted(k for k, v in self.items() if v.dtype == torch.bool)
        if flags:  # as torch refuses `+t` for a boolean tensor
            msg = (
                f"`+p` is not defined for the boolean entries {flags!r}, as torch "
                "refuses `+` on a bool tensor. Convert them first (`.to(dtype)`)."
            )
            raise TypeError(msg)
        return self

    def __abs__(self) -> Self:
        return self._run(torch._foreach_abs, self._vals)

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
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                a number is one torch refuses (an int beyond 64 bits, an `alpha`
                the entries' dtype cannot hold).
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, integer with a float
                `alpha`, ...): the message names the entries.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> p.add(p, alpha=0.5)["w"]
            tensor([1.5000, 3.0000])
        """
        if type(alpha) is float or type(alpha) is int:
            out = add_paired(self, other, alpha)
            if out is not None:
                return self._derive(out)
        return self._axpy(other, alpha, "`add`")

    def sub(self, other: Operand, /, *, alpha: float | Tensor = 1) -> Self:
        """Return `self - alpha * other`, like `torch.sub`; `self` is unchanged.

        The fused SGD step `params.sub(grads, alpha=lr)` is one
        `torch._foreach_sub` call when `lr` is a number; a 0-dim tensor `lr`
        (Meta-SGD) stays differentiable.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.
            alpha: The multiplier for `other`: a number or a 0-dim tensor.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                a number is one torch refuses (an int beyond 64 bits, an `alpha`
                the entries' dtype cannot hold).
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (boolean, as `torch.sub` does,
                sparse, ...): the message names the entries.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> g = ParamDict(w=torch.tensor([4.0, 4.0]))
            >>> p.sub(g, alpha=0.25)["w"]
            tensor([0., 1.])
        """
        if type(alpha) is float or type(alpha) is int:
            out = add_paired(self, other, alpha, torch._foreach_sub)
            if out is not None:
                return self._derive(out)
        return self._axpy(other, alpha, "`sub`", negate=True)

    def _axpy(
        self, other: object, alpha: object, what: str, *, negate: bool = False
    ) -> Self:
        arg = operand_or_raise(self, other, what)
        values = self._vals
        if isinstance(alpha, Tensor):
            # A tensor `alpha` must stay in the graph, so scale first, then add.
            if alpha.dim() != 0:
                msg = (
                    f"{what}: `alpha` must be a number or a 0-dim tensor, got a "
                    f"tensor of shape {tuple(alpha.shape)}."
                )
                raise TypeError(msg)
            check_scalar_device(self, alpha, f"{what}'s `alpha`")
            if negate:
                _no_bool_sub(self, arg)
            return self._derive(apply(self, add_scaled, values, arg, alpha, negate))
        if not is_number(alpha):
            msg = (
                f"{what}: `alpha` must be a number or a 0-dim tensor, got "
                f"{type(alpha).__name__}."
            )
            raise TypeError(msg)
        check_fits(alpha, {v.dtype for v in values}, f"{what}'s `alpha`")
        if holds_tensors(arg):
            if not negate:
                return self._run(torch._foreach_add, values, arg, alpha=alpha)
            # `_foreach_add` with `-alpha`, not `_foreach_sub`: only `add` has the
            # `.Tensor` overload that takes a shared 0-dim tensor in one launch on
            # an accelerator (`_foreach.call`). Booleans are refused as `torch.sub`
            # refuses them.
            _no_bool_sub(self, arg)
            return self._run(torch._foreach_add, values, arg, alpha=-alpha)
        # `_foreach_sub` for `sub`: as `torch.sub`, it refuses boolean operands.
        kernel = torch._foreach_sub if negate else torch._foreach_add
        if isinstance(alpha, float):
            _no_float_alpha(self, arg, what)
        if isinstance(arg, list):
            return self._run(kernel, values, [alpha * a for a in arg])
        return self._run(kernel, values, alpha * arg)

    def mul(self, other: Operand, /) -> Self:
        """Return `self * other`, like `torch.mul`; `self` is unchanged.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                an int is beyond 64 bits.
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).mul(3)["w"]
            tensor([3., 6.])
        """
        return self._scale(torch._foreach_mul, operand_or_raise(self, other, "`mul`"))

    def div(self, other: Operand, /) -> Self:
        """Return `self / other`, like `torch.div`; `self` is unchanged.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                an int is beyond 64 bits.
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).div(2)["w"]
            tensor([0.5000, 1.0000])
        """
        return self._scale(torch._foreach_div, operand_or_raise(self, other, "`div`"))

    def pow(self, exponent: Operand, /) -> Self:
        """Return `self ** exponent`, like `torch.pow`; `self` is unchanged.

        Args:
            exponent: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                an int is beyond 64 bits.
            TypeError: If `exponent` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).pow(2)["w"]
            tensor([1., 4.])
        """
        arg = operand_or_raise(self, exponent, "`pow`")
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
            ValueError: If the keys differ, an entry does not broadcast, or a
                number `weight` is one the entries' dtype cannot hold.
            TypeError: If `weight` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

        Example:
            >>> m = ParamDict(w=torch.tensor([0.0, 0.0]))
            >>> m.lerp({"w": torch.tensor([1.0, 2.0])}, 0.1)["w"]
            tensor([0.1000, 0.2000])
        """
        ends = self._aligned(end, what="`lerp`'s `end`")
        w = operand_or_raise(self, weight, "`lerp`'s `weight`")
        values = self._vals
        if is_number(w):  # torch converts it to the entries' dtype
            check_fits(w, {v.dtype for v in values}, "`lerp`'s `weight`")
        if isinstance(w, list) and not holds_tensors(w):
            # Per-key numbers become 0-dim tensors: every supported torch has the
            # tensor-list kernel, the number-list one exists from torch 2.6 on.
            w = [
                torch.as_tensor(x, dtype=v.dtype, device=v.device)
                for x, v in zip(w, values)
            ]
        return self._run(torch._foreach_lerp, values, ends, w)

    def _addc(
        self,
        op: Kernel,
        t1: Mapping[str, Tensor],
        t2: Mapping[str, Tensor],
        value: float | Tensor | Mapping[str, float],
        what: str,
    ) -> Self:
        a = self._aligned(t1, what=f"{what}'s `tensor1`")
        b = self._aligned(t2, what=f"{what}'s `tensor2`")
        v = operand_or_raise(self, value, f"{what}'s `value`")
        values = self._vals
        if is_number(v):  # torch converts it to the entries' dtype
            check_fits(v, {x.dtype for x in values}, f"{what}'s `value`")
        if holds_tensors(v):
            # A tensor `value` stays differentiable: form the product, then scale.
            combine = (
                torch._foreach_mul
                if op is torch._foreach_addcmul
                else torch._foreach_div
            )
            return self._derive(apply(self, add_combined, combine, values, a, b, v))
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
            ValueError: If the keys differ, an entry does not broadcast, or a
                number `value` is one the entries' dtype cannot hold.
            TypeError: If `value` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

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
            ValueError: If the keys differ, an entry does not broadcast, or a
                number `value` is one the entries' dtype cannot hold.
            TypeError: If `value` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, boolean, ...): the
                message names the entries.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> m = ParamDict(w=torch.tensor([2.0]))
            >>> d = ParamDict(w=torch.tensor([4.0]))
            >>> p.addcdiv(m, d, value=-0.1)["w"]
            tensor([0.9500])
        """
        return self._addc(torch._foreach_addcdiv, tensor1, tensor2, value, "`addcdiv`")
