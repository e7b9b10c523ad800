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
    return [(pytree.MappingKey(k), v) for k, v in tree.items()], tree._keys


def _to_dumpable(context: tuple[str, ...]) -> list[str]:
    return list(context)


def _from_dumpable(dumpable: object) -> tuple[str, ...]:
    # A serialized treespec is data from outside: its keys must be str, once each.
    if not isinstance(dumpable, list) or not all(isinstance(k, str) for k in dumpable):
        msg = (
            "A serialized ParamDict treespec must hold a list of str keys, got "
            f"{dumpable!r:.200}."
        )
        raise TypeError(msg)
    if len(set(dumpable)) != len(dumpable):
        repeated = sorted({k for k in dumpable if dumpable.count(k) > 1})
        msg = f"A serialized ParamDict treespec repeats the keys {repeated!r}."
        raise ValueError(msg)
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
    torch.serialization.add_safe_globals([cls])
