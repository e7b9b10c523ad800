"""Pytree registration and loading: how ParamDicts are taken apart and rebuilt.

Unflattening trusts its leaves: `torch.func` rebuilds trees whose leaves are ints or
`None` (`in_dims`, `out_dims`), so nothing here may check that leaves are tensors.

Loading trusts nothing: a ParamDict pickles as `rebuild(name, entries)`, and `rebuild`
(the one safe global for `torch.load(weights_only=True)`; the classes are not) builds
it through the class's constructor, which checks every entry. A file cannot name the
class itself, so it cannot make an instance without `__init__` or set its fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

if TYPE_CHECKING:
    from ._container import _Container

__all__ = ["rebuild", "register"]

_CLASSES: dict[str, type[_Container]] = {}
"""Every ParamDict class by its full name, for `rebuild`."""


def _flatten(tree: _Container) -> tuple[list[Any], tuple[str, ...]]:
    return list(tree.values()), tree._keys


def _flatten_with_keys(
    tree: _Container,
) -> tuple[list[tuple[pytree.KeyEntry, Any]], tuple[str, ...]]:
    # `MappingKey(k)` leaves the value type open, which pyright calls unknown.
    return [(pytree.MappingKey(k), v) for k, v in tree.items()], tree._keys  # pyright: ignore[reportReturnType, reportUnknownVariableType]


def _to_dumpable(context: tuple[str, ...]) -> list[str]:
    return list(context)


def _from_dumpable(dumpable: object) -> tuple[str, ...]:
    # A serialized treespec is data from outside: its keys must be str, once each.
    items = cast("list[object]", dumpable) if isinstance(dumpable, list) else None
    if items is None or not all(isinstance(k, str) for k in items):
        msg = (
            "A serialized ParamDict treespec must hold a list of str keys, got "
            f"{dumpable!r:.200}."
        )
        raise TypeError(msg)
    keys = cast("list[str]", items)
    if len(set(keys)) != len(keys):
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        msg = f"A serialized ParamDict treespec repeats the keys {repeated!r}."
        raise ValueError(msg)
    return tuple(keys)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def rebuild(*args: object) -> _Container:
    """Build the ParamDict class registered as `name` from `entries` (unpickling).

    Called as `rebuild(name, entries)` by the unpickler: a file names this
    function and its arguments, so every argument is checked before anything is
    built, and every refusal says what the file holds.

    Args:
        *args: `(name, entries)`: the class's full name, as `register` recorded
            it, and a plain `dict` of the entries, str keys to tensors.

    Returns:
        `cls(entries)`, checked as every construction is.

    Raises:
        TypeError: If the file gives other than two arguments, `name` is not a
            registered ParamDict class (import the module that defines a
            subclass before loading it), or `entries` is not a dict of str keys
            and tensor values; the message names the bad keys.
    """
    if len(args) != 2:
        msg = (
            "A pickled ParamDict is `rebuild(name, entries)`, two arguments; this "
            f"file gives {len(args)}. It was not written by saving a ParamDict, or "
            "was changed since."
        )
        raise TypeError(msg)
    name, entries = args
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        msg = (
            f"Cannot load a ParamDict of class {name!r:.100}: no such class is "
            "defined. Import the module that defines it before loading."
        )
        raise TypeError(msg)
    if type(entries) is not dict:
        msg = (
            f"A pickled {cls.__name__} holds a plain dict of its entries, got "
            f"{type(entries).__name__}."
        )
        raise TypeError(msg)
    given = cast("dict[object, object]", entries)
    keys = ", ".join(repr(k) for k in given if not isinstance(k, str))
    values = ", ".join(
        f"{k!r}: {type(v).__name__}"
        for k, v in sorted(((str(k), v) for k, v in given.items()), key=lambda e: e[0])
        if not isinstance(v, Tensor)
    )
    if keys or values:
        detail = "; ".join(
            part
            for part in (
                f"keys that are not str: {keys}" if keys else "",
                f"values that are not tensors: {values}" if values else "",
            )
            if part
        )
        msg = (
            f"A pickled {cls.__name__} holds str keys and tensor values; this file "
            f"holds {detail}. It was not written by saving a {cls.__name__}, or was "
            "changed since."
        )
        raise TypeError(msg)
    return cls(cast("dict[str, Tensor]", entries))


def register(cls: type[_Container]) -> None:
    """Register `cls` as a pytree node and for `rebuild` (loading).

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
        serialized_type_name=_name(cls),
        to_dumpable_context=_to_dumpable,
        from_dumpable_context=_from_dumpable,
        flatten_with_keys_fn=_flatten_with_keys,
    )
    _CLASSES[_name(cls)] = cls


# torch leaves the element type of `add_safe_globals`' list partly unannotated.
torch.serialization.add_safe_globals([rebuild])  # pyright: ignore[reportUnknownMemberType]
