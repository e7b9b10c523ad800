"""Per-tensor operations: detach, clone, conversion, gradient flags, `*_like`, `map`.

Each applies one tensor operation to every value and returns a new ParamDict with the
same keys, leaving `self` unchanged; the one exception is `requires_grad_`, which,
like torch's, sets a flag on the tensors in place.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar, overload

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import (
    check_flag,
    describe_kind,
    first_sentence,
    is_float_or_complex,
)
from ._container import _Container

__all__ = ["Device"]

Device: TypeAlias = torch.device | str | int
"""A device, as `Tensor.to` accepts it: `torch.device("cuda:0")`, `"cpu"` or `0`."""

_T = TypeVar("_T")
_V = TypeVar("_V")
_W = TypeVar("_W")


def _note(err: BaseException, key: str, what: str) -> None:
    if sys.version_info >= (3, 11):
        err.add_note(f"(raised by `{what}` for the entry {key!r})")


class _Tensors(_Container):
    """`detach`, `clone`, `to`, `requires_grad_` and `map` (`*_like`: `_likes.py`)."""

    __slots__ = ()

    def _each(self, fn: Callable[[Tensor], Tensor], what: str) -> Self:
        """Apply `fn` to every value, naming the entry if torch refuses one.

        torch's `RuntimeError` becomes a `ValueError`, its `TypeError` (arguments
        of the wrong kind) a `TypeError`, each naming the entry.
        """
        out: list[Tensor] = []
        for key, value in self.items():
            try:
                out.append(fn(value))
            except (RuntimeError, TypeError) as err:
                kind = TypeError if isinstance(err, TypeError) else ValueError
                msg = (
                    f"`{what}` failed for the entry {key!r} "
                    f"({describe_kind(value)}): {first_sentence(err)}"
                )
                raise kind(msg) from err
        return self._derive(out)

    # ------------------------------------------------------------ graph and copies

    def detach(self) -> Self:
        """Return the values detached from the autograd graph (`Tensor.detach`).

        The results share storage with the originals and do not require grad;
        `self` is unchanged. For fresh leaves to differentiate with respect to,
        use `p.detach().requires_grad_()`.

        Returns:
            A new ParamDict with the same keys.

        Example:
            >>> w = torch.ones(2, requires_grad=True)
            >>> ParamDict(w=w * 2).detach()["w"].requires_grad
            False
        """
        return self._derive([v.detach() for v in self.values()])

    def clone(
        self, *, memory_format: torch.memory_format = torch.preserve_format
    ) -> Self:
        """Return copies of the values (`Tensor.clone`), differentiable.

        Args:
            memory_format: The memory format of the copies, as for `Tensor.clone`.

        Returns:
            A new ParamDict of new tensors with the same keys; `self` is unchanged.

        Example:
            >>> p = ParamDict(w=torch.ones(2))
            >>> q = p.clone()
            >>> q["w"] is p["w"], torch.equal(q["w"], p["w"])
            (False, True)
        """
        if memory_format is torch.preserve_format:  # sparse tensors take no format
            return self._derive([v.clone() for v in self.values()])
        return self._each(lambda v: v.clone(memory_format=memory_format), "clone")

    @overload
    def to(
        self,
        dtype: torch.dtype,
        non_blocking: bool = False,
        copy: bool = False,
        *,
        memory_format: torch.memory_format | None = None,
    ) -> Self: ...

    @overload
    def to(
        self,
        device: Device | None = None,
        dtype: torch.dtype | None = None,
        non_blocking: bool = False,
        copy: bool = False,
        *,
        memory_format: torch.memory_format | None = None,
    ) -> Self: ...

    @overload
    def to(
        self,
        other: Tensor,
        non_blocking: bool = False,
        copy: bool = False,
        *,
        memory_format: torch.memory_format | None = None,
    ) -> Self: ...

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Return every value converted by `Tensor.to(*args, **kwargs)`.

        Takes exactly what `Tensor.to` takes (a dtype, a device, both, or a tensor
        to match) and applies it to every entry, integer ones included (unlike
        `nn.Module.to(dtype)`, which leaves them; `.select(...)` the floating
        entries first if that is what you want). As with `Tensor.to`, a value
        that already matches is returned as is, not copied, unless `copy=True`;
        conversions are differentiable.

        Args:
            *args: What `Tensor.to` takes positionally: a dtype, a device, a
                device and a dtype, or a tensor whose device and dtype to match.
            **kwargs: `Tensor.to`'s keyword arguments (`dtype`, `device`,
                `non_blocking`, `copy`, `memory_format`).

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If torch refuses the conversion of an entry (named, with
                torch's reason).
            TypeError: If torch refuses the arguments (named with the first
                entry).

        Example:
            >>> p = ParamDict(w=torch.ones(2))
            >>> p.to(torch.float64)["w"].dtype
            torch.float64
            >>> p.to("cpu")["w"] is p["w"]
            True
        """
        return self._each(lambda v: v.to(*args, **kwargs), "to")

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Set `requires_grad` on every value in place, like `Tensor.requires_grad_`.

        The one in-place operation of ParamDict, named and behaving as in torch:
        the mapping is unchanged, but its tensors' flags are set, so a ParamDict
        read with `from_module` freezes or unfreezes the module's parameters. It
        returns `self`. Everything is checked before any flag changes. For new
        leaves that leave the originals alone, use `p.detach().requires_grad_()`.

        Args:
            requires_grad: The flag to set.

        Returns:
            `self`, the same object.

        Raises:
            ValueError: If an entry cannot take the flag: an integer or boolean
                tensor cannot require grad, and a non-leaf tensor (the result of an
                operation) cannot stop requiring it. The message names the entries;
                no flag has changed.
            TypeError: If `requires_grad` is not a bool.

        Example:
            >>> p = ParamDict(w=torch.ones(2))
            >>> p.requires_grad_() is p, p["w"].requires_grad
            (True, True)
        """
        check_flag(requires_grad, "requires_grad", "requires_grad_")
        if requires_grad:
            bad = sorted(k for k, v in self.items() if not is_float_or_complex(v))
            reason = "only floating point and complex tensors can require grad"
            fix = "Leave them out with `.exclude(...)` or convert them with `.to(...)`."
        else:
            bad = sorted(k for k, v in self.items() if not v.is_leaf)
            reason = "they are results of operations, not leaves"
            fix = "Use `.detach()` for copies that do not require grad."
        if bad:
            msg = f"`requires_grad_` cannot set the flag on {bad!r}: {reason}. {fix}"
            raise ValueError(msg)
        for value in self.values():
            value.requires_grad_(requires_grad)
        return self

    # ------------------------------------------------------------ map

    def _gather(
        self, fn: Callable[..., _T], others: tuple[Mapping[str, Any], ...], what: str
    ) -> list[_T]:
        given: object = fn  # checked at run time
        if not callable(given):
            msg = f"`{what}` takes a function as `fn`, got {type(given).__name__}."
            raise TypeError(msg)
        columns = [self._aligned(o, what=f"`{what}`") for o in others]
        rows = zip(self._keys, self.values(), *columns)
        out: list[_T] = []
        for key, value, *more in rows:
            try:
                out.append(fn(value, *more))
            except Exception as err:
                _note(err, key, what)
                raise
        return out

    @overload
    def map(self, fn: Callable[[Tensor], Tensor], /) -> Self: ...

    @overload
    def map(
        self, fn: Callable[[Tensor, _V], Tensor], other: Mapping[str, _V], /
    ) -> Self: ...

    @overload
    def map(
        self,
        fn: Callable[[Tensor, _V, _W], Tensor],
        other: Mapping[str, _V],
        another: Mapping[str, _W],
        /,
    ) -> Self: ...

    @overload
    def map(
        self,
        fn: Callable[..., Tensor],
        other: Mapping[str, Any],
        another: Mapping[str, Any],
        yet_another: Mapping[str, Any],
        /,
        *others: Mapping[str, Any],
    ) -> Self: ...

    def map(self, fn: Callable[..., Tensor], /, *others: Mapping[str, Any]) -> Self:
        """Return `fn(value, *matching_values)` for every key, as a new ParamDict.

        For operations without a fused method: `p.map(torch.tanh)`, or with
        others, `p.map(torch.lerp, q, w)`. `fn` runs once per entry in `self`'s
        order, with the values of `others` under the same key (their key order
        may differ). It must return a tensor; for other results use
        `map_to_dict`.

        Args:
            fn: A function of one value and the matching values of `others`.
            *others: Mappings with the same keys as `self` (of tensors or of
                anything `fn` takes).

        Returns:
            A new ParamDict with the same keys; `self` and `others` are unchanged.

        Raises:
            ValueError: If the keys of an `others` mapping differ (named).
            TypeError: If `fn` is not callable, or returns something other than a
                tensor (the message names the entries). An exception raised by
                `fn` propagates unchanged (with a note naming the entry on
                Python 3.11+).

        Example:
            >>> p = ParamDict(w=torch.tensor([0.0, 1.0]))
            >>> p.map(torch.maximum, {"w": torch.tensor([0.5, 0.5])})["w"]
            tensor([0.5000, 1.0000])
        """
        out: list[object] = self._gather(fn, others, "map")
        tensors = [r for r in out if isinstance(r, Tensor)]
        if len(tensors) != len(out):
            bad = sorted(
                (k, type(r).__name__)
                for k, r in zip(self._keys, out)
                if not isinstance(r, Tensor)
            )
            kinds = ", ".join(f"{k!r}: {kind}" for k, kind in bad)
            msg = (
                f"`map` needs `fn` to return tensors, got {kinds}. Use "
                "`map_to_dict` to collect other results in a plain dict."
            )
            raise TypeError(msg)
        return self._derive(tensors)

    @overload
    def map_to_dict(self, fn: Callable[[Tensor], _T], /) -> dict[str, _T]: ...

    @overload
    def map_to_dict(
        self, fn: Callable[[Tensor, _V], _T], other: Mapping[str, _V], /
    ) -> dict[str, _T]: ...

    @overload
    def map_to_dict(
        self,
        fn: Callable[[Tensor, _V, _W], _T],
        other: Mapping[str, _V],
        another: Mapping[str, _W],
        /,
    ) -> dict[str, _T]: ...

    @overload
    def map_to_dict(
        self,
        fn: Callable[..., _T],
        other: Mapping[str, Any],
        another: Mapping[str, Any],
        yet_another: Mapping[str, Any],
        /,
        *others: Mapping[str, Any],
    ) -> dict[str, _T]: ...

    def map_to_dict(
        self, fn: Callable[..., _T], /, *others: Mapping[str, Any]
    ) -> dict[str, _T]:
        """Return `{key: fn(value, *matching_values)}` as a plain `dict`.

        Like `map`, but `fn` may return anything (shapes, norms, strings), so the
        result is a plain `dict` in `self`'s key order rather than a ParamDict.

        Args:
            fn: A function of one value and the matching values of `others`.
            *others: Mappings with the same keys as `self`.

        Returns:
            A new `dict` from each key to `fn`'s result; `self` is unchanged.

        Raises:
            ValueError: If the keys of an `others` mapping differ (named).
            TypeError: If `fn` is not callable. An exception raised by `fn`
                propagates unchanged (with a note naming the entry on Python
                3.11+).

        Example:
            >>> p = ParamDict(w=torch.zeros(2, 3), b=torch.zeros(2))
            >>> p.map_to_dict(lambda v: tuple(v.shape))
            {'w': (2, 3), 'b': (2,)}
        """
        return dict(zip(self._keys, self._gather(fn, others, "map_to_dict")))
