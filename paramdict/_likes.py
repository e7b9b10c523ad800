"""New tensors like every entry: the `*_like` family (`zeros_like`, ...)."""

from __future__ import annotations

from numbers import Number

import torch
from typing_extensions import Self

from ._checks import check_flag, check_int_range, first_sentence, is_float_or_complex
from ._tensors import Device, _Tensors

__all__: list[str] = []


class _Likes(_Tensors):
    """The `*_like` family, each checking its options before anything is made."""

    __slots__ = ()

    def _check_like(
        self, what: str, dtype: object, device: object, requires_grad: object
    ) -> None:
        """Check the options of the `*_like` methods before anything is made."""
        if dtype is not None and not isinstance(dtype, torch.dtype):
            msg = (
                f"`{what}` takes a torch.dtype (e.g. `torch.float32`) or None as "
                f"`dtype`, got {dtype!r}."
            )
            raise TypeError(msg)
        if device is not None:
            if isinstance(device, bool) or not isinstance(
                device, (torch.device, str, int)
            ):
                msg = (
                    f"`{what}` takes a torch.device, a str or an int as `device`, "
                    f"got {type(device).__name__}."
                )
                raise TypeError(msg)
            try:
                torch.device(device)
            except RuntimeError as err:
                msg = (
                    f"`{what}`: `device` {device!r} is not a device: "
                    f"{first_sentence(err)}"
                )
                raise ValueError(msg) from None
        check_flag(requires_grad, "requires_grad", what)
        if not requires_grad:
            return
        if isinstance(dtype, torch.dtype):
            if not (dtype.is_floating_point or dtype.is_complex):
                msg = (
                    f"`{what}` cannot make {dtype} tensors that require grad: only "
                    "floating point and complex ones can. Pass `requires_grad=False` "
                    "or a floating point `dtype`."
                )
                raise ValueError(msg)
            return
        bad = sorted(k for k, v in self.items() if not is_float_or_complex(v))
        if bad:
            msg = (
                f"`{what}` cannot make tensors that require grad like the entries "
                f"{bad!r}: only floating point and complex tensors can. Pass "
                "`requires_grad=False` or a floating point `dtype`."
            )
            raise ValueError(msg)

    def zeros_like(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: Device | None = None,
        requires_grad: bool = False,
    ) -> Self:
        """Return zeros shaped like every value (`torch.zeros_like`).

        Args:
            dtype: The dtype of the results; `None` keeps each value's.
            device: The device of the results; `None` keeps each value's.
            requires_grad: Whether the results require grad.

        Returns:
            A new ParamDict of new tensors with the same keys; `self` is unchanged.

        Raises:
            TypeError: If `dtype` is not a torch.dtype, `device` not a device
                (a torch.device, str or int) or `requires_grad` not a bool.
            ValueError: If `device` names no device, `requires_grad` asks for
                tensors of a dtype that cannot require grad, or torch refuses an
                entry (named, with torch's reason).

        Example:
            >>> ParamDict(w=torch.ones(2)).zeros_like()["w"]
            tensor([0., 0.])
        """
        self._check_like("zeros_like", dtype, device, requires_grad)
        return self._each(
            lambda v: torch.zeros_like(
                v, dtype=dtype, device=device, requires_grad=requires_grad
            ),
            "zeros_like",
        )

    def ones_like(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: Device | None = None,
        requires_grad: bool = False,
    ) -> Self:
        """Return ones shaped like every value (`torch.ones_like`).

        Args:
            dtype: The dtype of the results; `None` keeps each value's.
            device: The device of the results; `None` keeps each value's.
            requires_grad: Whether the results require grad.

        Returns:
            A new ParamDict of new tensors with the same keys; `self` is unchanged.

        Raises:
            TypeError: If `dtype` is not a torch.dtype, `device` not a device
                (a torch.device, str or int) or `requires_grad` not a bool.
            ValueError: If `device` names no device, `requires_grad` asks for
                tensors of a dtype that cannot require grad, or torch refuses an
                entry (named, with torch's reason).

        Example:
            >>> ParamDict(w=torch.zeros(2)).ones_like()["w"]
            tensor([1., 1.])
        """
        self._check_like("ones_like", dtype, device, requires_grad)
        return self._each(
            lambda v: torch.ones_like(
                v, dtype=dtype, device=device, requires_grad=requires_grad
            ),
            "ones_like",
        )

    def full_like(
        self,
        fill_value: float,
        /,
        *,
        dtype: torch.dtype | None = None,
        device: Device | None = None,
        requires_grad: bool = False,
    ) -> Self:
        """Return tensors filled with `fill_value`, shaped like every value.

        The keyed `torch.full_like`, e.g. Adagrad's initial accumulator.

        Args:
            fill_value: The number to fill with.
            dtype: The dtype of the results; `None` keeps each value's.
            device: The device of the results; `None` keeps each value's.
            requires_grad: Whether the results require grad.

        Returns:
            A new ParamDict of new tensors with the same keys; `self` is unchanged.

        Raises:
            TypeError: If `fill_value` is not a number, `dtype` is not a
                torch.dtype, `device` not a device or `requires_grad` not a bool.
            ValueError: If `fill_value` is an int beyond 64 bits, `device` names
                no device, `requires_grad` asks for tensors of a dtype that cannot
                require grad, or torch refuses an entry (named, with torch's
                reason).

        Example:
            >>> ParamDict(w=torch.zeros(2)).full_like(0.1)["w"]
            tensor([0.1000, 0.1000])
        """
        fill: object = fill_value  # checked at run time
        if isinstance(fill, bool) or not isinstance(fill, Number):
            msg = (
                "`full_like` takes a number as `fill_value`, got "
                f"{type(fill).__name__}. Use `p.zeros_like() + value` for a "
                "tensor value."
            )
            raise TypeError(msg)
        check_int_range(fill_value, "`full_like`'s `fill_value`")
        self._check_like("full_like", dtype, device, requires_grad)
        return self._each(
            lambda v: torch.full_like(
                v, fill_value, dtype=dtype, device=device, requires_grad=requires_grad
            ),
            "full_like",
        )

    def randn_like(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: Device | None = None,
        requires_grad: bool = False,
        generator: torch.Generator | None = None,
    ) -> Self:
        """Return standard normal samples shaped like every value (`torch.randn_like`).

        The entries are drawn in key order, so a seeded `generator` gives the same
        result every time.

        Args:
            dtype: The dtype of the results; `None` keeps each value's.
            device: The device of the results; `None` keeps each value's.
            requires_grad: Whether the results require grad.
            generator: The random number generator; `None` for the default one.

        Returns:
            A new ParamDict of new tensors with the same keys; `self` is unchanged.

        Raises:
            ValueError: If `dtype`, or an entry's dtype where `dtype` is None, is
                one normal samples cannot take (an integer one), naming it; or
                `device` names no device, or `requires_grad` asks for tensors of a
                dtype that cannot require grad.
            TypeError: If `dtype` is not a torch.dtype, `device` not a device or
                `requires_grad` not a bool.

        Example:
            >>> g = torch.Generator().manual_seed(0)
            >>> ParamDict(w=torch.zeros(2, 3)).randn_like(generator=g)["w"].shape
            torch.Size([2, 3])
        """
        self._check_like("randn_like", dtype, device, requires_grad)
        if isinstance(dtype, torch.dtype) and not (
            dtype.is_floating_point or dtype.is_complex
        ):
            msg = (
                f"`randn_like` draws normal samples, which a {dtype} tensor cannot "
                "hold. Pass a floating point `dtype`."
            )
            raise ValueError(msg)
        # What `torch.randn_like` does; its `generator` argument is newer than 2.8.
        return self._each(
            lambda v: (
                torch.empty_like(v, dtype=dtype, device=device)
                .normal_(generator=generator)
                .requires_grad_(requires_grad)
            ),
            "randn_like",
        )

    def empty_like(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: Device | None = None,
        requires_grad: bool = False,
    ) -> Self:
        """Return uninitialized tensors shaped like every value (`torch.empty_like`).

        Args:
            dtype: The dtype of the results; `None` keeps each value's.
            device: The device of the results; `None` keeps each value's.
            requires_grad: Whether the results require grad.

        Returns:
            A new ParamDict of new tensors with the same keys, holding arbitrary
            values; `self` is unchanged.

        Raises:
            TypeError: If `dtype` is not a torch.dtype, `device` not a device
                (a torch.device, str or int) or `requires_grad` not a bool.
            ValueError: If `device` names no device, `requires_grad` asks for
                tensors of a dtype that cannot require grad, or torch refuses an
                entry (named, with torch's reason).

        Example:
            >>> ParamDict(w=torch.zeros(2, 3)).empty_like()["w"].shape
            torch.Size([2, 3])
        """
        self._check_like("empty_like", dtype, device, requires_grad)
        return self._each(
            lambda v: torch.empty_like(
                v, dtype=dtype, device=device, requires_grad=requires_grad
            ),
            "empty_like",
        )
