"""Reductions over all entries: dot, norm, sum, counts, finiteness, clipping, vectors.

Reductions that return a tensor return a 0-dim one that stays on the device and in
the graph (no `.item()`, no synchronization), so they compose with autograd and
`torch.compile`. They combine entries across keys, so every entry must be on one
device; dtypes are promoted as `torch.stack` promotes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import cast

import torch
import torch._C._nn  # typed by torch, but only as a named submodule
from torch import Tensor
from typing_extensions import Self

from ._checks import check_int_range, is_float_or_complex, is_number, norm_order
from ._container import _Container
from ._foreach import call

__all__: list[str] = []

CLIP_EPS = 1e-6  # what `torch.nn.utils.clip_grad_norm_` adds to the norm


# One copy of every entry into a vector, then one reduction, beats one reduction per
# entry on CPU (where foreach kernels loop over the entries) while the entries are
# small: below about this many elements each, and this many in all.
_FLAT_MEAN_LIMIT = 4096
_FLAT_TOTAL_LIMIT = 1 << 22


def _flattened(values: list[Tensor]) -> Tensor | None:
    """Return the values as one vector when that is the faster way to reduce them.

    Returns `None` (reduce per entry instead) unless every value is a CPU tensor of
    one floating dtype and the values are small; also under `vmap`.
    """
    first = values[0]
    dtype = first.dtype
    if not first.is_cpu or not is_float_or_complex(first):
        return None
    total = 0
    vectors = True  # 1-dim entries go to `cat` as they are, without views
    for value in values:
        if value.dtype is not dtype:
            return None
        total += value.numel()
        vectors = vectors and value.dim() == 1
    if total > _FLAT_TOTAL_LIMIT or total > _FLAT_MEAN_LIMIT * len(values):
        return None
    try:
        # `cat` refuses other devices, so one CPU entry checks them all.
        if vectors:
            return torch.cat(values)
        return torch._C._nn.flatten_dense_tensors(values)
    except RuntimeError:  # another device, or batched tensors inside vmap
        return None


class _Reduce(_Container):
    """`dot`, `norm`, `sum`, `numel`, `isfinite`, `clip_norm` and the vector pair."""

    __slots__ = ()

    def _on_one_device(self, what: str, *others: list[Tensor]) -> list[Tensor]:
        """Return the values, after checking they (and `others`) share one device."""
        values = self._vals
        if not values:
            return values
        device = values[0].device
        columns = (values, *others)
        if all(v.device == device for column in columns for v in column):
            return values
        stray = sorted(
            {
                k
                for column in columns
                for k, v in zip(self._keys, column)
                if v.device != device
            }
        )
        msg = (
            f"`{what}` combines all entries, so they must share one device; "
            f"{stray!r} are not on {device} (where {self._keys[0]!r} is). Move them "
            "first with `.to(device)`."
        )
        raise ValueError(msg)

    def _dense(self, what: str, *others: list[Tensor]) -> None:
        """Refuse sparse entries (of `self` or `others`), naming them.

        The reductions flatten every entry, which torch does for dense tensors
        only.
        """
        sparse = sorted(
            {
                k
                for column in (self._vals, *others)
                for k, v in zip(self._keys, column)
                if v.layout != torch.strided
            }
        )
        if sparse:
            msg = (
                f"`{what}` combines dense tensors; the entries {sparse!r} are sparse. "
                "Convert them with `.to_dense()` first."
            )
            raise TypeError(msg)

    def _not_floating(self, what: str) -> TypeError | None:
        bad = sorted(k for k, v in self.items() if not is_float_or_complex(v))
        if not bad:
            return None
        msg = (
            f"`{what}` needs floating point entries; {bad!r} are not. Leave them "
            "out with `.exclude(...)` or convert them with `.to(dtype)`."
        )
        return TypeError(msg)

    # ------------------------------------------------------------ reductions

    def dot(self, other: Mapping[str, Tensor], /) -> Tensor:
        """Return the sum over all keys of the dot product of the flattened entries.

        The inner product of `self` and `other` seen as one long vector each, as
        `torch.dot(p.to_vector(), q.to_vector())`, which is how small entries on
        CPU are handled; larger ones are multiplied entry by entry, without a
        copy. Differentiable (second order too), no synchronization.

        Args:
            other: A mapping with the same keys, each value of the same shape and
                dtype as `self`'s, on the same device.

        Returns:
            A 0-dim tensor; `self` and `other` are unchanged. Zero for an empty
            ParamDict.

        Raises:
            ValueError: If the keys differ, or an entry's shape, dtype or device
                differs from `other`'s (the message names the keys).
            TypeError: If a value of `other` is not a tensor, or an entry is
                sparse, or of a kind `torch.dot` does not take (boolean) (named).

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor(3.0))
            >>> p.dot(p)
            tensor(14.)
        """
        theirs = self._aligned(other, what="`dot`")
        not_tensors = sorted(
            k for k, t in zip(self._keys, theirs) if not isinstance(t, Tensor)
        )
        if not_tensors:
            msg = f"`dot` takes a mapping of tensors; {not_tensors!r} are not tensors."
            raise TypeError(msg)
        values = self._on_one_device("dot", theirs)
        self._dense("dot", theirs)
        differ = sorted(
            k
            for k, a, b in zip(self._keys, values, theirs)
            if a.shape != b.shape or a.dtype != b.dtype
        )
        if differ:
            shown = ", ".join(
                f"{k!r} ({self[k].dtype}{list(self[k].shape)} vs "
                f"{other[k].dtype}{list(other[k].shape)})"
                for k in differ
            )
            msg = (
                f"`dot` needs the same shape and dtype per entry; they differ for "
                f"{shown}."
            )
            raise ValueError(msg)
        if not values:
            return torch.zeros(())
        mine, yours = _flattened(values), _flattened(theirs)
        if mine is not None and yours is not None:
            return torch.dot(mine, yours)
        try:
            parts = [
                torch.dot(a.reshape(-1), b.reshape(-1)) for a, b in zip(values, theirs)
            ]
        except RuntimeError as err:  # a kind `torch.dot` does not take (bool)
            explained = self._not_floating("dot")
            if explained is None:
                raise
            raise explained from err
        return torch.stack(parts).sum()

    def norm(self, p: float = 2) -> Tensor:
        """Return the global `p`-norm of all entries taken together.

        The norm of the concatenation of every flattened value (the norm that
        `torch.nn.utils.clip_grad_norm_` computes): one `torch._foreach_norm` call
        and one norm of the per-entry norms, or, for small entries on CPU (where
        a foreach kernel loops over its entries), one norm of a flattened copy,
        which is several times faster there. Differentiable (second order too),
        no synchronization.

        Args:
            p: The order: a positive number, or `math.inf` for the largest
                absolute value.

        Returns:
            A 0-dim tensor; `self` is unchanged. Zero for an empty ParamDict.

        Raises:
            ValueError: If `p` is not positive, or the entries are on more than one
                device (the message names the strays).
            TypeError: If `p` is not a number, or some entries are not floating
                point or are sparse (named).

        Example:
            >>> p = ParamDict(w=torch.tensor([3.0, 0.0]), b=torch.tensor(-4.0))
            >>> p.norm()
            tensor(5.)
            >>> p.norm(math.inf)
            tensor(4.)
        """
        return self._norm(p, "norm")

    def _norm(self, p: object, what: str) -> Tensor:
        order = norm_order(p, what)
        self._dense(what)
        values = self._vals
        flat = _flattened(values) if values else None
        if flat is not None:
            if not flat.numel():  # the max of nothing is undefined
                return torch.zeros((), dtype=flat.dtype)
            # torch builds `vector_norm` with `_add_docstr`, which leaves it untyped.
            return cast(Tensor, torch.linalg.vector_norm(flat, order))  # pyright: ignore[reportUnknownMemberType]
        values = self._on_one_device(what)
        if order == math.inf:
            # The max of nothing is undefined; empty entries change nothing.
            values = [v for v in values if v.numel()]
        if not values:
            return torch.zeros(())
        try:
            norms = call(torch._foreach_norm, values, order)
        except RuntimeError as err:
            explained = self._not_floating(what)
            if explained is None:
                raise
            raise explained from err
        return cast(Tensor, torch.linalg.vector_norm(torch.stack(norms), order))  # pyright: ignore[reportUnknownMemberType]

    def sum(self) -> Tensor:
        """Return the sum of every element of every entry.

        Returns:
            A 0-dim tensor (dtypes promoted as `torch.sum` and `torch.stack` do);
            `self` is unchanged. Zero for an empty ParamDict.

        Raises:
            ValueError: If the entries are on more than one device (named).

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor(3.0)).sum()
            tensor(6.)
        """
        values = self._on_one_device("sum")
        if not values:
            return torch.zeros(())
        flat = _flattened(values)
        if flat is not None:
            return flat.sum()
        return torch.stack([v.sum() for v in values]).sum()

    def numel(self) -> int:
        """Return the total number of elements over all entries.

        Returns:
            A Python `int` (shapes are known without reading values).

        Example:
            >>> ParamDict.from_module(torch.nn.Linear(3, 2)).numel()
            8
        """
        return sum(v.numel() for v in self.values())

    def isfinite(self) -> bool:
        """Return whether no entry holds an infinity or a NaN.

        Reads the values, so it synchronizes with an accelerator (once). Integer
        and boolean entries are always finite.

        Returns:
            A Python `bool`.

        Raises:
            ValueError: If the entries are on more than one device (named).
            TypeError: If some entries are sparse (named).

        Example:
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> p.isfinite(), (p / 0).isfinite()
            (True, False)
        """
        values = self._on_one_device("isfinite")
        self._dense("isfinite")
        flat = _flattened(values) if values else None
        if flat is not None:
            return bool(torch.isfinite(flat).all())
        checked = [v for v in values if is_float_or_complex(v) and v.numel()]
        if not checked:
            return True
        # The largest magnitude is finite exactly when every element is (NaN
        # propagates through the max).
        largest = call(torch._foreach_norm, checked, math.inf)
        return bool(torch.isfinite(torch.stack(largest)).all())

    def clip_norm(self, max_norm: float | Tensor, /, *, p: float = 2) -> Self:
        """Return the entries scaled so their global `p`-norm is at most `max_norm`.

        The functional `torch.nn.utils.clip_grad_norm_`, with the same result:
        every entry is multiplied by `min(1, max_norm / (norm + 1e-6))`. Nothing
        reads the norm on the host (no synchronization), and the result is
        differentiable, also with respect to `max_norm` when it is a tensor.

        Args:
            max_norm: The largest norm allowed: a non-negative number or a 0-dim
                tensor.
            p: The order of the norm, as for `norm`.

        Returns:
            A new ParamDict with the same keys; `self` is unchanged.

        Raises:
            ValueError: If `max_norm` is negative or NaN or an int beyond 64 bits,
                a 0-dim tensor `max_norm` is on a device other than the entries'
                (it is not read, so its value is not checked), `p` is not
                positive, or the entries are on more than one device.
            TypeError: If `max_norm` is not a number or a 0-dim tensor, or some
                entries are not floating point or are sparse (named).

        Example:
            >>> g = ParamDict(w=torch.tensor([3.0, 0.0]), b=torch.tensor(-4.0))
            >>> clipped = g.clip_norm(1.0)
            >>> clipped["w"], clipped.norm()
            (tensor([0.6000, 0.0000]), tensor(1.0000))
        """
        limit: object = max_norm  # checked at run time
        if isinstance(limit, Tensor):
            if limit.dim() != 0:
                msg = (
                    "`clip_norm` takes a number or a 0-dim tensor as `max_norm`, "
                    f"got a tensor of shape {tuple(limit.shape)}."
                )
                raise TypeError(msg)
            devices = {v.device for v in self._vals}
            if not limit.is_cpu and devices and devices != {limit.device}:
                msg = (
                    f"`clip_norm` got `max_norm` on {limit.device}, but the entries "
                    f"are on {', '.join(sorted(map(str, devices)))}. Move it first "
                    "(`.to(device)`)."
                )
                raise ValueError(msg)
        elif not is_number(limit):
            msg = (
                "`clip_norm` takes a number or a 0-dim tensor as `max_norm`, got "
                f"{type(limit).__name__}."
            )
            raise TypeError(msg)
        elif not float(limit) >= 0:  # also refuses NaN
            msg = f"`clip_norm` takes a non-negative `max_norm`, got {limit!r}."
            raise ValueError(msg)
        else:
            check_int_range(limit, "`clip_norm`'s `max_norm`")
        total = self._norm(p, "clip_norm")
        values = self._vals
        if not values:
            return self._derive(())
        coef = torch.clamp(max_norm / (total + CLIP_EPS), max=1.0)
        # A list, not the tensor: the foreach `.Tensor` overloads have neither a
        # working backward for it nor vmap support (see `_operators`).
        return self._derive(call(torch._foreach_mul, values, [coef] * len(values)))

    # ------------------------------------------------------------ one vector

    def to_vector(self) -> Tensor:
        """Return every entry flattened and concatenated, in key order.

        The keyed `torch.nn.utils.parameters_to_vector`: out of place (a new
        tensor) and differentiable; `from_vector` undoes it.

        Returns:
            A 1-dim tensor of `self.numel()` elements; `self` is unchanged.

        Raises:
            ValueError: If the entries do not share one device and one dtype (the
                message names the strays).
            TypeError: If some entries are sparse (named).

        Example:
            >>> p = ParamDict(w=torch.tensor([[1.0, 2.0]]), b=torch.tensor(3.0))
            >>> p.to_vector()
            tensor([1., 2., 3.])
        """
        values = self._on_one_device("to_vector")
        if not values:
            return torch.empty(0)
        self._dense("to_vector")
        dtype = values[0].dtype
        stray = sorted(k for k, v in zip(self._keys, values) if v.dtype != dtype)
        if stray:
            msg = (
                f"`to_vector` makes one tensor, so entries must share one dtype; "
                f"{stray!r} are not {dtype} (as {self._keys[0]!r} is). Convert them "
                "first with `.to(dtype)`."
            )
            raise ValueError(msg)
        return torch.cat([v.reshape(-1) for v in values])

    @classmethod
    def from_vector(cls, vector: Tensor, /, *, like: Mapping[str, Tensor]) -> Self:
        """Return `vector` cut into entries with the keys and shapes of `like`.

        The inverse of `to_vector` and the out-of-place, differentiable
        `torch.nn.utils.vector_to_parameters`: the values are views into
        `vector`, with its dtype and device, so gradients flow back to it.

        Args:
            vector: A 1-dim tensor with as many elements as `like` holds.
            like: A mapping whose keys (in order) and value shapes to use.

        Returns:
            A new ParamDict of this class; `vector` and `like` are unchanged.

        Raises:
            ValueError: If `vector` is not 1-dim or its length differs from the
                number of elements of `like`.
            TypeError: If `vector` is not a dense tensor, a key of `like` is not a
                `str`, or a value of `like` is not a tensor.

        Example:
            >>> like = ParamDict(w=torch.zeros(1, 2), b=torch.zeros(()))
            >>> q = ParamDict.from_vector(torch.tensor([1.0, 2.0, 3.0]), like=like)
            >>> q["w"], q["b"]
            (tensor([[1., 2.]]), tensor(3.))
        """
        given: tuple[object, object] = (vector, like)  # checked at run time
        if not isinstance(given[0], Tensor):
            msg = f"`from_vector` takes a tensor, got {type(given[0]).__name__}."
            raise TypeError(msg)
        if not isinstance(given[1], Mapping):
            msg = (
                "`from_vector` takes a mapping as `like`, got "
                f"{type(given[1]).__name__}."
            )
            raise TypeError(msg)
        shaped: dict[object, object] = {}
        shaped.update(like)
        not_str = [k for k in shaped if not isinstance(k, str)]
        if not_str:
            shown = ", ".join(repr(k) for k in not_str)
            msg = f"`from_vector`: ParamDict keys must be str; `like` has {shown}."
            raise TypeError(msg)
        bad = sorted(str(k) for k, v in shaped.items() if not isinstance(v, Tensor))
        if bad:
            msg = f"`from_vector`: the entries {bad!r} of `like` are not tensors."
            raise TypeError(msg)
        if vector.layout != torch.strided:
            msg = (
                f"`from_vector` takes a dense tensor, got a {vector.layout} one. "
                "Convert it with `.to_dense()`."
            )
            raise TypeError(msg)
        if vector.dim() != 1:
            msg = (
                "`from_vector` takes a 1-dim tensor, got one of shape "
                f"{tuple(vector.shape)}. Flatten it with `.reshape(-1)`."
            )
            raise ValueError(msg)
        keys = tuple(like.keys())
        shapes = [v.shape for v in like.values()]
        sizes = [s.numel() for s in shapes]
        if vector.shape[0] != sum(sizes):
            msg = (
                f"`from_vector` got a vector of {vector.shape[0]} elements, but "
                f"`like` holds {sum(sizes)}."
            )
            raise ValueError(msg)
        if not keys:
            return cls._from_parts((), ())
        pieces = torch.split(vector, sizes)
        return cls._from_parts(
            keys, [piece.reshape(shape) for piece, shape in zip(pieces, shapes)]
        )
