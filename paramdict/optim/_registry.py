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

    Adds `cls` to `torch.load`'s safe globals and registers its pytree type name.

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

    The states are defined in light modules but keep the `__module__` they were
    saved under (their optimizer's, `"paramdict.optim.adam"`), so they load.
    """

    def register(cls: T) -> T:
        cls.__module__ = module
        return register_state(cls)

    return register
