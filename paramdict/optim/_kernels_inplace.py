"""The in-place implementation of the kernel vocabulary (the base of `step_`).

See `_kernels.py` for the vocabulary and its functional implementation.
"""

from __future__ import annotations

# pyright: reportPrivateImportUsage=false, reportPrivateUsage=false
# (torch's in-place foreach kernels have private names only; `_aligned` is
# ParamDict's own package-internal alignment)
from collections.abc import Callable, Mapping
from typing import TypeGuard

import torch
from torch import Tensor
from typing_extensions import override

from .._foreach import copy_, holds_dtensors
from .._paramdict import ParamDict
from ._hyper import Rate
from ._kernels import Kernels, P

__all__ = ["InPlaceKernels"]


def _values(x: ParamDict) -> list[Tensor]:
    return list(x.values())


def _on_cpu(value: Rate, x: ParamDict) -> TypeGuard[Tensor]:
    """Whether `value` is a 0-dim tensor and `x`'s entries are plain CPU tensors.

    DTensor entries are left out: a scalar-list kernel with a plain tensor beside
    them mixes tensor kinds, which DTensor refuses.
    """
    return (
        isinstance(value, Tensor)
        and value.device.type == "cpu"
        and all(v.device.type == "cpu" for v in x.values())
        and not holds_dtensors(x._vals)
    )


class InPlaceKernels(Kernels):
    """The in-place vocabulary: results are written into owned first operands.

    `own(...)` names the ParamDicts whose tensors may be overwritten (the
    parameters and the state's buffers); everything an operation makes out of
    place is owned too. An operation whose first operand is owned writes into it
    and returns its tensors as a new ParamDict; the operand is then spent, and
    passing it as a first operand again raises (borrow it with `ops.borrowed`
    where its old value is still needed). Any other runs out of place. Results are
    bitwise those of `Kernels`. Runs under `torch.no_grad()` only.

    Args:
        dtype: As for `Kernels`.
        device: As for `Kernels`.

    Example:
        >>> from paramdict import optim
        >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
        >>> ops = optim.InPlaceKernels.for_params(p)
        >>> ops.own(p)
        >>> w = p["w"]
        >>> ops.mul(p, 0.5)["w"] is w, w
        (True, tensor([0.5000, 2.0000]))
        >>> ops.mul(p, 2.0)  # `p`'s old value is gone: borrow what is still needed
        Traceback (most recent call last):
        ...
        ValueError: A kernel got as its first operand a ParamDict that ...
    """

    __slots__ = ("_owned", "_spent")

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        super().__init__(dtype, device)
        # id -> object, so an id is never reused while this step runs.
        self._owned: dict[int, ParamDict] = {}
        # The ParamDicts an operation wrote into: their old values are gone.
        self._spent: dict[int, ParamDict] = {}

    def own(self, *values: object) -> None:
        """Allow writing into the tensors of each ParamDict among `values`.

        Args:
            values: The parameters and the state's fields; what is not a
                ParamDict (the step counter) is skipped.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> ops = optim.InPlaceKernels.for_params(p)
            >>> ops.own(p, torch.tensor(0.0))
            >>> ops.neg(p)["w"] is p["w"]
            True
        """
        for value in values:
            if isinstance(value, ParamDict):
                self._owned[id(value)] = value

    def _mine(self, x: ParamDict) -> bool:
        if id(x) in self._spent:
            msg = (
                "A kernel got as its first operand a ParamDict that an earlier "
                "operation of this step consumed (wrote its result into), so its "
                "old value is gone. Pass `ops.borrowed(x)` to the operation that "
                "still needs `x` afterwards, or use the value it returned."
            )
            raise ValueError(msg)
        # An empty operand (Adafactor's factored buffers when no entry is a
        # matrix) takes the functional path: torch's foreach kernels refuse
        # empty lists.
        return bool(x) and id(x) in self._owned

    def _spend(self, x: P) -> P:
        """Return `x`'s tensors, just written, as a new owned ParamDict; spend `x`."""
        del self._owned[id(x)]
        self._spent[id(x)] = x
        return self._made(x._derive(_values(x)))

    def _made(self, x: P) -> P:
        self._owned[id(x)] = x
        return x

    def _copied(self, x: P, result: ParamDict) -> P:
        copy_(_values(x), _values(result))
        return self._spend(x)

    @override
    def borrowed(self, x: P, /) -> P:
        return type(x)(x)

    @override
    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        out = super().subset(x, keys)
        return self._made(out) if self._mine(x) else out

    @override
    def neg(self, x: P, /) -> P:
        if not self._mine(x):
            return self._made(super().neg(x))
        torch._foreach_neg_(_values(x))
        return self._spend(x)

    @override
    def mul(self, x: P, rate: Rate, /) -> P:
        if not self._mine(x):
            return self._made(super().mul(x, rate))
        if isinstance(rate, ParamDict):
            return self._copied(x, super().mul(x, rate))
        torch._foreach_mul_(_values(x), self.scalar(rate))
        return self._spend(x)

    @override
    def div(self, x: P, value: float | Tensor | ParamDict, /) -> P:
        if not self._mine(x):
            return self._made(super().div(x, value))
        if isinstance(value, ParamDict):
            torch._foreach_div_(_values(x), x._aligned(value, what="`div`"))
            return self._spend(x)
        torch._foreach_div_(_values(x), self.scalar(value))
        return self._spend(x)

    @override
    def add(self, x: P, value: float | Tensor, /) -> P:
        if not self._mine(x):
            return self._made(super().add(x, value))
        torch._foreach_add_(_values(x), self.scalar(value))
        return self._spend(x)

    @override
    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        if not self._mine(x):
            return self._made(super().add_scaled(x, y, rate))
        if isinstance(rate, (Tensor, ParamDict)):
            return self._copied(x, super().add_scaled(x, y, rate))
        torch._foreach_add_(_values(x), x._aligned(y, what="`add_scaled`"), alpha=rate)
        return self._spend(x)

    @override
    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        if not self._mine(x):
            return self._made(super().sub_scaled(x, y, rate))
        if isinstance(rate, (Tensor, ParamDict)):
            return self._copied(x, super().sub_scaled(x, y, rate))
        ys = x._aligned(y, what="`sub_scaled`")
        torch._foreach_add_(_values(x), ys, alpha=-rate)
        return self._spend(x)

    @override
    def lerp(self, x: P, end: ParamDict, weight: float | Tensor, /) -> P:
        if not self._mine(x):
            return self._made(super().lerp(x, end, weight))
        values, ends = _values(x), x._aligned(end, what="`lerp`")
        if isinstance(weight, Tensor):  # a cycled momentum: one weight per entry
            torch._foreach_lerp_(values, ends, [weight] * len(values))
        else:
            torch._foreach_lerp_(values, ends, weight)
        return self._spend(x)

    @override
    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        if not self._mine(x):
            return self._made(super().addcmul(x, a, b, value))
        what = "`addcmul`"
        torch._foreach_addcmul_(
            _values(x), x._aligned(a, what=what), x._aligned(b, what=what), value
        )
        return self._spend(x)

    @override
    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        if self.dtype is not None and _on_cpu(value, x):
            # With float32 or float64 entries, a 0-dim CPU value goes to the
            # kernel as one scalar per entry, read
            # on the host: bitwise `a * value` first (the kernel rounds the value
            # to the entries' dtype and multiplies before dividing), without that
            # extra pass over memory (24 -> 16 passes of an Adam step at 50 x
            # 400,000, about 20% of it).
            what = "`addcdiv`"
            scalars = value.repeat(len(x))
            ys, zs = x._aligned(a, what=what), x._aligned(b, what=what)
            if not self._mine(x):
                values = torch._foreach_addcdiv(_values(x), ys, zs, scalars)
                return self._made(x._derive(values))
            torch._foreach_addcdiv_(_values(x), ys, zs, scalars)
            return self._spend(x)
        if not self._mine(x):
            return self._made(super().addcdiv(x, a, b, value))
        if isinstance(value, (Tensor, ParamDict)):
            a = Kernels.mul(self, a, value)
            value = 1
        what = "`addcdiv`"
        torch._foreach_addcdiv_(
            _values(x), x._aligned(a, what=what), x._aligned(b, what=what), value
        )
        return self._spend(x)

    @override
    def sqrt(self, x: P, /) -> P:
        if not self._mine(x):
            return self._made(super().sqrt(x))
        torch._foreach_sqrt_(_values(x))
        return self._spend(x)

    @override
    def sign(self, x: P, /) -> P:
        if not self._mine(x):
            return self._made(super().sign(x))
        torch._foreach_sign_(_values(x))
        return self._spend(x)

    @override
    def maximum(self, x: P, other: ParamDict, /) -> P:
        if not self._mine(x):
            return self._made(super().maximum(x, other))
        values = _values(x)
        if holds_dtensors(values):
            return self._copied(x, super().maximum(x, other))
        # One pass instead of a new result and a copy (Adamax, AMSGrad).
        torch._foreach_maximum_(values, x._aligned(other, what="`maximum`"))
        return self._spend(x)

    @override
    def abs(self, x: P, /) -> P:
        if not self._mine(x):
            return self._made(super().abs(x))
        torch._foreach_abs_(_values(x))
        return self._spend(x)

    @override
    def reciprocal(self, x: P, /) -> P:
        if not self._mine(x):
            return self._made(super().reciprocal(x))
        torch._foreach_reciprocal_(_values(x))
        return self._spend(x)

    @override
    def clamp(self, x: P, min: float, max: float, /) -> P:  # torch's names
        if not self._mine(x):
            return self._made(super().clamp(x, min, max))
        torch._foreach_clamp_min_(_values(x), min)
        torch._foreach_clamp_max_(_values(x), max)
        return self._spend(x)

    @override
    def masked_fill(self, x: P, mask: ParamDict, value: float, /) -> P:
        if not self._mine(x):
            return self._made(super().masked_fill(x, mask, value))
        for v, m in zip(_values(x), x._aligned(mask, what="`masked_fill`")):
            v.masked_fill_(m, value)
        return self._spend(x)

    @override
    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        if not self._mine(x):
            return self._made(super().where(condition, x, other))
        return self._copied(x, super().where(condition, x, other))

    @override
    def sub_scaled_by_key(
        self, x: P, y: ParamDict, rates: Mapping[str, float | Tensor], /
    ) -> P:
        if not self._mine(x):
            return self._made(super().sub_scaled_by_key(x, y, rates))
        return self._copied(x, super().sub_scaled_by_key(x, y, rates))

    @override
    def orthogonalize(
        self, x: P, coefficients: tuple[float, float, float], steps: int, eps: float, /
    ) -> P:
        if not self._mine(x):
            return self._made(super().orthogonalize(x, coefficients, steps, eps))
        return self._copied(x, super().orthogonalize(x, coefficients, steps, eps))

    @override
    def apply(self, x: P, fn: Callable[..., Tensor], /, *others: ParamDict) -> P:
        if not self._mine(x):
            return self._made(super().apply(x, fn, *others))
        return self._copied(x, super().apply(x, fn, *others))
