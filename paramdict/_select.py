"""Selection by key: shell-style patterns, predicates, prefixes and scopes.

Every method here returns a new ParamDict holding the very same tensor objects (no
copy), in `self`'s order, and leaves `self` unchanged.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Callable
from typing import Any

from torch import Tensor
from typing_extensions import Self

from ._container import _Container

__all__: list[str] = []


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> Callable[[str], Any]:
    return re.compile(fnmatch.translate(pattern)).match


def _check_patterns(patterns: tuple[object, ...], what: str) -> tuple[str, ...]:
    checked: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            msg = (
                f"`{what}` takes key patterns as separate str arguments, got "
                f"{type(pattern).__name__}. Unpack a list with `{what}(*patterns)`."
            )
            raise TypeError(msg)
        checked.append(pattern)
    return tuple(checked)


def _check_prefix(prefix: object, what: str) -> str:
    if not isinstance(prefix, str):
        msg = f"`{what}` takes a str prefix, got {type(prefix).__name__}."
        raise TypeError(msg)
    if prefix.endswith("."):
        msg = (
            f"`{what}` takes a module path without the trailing dot, got "
            f"{prefix!r}; pass {prefix.rstrip('.')!r}."
        )
        raise ValueError(msg)
    return prefix


class _Select(_Container):
    """`select`, `exclude`, `filter`, `trainable`, `prefixed`, `scoped`."""

    __slots__ = ()

    def _matches(
        self, patterns: tuple[str, ...], what: str, missing_ok: bool
    ) -> list[bool]:
        """Return, per key, whether any pattern matches; check every pattern hits."""
        matchers = [_compiled(p) for p in patterns]
        hit = [False] * len(matchers)
        result: list[bool] = []
        for key in self._keys:
            found = False
            for i, match in enumerate(matchers):
                if match(key) is not None:
                    hit[i] = found = True
            result.append(found)
        if not missing_ok and not all(hit):
            unmatched = sorted({p for p, h in zip(patterns, hit) if not h})
            msg = (
                f"`{what}`: the patterns {unmatched!r} match no key. Check the "
                "spelling against `list(p)`, or pass `missing_ok=True` to allow it."
            )
            raise ValueError(msg)
        return result

    def _keep(self, keep: list[bool]) -> Self:
        if all(keep):
            return self._from_parts(self._keys, self.values())
        pairs = [(k, v) for (k, v), kept in zip(self.items(), keep) if kept]
        return self._from_parts(tuple(k for k, _ in pairs), (v for _, v in pairs))

    def select(self, *patterns: str, missing_ok: bool = False) -> Self:
        """Return the entries whose key matches any of the shell-style `patterns`.

        Patterns follow `fnmatch.fnmatchcase`: `*` matches any run of characters,
        dots included (`"encoder.*"` matches every key under `encoder`), `?` one
        character and `[seq]` one of `seq`; matching is case-sensitive, and a
        plain key is a pattern that matches itself. The order of `self` is kept.

        Args:
            *patterns: Shell-style key patterns.
            missing_ok: Allow patterns that match no key instead of raising.

        Returns:
            A new ParamDict with the selected entries (the same tensor objects);
            `self` is unchanged.

        Raises:
            ValueError: If a pattern matches no key (the message names it), unless
                `missing_ok` is true.
            TypeError: If a pattern is not a `str`.

        Example:
            >>> from torch import nn
            >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
            >>> p = ParamDict.from_module(model)
            >>> list(p.select("*.bias"))
            ['0.bias', '1.bias']
            >>> list(p.select("0.*", "head.*", missing_ok=True))
            ['0.weight', '0.bias']
        """
        checked = _check_patterns(patterns, "select")
        return self._keep(self._matches(checked, "select", missing_ok))

    def exclude(self, *patterns: str, missing_ok: bool = False) -> Self:
        """Return the entries whose key matches none of the shell-style `patterns`.

        The complement of `select` with the same patterns (see there for the
        pattern syntax). The order of `self` is kept.

        Args:
            *patterns: Shell-style key patterns.
            missing_ok: Allow patterns that match no key instead of raising.

        Returns:
            A new ParamDict without the matching entries (the same tensor
            objects); `self` is unchanged.

        Raises:
            ValueError: If a pattern matches no key (the message names it), unless
                `missing_ok` is true.
            TypeError: If a pattern is not a `str`.

        Example:
            >>> from torch import nn
            >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
            >>> list(ParamDict.from_module(model).exclude("*.bias"))
            ['0.weight', '1.weight']
        """
        checked = _check_patterns(patterns, "exclude")
        return self._keep(
            [not m for m in self._matches(checked, "exclude", missing_ok)]
        )

    def filter(self, pred: Callable[[str, Tensor], object], /) -> Self:
        """Return the entries for which `pred(key, value)` is true.

        `pred` must return a Python truth value (`bool`, `int`, ...). A tensor is
        refused, because reading it would silently synchronize with an
        accelerator: call `bool(...)` or `.item()` yourself if that is intended.

        Args:
            pred: A function of the key and the value.

        Returns:
            A new ParamDict with the kept entries (the same tensor objects), in
            `self`'s order; `self` is unchanged.

        Raises:
            TypeError: If `pred` is not callable, or returns a tensor (the message
                names the key).

        Example:
            >>> p = ParamDict(w=torch.ones(2, 2), b=torch.ones(2))
            >>> list(p.filter(lambda key, value: value.dim() > 1))
            ['w']
        """
        given: object = pred  # checked at run time
        if not callable(given):
            msg = (
                "`filter` takes a function of the key and the value as `pred`, got "
                f"{type(given).__name__}."
            )
            raise TypeError(msg)
        keep: list[bool] = []
        for key, value in self.items():
            verdict = pred(key, value)
            if isinstance(verdict, Tensor):
                msg = (
                    f"`filter`: the predicate returned a tensor for {key!r}. Return a "
                    "Python bool; `bool(t)` reads the value (a device sync)."
                )
                raise TypeError(msg)
            keep.append(bool(verdict))
        return self._keep(keep)

    def trainable(self) -> Self:
        """Return the entries whose value requires grad.

        Returns:
            A new ParamDict with those entries (the same tensor objects), in
            `self`'s order; `self` is unchanged.

        Example:
            >>> w = torch.ones(2, requires_grad=True)
            >>> list(ParamDict(w=w, running_mean=torch.zeros(2)).trainable())
            ['w']
        """
        return self._keep([v.requires_grad for v in self.values()])

    def prefixed(self, prefix: str, /) -> Self:
        """Return the entries with `prefix.` put in front of every key.

        The inverse of `scoped`: use it to place a submodule's tensors in its
        parent's namespace. An empty prefix means the root and changes nothing.

        Args:
            prefix: A module path such as `"encoder"` or `"blocks.0"`, without the
                trailing dot.

        Returns:
            A new ParamDict with the renamed entries (the same tensor objects), in
            `self`'s order; `self` is unchanged.

        Raises:
            ValueError: If `prefix` ends with a dot.
            TypeError: If `prefix` is not a `str`.

        Example:
            >>> list(ParamDict(weight=torch.ones(1)).prefixed("encoder"))
            ['encoder.weight']
        """
        prefix = _check_prefix(prefix, "prefixed")
        if not prefix:
            return self._from_parts(self._keys, self.values())
        keys = tuple(f"{prefix}.{k}" for k in self._keys)
        return self._from_parts(keys, self.values())

    def scoped(self, prefix: str, /, *, missing_ok: bool = False) -> Self:
        """Return the entries under `prefix.`, with `prefix.` removed from the keys.

        The result fits the submodule at that path, e.g.
        `p.scoped("encoder").call(model.encoder, x)`. A key equal to `prefix`
        itself is not under it and is left out. An empty prefix means the root
        and keeps everything.

        Args:
            prefix: A module path such as `"encoder"` or `"blocks.0"`, without the
                trailing dot.
            missing_ok: Return an empty ParamDict instead of raising when no key
                is under `prefix`.

        Returns:
            A new ParamDict with the renamed entries (the same tensor objects), in
            `self`'s order; `self` is unchanged.

        Raises:
            ValueError: If no key is under `prefix` (unless `missing_ok` is true),
                or `prefix` ends with a dot.
            TypeError: If `prefix` is not a `str`.

        Example:
            >>> from torch import nn
            >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
            >>> first = ParamDict.from_module(model).scoped("0")
            >>> list(first)
            ['weight', 'bias']
            >>> first.call(model[0], torch.ones(1, 2)).shape
            torch.Size([1, 2])
        """
        prefix = _check_prefix(prefix, "scoped")
        if not prefix:
            return self._from_parts(self._keys, self.values())
        start = f"{prefix}."
        cut = len(start)
        pairs = [(k[cut:], v) for k, v in self.items() if k.startswith(start)]
        if not pairs and not missing_ok:
            msg = (
                f"`scoped`: no key starts with {start!r}. Check the module path "
                "against `list(p)`, or pass `missing_ok=True` to allow it."
            )
            raise ValueError(msg)
        return self._from_parts(tuple(k for k, _ in pairs), (v for _, v in pairs))
