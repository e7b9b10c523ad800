"""`register_state`: state classes that `torch.load` and pytree specs accept."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch.utils import _pytree as pytree

__all__ = ["register_state"]

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
