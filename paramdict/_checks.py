"""Small checks and descriptions shared by every part of the package.

One home for the questions many operations ask of a value ("is this a number?",
"can this tensor carry a gradient?", "is this a valid norm order?") and for the way
error messages describe a tensor, so that every message and every check agree.
"""

from __future__ import annotations

from numbers import Real
from typing import TypeGuard

from torch import Tensor

__all__ = ["describe_kind", "is_float_or_complex", "is_number", "norm_order"]


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
    """Describe a tensor for an error message: `float32[3, 1] cpu`."""
    dtype = str(value.dtype).removeprefix("torch.")
    return f"{dtype}{list(value.shape)} {value.device}"


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
    order = float(p)
    if not order > 0:
        msg = f"`{what}` takes a positive `p` (or `math.inf`), got {p!r}."
        raise ValueError(msg)
    return order
