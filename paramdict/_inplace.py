"""In-place arithmetic: the `_`-suffixed twins of ParamDict's operations.

A ParamDict is an immutable mapping: its keys and the tensor objects it holds never
change. The tensors themselves are torch's, and these methods write into them, as
`Tensor.add_` writes into a tensor: `m.lerp_(g, 0.1)` is one
`torch._foreach_lerp_` over every entry, and returns `m` itself so that calls chain
(`v.mul_(beta2).addcmul_(g, g, value=1 - beta2)`). Operands take the forms of the
out-of-place methods (a number, a 0-dim tensor, or a mapping with the same keys);
the result keeps each entry's dtype, as torch's in-place operations do.

They are the vocabulary of optimizer rules (`paramdict.optim`): a rule writes into
the parameters and the state it is handed, and the optimizer decides whose tensors
those are (the caller's for `step_`, fresh copies for `step`, recorded copies with
`differentiable=True`), so every mode runs the same kernels on the same values.
Each method is one foreach kernel (two where torch has none that fits, noted on
the method). Under `torch.func.vmap`, where torch has no batching rule for the
in-place foreach kernels, the same operation runs entry by entry.
"""

# pyright: reportUnknownVariableType=false, reportUnknownArgumentType=false
# (operands are `Any` once `operand` has turned them into foreach arguments)

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from typing_extensions import Self

from ._checks import is_number
from ._foreach import call, call_
from ._fresh import OUT_OF_PLACE, rebind
from ._inplace_unary import _InPlaceUnary
from ._kernels import explain, hoisted, holds_tensors, operand_or_raise
from ._pointwise import Operand

__all__ = ["Rate"]

Rate = float | Tensor | Mapping[str, float | Tensor]
"""A multiplier: a number, a 0-dim tensor, or per-key values (a mapping)."""


def _entry_dtypes(values: list[Tensor], scalar: Tensor) -> list[Tensor]:
    """`scalar` (0-dim) in each entry's dtype, as type promotion reads it."""
    cast: dict[torch.dtype, Tensor] = {scalar.dtype: scalar}
    out: list[Tensor] = []
    for value in values:
        dtype = value.dtype
        if dtype not in cast:
            cast[dtype] = scalar.to(dtype)
        out.append(cast[dtype])
    return out


def _as_number(value: Tensor, values: list[Tensor]) -> bool:
    """Whether a 0-dim `value` may go to a kernel as the number it holds.

    Where reading it is free and autograd does not need it: a CPU tensor
    (beside entries on any device: torch.optim reads its rates on the host and
    hands the kernels numbers), eagerly, not requiring grad (entries that do
    are recorded with the number as a constant, as torch's differentiable
    steps record theirs).
    """
    return (
        value.dim() == 0
        and value.is_cpu
        and bool(values)
        and not torch.compiler.is_compiling()
        and not torch._C._functorch.is_functorch_wrapped_tensor(value)
        and not (torch.is_grad_enabled() and value.requires_grad)
    )


def _differ(made: Tensor, source: Tensor) -> bool:
    return made.dtype != source.dtype


def _numbers(scales: list[Any], values: list[Tensor]) -> list[float] | None:
    """`scales` as numbers where each is one or may be read as one, else None."""
    if not holds_tensors(scales):
        return scales
    if all(_as_number(s, values) for s in scales):
        return [s.item() for s in scales]
    return None


class _InPlace(_InPlaceUnary):
    """The in-place operations (see `ParamDict`)."""

    __slots__ = ()

    def _write(self, op: Any, /, *args: Any, **kwargs: Any) -> Self:
        """Run one in-place foreach kernel on the entries; return `self`."""
        if self._pending:
            return self._first_write(op, args, kwargs)
        if self._vals:
            try:
                call_(self._keys, op, self._vals, *args, **kwargs)
            except RuntimeError as err:
                explained = explain(self._keys, err, (self._vals, *args))
                if explained is err:
                    raise
                raise explained from err
        return self

    def _first_write(
        self, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Self:
        """`_write` on a container holding its sources: into new tensors (`_fresh`)."""
        sources = self._vals
        fresh = OUT_OF_PLACE.get(op)
        try:
            if fresh is not None:
                made = call(fresh, sources, *args, **kwargs)
            else:  # `zero_`, `copy_`: the in-place kernel on new tensors
                made = [torch.empty_like(v) for v in sources]
                call_(self._keys, op, made, *args, **kwargs)
        except RuntimeError as err:
            explained = explain(self._keys, err, (sources, *args))
            if explained is err:
                raise
            raise explained from err
        # An operand of a wider dtype (or, for a 0-dim entry, a 0-dim operand
        # of a wider one): the in-place kernel would have rounded the results
        # into the entries' dtypes, as this does. Entries of one dtype and none
        # 0-dim promote alike: the first tells.
        if made and (
            made[0].dtype != sources[0].dtype
            or (self._pending == 2 and any(map(_differ, made, sources)))
        ):
            made = [m.to(s.dtype) for m, s in zip(made, sources)]
        rebind(self, made)
        return self

    # ------------------------------------------------------------ linear

    def add_(self, other: Operand, /, *, alpha: Rate = 1) -> Self:
        """Add `alpha * other` into every entry (`Tensor.add_`); return `self`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.
            alpha: The multiplier of `other`: a number (one kernel, as
                `torch._foreach_add_(values, others, alpha=...)`), a 0-dim tensor
                (rounded as that number would be), or per-key values.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If an operand is of the wrong kind.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> w = p["w"]
            >>> p.add_(ParamDict(w=torch.ones(2)), alpha=-0.5)["w"] is w, w
            (True, tensor([0.5000, 1.5000]))
        """
        arg: Any = operand_or_raise(self, other, "`add_`")
        if is_number(alpha):
            if holds_tensors(arg):
                return self._write(torch._foreach_add_, arg, alpha=alpha)
            if alpha != 1:
                arg = [alpha * a for a in arg] if isinstance(arg, list) else alpha * arg
            return self._write(torch._foreach_add_, arg)
        if isinstance(alpha, Tensor) and _as_number(alpha, self._vals):
            # Read as the number it holds (free on the host), as torch.optim
            # reads a tensor rate outside autograd: `add`'s own `alpha`.
            return self.add_(other, alpha=alpha.item())
        if isinstance(alpha, Tensor):
            if alpha.dim() != 0:
                msg = (
                    "`add_`: `alpha` must be a number, a 0-dim tensor or per-key "
                    f"values, got a tensor of shape {tuple(alpha.shape)}."
                )
                raise TypeError(msg)
            alpha = hoisted(alpha)
            if holds_tensors(arg):
                # `x + y * alpha` in one kernel per entry: rounded as a number
                # `alpha` would be.
                scales = _entry_dtypes(self._vals, alpha)
                return self._write(torch._foreach_addcmul_, arg, scales)
            n = len(self._keys)
            scaled = (
                [alpha * a for a in arg] if isinstance(arg, list) else [alpha * arg] * n
            )
            return self._write(torch._foreach_add_, scaled)
        if isinstance(alpha, Mapping):
            scales = operand_or_raise(self, alpha, "`add_`")
            if not holds_tensors(arg):  # a number, or per-key numbers
                n = len(self._keys)
                plain: list[Any] = arg if isinstance(arg, list) else [arg] * n
                return self._write(
                    torch._foreach_add_, [s * a for s, a in zip(scales, plain)]
                )
            read = _numbers(scales, self._vals)
            if read is not None:
                # Per-key numbers (or 0-dim tensors read as theirs): each
                # entry's `add_(other, alpha=number)`, one kernel per entry,
                # rounded as torch.optim's per-parameter steps.
                if self._pending:  # into new tensors (`_fresh`)
                    rebind(
                        self,
                        [
                            torch.add(value, term, alpha=scale)
                            for value, term, scale in zip(self._vals, arg, read)
                        ],
                    )
                    return self
                for value, term, scale in zip(self._vals, arg, read):
                    value.add_(term, alpha=scale)
                return self
            return self._write(
                torch._foreach_add_, call(torch._foreach_mul, arg, scales)
            )
        msg = (
            "`add_`: `alpha` must be a number, a 0-dim tensor or per-key values, "
            f"got {type(alpha).__name__}."
        )
        raise TypeError(msg)

    def sub_(self, other: Operand, /, *, alpha: Rate = 1) -> Self:
        """Subtract `alpha * other` from every entry (`Tensor.sub_`); return `self`.

        `p.sub_(g, alpha=lr)` is the SGD step, one kernel for a number `lr`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.
            alpha: The multiplier of `other`, in any form `add_` takes.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If an operand is of the wrong kind.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> p.sub_(ParamDict(w=torch.ones(2)), alpha=0.5)["w"]
            tensor([0.5000, 1.5000])
        """
        if is_number(alpha):
            return self.add_(other, alpha=-alpha)
        if isinstance(alpha, Tensor):
            return self.add_(other, alpha=-alpha)
        if isinstance(alpha, Mapping):
            arg: Any = operand_or_raise(self, other, "`sub_`")
            scales = operand_or_raise(self, alpha, "`sub_`")
            if holds_tensors(arg) and holds_tensors(scales):
                read = _numbers(scales, self._vals)
                if read is None:
                    # Scales on a device: multiplied in one kernel, subtracted
                    # in another (negating each would take a kernel per entry).
                    return self._write(
                        torch._foreach_sub_, call(torch._foreach_mul, arg, scales)
                    )
                return self.add_(other, alpha={k: -r for k, r in zip(self._keys, read)})
            negated: Any = {k: -v for k, v in alpha.items()}
            return self.add_(other, alpha=negated)
        return self.add_(other, alpha=alpha)

    def mul_(self, other: Operand, /) -> Self:
        """Multiply every entry by `other` (`Tensor.mul_`); return `self`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is of the wrong kind.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).mul_(3.0)["w"]
            tensor([3., 6.])
        """
        return self._write(torch._foreach_mul_, operand_or_raise(self, other, "`mul_`"))

    def div_(self, other: Operand, /) -> Self:
        """Divide every entry by `other` (`Tensor.div_`); return `self`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `other` is of the wrong kind.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).div_(2.0)["w"]
            tensor([0.5000, 1.0000])
        """
        return self._write(torch._foreach_div_, operand_or_raise(self, other, "`div_`"))

    def pow_(self, exponent: Operand, /) -> Self:
        """Raise every entry to `exponent` (`Tensor.pow_`); return `self`.

        Args:
            exponent: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If a mapping's keys differ or an entry does not broadcast.
            TypeError: If `exponent` is of the wrong kind.

        Example:
            >>> ParamDict(w=torch.tensor([2.0, 3.0])).pow_(2)["w"]
            tensor([4., 9.])
        """
        arg = operand_or_raise(self, exponent, "`pow_`")
        return self._write(torch._foreach_pow_, arg)

    def lerp_(self, end: Mapping[str, Tensor], /, weight: Operand) -> Self:
        """Move every entry towards `end` by `weight` (`Tensor.lerp_`); return `self`.

        `m.lerp_(g, 1 - beta1)` is the running average of torch's Adam.

        Args:
            end: A mapping with the same keys.
            weight: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.
            TypeError: If `weight` is of the wrong kind.

        Example:
            >>> ParamDict(w=torch.zeros(2)).lerp_({"w": torch.ones(2)}, 0.25)["w"]
            tensor([0.2500, 0.2500])
        """
        ends = self._aligned(end, what="`lerp_`")
        w = operand_or_raise(self, weight, "`lerp_`")
        if isinstance(w, list) and not holds_tensors(w):
            w = [
                torch.as_tensor(x, dtype=v.dtype, device=v.device)
                for x, v in zip(w, self._vals)
            ]
        return self._write(torch._foreach_lerp_, ends, w)

    def _addc_(
        self,
        op: Any,
        t1: Mapping[str, Tensor],
        t2: Mapping[str, Tensor],
        value: Rate,
        what: str,
    ) -> Self:
        a = self._aligned(t1, what=what)
        b = self._aligned(t2, what=what)
        if isinstance(value, Tensor) and _as_number(value, self._vals):
            # Read as the number it holds (free on the host): one kernel,
            # rounded as that number, as torch.optim reads a tensor rate outside
            # autograd.
            return self._write(op, a, b, value.item())
        v = operand_or_raise(self, value, what)
        numbers = _numbers(v, self._vals) if isinstance(v, list) else None
        if not holds_tensors(v) or numbers is not None:
            return self._write(op, a, b, v if numbers is None else numbers)
        # A tensor `value` multiplies `tensor1` first, as torch.optim does with a
        # tensor rate (and autograd can differentiate it).
        return self._write(op, call(torch._foreach_mul, a, v), b)

    def addcmul_(
        self,
        tensor1: Mapping[str, Tensor],
        tensor2: Mapping[str, Tensor],
        /,
        *,
        value: Rate = 1,
    ) -> Self:
        """Add `value * tensor1 * tensor2` into every entry; return `self`.

        Args:
            tensor1: A mapping with the same keys.
            tensor2: A mapping with the same keys.
            value: A number (one `torch._foreach_addcmul_`), a 0-dim tensor or
                per-key values (which multiply `tensor1` first).

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> g = ParamDict(w=torch.tensor([2.0]))
            >>> ParamDict(w=torch.tensor([1.0])).addcmul_(g, g, value=0.5)["w"]
            tensor([3.])
        """
        return self._addc_(
            torch._foreach_addcmul_,
            tensor1,
            tensor2,
            value,
            "`addcmul_`",
        )

    def addcdiv_(
        self,
        tensor1: Mapping[str, Tensor],
        tensor2: Mapping[str, Tensor],
        /,
        *,
        value: Rate = 1,
    ) -> Self:
        """Add `value * tensor1 / tensor2` into every entry; return `self`.

        Args:
            tensor1: A mapping with the same keys.
            tensor2: A mapping with the same keys.
            value: A number (one `torch._foreach_addcdiv_`), a 0-dim tensor or
                per-key values (which multiply `tensor1` first).

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> a, b = ParamDict(w=torch.ones(1)), ParamDict(w=torch.tensor([4.0]))
            >>> ParamDict(w=torch.tensor([1.0])).addcdiv_(a, b, value=-0.2)["w"]
            tensor([0.9500])
        """
        return self._addc_(
            torch._foreach_addcdiv_,
            tensor1,
            tensor2,
            value,
            "`addcdiv_`",
        )

    # ------------------------------------------------------------ elementwise

    def maximum_(self, other: Operand, /) -> Self:
        """Replace every entry by its elementwise maximum with `other`; return `self`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).maximum_(2.0)["w"]
            tensor([2., 5.])
        """
        arg = operand_or_raise(self, other, "`maximum_`")
        return self._write(torch._foreach_maximum_, arg)

    def minimum_(self, other: Operand, /) -> Self:
        """Replace every entry by its elementwise minimum with `other`; return `self`.

        Args:
            other: A number, a 0-dim tensor, or a mapping with the same keys.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 5.0])).minimum_(2.0)["w"]
            tensor([1., 2.])
        """
        arg = operand_or_raise(self, other, "`minimum_`")
        return self._write(torch._foreach_minimum_, arg)

    def clamp_(
        self,
        min: Operand | None = None,  # torch.clamp_'s argument name
        max: Operand | None = None,  # torch.clamp_'s argument name
    ) -> Self:
        """Clamp every entry to `[min, max]` (`Tensor.clamp_`); return `self`.

        Args:
            min: Lower bound: a number, a 0-dim tensor or per-key values; or `None`.
            max: Upper bound, in the same forms; or `None`.

        Returns:
            `self`, its tensors updated.

        Raises:
            ValueError: If neither bound is given.

        Example:
            >>> ParamDict(w=torch.tensor([-2.0, 0.5, 3.0])).clamp_(-1, 1)["w"]
            tensor([-1.0000,  0.5000,  1.0000])
        """
        if min is None and max is None:
            msg = "`clamp_` needs at least one of `min` and `max`."
            raise ValueError(msg)
        if min is not None:
            arg = operand_or_raise(self, min, "`clamp_`")
            self._write(torch._foreach_clamp_min_, arg)
        if max is not None:
            arg = operand_or_raise(self, max, "`clamp_`")
            self._write(torch._foreach_clamp_max_, arg)
        return self

    def copy_(self, source: Mapping[str, Tensor], /) -> Self:
        """Copy `source`'s values into the entries (`Tensor.copy_`); return `self`.

        Args:
            source: A mapping with the same keys; each value broadcasts to its
                entry (and is converted to its dtype).

        Returns:
            `self`, its tensors holding `source`'s values.

        Raises:
            ValueError: If the keys differ or an entry does not broadcast.

        Example:
            >>> p = ParamDict(w=torch.zeros(2))
            >>> p.copy_({"w": torch.tensor([1.0, 2.0])})["w"]
            tensor([1., 2.])
        """
        sources = self._aligned(source, what="`copy_`")
        if torch.is_grad_enabled() and any(
            t.requires_grad for t in (*self._vals, *sources)
        ):
            # Recorded: `_foreach_copy_` has no derivative, each `copy_` has.
            if self._pending:
                made = [torch.empty_like(t) for t in self._vals]
                for target, value in zip(made, sources):
                    target.copy_(value)
                rebind(self, made)
                return self
            for target, value in zip(self._vals, sources):
                target.copy_(value)
            return self
        return self._write(torch._foreach_copy_, sources)
