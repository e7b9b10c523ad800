"""Elementwise functions on ParamDicts: `sqrt`, `sign`, `clamp`, `where` and kin.

Like the operators of `_operators.py`, each gathers the values once and makes one
`torch._foreach_*` call where torch has a matching kernel; results are new
ParamDicts and everything is differentiable.
"""

# pyright: reportUnknownVariableType=false, reportUnknownArgumentType=false
# (operands are `Any` once `operand` has turned them into foreach arguments)

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import check_fits, is_number
from ._container import _Container
from ._foreach import call
from ._kernels import Kernel, apply, operand_or_raise, where

__all__ = ["Operand"]

Operand: TypeAlias = float | Tensor | Mapping[str, Tensor] | Mapping[str, float]
"""A number, a 0-dim tensor, or a mapping with the same keys (tensors or numbers)."""


class _Pointwise(_Container):
    """Elementwise functions (see `ParamDict`)."""

    __slots__ = ()

    def _run(self, fn: Kernel, /, *args: Any, **kwargs: Any) -> Self:
        """Run one foreach kernel over the entries; the result as a ParamDict."""
        return self._derive(apply(self, call, fn, *args, **kwargs))

    def sqrt(self) -> Self:
        """Return the elementwise square root (`torch.sqrt`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([4.0, 9.0])).sqrt()["w"]
            tensor([2., 3.])
        """
        return self._run(torch._foreach_sqrt, self._vals)

    def rsqrt(self) -> Self:
        """Return the elementwise reciprocal square root (`torch.rsqrt`).

        One `torch._foreach_pow` call with exponent `-0.5`, which every supported
        torch has (`torch._foreach_rsqrt` exists from torch 2.6 on).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If an entry is sparse (`torch.rsqrt` takes dense tensors),
                or torch refuses an entry's kind here: the message names it.

        Example:
            >>> ParamDict(w=torch.tensor([4.0])).rsqrt()["w"]
            tensor([0.5000])
        """
        sparse = sorted(k for k, v in self.items() if v.layout != torch.strided)
        if sparse:  # `pow` would keep a sparse tensor's zeros, not make them inf
            msg = (
                f"`rsqrt` takes dense entries, as `torch.rsqrt` does; {sparse!r} are "
                "not. Convert them with `.to_dense()` first."
            )
            raise TypeError(msg)
        return self._run(torch._foreach_pow, self._vals, -0.5)

    def exp(self) -> Self:
        """Return the elementwise exponential (`torch.exp`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([0.0])).exp()["w"]
            tensor([1.])
        """
        return self._run(torch._foreach_exp, self._vals)

    def log(self) -> Self:
        """Return the elementwise natural logarithm (`torch.log`).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([1.0])).log()["w"]
            tensor([0.])
        """
        return self._run(torch._foreach_log, self._vals)

    def sign(self) -> Self:
        """Return the elementwise sign (`torch.sign`) as a new ParamDict.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 0.0, 3.0])).sign()["w"]
            tensor([-1.,  0.,  1.])
        """
        return self._run(torch._foreach_sign, self._vals)

    def abs(self) -> Self:
        """Return the elementwise absolute value (`torch.abs`); same as `abs(p)`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 3.0])).abs()["w"]
            tensor([2., 3.])
        """
        return self._run(torch._foreach_abs, self._vals)

    def neg(self) -> Self:
        """Return the elementwise negation (`torch.neg`); same as `-p`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([1.0])).neg()["w"]
            tensor([-1.])
        """
        return self._run(torch._foreach_neg, self._vals)

    def reciprocal(self) -> Self:
        """Return the elementwise reciprocal `1 / p` (`torch.reciprocal`).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            TypeError: If torch refuses an entry's kind here (a sparse or boolean
                entry, ...): the message names it and gives torch's reason.

        Example:
            >>> ParamDict(w=torch.tensor([4.0])).reciprocal()["w"]
            tensor([0.2500])
        """
        return self._run(torch._foreach_reciprocal, self._vals)

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
            ValueError: If neither bound is given, a mapping's keys differ, or a
                number bound is one the entries' dtype cannot hold.
            TypeError: If a bound is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, complex, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 0.5, 3.0])).clamp(-1, 1)["w"]
            tensor([-1.0000,  0.5000,  1.0000])
        """
        if min is None and max is None:
            msg = "`clamp` needs at least one of `min` and `max`."
            raise ValueError(msg)
        bounds = [
            (kernel, operand_or_raise(self, bound, f"`clamp`'s `{name}`"), name)
            for kernel, bound, name in (
                (torch._foreach_clamp_min, min, "min"),
                (torch._foreach_clamp_max, max, "max"),
            )
            if bound is not None
        ]
        for _, arg, name in bounds:
            if is_number(arg):  # torch converts it to the entries' dtype
                check_fits(arg, {v.dtype for v in self._vals}, f"`clamp`'s `{name}`")
        out: Self = self
        for kernel, arg, _ in bounds:
            out = out._run(kernel, out._vals, arg)
        return out

    def maximum(self, other: Operand, /) -> Self:
        """Return the elementwise maximum with `other`, like `torch.maximum`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                a number is one the entries' dtype cannot hold.
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, complex, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).maximum(2)["w"]
            tensor([2., 5.])
        """
        arg = operand_or_raise(self, other, "`maximum`")
        if is_number(arg):  # torch converts it to the entries' dtype
            check_fits(arg, {v.dtype for v in self._vals}, "`maximum`")
        return self._run(torch._foreach_maximum, self._vals, arg)

    def minimum(self, other: Operand, /) -> Self:
        """Return the elementwise minimum with `other`, like `torch.minimum`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If a mapping's keys differ, an entry does not broadcast, or
                a number is one the entries' dtype cannot hold.
            TypeError: If `other` is not a number, 0-dim tensor or mapping, or
                torch refuses an entry's kind here (sparse, complex, ...): the
                message names the entries.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).minimum(2)["w"]
            tensor([1., 2.])
        """
        arg = operand_or_raise(self, other, "`minimum`")
        if is_number(arg):  # torch converts it to the entries' dtype
            check_fits(arg, {v.dtype for v in self._vals}, "`minimum`")
        return self._run(torch._foreach_minimum, self._vals, arg)

    def where(self, condition: Mapping[str, Tensor], /, other: Operand) -> Self:
        """Return `self` where `condition` holds and `other` elsewhere (`torch.where`).

        Torch has no foreach `where`, so this is one `torch.where` per entry.

        Args:
            condition: A mapping of boolean tensors with the same keys.
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If the keys differ, an entry does not broadcast, or a
                number `other` is one the entries' dtype cannot hold.
            TypeError: If `condition` holds other than boolean tensors, `other` is
                not a number, 0-dim tensor or mapping, or torch refuses an entry's
                kind here (sparse, ...): the message names the entries.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, -1.0]))
            >>> p.where({"w": torch.tensor([True, False])}, 0.0)["w"]
            tensor([1., 0.])
        """
        conds = self._aligned(condition, what="`where`'s `condition`")
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
        arg = operand_or_raise(self, other, "`where`'s `other`")
        if is_number(arg):  # torch converts it to the entries' dtype
            check_fits(arg, {v.dtype for v in self._vals}, "`where`'s `other`")
        others = arg if isinstance(arg, list) else [arg] * len(self)
        return self._derive(apply(self, where, conds, self._vals, others))
