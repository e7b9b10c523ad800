"""`register_state`: state classes that `torch.load` and pytree specs accept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils import _pytree as pytree

__all__ = ["register_state", "register_state_as"]

T = TypeVar("T", bound=type[Any])


def register_state(cls: T) -> T:
    """Make a NamedTuple state class loadable and its pytree spec serializable.

    Adds `cls` to `torch.load`'s safe globals and registers it with a serialized
    type name, so `torch.export`-style tree specs containing it can be saved.

    Args:
        cls: The NamedTuple class.

    Returns:
        `cls` itself, so this can be used as a class decorator.

    Example:
        >>> from typing import NamedTuple
        >>> from paramdict import optim
        >>> @optim.register_state
        ... class CountState(NamedTuple):
        ...     step: torch.Tensor
        >>> CountState in torch.serialization.get_safe_globals()
        True
    """
    torch.serialization.add_safe_globals([cls])  # pyright: ignore[reportUnknownMemberType]  # torch's annotation
    pytree._register_namedtuple(
        cls, serialized_type_name=f"{cls.__module__}.{cls.__qualname__}"
    )
    return cls


def register_state_as(module: str) -> Callable[[T], T]:
    """Register a built-in state class under the module its checkpoints name.

    Pickles (`torch.save`) and pytree specs name a class by `__module__` and
    `__qualname__`. The built-in states are defined in light modules, so that
    `import paramdict.optim` registers them without building the optimizers;
    each keeps the name it was saved under, that of the module holding its
    optimizer (which re-exports it), so saved states load as they always did.

    Args:
        module: The module path checkpoints name, `"paramdict.optim.adam"`.

    Returns:
        A class decorator: it sets `__module__` and applies `register_state`.
    """

    def register(cls: T) -> T:
        cls.__module__ = module
        return register_state(cls)

    return register
