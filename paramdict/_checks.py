"""Small checks and descriptions shared by every part of the package.

One home for the questions many operations ask of a value ("is this a number?",
"can this tensor carry a gradient?", "is this a valid norm order?") and for the way
error messages describe a tensor, so that every message and every check agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Real
from typing import TypeGuard

import torch
from torch import Tensor

__all__ = [
    "check_fits",
    "check_flag",
    "check_int_range",
    "describe_kind",
    "first_sentence",
    "is_float_or_complex",
    "is_number",
    "norm_order",
]


def is_number(value: object) -> TypeGuard[float]:
    """Whether `value` is a real Python (or numpy) number, not a bool or a tensor.

    `True` is refused on purpose: a flag passed where a number belongs is a mistake
    far more often than it is the number 1.
    """
    kind = type(value)
    if kind is float or kind is int:  # the common case, without the ABC check
        return True
    return isinstance(value, Real) and not isinstance(value, (bool, Tensor))


def is_float_or_complex(value: Tensor) -> bool:
    """Whether `value` has a floating-point or complex dtype (can require grad)."""
    return value.is_floating_point() or value.is_complex()


def describe_kind(value: Tensor) -> str:
    """Describe a tensor for an error message: `float32[3, 1] cpu` (+ its layout)."""
    dtype = str(value.dtype).removeprefix("torch.")
    layout = "" if value.layout == torch.strided else f" {value.layout}"
    return f"{dtype}{list(value.shape)} {value.device}{layout}".replace(" torch.", " ")


def norm_order(p: object, what: str) -> float:
    """Return the norm order `p` as a float, or raise naming `what`.

    Args:
        p: The order: a positive number, or `math.inf`.
        what: The operation or argument, for the message.

    Raises:
        TypeError: If `p` is not a number.
        ValueError: If `p` is not positive (NaN included).
    """
    if not is_number(p):
        msg = f"`{what}` takes a number as `p`, got {type(p).__name__}."
        raise TypeError(msg)
    check_int_range(p, f"`{what}`'s `p`")
    order = float(p)
    if not order > 0:
        msg = f"`{what}` takes a positive `p` (or `math.inf`), got {p!r}."
        raise ValueError(msg)
    return order


# torch reads a Python int as a 64-bit integer: below -2**63 or from 2**64 on it
# raises a bare `OverflowError` ("int too big to convert").
_INT_LOW = -(2**63)
_INT_HIGH = 2**64


def check_int_range(value: float, what: str) -> None:
    """Raise a ValueError naming `what` if `value` is an int torch cannot read.

    Args:
        value: A number (see `is_number`).
        what: The argument, for the message ("`add`'s `alpha`").

    Raises:
        ValueError: If `value` is an int beyond 64 bits.
    """
    exact = type(value) is not float and isinstance(value, int)
    if exact and not _INT_LOW <= value < _INT_HIGH:
        msg = (
            f"{what} got the int {value}, which is beyond 64 bits, so torch "
            "cannot read it. Pass a float (e.g. `float(value)`) instead."
        )
        raise ValueError(msg)


def check_fits(value: float, dtypes: Iterable[torch.dtype], what: str) -> None:
    """Raise a ValueError naming `what` if a float dtype among `dtypes` cannot hold it.

    torch converts some numbers to the entries' dtype (`alpha` of `add`, the weight
    of `lerp`, the bounds of `clamp`, the `value` of `addcmul`) and refuses one it
    would overflow; others (`p * 1e308`) it keeps in double precision.

    Args:
        value: A number (see `is_number`).
        dtypes: The dtypes of the entries it meets.
        what: The argument, for the message.

    Raises:
        ValueError: If `value` is an int beyond 64 bits, or a finite number larger
            in magnitude than the largest finite value of one of `dtypes`.
    """
    check_int_range(value, what)
    magnitude = abs(float(value))
    if not math.isfinite(magnitude):
        return
    small = sorted(
        {
            str(d).removeprefix("torch.")
            for d in dtypes
            if d.is_floating_point and magnitude > torch.finfo(d).max
        }
    )
    if small:
        msg = (
            f"{what} got {value!r}, which {', '.join(small)} cannot hold, so torch "
            "refuses it for these entries. Pass a smaller number, or convert the "
            "entries first (`.to(torch.float64)`)."
        )
        raise ValueError(msg)


def check_flag(value: object, name: str, what: str, *, none_ok: bool = False) -> None:
    """Raise a TypeError naming `name` unless `value` is a bool (or `None`).

    Args:
        value: The flag given.
        name: The argument's name.
        what: The operation, for the message.
        none_ok: Whether `None` is accepted (torch's default of `retain_graph`).

    Raises:
        TypeError: If `value` is not a bool (nor `None` where `none_ok`).
    """
    if isinstance(value, bool) or (none_ok and value is None):
        return
    also = " or None" if none_ok else ""
    msg = f"`{what}` takes True or False{also} as `{name}`, got {value!r}."
    raise TypeError(msg)


def first_sentence(err: BaseException) -> str:
    """Return the message of `err`, cut to its first sentence, ending with a period."""
    text = " ".join(str(err).split())
    for end in (". ", "! ", "; "):
        cut = text.find(end)
        if cut > 0:
            text = text[:cut]
            break
    text = text.rstrip(".!; ")
    if len(text) > _LONGEST:  # torch's lists of overloads run to pages
        text = text[:_LONGEST].rstrip() + " ..."
    return f"{text}." if text else f"{type(err).__name__}."


_LONGEST = 240
