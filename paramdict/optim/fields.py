"""Options of an optimizer, each declared with its validator (public).

An optimizer in the style of `torch.optim` is an `attrs.frozen(kw_only=True,
eq=False, field_transformer=fields.shared_last)` subclass of `TorchOptimizer`
whose options are declared with these helpers, so a value of the wrong kind is
refused the same way everywhere:

| helper | accepts |
|---|---|
| `flag(default)` | `True` or `False` |
| `non_negative(default)` | a finite real number `>= 0` |
| `fraction(default)` | a real number in `[0, 1]` |
| `betas(default)` | two (or, as `default`, three) real numbers, each in `[0, 1)` |
| `fused_option()` | `None`, `True` or `False` (`True` only if not differentiable) |

`shared_last` puts the options every optimizer shares (`maximize`,
`differentiable`, declared on `TorchOptimizer`) after a class's own, then
`fused`, so the signature reads in torch.optim's order.

Example:
    >>> import attrs
    >>> from paramdict.optim import fields
    >>> @attrs.frozen
    ... class Options:
    ...     amsgrad: bool = fields.flag()
    ...     betas: tuple[float, float] = fields.betas((0.9, 0.999))
    >>> Options(betas=(0.9, 1.0))
    Traceback (most recent call last):
    ...
    ValueError: `betas[1]` must be in [0, 1), got 1.0.
"""

from __future__ import annotations

from ._fields import betas, flag, fraction, fused_option, non_negative, shared_last

__all__ = ["betas", "flag", "fraction", "fused_option", "non_negative", "shared_last"]
