"""The immutable keyed container: construction, the mapping protocol, equality, repr.

Every other part of `ParamDict` is a mixin over `_Container`, which owns the storage:
the entries live in the `dict` itself (so `torch.func.functional_call` and anything
else that wants a real `dict` accepts a ParamDict), and `_keys` keeps the key order as a
tuple that derived results share, so aligning two ParamDicts is one identity check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, Union, cast

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import check_flag, describe_kind, is_number
from ._pytree import rebuild

if TYPE_CHECKING:
    from _typeshed import SupportsKeysAndGetItem

__all__ = ["MappingOrPairs", "key_mismatch_message"]

MappingOrPairs: TypeAlias = Union[
    "SupportsKeysAndGetItem[str, Tensor]", Iterable[tuple[str, Tensor]]
]

_REPR_HEAD = 12
_REPR_TAIL = 3


def _format_keys(keys: Iterable[str]) -> str:
    return repr(sorted(keys))


def key_mismatch_message(
    expected: Sequence[str], got: Iterable[str], *, what: str, fix: str = ""
) -> str:
    """Build the error message for two key sets that should be equal.

    Args:
        expected: The keys of the ParamDict the operation runs on.
        got: The keys of the other operand.
        what: The operation, for the message ("`p + other`").
        fix: An optional sentence telling the user what to do instead.

    Returns:
        A full sentence naming the missing and unexpected keys, sorted.
    """
    got_set = set(got)
    expected_set = set(expected)
    parts: list[str] = []
    missing = expected_set - got_set
    unexpected = got_set - expected_set
    if missing:
        parts.append(f"missing {_format_keys(missing)}")
    if unexpected:
        parts.append(f"unexpected {_format_keys(unexpected)}")
    detail = ", ".join(parts) if parts else "same keys"
    msg = f"Keys differ in {what}: {detail}."
    if fix:
        msg = f"{msg} {fix}"
    return msg


def _refuse(name: str, alternative: str) -> NoReturn:
    msg = (
        f"ParamDict is immutable: `{name}` is not supported. {alternative} "
        "Every operation returns a new ParamDict and leaves its operands unchanged."
    )
    raise TypeError(msg)


def _validated(items: dict[Any, Any]) -> dict[str, Tensor]:
    bad_keys = [k for k in items if not isinstance(k, str)]
    if bad_keys:
        shown = ", ".join(repr(k) for k in bad_keys)
        msg = (
            f"ParamDict keys must be str, got {shown}. "
            "Convert them, e.g. `ParamDict({str(k): v for k, v in d.items()})`."
        )
        raise TypeError(msg)
    bad_values = sorted(k for k, v in items.items() if not isinstance(v, Tensor))
    if bad_values:
        kinds = ", ".join(f"{k!r}: {type(items[k]).__name__}" for k in bad_values)
        msg = (
            f"ParamDict values must be torch.Tensor, got {kinds}. "
            "Wrap numbers with `torch.as_tensor(...)`."
        )
        raise TypeError(msg)
    return items


_ABSENT = object()


class _Container(dict[str, Tensor]):
    """Storage, construction and the read-only mapping protocol (see `ParamDict`)."""

    # `__weakref__`: a ParamDict can be a key of a `weakref.WeakKeyDictionary`.
    __slots__ = ("__weakref__", "_keys", "_pending", "_vals")
    # numpy must not treat a ParamDict as an array of objects: with this, numpy
    # operators return `NotImplemented` and Python asks the ParamDict, which refuses.
    __array_ufunc__ = None
    _keys: tuple[str, ...]
    _vals: list[Tensor]  # the values in key order; never mutated, never handed out
    # The values are sources the first in-place write copies (`_fresh`): 0
    # (no), 1, or 2 where their dtypes differ or some are 0-dim.
    _pending: int

    def __init__(
        self, mapping_or_pairs: MappingOrPairs = (), /, **kwargs: Tensor
    ) -> None:
        if hasattr(self, "_keys"):
            _refuse("__init__ on an existing ParamDict", "Build a new one instead.")
        try:
            given = dict(mapping_or_pairs, **kwargs)
        except (TypeError, ValueError) as err:
            msg = (
                "ParamDict takes a mapping or an iterable of (key, tensor) pairs, got "
                f"{type(mapping_or_pairs).__name__} ({err})."
            )
            raise TypeError(msg) from None
        items = _validated(given)
        dict.__init__(self, items)  # pyright: ignore[reportUnknownMemberType]
        self._keys = tuple(items)
        self._vals = list(items.values())
        self._pending = 0

    @classmethod
    def _from_parts(cls, keys: tuple[str, ...], values: Iterable[Any], /) -> Self:
        """Build without validation: `keys` is trusted, values may be any leaf.

        The one place besides `__init__` that sets the storage and the kept key
        and value order; every derived ParamDict is built here.
        """
        vals: list[Any] = values if type(values) is list else list(values)  # pyright: ignore[reportUnknownVariableType]
        obj = dict.__new__(cls)
        dict.update(obj, zip(keys, vals))  # pyright: ignore[reportUnknownMemberType]
        obj._keys = keys
        obj._vals = vals
        obj._pending = 0
        return obj

    def _derive(self, values: Iterable[Tensor], /) -> Self:
        """A ParamDict of the same type and keys as `self`, holding `values`."""
        return self._from_parts(self._keys, values)

    def _twin(self) -> Self:
        """A new object equal to `self`, sharing its (immutable) key and value lists.

        What `_derive(self._vals)` gives, without rebuilding the mapping entry by
        entry (a dict copies another dict's table in one step).
        """
        obj = dict.__new__(type(self))
        dict.update(obj, self)  # pyright: ignore[reportUnknownMemberType]
        obj._keys = self._keys
        obj._vals = self._vals
        obj._pending = 0
        return obj

    # ---------------------------------------------------------------- read-only mapping

    def __setitem__(self, key: str, value: Tensor) -> NoReturn:
        _refuse("p[key] = value", "Use `p | {key: value}` to get an updated copy.")

    def __delitem__(self, key: str) -> NoReturn:
        _refuse("del p[key]", "Use `p.exclude(key)` to get a copy without it.")

    def __ior__(self, other: object) -> NoReturn:
        _refuse("p |= other", "Use `p = p | other`.")

    def pop(self, *args: object) -> NoReturn:
        """Refuse: ParamDict is immutable (use `p.exclude(key)` for a copy)."""
        _refuse("pop", "Use `p[key]` to read and `p.exclude(key)` for a copy.")

    def popitem(self) -> NoReturn:
        """Refuse: ParamDict is immutable."""
        _refuse("popitem", "Use `p.exclude(key)` to get a copy without an entry.")

    def clear(self) -> NoReturn:
        """Refuse: ParamDict is immutable (build an empty `ParamDict()` instead)."""
        _refuse("clear", "Build an empty `ParamDict()` instead.")

    def setdefault(self, *args: object) -> NoReturn:
        """Refuse: ParamDict is immutable (use `p | {key: value}`)."""
        _refuse("setdefault", "Use `p | {key: value}` to get an updated copy.")

    def update(self, *args: Any, **kwargs: Tensor) -> None:
        """Refuse any real change: ParamDict is immutable (use `p | other`).

        Writing back the very same tensor objects is accepted as a no-op, because
        `torch.func.functional_call` ends by calling `update` with the tensors the
        module holds, which are the ones it was given unless the module replaced one.

        Args:
            *args: A mapping or an iterable of `(key, tensor)` pairs, as for `dict`.
            **kwargs: More entries, as for `dict`.

        Raises:
            TypeError: If any key is new or any value is not the stored object.

        Example:
            >>> p = ParamDict(w=torch.ones(2))
            >>> p.update(w=p["w"])  # the same object: nothing changes
            >>> p.update(w=torch.zeros(2))
            Traceback (most recent call last):
            ...
            TypeError: ParamDict is immutable: `update` would change ['w']. ...
        """
        incoming = dict(*args, **kwargs)
        stored = dict.get  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        for key, value in incoming.items():
            if stored(self, key, _ABSENT) is not value:
                break
        else:
            return  # every value is the stored object: nothing changes
        changed = sorted(
            repr(k) for k, v in incoming.items() if stored(self, k, _ABSENT) is not v
        )
        msg = (
            f"ParamDict is immutable: `update` would change [{', '.join(changed)}]. "
            "Use `p | other` for an updated copy. If a module replaced these tensors "
            "inside `torch.func.functional_call`, pass `dict(p)` to receive the "
            "replacements."
        )
        raise TypeError(msg)

    @classmethod
    def fromkeys(cls, keys: Iterable[str], value: Tensor, /) -> Self:  # type: ignore[override]  # values must be tensors
        """Return a ParamDict mapping each of `keys` to the same tensor `value`.

        Useful for a per-entry operand that is one tensor for every entry.

        Args:
            keys: The keys, in order (a ParamDict gives its own keys).
            value: The tensor every key maps to (the same object, not copies).

        Returns:
            A new ParamDict of this class.

        Raises:
            TypeError: If `keys` is not iterable, a key is not a `str` or `value`
                is not a tensor.

        Example:
            >>> p = ParamDict.fromkeys(["w", "b"], torch.tensor(0.5))
            >>> list(p), p["w"] is p["b"]
            (['w', 'b'], True)
        """
        try:
            names = list(keys)
        except TypeError:
            msg = (
                f"`fromkeys` takes an iterable of str keys, got {type(keys).__name__}."
            )
            raise TypeError(msg) from None
        return cls((k, value) for k in names)

    def copy(self) -> dict[str, Tensor]:
        """Return a shallow, mutable copy as a plain `dict` (the same tensor objects).

        As `dict.copy` does for every `dict` subclass, the copy is a plain `dict`:
        a copy of an immutable mapping is only useful to change, and
        `torch.func.functional_call` copies its mapping and writes the tied
        aliases into the copy. `copy.copy(p)` returns a ParamDict of the same type.

        Returns:
            A new `dict` with the same keys, order and tensors; `self` is unchanged.
            Use `clone()` for copies of the tensors.

        Example:
            >>> p = ParamDict(w=torch.ones(2))
            >>> d = p.copy()
            >>> type(d).__name__, d["w"] is p["w"]
            ('dict', True)
        """
        return dict(self)

    def __copy__(self) -> Self:
        return self._from_parts(self._keys, self._vals)

    def __setstate__(self, state: object) -> NoReturn:
        # A ParamDict pickles as `rebuild(name, dict(p))` and carries no state: a
        # state could only set `_keys`/`_vals` apart from the entries (a forgery).
        msg = (
            f"Refusing to unpickle a {type(self).__name__} with extra state "
            f"({type(state).__name__}): ParamDict pickles hold only their entries, so "
            "this file was not written by `torch.save`/`pickle` of a ParamDict. Load "
            "the entries as a plain dict and build `ParamDict(entries)` instead."
        )
        raise TypeError(msg)

    def __or__(self, other: Mapping[str, Tensor]) -> Self:  # type: ignore[override]  # returns Self, not dict
        if not isinstance(other, Mapping):
            return NotImplemented
        merged = dict(self)
        merged.update(_validated(dict(other)))
        return type(self)(merged)

    def __ror__(self, other: Mapping[str, Tensor]) -> Self:  # type: ignore[override]  # returns Self, not dict
        if not isinstance(other, Mapping):
            return NotImplemented
        merged = _validated(dict(other))
        merged.update(self)
        return type(self)(merged)

    # ---------------------------------------------------------------- pickling

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, dict[str, Tensor]]]:
        # `rebuild` is the one safe global for `torch.load(weights_only=True)`: it
        # calls the constructor on an exact dict (the only mapping that loader
        # fills), so nothing in a file reaches the internal fields.
        cls = type(self)
        return (rebuild, (f"{cls.__module__}.{cls.__qualname__}", dict(self)))

    # ---------------------------------------------------------------- equality

    def __eq__(self, other: object) -> bool:
        """Return whether `other` is a mapping with the same keys and equal tensors.

        Key order is ignored, as for `dict`. Two tensors are equal when they have
        the same shape, dtype, device and layout and the same values (sparse ones
        compared as dense). The result is a plain `bool` (it reads values, so it
        synchronizes with an accelerator).

        Raises:
            ValueError: If an entry to compare is a meta tensor, which holds no
                values (the message names the keys).
        """
        if not isinstance(other, Mapping):
            return NotImplemented
        other = cast("Mapping[str, object]", other)
        if len(other) != len(self) or set(other.keys()) != set(self._keys):
            return False
        pairs: list[tuple[Tensor, Tensor]] = []
        for key, value in self.items():
            theirs = other[key]
            if not isinstance(theirs, Tensor):
                return False
            if (
                theirs.shape != value.shape
                or theirs.dtype != value.dtype
                or theirs.device != value.device
                or theirs.layout != value.layout
            ):
                return False
            pairs.append((value, theirs))
        meta = sorted(k for k, (a, _) in zip(self._keys, pairs) if a.is_meta)
        if meta:
            msg = (
                f"Cannot compare the entries {meta!r}: they are meta tensors, which "
                "hold no values. Compare their shapes and dtypes instead, or move "
                "them to a real device first (`.to(device)`)."
            )
            raise ValueError(msg)
        return all(
            torch.equal(a, b)
            if a.layout == torch.strided
            else torch.equal(a.to_dense(), b.to_dense())
            for a, b in pairs
        )

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def _aligned(self, other: Mapping[str, Any], /, *, what: str) -> list[Any]:
        """Return `other`'s values in `self`'s key order, or raise naming the keys."""
        if isinstance(other, _Container) and (
            other._keys is self._keys or other._keys == self._keys
        ):
            return other._vals  # callers only read it
        given: object = other  # checked at run time
        if not isinstance(given, Mapping):
            msg = (
                f"{what} takes a mapping with the same keys, got "
                f"{type(given).__name__}."
            )
            raise TypeError(msg)
        if len(other) == len(self._keys):
            try:
                return [other[k] for k in self._keys]
            except KeyError:
                pass
        msg = key_mismatch_message(
            self._keys,
            other.keys(),
            what=what,
            fix="Use `.select(...)` or `.exclude(...)` to align the keys first.",
        )
        raise ValueError(msg)

    def allclose(
        self,
        other: Mapping[str, Tensor],
        /,
        *,
        rtol: float = 1e-05,
        atol: float = 1e-08,
        equal_nan: bool = False,
    ) -> bool:
        """Return whether every entry is close to `other`'s, like `torch.allclose`.

        Args:
            other: A mapping with the same keys, in any order.
            rtol: Relative tolerance.
            atol: Absolute tolerance.
            equal_nan: Whether two NaNs compare equal.

        Returns:
            `True` when `torch.allclose` holds for every key. The result is a plain
            `bool` (it reads values, so it synchronizes with an accelerator).

        Raises:
            ValueError: If the keys differ, an entry's shape, dtype or device
                differs from `other`'s, an entry is a meta tensor (no values), or
                a tolerance is negative or NaN (the message names the keys or the
                tolerance).
            TypeError: If a value of `other` is not a tensor, an entry is sparse,
                a tolerance is not a number or `equal_nan` is not a bool.

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> p.allclose({"w": torch.tensor([1.0, 2.0 + 1e-9])})
            True
        """
        for name, tolerance in (("rtol", rtol), ("atol", atol)):
            if not is_number(tolerance):
                msg = (
                    f"`allclose` takes a number as `{name}`, got "
                    f"{type(tolerance).__name__}."
                )
                raise TypeError(msg)
            if not tolerance >= 0:
                msg = f"`allclose` takes `{name}` >= 0, got {tolerance!r}."
                raise ValueError(msg)
        check_flag(equal_nan, "equal_nan", "allclose")
        theirs = self._aligned(other, what="`allclose`")
        not_tensors = sorted(
            k for k, b in zip(self._keys, theirs) if not isinstance(b, Tensor)
        )
        if not_tensors:
            msg = (
                f"`allclose` compares tensors; the entries {not_tensors!r} of "
                "`other` are not. Convert them with `torch.as_tensor`."
            )
            raise TypeError(msg)
        differ = sorted(
            f"{k!r} ({describe_kind(a)} vs {describe_kind(b)})"
            for k, a, b in zip(self._keys, self.values(), theirs)
            if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
        )
        if differ:
            msg = (
                "`allclose` needs the same shape, dtype and device per entry; they "
                f"differ for {', '.join(differ)}. Convert with `.to(...)` first."
            )
            raise ValueError(msg)
        sparse = sorted(
            k
            for k, a, b in zip(self._keys, self.values(), theirs)
            if a.layout != torch.strided or b.layout != torch.strided
        )
        if sparse:
            msg = (
                f"`allclose` compares dense tensors, as `torch.allclose` does; the "
                f"entries {sparse!r} are not. Convert them with `.to_dense()` first."
            )
            raise TypeError(msg)
        meta = sorted(k for k, a in zip(self._keys, self.values()) if a.is_meta)
        if meta:
            msg = (
                f"`allclose` cannot compare the entries {meta!r}: they are meta "
                "tensors, which hold no values. Move them to a real device first."
            )
            raise ValueError(msg)
        return all(
            torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
            for a, b in zip(self.values(), theirs)
        )

    # ---------------------------------------------------------------- repr

    def __repr__(self) -> str:
        name = type(self).__name__
        if not self:
            return f"{name}()"
        lines = [_describe(k, v) for k, v in self.items()]
        if len(lines) > _REPR_HEAD + _REPR_TAIL + 1:
            hidden = len(lines) - _REPR_HEAD - _REPR_TAIL
            lines = [
                *lines[:_REPR_HEAD],
                f"... {hidden} more entries ...",
                *lines[-_REPR_TAIL:],
            ]
        total = sum(_numel(v) for v in self.values())
        body = "".join(
            f"\n  {line}" + ("" if line.startswith("...") else ",") for line in lines
        )
        entries = "entry" if len(self) == 1 else "entries"
        elements = "element" if total == 1 else "elements"
        return f"{name}(  # {len(self)} {entries}, {total:,} {elements}{body}\n)"


def _numel(value: object) -> int:
    return value.numel() if isinstance(value, Tensor) else 0


def _describe(key: str, value: object) -> str:
    if not isinstance(value, Tensor):  # a pytree placeholder leaf inside torch.func
        return f"{key!r}: {value!r}"
    shape = "[" + ", ".join(str(s) for s in value.shape) + "]"
    dtype = str(value.dtype).removeprefix("torch.")
    extra = ""
    if value.grad_fn is not None:
        extra = f" grad_fn={value.grad_fn.name()}"
    elif value.requires_grad:
        extra = " requires_grad"
    return f"{key!r}: {dtype}{shape} {value.device}{extra}"
