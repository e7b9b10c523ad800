"""Data-parallel MAML on sinusoid regression: torchrun, gloo, keyed all-reduce.

Every process draws the same meta-batch of 25 sinusoid tasks (y = A sin(x - phi),
A ~ U[0.1, 5], phi ~ U[0, pi], x ~ U[-5, 5]; K = 10 support and 10 query points),
takes its contiguous share of them (13 and 12 on two processes), and computes the
second-order MAML meta-gradient of its share with one inner SGD step (lr 0.01) on an
MLP 1-40-40-1 with ReLU. Each share's loss is divided by the whole meta-batch size, so
the keyed all-reduce (`op="sum"`) gives every process the mean over all 25 tasks, even
with uneven shares. Then each process takes the same Adam step (lr 1e-3).

Run with:

    torchrun --nproc-per-node 2 examples/maml_distributed.py --check

`--check` makes rank 0 also train a single-process copy on the same tasks and compare
its meta-gradients (every step) and final parameters with the data-parallel ones; the
run fails if they differ. Without torchrun the script runs as one process.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict
from paramdict.distributed import all_reduce, broadcast

Task = tuple[Tensor, Tensor, Tensor, Tensor]


def sample_tasks(generator: torch.Generator, n: int, dtype: torch.dtype) -> list[Task]:
    """Return `n` tasks as (support x, support y, query x, query y), 10 points each."""
    tasks = []
    for _ in range(n):
        amplitude = torch.empty((), dtype=dtype).uniform_(0.1, 5.0, generator=generator)
        phase = torch.empty((), dtype=dtype).uniform_(
            0.0, torch.pi, generator=generator
        )
        x = torch.empty(20, 1, dtype=dtype).uniform_(-5.0, 5.0, generator=generator)
        y = amplitude * torch.sin(x - phase)
        tasks.append((x[:10], y[:10], x[10:], y[10:]))
    return tasks


def share(n: int, rank: int, world_size: int) -> range:
    """Return this rank's contiguous share of `n` tasks (sizes differ by one)."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def meta_loss(
    model: nn.Module,
    params: ParamDict,
    tasks: list[Task],
    *,
    inner_lr: float,
    meta_batch: int,
) -> Tensor:
    """Return the sum of the tasks' query losses after one inner step, / meta_batch."""
    total = torch.zeros((), dtype=next(iter(params.values())).dtype)
    for x_support, y_support, x_query, y_query in tasks:
        support_loss = F.mse_loss(params.call(model, x_support), y_support)
        fast = params - inner_lr * params.grad(support_loss, create_graph=True)
        total = total + F.mse_loss(fast.call(model, x_query), y_query)
    return total / meta_batch


def set_grads(params: ParamDict, grads: ParamDict) -> None:
    """Hand keyed gradients to a `torch.optim` optimizer through `.grad`."""
    for key, grad in grads.items():
        params[key].grad = grad


def largest_difference(a: ParamDict, b: ParamDict) -> float:
    """Return the largest absolute difference between two ParamDicts' entries."""
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def init_process_group() -> None:
    """Join torchrun's group, or make a group of one when run without torchrun."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--meta-batch", type=int, default=25)
    parser.add_argument("--inner-lr", type=float, default=0.01)
    parser.add_argument("--meta-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--float64", action="store_true", help="train in float64")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument(
        "--check",
        action="store_true",
        help="on rank 0, also train a single-process copy and compare",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = torch.float64 if args.float64 else torch.float32
    init_process_group()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = share(args.meta_batch, rank, world_size)

    torch.manual_seed(args.seed + rank)  # deliberately different on each rank ...
    model = nn.Sequential(
        nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
    ).to(dtype)
    # ... until every rank starts from rank 0's weights.
    broadcast(ParamDict.from_module(model), src=0).to_module(model)
    params = ParamDict.from_module(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.meta_lr)

    check = args.check and rank == 0
    if check:
        single_model = copy.deepcopy(model)
        single_params = ParamDict.from_module(single_model)
        single_optimizer = torch.optim.Adam(single_model.parameters(), lr=args.meta_lr)
        worst_grad = 0.0
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-10, 1e-12)

    if rank == 0:
        shares = [len(share(args.meta_batch, r, world_size)) for r in range(world_size)]
        print(
            f"{world_size} process(es), tasks per process {shares}, "
            f"{args.steps} steps, "
            f"{dtype}"
        )
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        # Every rank draws the same meta-batch, then keeps its share of it.
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        tasks = sample_tasks(generator, args.meta_batch, dtype)
        loss = meta_loss(
            model,
            params,
            [tasks[i] for i in mine],
            inner_lr=args.inner_lr,
            meta_batch=args.meta_batch,
        )
        grads = all_reduce(params.grad(loss), op="sum")  # the mean over all tasks
        set_grads(params, grads)
        optimizer.step()

        if check:
            single_loss = meta_loss(
                single_model,
                single_params,
                tasks,
                inner_lr=args.inner_lr,
                meta_batch=args.meta_batch,
            )
            single_grads = single_params.grad(single_loss)
            torch.testing.assert_close(
                dict(grads),
                dict(single_grads),
                rtol=rtol,
                atol=atol,
                msg=functools.partial("step {}: {}".format, step),
            )
            worst_grad = max(worst_grad, largest_difference(grads, single_grads))
            set_grads(single_params, single_grads)
            single_optimizer.step()

        if step % args.log_every == 0 or step == args.steps:
            total = all_reduce(ParamDict(loss=loss.detach()), op="sum")["loss"]
            if rank == 0:
                print(
                    f"step {step:5d}  meta-loss {total.item():.4f}  "
                    f"{time.perf_counter() - start:.1f} s"
                )

    if check:
        torch.testing.assert_close(
            dict(params), dict(single_params), rtol=rtol, atol=atol
        )
        worst_param = largest_difference(params, single_params)
        print(
            "check passed: data-parallel meta-gradients and final parameters equal the "
            f"single-process run on the same tasks (max |difference|: gradients "
            f"{worst_grad:.2e}, parameters {worst_param:.2e})"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
