"""The in-place implementation of the kernel vocabulary (the base of `step_`).

See `_vocabulary.py` for the vocabulary and its functional implementation.
"""

from __future__ import annotations

# pyright: reportPrivateImportUsage=false, reportPrivateUsage=false
# (torch's in-place foreach kernels have private names only; `_aligned` is
# ParamDict's own package-internal alignment)
import weakref
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeGuard, cast

import torch
from torch import Tensor
from typing_extensions import override

from .._foreach import copy_, holds_dtensors
from .._paramdict import ParamDict
from ._hyper import Rate
from ._vocabulary import Kernels, P

__all__ = ["InPlaceKernels"]


def _values(x: ParamDict) -> list[Tensor]:
    """`x`'s values in key order: its own list, which nothing here mutates."""
    return x._vals


def _on_device_of(scalar: Tensor, values: list[Tensor]) -> bool:
    """Whether the 0-dim `scalar` is on the accelerator of plain `values`, eagerly."""
    return (
        bool(values)
        and not scalar.is_cpu
        and scalar.dim() == 0
        and scalar.device == values[0].device
        and not torch.compiler.is_compiling()
        and not holds_dtensors(values)
    )


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


def _alike(x: ParamDict, y: ParamDict) -> bool:
    """Whether `y` has `x`'s keys, and each entry `x`'s shape and dtype."""
    return x.keys() == y.keys() and all(
        v.shape == y[k].shape and v.dtype == y[k].dtype for k, v in x.items()
    )


def _listed(table: dict[int, weakref.ref[ParamDict]], x: ParamDict) -> bool:
    """Whether `table` lists `x` itself (not a dead object that had its id)."""
    ref = table.get(id(x))
    return ref is not None and ref() is x


def _refuse_spent() -> NoReturn:
    msg = (
        "A kernel got as its first operand a ParamDict that an earlier operation "
        "of this step consumed (wrote its result into), so its old value is gone. "
        "Pass `ops.borrowed(x)` to the operation that still needs `x` afterwards, "
        "or use the value it returned."
    )
    raise ValueError(msg)


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
        # id -> weak reference: a ParamDict counts while it is alive and is that
        # object (an id can be reused once it is gone), and no temporary of the
        # step is kept alive by being listed (its memory is freed when the rule
        # drops it, as torch frees its temporaries).
        self._owned: dict[int, weakref.ref[ParamDict]] = {}
        # The ParamDicts an operation wrote into: their old values are gone.
        self._spent: dict[int, weakref.ref[ParamDict]] = {}

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
                self._owned[id(value)] = weakref.ref(value)

    def _mine(self, x: ParamDict) -> bool:
        if _listed(self._spent, x):
            _refuse_spent()
        # An empty operand (Adafactor's factored buffers when no entry is a
        # matrix) takes the functional path: torch's foreach kernels refuse
        # empty lists.
        return bool(x) and _listed(self._owned, x)

    def _spend(self, x: P) -> P:
        """Return `x`'s tensors, just written, as a new owned ParamDict; spend `x`."""
        self._spent[id(x)] = self._owned.pop(id(x))
        return self._made(x._twin())

    def _made(self, x: P) -> P:
        self._owned[id(x)] = weakref.ref(x)
        return x

    def _into(
        self,
        x: P,
        functional: Callable[[], P],
        kernel: Callable[[list[Tensor]], object] | None = None,
    ) -> P:
        """Return `functional()`, written into `x` when `x` is owned.

        Owned, `x` is spent: `kernel` writes into its tensors, or without one
        the functional result is copied into them. Else the result is new.
        """
        # `_mine` and `_made` inline: this runs for every operation of a step,
        # and at small sizes its calls are a step's overhead.
        key = id(x)
        owned = self._owned
        spent = self._spent.get(key)
        if spent is not None and spent() is x:
            _refuse_spent()
        mine = owned.get(key)
        if not x or mine is None or mine() is not x:
            made = functional()
            owned[id(made)] = weakref.ref(made)
            return made
        if kernel is None:
            copy_(x._vals, functional()._vals)
        else:
            kernel(x._vals)
        del owned[key]
        self._spent[key] = mine
        twin = x._twin()
        owned[id(twin)] = weakref.ref(twin)
        return twin

    @override
    def borrowed(self, x: P, /) -> P:
        return x._twin()  # another object, so not owned: read, never written

    @override
    def copy(self, x: P, source: ParamDict, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            copy_(values, x._aligned(source, what="`copy`"))

        return self._into(x, lambda: Kernels.copy(self, x, source), kernel)

    @override
    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        out = super().subset(x, keys)
        return self._made(out) if self._mine(x) else out

    @override
    def neg(self, x: P, /) -> P:
        return self._into(x, lambda: Kernels.neg(self, x), torch._foreach_neg_)

    @override
    def sqrt(self, x: P, /) -> P:
        return self._into(x, lambda: Kernels.sqrt(self, x), torch._foreach_sqrt_)

    @override
    def sign(self, x: P, /) -> P:
        return self._into(x, lambda: Kernels.sign(self, x), torch._foreach_sign_)

    @override
    def abs(self, x: P, /) -> P:
        return self._into(x, lambda: Kernels.abs(self, x), torch._foreach_abs_)

    @override
    def reciprocal(self, x: P, /) -> P:
        kernel = torch._foreach_reciprocal_
        return self._into(x, lambda: Kernels.reciprocal(self, x), kernel)

    @override
    def mul(self, x: P, rate: Rate, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            if isinstance(rate, ParamDict):
                torch._foreach_mul_(values, x._aligned(rate, what="`mul`"))
            else:
                torch._foreach_mul_(values, self.scalar(rate))

        # A per-key rate of other shapes or dtypes broadcasts or promotes: the
        # product is made out of place and copied, rounded as `Kernels.mul`.
        fits = not isinstance(rate, ParamDict) or _alike(x, rate)
        return self._into(
            x, lambda: Kernels.mul(self, x, rate), kernel if fits else None
        )

    @override
    def div(self, x: P, value: float | Tensor | ParamDict, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            if by_key is not None:
                torch._foreach_div_(values, x._aligned(by_key, what="`div`"))
            else:
                torch._foreach_div_(values, self.scalar(cast("float | Tensor", value)))

        by_key = value if isinstance(value, ParamDict) else None

        return self._into(x, lambda: Kernels.div(self, x, value), kernel)

    @override
    def add(self, x: P, value: float | Tensor, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            scalar = self.scalar(value)
            if isinstance(scalar, Tensor) and _on_device_of(scalar, values):
                # `alpha` picks the `.Tensor` overload, which reads the scalar on
                # the device; without it torch reads it on the host as a number,
                # waiting for the device.
                torch._foreach_add_(values, scalar, alpha=1)
            else:
                torch._foreach_add_(values, scalar)

        return self._into(x, lambda: Kernels.add(self, x, value), kernel)

    @override
    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        return self._scaled(x, y, rate, lambda: Kernels.add_scaled(self, x, y, rate))

    @override
    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        minus = -rate if isinstance(rate, (int, float)) else rate
        return self._scaled(x, y, minus, lambda: Kernels.sub_scaled(self, x, y, rate))

    def _scaled(
        self, x: P, y: ParamDict, alpha: Rate, functional: Callable[[], P]
    ) -> P:
        """`add_scaled`, `sub_scaled`: a number `alpha` is one in-place kernel."""

        def kernel(values: list[Tensor]) -> None:
            ys = x._aligned(y, what="`add_scaled`")
            torch._foreach_add_(values, ys, alpha=cast(float, alpha))

        number = not isinstance(alpha, (Tensor, ParamDict))
        return self._into(x, functional, kernel if number else None)

    @override
    def lerp(self, x: P, end: ParamDict, weight: float | Tensor, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            ends = x._aligned(end, what="`lerp`")
            if isinstance(weight, Tensor):  # a cycled momentum: one weight per entry
                torch._foreach_lerp_(values, ends, [weight] * len(values))
            else:
                torch._foreach_lerp_(values, ends, weight)

        return self._into(x, lambda: Kernels.lerp(self, x, end, weight), kernel)

    @override
    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            ys, zs = x._aligned(a, what="`addcmul`"), x._aligned(b, what="`addcmul`")
            torch._foreach_addcmul_(values, ys, zs, value)

        return self._into(x, lambda: Kernels.addcmul(self, x, a, b, value), kernel)

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

        def kernel(values: list[Tensor]) -> None:
            # A tensor or per-key value multiplies `a` first, as in `Kernels`.
            numerator = a if number is not None else Kernels.mul(self, a, value)
            ys = x._aligned(numerator, what="`addcdiv`")
            zs = x._aligned(b, what="`addcdiv`")
            torch._foreach_addcdiv_(values, ys, zs, 1 if number is None else number)

        number = None if isinstance(value, (Tensor, ParamDict)) else value
        return self._into(x, lambda: Kernels.addcdiv(self, x, a, b, value), kernel)

    @override
    def clamp(self, x: P, min: float, max: float, /) -> P:  # torch's names
        def kernel(values: list[Tensor]) -> None:
            for v in values:  # one pass each, where the foreach kernels take two
                v.clamp_(min, max)

        return self._into(x, lambda: Kernels.clamp(self, x, min, max), kernel)

    @override
    def masked_fill(self, x: P, mask: ParamDict, value: float, /) -> P:
        def kernel(values: list[Tensor]) -> None:
            for v, m in zip(values, x._aligned(mask, what="`masked_fill`")):
                v.masked_fill_(m, value)

        return self._into(x, lambda: Kernels.masked_fill(self, x, mask, value), kernel)

    @override
    def maximum(self, x: P, other: ParamDict, /) -> P:
        def kernel(values: list[Tensor]) -> None:  # one pass (Adamax, AMSGrad)
            torch._foreach_maximum_(values, x._aligned(other, what="`maximum`"))

        # No in-place DTensor kernel: computed, then copied.
        in_place = None if holds_dtensors(_values(x)) else kernel
        return self._into(x, lambda: Kernels.maximum(self, x, other), in_place)

    # No in-place kernel: computed out of place, then copied into an owned `x`.

    @override
    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        return self._into(x, lambda: Kernels.where(self, condition, x, other))

    @override
    def sub_scaled_by_key(
        self, x: P, y: ParamDict, rates: Mapping[str, float | Tensor], /
    ) -> P:
        def kernel(values: list[Tensor]) -> None:
            for (k, v), old in zip(x.items(), values):
                rate = rates[k]
                if isinstance(rate, Tensor) and rate.dim() == 0:
                    rate = self.item(rate)
                if isinstance(rate, Tensor):  # as `Kernels`, written in place
                    old.sub_(y[k] * rate.to(v.dtype))
                else:
                    value = y[k]
                    if value.dtype != v.dtype:
                        value = value.to(v.dtype)
                    old.add_(value, alpha=-rate)

        return self._into(
            x, lambda: Kernels.sub_scaled_by_key(self, x, y, rates), kernel
        )

    @override
    def orthogonalize(
        self, x: P, coefficients: tuple[float, float, float], steps: int, eps: float, /
    ) -> P:
        return self._into(
            x, lambda: Kernels.orthogonalize(self, x, coefficients, steps, eps)
        )

    @override
    def apply(self, x: P, fn: Callable[..., Tensor], /, *others: ParamDict) -> P:
        return self._into(x, lambda: Kernels.apply(self, x, fn, *others))
