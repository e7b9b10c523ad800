"""Flat buffers for collectives: group entries into buckets, pack them, unpack them.

A collective per tensor costs a round trip per tensor. Instead, entries that share a
dtype and a device are copied, in key order, into one flat buffer per bucket (a bucket
holds at most `cap_bytes`, unless a single entry is larger), so a ParamDict with
hundreds of entries costs a few collectives. The plan depends only on the keys order,
shapes, dtypes and devices, so processes that agree on those agree on the plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch._C._nn  # typed by torch, but only as a named submodule
from torch import Tensor

__all__ = ["Bucket", "pack", "plan", "unpack"]


class Bucket(NamedTuple):
    """Which entries share one flat buffer, and where each one sits in it."""

    positions: tuple[int, ...]
    """Indices of the entries, in key order."""
    numels: tuple[int, ...]
    """Number of elements of each entry, in the same order."""
    dtype: torch.dtype
    device: torch.device

    @property
    def numel(self) -> int:
        """Return the length of the flat buffer."""
        return sum(self.numels)


def plan(values: Sequence[Tensor], cap_bytes: int) -> list[Bucket]:
    """Group `values` into buckets of one dtype and device, each at most `cap_bytes`.

    Entries are taken in order; a bucket is closed when the next entry of its dtype and
    device would take it over `cap_bytes`. An entry larger than the cap gets a bucket of
    its own.

    Args:
        values: The tensors, in key order.
        cap_bytes: The most bytes one bucket holds (a single larger entry excepted).

    Returns:
        The buckets, in the order they were closed; together they hold every position
        exactly once.
    """
    done: list[Bucket] = []
    filling: dict[tuple[torch.dtype, torch.device], tuple[list[int], list[int], int]]
    filling = {}
    for position, value in enumerate(values):
        kind = (value.dtype, value.device)
        size = value.numel() * value.element_size()
        current: tuple[list[int], list[int], int] | None = filling.get(kind)
        if current is not None and current[0] and current[2] + size > cap_bytes:
            done.append(_close(kind, current))
            current = None
        if current is None:
            current = ([], [], 0)
        positions, numels, used = current
        positions.append(position)
        numels.append(value.numel())
        filling[kind] = (positions, numels, used + size)
    done.extend(_close(kind, current) for kind, current in filling.items())
    return done


def _close(
    kind: tuple[torch.dtype, torch.device], current: tuple[list[int], list[int], int]
) -> Bucket:
    positions, numels, _ = current
    return Bucket(tuple(positions), tuple(numels), kind[0], kind[1])


def pack(values: Sequence[Tensor], bucket: Bucket) -> Tensor:
    """Copy the bucket's entries into a new flat buffer, outside autograd.

    Args:
        values: The tensors, in key order.
        bucket: Which of them to pack.

    Returns:
        A new 1-dim tensor of `bucket.numel` elements (never a view of an input).
    """
    tensors = [values[i] for i in bucket.positions]
    with torch.no_grad():
        if len(tensors) == 1:  # the flattening kernel would return a view of it
            return tensors[0].reshape(-1).clone()
        # The C++ helper behind DistributedDataParallel's buckets: one concatenation
        # without a Python-level `reshape` per entry.
        return torch._C._nn.flatten_dense_tensors(tensors)


def unpack(
    buffer: Tensor, bucket: Bucket, values: Sequence[Tensor], out: list[Tensor]
) -> None:
    """Write views of `buffer`, shaped like the bucket's entries, into `out`.

    Args:
        buffer: A flat buffer laid out as `pack` lays out `bucket`.
        bucket: The entries it holds.
        values: The tensors, in key order (only their shapes are read).
        out: The list of results, in key order; the bucket's positions are set.
    """
    templates = [values[i] for i in bucket.positions]
    pieces = torch._C._nn.unflatten_dense_tensors(buffer, templates)
    for position, numel, piece in zip(bucket.positions, bucket.numels, pieces):
        # torch 2.4 gives every empty entry the shape (0,): restore its own.
        out[position] = piece if numel else piece.view(values[position].shape)
