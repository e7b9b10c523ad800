"""Pytree registration: ParamDicts flatten to their values, keyed by `MappingKey`.

Unflattening trusts its leaves: `torch.func` rebuilds trees whose leaves are ints or
`None` (`in_dims`, `out_dims`), so nothing here may check that leaves are tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

if TYPE_CHECKING:
    from ._container import _Container

__all__ = ["register"]


def _flatten(tree: _Container) -> tuple[list[Any], tuple[str, ...]]:
    return list(tree.values()), tree._keys


def _flatten_with_keys(
    tree: _Container,
) -> tuple[list[tuple[pytree.KeyEntry, Any]], tuple[str, ...]]:
    # `MappingKey(k)` leaves the value type open, which pyright calls unknown.
    return [(pytree.MappingKey(k), v) for k, v in tree.items()], tree._keys  # pyright: ignore[reportReturnType, reportUnknownVariableType]


def _to_dumpable(context: tuple[str, ...]) -> list[str]:
    return list(context)


def _from_dumpable(dumpable: list[str]) -> tuple[str, ...]:
    return tuple(dumpable)


def register(cls: type[_Container]) -> None:
    """Register `cls` as a pytree node and as a safe global for `torch.load`.

    Called for `ParamDict` on import and for each subclass when it is defined.

    Args:
        cls: The class to register.
    """

    def unflatten(values: Any, context: tuple[str, ...]) -> _Container:
        return cls._from_parts(context, values)

    pytree.register_pytree_node(
        cls,
        _flatten,
        unflatten,
        serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
        to_dumpable_context=_to_dumpable,
        from_dumpable_context=_from_dumpable,
        flatten_with_keys_fn=_flatten_with_keys,
    )
    # torch leaves the element type of `add_safe_globals`' list partly unannotated.
    torch.serialization.add_safe_globals([cls])  # pyright: ignore[reportUnknownMemberType]
