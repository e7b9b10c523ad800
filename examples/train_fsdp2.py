"""Train an FSDP2-sharded model with `paramdict.optim.AdamW` on keyed parameters.

The model's parameters are sharded over the processes by FSDP2 (`fully_shard`),
so `ParamDict.from_module(model)` holds DTensor shards. Each step:

    grads = params.backward(loss)                  # the sharded gradients, keyed
    new, state = opt.step(params, grads, state)    # clipped, grouped AdamW
    new.to_module(model)                           # into FSDP2's own parameters

The optimizer is AdamW in two groups chosen by key pattern (no weight decay on
biases and norms) behind a global gradient-norm clip. Halfway, parameters and
optimizer state are saved with `torch.distributed.checkpoint`; at the end a fresh
model and state are restored from it and the next step is taken again, which must
give bitwise the same loss. A later run with `--resume` continues from the
checkpoint on any number of processes (the checkpoint is resharded on load).

Run (gloo on CPU, NCCL where a GPU is present):

    torchrun --nproc-per-node 2 examples/train_fsdp2.py --checkpoint ckpt
    torchrun --nproc-per-node 3 examples/train_fsdp2.py --checkpoint ckpt --resume
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict_loader import load as load_checkpoint
from torch.distributed.checkpoint.state_dict_saver import save as save_checkpoint
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from paramdict import ParamDict, optim

BATCH = 24  # rows per step, divisible by 1, 2, 3, 4, 6 processes
FEATURES = 16


class Block(nn.Module):
    """A residual MLP block with a pre-norm."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        """Return `x` plus the block's update."""
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):
    """A small residual MLP: embed, blocks, norm, head."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Return the prediction for `x`."""
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        out: Tensor = self.head(self.norm(x))
        return out


def build(mesh: DeviceMesh, width: int, depth: int, device: torch.device) -> Net:
    """The model, made identically on every process, each block sharded by FSDP2."""
    torch.manual_seed(0)
    model = Net(width, depth).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def optimizer(lr: float) -> optim.Optimizer[Any]:
    """AdamW with no weight decay on biases and norms, behind a gradient clip."""
    groups = optim.ParamGroups(
        {("*bias", "*norm.*"): optim.AdamW(lr=lr, weight_decay=0.0)},
        default=optim.AdamW(lr=lr, weight_decay=0.1),
    )
    return optim.ClipGradNorm(groups, max_norm=1.0)


def batch(step: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """This process's rows of step `step`'s batch (the same batch on any layout)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(BATCH, 1, generator=g)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
    return x[rows].to(device), y[rows].to(device)


def train_step(
    model: Net, opt: optim.Optimizer[Any], state: Any, step: int
) -> tuple[Any, float]:
    """One step; returns the new state and the loss averaged over the processes."""
    device = next(model.parameters()).device
    params = ParamDict.from_module(model)
    x, y = batch(step, device)
    loss = F.mse_loss(model(x), y)
    grads = params.backward(loss)  # sharded DTensor gradients, keyed like params
    new, state = opt.step(params, grads, state)
    new.to_module(model)  # copied into FSDP2's sharded parameters
    model.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return state, mean.item() / dist.get_world_size()


def checkpoint(model: Net, state: Any, step: int) -> dict[str, Any]:
    """Parameters, optimizer state and step as a plain dict of (D)Tensors.

    The dict holds the very tensors of the model and the state, so
    `torch.distributed.checkpoint.load` into it restores them in place.
    """
    groups = {
        str(i): {
            name: dict(value) if isinstance(value, ParamDict) else value
            for name, value in group._asdict().items()
        }
        for i, group in enumerate(state)
    }
    return {
        "model": dict(ParamDict.from_module(model)),
        "optim": groups,
        "step": torch.tensor(step),
    }


def full(tensors: dict[str, Any]) -> dict[str, Tensor]:
    """Every (D)Tensor of a checkpoint dict, gathered whole, keyed by its path."""
    out: dict[str, Tensor] = {}
    for key, value in tensors.items():
        if isinstance(value, dict):
            inner = full(cast("dict[str, Any]", value))
            out.update({f"{key}.{k}": v for k, v in inner.items()})
        elif isinstance(value, DTensor):
            out[key] = cast(DTensor, value.detach()).full_tensor().cpu()
        elif isinstance(value, tuple) and not value:  # an empty schedule slot
            continue
        else:
            out[key] = cast(Tensor, value).detach().cpu().clone()
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Train, checkpoint halfway, and check the restore; return what was measured."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small steps")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint", help="checkpoint directory (default: temp)")
    parser.add_argument(
        "--resume", action="store_true", help="continue from --checkpoint"
    )
    args = parser.parse_args(argv)
    steps, width, depth = (6, 8, 2) if args.quick else (args.steps, 64, 4)

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda" if cuda else "cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        return _run(args, steps, width, depth, device)
    finally:
        dist.destroy_process_group()


def _run(
    args: argparse.Namespace, steps: int, width: int, depth: int, device: torch.device
) -> dict[str, Any]:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world_size,))
    path = args.checkpoint
    if path is None:
        made = [tempfile.mkdtemp(prefix="train_fsdp2-") if rank == 0 else None]
        dist.broadcast_object_list(made)
        path = cast(str, made[0])
    opt = optimizer(args.lr)

    if args.resume:
        model = build(mesh, width, depth, device)
        state = opt.init(ParamDict.from_module(model))
        restored = checkpoint(model, state, 0)
        load_checkpoint(restored, checkpoint_id=path)  # resharded onto this layout
        loaded = full(restored)  # before training writes into these tensors
        start = int(restored["step"])
        losses: list[float] = []
        for step in range(start, steps):
            state, loss = train_step(model, opt, state, step)
            losses.append(loss)
            if rank == 0:
                print(f"step {step:4d}  loss {loss:.6f}  ({world_size} processes)")
        return {"restored": loaded, "start": start, "losses": losses}

    model = build(mesh, width, depth, device)
    state = opt.init(ParamDict.from_module(model))
    save_at = steps // 2
    losses = []
    saved: dict[str, Tensor] = {}
    for step in range(steps):
        if step == save_at:
            tensors = checkpoint(model, state, step)
            save_checkpoint(tensors, checkpoint_id=path)
            saved = full(tensors)
        state, loss = train_step(model, opt, state, step)
        losses.append(loss)
        if rank == 0:
            print(f"step {step:4d}  loss {loss:.6f}")

    # Restore into a fresh model and state and take the step after the save again.
    model = build(mesh, width, depth, device)
    state = opt.init(ParamDict.from_module(model))
    restored = checkpoint(model, state, 0)
    load_checkpoint(restored, checkpoint_id=path)
    _, again = train_step(model, opt, state, int(restored["step"]))
    if rank == 0:
        same = "bitwise the same" if again == losses[save_at] else "DIFFERENT"
        print(f"restored step {save_at}: loss {again:.6f}, {same}; saved to {path}")
    return {
        "losses": losses,
        "save_at": save_at,
        "again": again,
        "saved": saved,
        "checkpoint": path,
    }


if __name__ == "__main__":
    main()
