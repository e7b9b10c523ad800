"""What each gloo process runs for `test_distributed.py`, and the data both sides share.

Every scenario is a function of `(rank, world_size)` that returns plain results
(tensors, ParamDicts, exceptions it was meant to catch); the assertions and the
single-process references live in the test module.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _distributed_worker import Scenario
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from paramdict import ParamDict
from paramdict.distributed import all_gather, all_reduce, broadcast

DTYPES = (torch.float32, torch.float64, torch.float16, torch.int64, torch.complex64)
SHAPES = ((3,), (2, 3), (), (0,), (4, 1, 2), (5, 2))
ENTRIES = 160
PER_TENSOR = 20
MAML_TASKS = 25
INNER_LR = 0.01
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "distributed.md"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


# ---------------------------------------------------------------- shared data


def entries(rank: int, *, dtypes: tuple[torch.dtype, ...] = DTYPES) -> ParamDict:
    """Return 160 small entries of mixed dtypes and shapes, different on each rank.

    Values are multiples of 1/8 below 8, so sums are exact in every dtype here; the
    `(5, 2)` entries are transposed views (not contiguous).
    """
    g = torch.Generator().manual_seed(1000 + rank)
    items = {}
    for i in range(ENTRIES):
        dtype = dtypes[i % len(dtypes)]
        shape = SHAPES[i % len(SHAPES)]
        stored = shape[::-1] if shape == (5, 2) else shape
        value = torch.randint(-64, 64, stored, generator=g).to(dtype)
        if dtype.is_floating_point:
            value = value / 8
        elif dtype.is_complex:
            value = (value + 1j * torch.randint(-64, 64, stored, generator=g)) / 8
        if shape == (5, 2):
            value = value.t()
        items[f"block{i // 4}.param{i % 4}"] = value
    return ParamDict(items)


def floating(p: ParamDict) -> ParamDict:
    """Return the floating-point and complex entries of `p`."""
    return p.filter(lambda _, v: v.is_floating_point() or v.is_complex())


def real(p: ParamDict) -> ParamDict:
    """Return the entries of `p` that are not complex."""
    return p.filter(lambda _, v: not v.is_complex())


def mlp(seed: int, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Return the sinusoid MLP (1-40-40-1, ReLU), initialized from `seed`."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
        )
    return model.to(dtype)


Task = tuple[Tensor, Tensor, Tensor, Tensor]


def sinusoid_tasks(seed: int, n: int, dtype: torch.dtype = torch.float64) -> list[Task]:
    """Return `n` sinusoid tasks (support x, support y, query x, query y), K=10."""
    g = torch.Generator().manual_seed(seed)
    tasks = []
    for _ in range(n):
        amplitude = torch.empty((), dtype=dtype).uniform_(0.1, 5.0, generator=g)
        phase = torch.empty((), dtype=dtype).uniform_(0.0, torch.pi, generator=g)
        x = torch.empty(20, 1, dtype=dtype).uniform_(-5.0, 5.0, generator=g)
        y = amplitude * torch.sin(x - phase)
        tasks.append((x[:10], y[:10], x[10:], y[10:]))
    return tasks


def share(n: int, rank: int, world_size: int) -> range:
    """Return this rank's contiguous share of `n` items (sizes differ by one)."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def regression_batch(rank: int) -> tuple[Tensor, Tensor]:
    """Return this rank's 8 points of a regression batch (float32)."""
    g = torch.Generator().manual_seed(50 + rank)
    x = torch.randn(8, 1, generator=g)
    return x, torch.sin(x)


# ---------------------------------------------------------------- counting


class CountCollectives(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's base class is unannotated
    """Count the `c10d` operations (every collective, however it was called)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # unannotated in torch
        self.count = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func.namespace == "c10d":
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting() -> Iterator[CountCollectives]:
    """Count the collectives run inside the block."""
    with CountCollectives() as counter:
        yield counter


# ---------------------------------------------------------------- scenarios


def reduce(rank: int, world_size: int) -> dict[str, Any]:
    p = entries(rank)
    before = entries(rank)
    results: dict[str, Any] = {
        "sum": all_reduce(p, op="sum"),
        "mean": all_reduce(floating(p), op="mean"),
        "max": all_reduce(real(p), op="max"),
        "min": all_reduce(real(p), op="min"),
    }
    results["unchanged"] = p == before
    return results


def count(rank: int, world_size: int) -> dict[str, Any]:
    same = entries(rank, dtypes=(torch.float32,))
    mixed = entries(rank)
    one_kib = ParamDict(
        {f"w{i}": torch.full((256,), float(rank + i)) for i in range(ENTRIES)}
    )
    counts: dict[str, Any] = {}
    with counting() as c:
        all_reduce(same, op="sum")
    counts["float32"] = c.count
    with counting() as c:
        all_reduce(mixed, op="sum")
    counts["mixed"] = c.count
    with counting() as c:
        all_reduce(mixed, op="sum", bucket_cap_mb=1e6)
    counts["mixed, huge cap"] = c.count
    with counting() as c:
        capped = all_reduce(one_kib, op="sum", bucket_cap_mb=0.01)
    counts["1 KiB entries, 0.01 MiB cap"] = c.count
    with counting() as c:
        broadcast(mixed, src=0)
    counts["broadcast mixed"] = c.count
    with counting() as c:  # one collective per tensor, for the first 20 entries
        for value in list(same.values())[:PER_TENSOR]:
            dist.all_reduce(value.clone())
    counts["per tensor"] = c.count
    counts["capped result"] = capped
    return counts


def broadcast_last(rank: int, world_size: int) -> ParamDict:
    return broadcast(entries(rank), src=world_size - 1)


def gather(rank: int, world_size: int) -> list[ParamDict]:
    return all_gather(entries(rank))


def mismatch(rank: int, world_size: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    base = ParamDict(
        {
            "a.weight": torch.randn(2, 3, generator=g),
            "a.bias": torch.randn(2, generator=g),
            "b.weight": torch.randn(1, 2, generator=g),
        }
    )
    odd = rank == 1
    cases: dict[str, tuple[ParamDict, str]] = {
        "order": (ParamDict(dict(reversed(base.items()))) if odd else base, "sum"),
        "keys": (
            ParamDict({("a.beta" if k == "a.bias" else k): v for k, v in base.items()})
            if odd
            else base,
            "sum",
        ),
        "shape": (base | {"a.bias": torch.zeros(3)} if odd else base, "sum"),
        "dtype": (
            base | {"a.bias": base["a.bias"].double()} if odd else base,
            "sum",
        ),
        "options": (base, "mean" if odd else "sum"),
    }
    caught: dict[str, Any] = {}
    for name, (p, op) in cases.items():
        try:
            all_reduce(p, op=op)  # type: ignore[arg-type]  # op is "sum" or "mean"
        except ValueError as err:
            caught[name] = err
        else:
            caught[name] = None
    try:
        if odd:
            broadcast(base, src=0)
        else:
            all_reduce(base, op="sum")
    except ValueError as err:
        caught["operation"] = err
    else:
        caught["operation"] = None
    # The group is still usable after the errors.
    caught["after"] = all_reduce(base, op="mean")
    caught["base"] = base
    return caught


def autograd(rank: int, world_size: int) -> dict[str, Any]:
    model = mlp(0)
    params = ParamDict.from_module(model)
    x, y = regression_batch(rank)
    grads = params.grad(F.mse_loss(params.call(model, x), y), create_graph=True)
    fast = params - INNER_LR * grads
    reduced_params = all_reduce(params, op="mean")
    reduced_fast = all_reduce(fast, op="sum")
    return {
        "params require grad": all(v.requires_grad for v in params.values()),
        "fast has grad_fn": all(v.grad_fn is not None for v in fast.values()),
        "results require grad": [
            v.requires_grad for v in (*reduced_params.values(), *reduced_fast.values())
        ],
        "params untouched": all(params[k] is v for k, v in model.named_parameters()),
        "reduced params": reduced_params,
        "params": params.detach(),
    }


def maml(rank: int, world_size: int) -> ParamDict:
    model = mlp(0, torch.float64)
    params = ParamDict.from_module(model)
    tasks = sinusoid_tasks(1, MAML_TASKS)
    meta_loss = torch.zeros((), dtype=torch.float64)
    for i in share(MAML_TASKS, rank, world_size):
        x_support, y_support, x_query, y_query = tasks[i]
        support_loss = F.mse_loss(params.call(model, x_support), y_support)
        fast = params - INNER_LR * params.grad(support_loss, create_graph=True)
        meta_loss = meta_loss + F.mse_loss(fast.call(model, x_query), y_query)
    # Divide by the whole meta-batch, not this rank's share, then sum over ranks:
    # the result is the mean over all tasks whatever the shares are.
    local = params.grad(meta_loss / MAML_TASKS)
    return all_reduce(local, op="sum")


def ddp(rank: int, world_size: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    wrapped = DistributedDataParallel(mlp(rank))  # starts from rank 0's weights
    params = ParamDict.from_module(wrapped.module)
    x, y = regression_batch(rank)
    ddp_grads = params.backward(F.mse_loss(wrapped(x), y))
    local = params.grad(F.mse_loss(params.call(wrapped.module, x), y))
    return {
        "keys": list(params),
        "wrapper keys": list(ParamDict.from_module(wrapped)),
        "module keys": [k for k, _ in mlp(0).named_parameters()],
        "same objects": all(
            params[k] is v for k, v in wrapped.module.named_parameters()
        ),
        "ddp grads": ParamDict({k: v.clone() for k, v in ddp_grads.items()}),
        "keyed mean": all_reduce(local, op="mean"),
    }


def dtensor(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_module
    from torch.distributed.tensor import distribute_tensor as place

    mesh = init_device_mesh("cpu", (world_size,))
    model = distribute_module(mlp(0), mesh)  # parameters become replicated DTensors
    params = ParamDict.from_module(model)
    x, y = (torch.cat(t) for t in zip(*(regression_batch(r) for r in range(2))))
    # Batch sharded over the processes, parameters replicated: data parallel.
    prediction = params.call(model, place(x, mesh, [Shard(0)]))
    # `mse_loss(reduction="sum")` spelled out: DTensor shards these ops on every
    # torch with a public DTensor, `mse_loss` itself only on newer ones.
    loss = ((prediction - place(y, mesh, [Shard(0)])) ** 2).sum()
    grads = params.grad(loss)  # Partial(sum) DTensors
    stepped = params - INNER_LR * grads
    try:
        all_reduce(grads, op="mean")
    except TypeError as err:
        refused: Any = err
    else:
        refused = None
    return {
        "keys": list(params),
        "params are DTensors": all(isinstance(v, DTensor) for v in params.values()),
        "grads are DTensors": all(isinstance(v, DTensor) for v in grads.values()),
        "stepped are DTensors": all(isinstance(v, DTensor) for v in stepped.values()),
        "full grads": ParamDict(
            {k: cast(DTensor, v).full_tensor() for k, v in grads.items()}
        ),
        "refused": refused,
    }


def docs(rank: int, world_size: int) -> None:
    # Every python block of the page, also those that tests/test_docs.py skips for
    # needing several processes, as one script. (When the page's script still held
    # its DDP wrapper here, freeing it after the group was destroyed hung now and
    # then in gloo's shutdown; the page now frees it first.)
    blocks = FENCE.findall(DOCS_PAGE.read_text(encoding="utf-8"))
    script = "\n".join(blocks)
    exec(compile(script, str(DOCS_PAGE), "exec"), {"__name__": "__docs__"})


SCENARIOS: dict[str, Scenario] = {
    "reduce": reduce,
    "count": count,
    "broadcast": broadcast_last,
    "gather": gather,
    "mismatch": mismatch,
    "autograd": autograd,
    "maml": maml,
    "ddp": ddp,
    "dtensor": dtensor,
    "docs": docs,
}
