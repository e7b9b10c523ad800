"""Coalesced keyed all-reduce vs one `torch.distributed.all_reduce` per tensor.

Two gloo processes on 127.0.0.1 reduce the same 160 float32 entries three ways:

- per tensor: `torch.distributed.all_reduce` on each of the 160 tensors;
- flat buffer by hand: `torch.cat`, one `all_reduce`, `torch.split` (no checks);
- `paramdict.distributed.all_reduce`: the same coalescing plus the cross-process
  check of keys, shapes and dtypes (one extra all-reduce of two integers).

Each timing is the median over repeats on rank 0, each repeat after a barrier.

Run with `python -m benchmarks.distributed` (add `--quick` for a short run).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore  # typed; `dist.TCPStore` is not
from torch.multiprocessing import get_context
from torch.multiprocessing.spawn import ProcessContext, start_processes

from paramdict import ParamDict
from paramdict.distributed import all_reduce

ENTRIES = 160
WORLD_SIZE = 2
TIMEOUT = datetime.timedelta(seconds=60)

# (label, elements per entry): about 160 KiB and about 26 MiB of float32 in all.
SIZES = (("160 x 256 elements", 256), ("160 x 43,000 elements", 43_000))


def entries(rank: int, numel: int) -> ParamDict:
    g = torch.Generator().manual_seed(rank)
    return ParamDict(
        {f"layer{i}.weight": torch.randn(numel, generator=g) for i in range(ENTRIES)}
    )


def per_tensor(p: ParamDict) -> list[torch.Tensor]:
    out = [v.clone() for v in p.values()]
    for value in out:
        dist.all_reduce(value)
    return out


def by_hand(p: ParamDict) -> list[torch.Tensor]:
    values = list(p.values())
    flat = torch.cat([v.reshape(-1) for v in values])
    dist.all_reduce(flat)
    pieces = torch.split(flat, [v.numel() for v in values])
    return [piece.view(v.shape) for piece, v in zip(pieces, values)]


def keyed(p: ParamDict) -> ParamDict:
    return all_reduce(p, op="sum")


CASES: tuple[tuple[str, Callable[[ParamDict], object]], ...] = (
    ("per tensor (160 collectives)", per_tensor),
    ("flat buffer by hand (1)", by_hand),
    ("paramdict all_reduce (1 + 1 check)", keyed),
)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, port: int, repeats: int, sizes: Any, queue: Any) -> None:
    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, WORLD_SIZE, is_master=False, timeout=TIMEOUT)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=TIMEOUT
    )
    rows = []
    for label, numel in sizes:
        p = entries(rank, numel)
        expected = torch.stack(
            [torch.stack(list(entries(r, numel).values())) for r in range(WORLD_SIZE)]
        ).sum(0)
        for name, fn in CASES:
            got = torch.stack([torch.as_tensor(v) for v in _values(fn(p))])
            torch.testing.assert_close(got, expected)
            seconds = median_seconds(functools.partial(fn, p), repeats)
            rows.append((label, name, seconds))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def _values(result: object) -> list[torch.Tensor]:
    if isinstance(result, ParamDict):
        return list(result.values())
    return cast("list[torch.Tensor]", result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (10 if args.quick else 50)
    sizes = SIZES[:1] if args.quick else SIZES

    server = TCPStore(
        "127.0.0.1",
        0,
        WORLD_SIZE + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=TIMEOUT,
    )
    queue = get_context("spawn").SimpleQueue()
    start = cast("Callable[..., ProcessContext]", start_processes)  # unannotated
    start(
        _worker,
        args=(server.port, repeats, sizes, queue),
        nprocs=WORLD_SIZE,
        start_method="spawn",
    )
    rows = queue.get()
    print(
        f"all_reduce (sum) of {ENTRIES} float32 entries, {WORLD_SIZE} gloo processes, "
        f"torch {torch.__version__}, median of {repeats} on rank 0"
    )
    width = max(len(name) for name, _ in CASES)
    for label, *_ in sizes:
        print(f"\n{label}")
        baseline = next(
            t for size, name, t in rows if size == label and name == CASES[0][0]
        )
        for size, name, seconds in rows:
            if size == label:
                speedup = baseline / seconds
                print(f"  {name:<{width}}  {seconds * 1e3:9.3f} ms  x{speedup:6.1f}")


if __name__ == "__main__":
    main()
