from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from paramdict import _buckets

DTYPES = (torch.float32, torch.float64, torch.int64, torch.float16)

shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
entries = st.lists(st.tuples(st.sampled_from(DTYPES), shapes), max_size=24)


def make(spec: list[tuple[torch.dtype, tuple[int, ...]]]) -> list[Tensor]:
    return [
        torch.arange(torch.Size(shape).numel()).reshape(shape).to(dtype) + i
        for i, (dtype, shape) in enumerate(spec)
    ]


@given(entries, st.integers(1, 200))
def test_plan_covers_every_entry_once_in_order_within_the_cap(
    spec: list[tuple[torch.dtype, tuple[int, ...]]], cap: int
) -> None:
    """Buckets hold one dtype each, every entry once, in order, under the cap."""
    values = make(spec)
    buckets = _buckets.plan(values, cap)
    seen = sorted(i for b in buckets for i in b.positions)
    assert seen == list(range(len(values)))
    for bucket in buckets:
        assert bucket.positions  # no empty buckets
        assert list(bucket.positions) == sorted(bucket.positions)
        assert {values[i].dtype for i in bucket.positions} == {bucket.dtype}
        assert bucket.numels == tuple(values[i].numel() for i in bucket.positions)
        size = bucket.numel * values[bucket.positions[0]].element_size()
        assert size <= cap or len(bucket.positions) == 1
    for dtype in DTYPES:  # buckets of one dtype follow the key order
        order = [i for b in buckets if b.dtype == dtype for i in b.positions]
        assert order == sorted(order)


@given(entries, st.integers(1, 200))
def test_pack_then_unpack_gives_back_the_values(
    spec: list[tuple[torch.dtype, tuple[int, ...]]], cap: int
) -> None:
    """Packing and unpacking every bucket returns equal, non-aliasing entries."""
    values = make(spec)
    out = list(values)
    for bucket in _buckets.plan(values, cap):
        buffer = _buckets.pack(values, bucket)
        assert buffer.shape == (bucket.numel,)
        if bucket.numel:  # empty storages may all share the null pointer
            assert buffer.untyped_storage().data_ptr() not in {
                values[i].untyped_storage().data_ptr() for i in bucket.positions
            }
        _buckets.unpack(buffer, bucket, values, out)
    for got, want in zip(out, values, strict=True):
        assert got is not want
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_bucket_closes_when_the_next_entry_would_overflow_it() -> None:
    """Four 16-byte entries under a 40-byte cap: buckets of two, two."""
    values = [torch.zeros(4) for _ in range(4)]
    buckets = _buckets.plan(values, 40)
    assert [b.positions for b in buckets] == [(0, 1), (2, 3)]


def test_pack_copies_a_lone_non_contiguous_entry() -> None:
    """A bucket of one transposed entry is packed into a new buffer."""
    value = torch.arange(6.0).reshape(2, 3).t()
    (bucket,) = _buckets.plan([value], 1)
    buffer = _buckets.pack([value], bucket)
    buffer.zero_()
    torch.testing.assert_close(value, torch.arange(6.0).reshape(2, 3).t())
