"""Stacking: many ParamDicts with the same keys into one with a leading dimension.

The keyed counterpart of `torch.func.stack_module_state`, for ensembles under
`torch.func.vmap`, and its inverse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import describe_kind
from ._container import _Container, key_mismatch_message

__all__: list[str] = []


class _Stack(_Container):
    """`stack` and `unstack` (see `ParamDict`)."""

    __slots__ = ()

    @classmethod
    def stack(cls, paramdicts: Iterable[Mapping[str, Tensor]], /) -> Self:
        """Return the entries of `paramdicts` stacked along a new first dimension.

        The keyed `torch.func.stack_module_state`: entry `k` of the result is
        `torch.stack([d[k] for d in paramdicts])`, so
        `torch.func.vmap(lambda q: q.call(model, x))(stacked)` runs an ensemble.
        Keys come in the first mapping's order; the others may order them
        differently. Unlike `stack_module_state`, the result stays differentiable
        with respect to the inputs; for fresh leaves to train, use
        `.detach().requires_grad_()`.

        Args:
            paramdicts: A non-empty iterable of mappings with the same keys, and
                per key the same shape, dtype and device.

        Returns:
            A new ParamDict of this class; the inputs are unchanged.

        Raises:
            ValueError: If `paramdicts` is empty, the keys differ (naming the
                position and the keys), or the values of a key differ in shape,
                dtype, device or layout (naming the key).
            TypeError: If `paramdicts` is a single mapping or not iterable, an
                element is not a mapping, a key is not a `str` or a value is not a
                tensor.

        Example:
            >>> models = [torch.nn.Linear(3, 2) for _ in range(4)]
            >>> stacked = ParamDict.stack(ParamDict.from_module(m) for m in models)
            >>> stacked["weight"].shape
            torch.Size([4, 2, 3])
            >>> x = torch.ones(5, 3)
            >>> out = torch.func.vmap(lambda q: q.call(models[0], x))(stacked)
            >>> out.shape
            torch.Size([4, 5, 2])
        """
        kind = type(paramdicts).__name__
        if isinstance(paramdicts, Mapping):  # iterating it would give its keys
            msg = (
                "`stack` takes an iterable of mappings as `paramdicts`, got one "
                f"mapping ({kind}). Pass a list of them, e.g. "
                "`ParamDict.stack([p, q])`."
            )
            raise TypeError(msg)
        try:
            members: list[object] = list(paramdicts)  # checked below
        except TypeError:
            msg = (
                "`stack` takes an iterable of mappings, got "
                f"{type(paramdicts).__name__}."
            )
            raise TypeError(msg) from None
        if not members:
            msg = "`stack` needs at least one mapping to stack, got none."
            raise ValueError(msg)
        first = members[0]
        if not isinstance(first, Mapping):
            msg = f"`stack` takes mappings of tensors, got {type(first).__name__}."
            raise TypeError(msg)
        given = tuple(cast("Mapping[object, object]", first).keys())
        not_str = [k for k in given if not isinstance(k, str)]
        if not_str:
            shown = ", ".join(repr(k) for k in not_str)
            msg = f"`stack`: ParamDict keys must be str; the mappings have {shown}."
            raise TypeError(msg)
        keys = cast("tuple[str, ...]", given)
        columns: list[list[Tensor]] = [[] for _ in keys]
        for position, member in enumerate(members):
            if not isinstance(member, Mapping):
                msg = (
                    f"`stack` takes mappings of tensors, got {type(member).__name__} "
                    f"at position {position}."
                )
                raise TypeError(msg)
            member = cast("Mapping[str, Tensor]", member)
            if len(member) != len(keys) or any(k not in member for k in keys):
                msg = key_mismatch_message(
                    keys, member.keys(), what=f"`stack` (position {position})"
                )
                raise ValueError(msg)
            for column, key in zip(columns, keys):
                column.append(member[key])
        out: list[Tensor] = []
        for key, column in zip(keys, columns):
            if not all(isinstance(v, Tensor) for v in column):
                msg = f"`stack` takes mappings of tensors; {key!r} is not always one."
                raise TypeError(msg)
            kinds = {describe_kind(v) for v in column}  # layouts included
            if len(kinds) > 1:
                msg = (
                    "`stack` needs the same shape, dtype, device and layout for each "
                    f"key; {key!r} has {', '.join(sorted(kinds))}."
                )
                raise ValueError(msg)
            out.append(torch.stack(column))
        return cls._from_parts(keys, out)

    def unstack(self) -> list[Self]:
        """Split every value along its first dimension: the inverse of `stack`.

        Returns:
            A list of new ParamDicts with the same keys, one per index of the first
            dimension; their values are views into `self`'s (differentiable), and
            `self` is unchanged.

        Raises:
            ValueError: If `self` is empty (the count is unknown), an entry is
                0-dim, or the first dimensions differ (the message names the keys
                and sizes).

        Example:
            >>> p = ParamDict(w=torch.arange(6.0).reshape(3, 2))
            >>> [q["w"] for q in p.unstack()]
            [tensor([0., 1.]), tensor([2., 3.]), tensor([4., 5.])]
        """
        if not self._keys:
            msg = "`unstack` cannot tell how many ParamDicts an empty one holds."
            raise ValueError(msg)
        scalars = sorted(k for k, v in self.items() if v.dim() == 0)
        if scalars:
            msg = (
                f"`unstack` splits along the first dimension, but {scalars!r} are "
                "0-dim."
            )
            raise ValueError(msg)
        sizes = {k: v.shape[0] for k, v in self.items()}
        if len(set(sizes.values())) > 1:
            shown = ", ".join(f"{k!r}: {n}" for k, n in sorted(sizes.items()))
            msg = f"`unstack` needs one size for the first dimension, got {shown}."
            raise ValueError(msg)
        pieces = [v.unbind(0) for v in self.values()]
        return [self._derive(row) for row in zip(*pieces)]
