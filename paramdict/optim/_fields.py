"""Field helpers: an optimizer's options, each declared with its validator.

Each returns an attrs field, typed as its value for the class body (the table
of what each accepts is in `fields.py`):

```python
>>> import attrs
>>> @attrs.frozen
... class Options:
...     amsgrad: bool = flag()
...     eps: float = non_negative(1e-8)
...     betas: tuple[float, float] = betas((0.9, 0.999))
>>> Options(amsgrad="yes")
Traceback (most recent call last):
...
TypeError: `amsgrad` must be True or False, got 'yes'.
>>> Options(betas=(0.9, 1.0))
Traceback (most recent call last):
...
ValueError: `betas[1]` must be in [0, 1), got 1.0.

```
"""

from __future__ import annotations

from typing import Any, overload

import attrs

from ._hyper import (
    check_betas,
    check_flag,
    check_fraction,
    check_fused,
    check_non_negative,
)

__all__ = [
    "SHARED",
    "betas",
    "flag",
    "fraction",
    "fused_option",
    "non_negative",
    "shared_last",
]

SHARED = ("maximize", "capturable", "differentiable")
"""The options every `TorchOptimizer` has, declared once on the base."""

_TAIL = (*SHARED, "fused")


def flag(default: bool = False) -> bool:
    """Return an option that is `True` or `False`."""
    return attrs.field(default=default, validator=check_flag)


def non_negative(default: float) -> float:
    """Return an option that is a finite real number `>= 0`."""
    return attrs.field(default=default, validator=check_non_negative)


def fraction(default: float) -> float:
    """Return an option that is a real number in `[0, 1]`."""
    return attrs.field(default=default, validator=check_fraction)


@overload
def betas(default: tuple[float, float]) -> tuple[float, float]: ...
@overload
def betas(default: tuple[float, float, float]) -> tuple[float, float, float]: ...
def betas(default: tuple[float, ...]) -> tuple[float, ...]:
    """Return an option of two (or, as `default`, three) numbers, each in `[0, 1)`."""
    return attrs.field(default=default, validator=check_betas(len(default)))


def fused_option() -> bool | None:
    """Return the `fused` option: `None` (the default), `True` or `False`."""
    field: bool | None = attrs.field(default=None, validator=check_fused)
    return field


def shared_last(
    cls: type, fields: list[attrs.Attribute[Any]]
) -> list[attrs.Attribute[Any]]:
    """Return `fields` with the shared options after the class's own.

    The field transformer of every optimizer class
    (`attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)`).

    Args:
        cls: The class being made.
        fields: Its fields, inherited ones first.

    Returns:
        The same fields: the class's own, then `maximize`, `capturable`,
        `differentiable` and `fused` (those it has).

    Example:
        >>> from paramdict import optim
        >>> [f.name for f in attrs.fields(optim.SGD)][-4:]
        ['maximize', 'capturable', 'differentiable', 'fused']
    """
    del cls
    own = [f for f in fields if f.name not in _TAIL]
    tail = sorted(
        (f for f in fields if f.name in _TAIL), key=lambda f: _TAIL.index(f.name)
    )
    return own + tail
