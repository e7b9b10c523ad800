"""Scenarios on FSDP2-sharded models, run in gloo processes by `tests/test_fsdp.py`.

Each is a plain function of `(rank, world_size)` returning what the test compares
with single-process references: plain tensors, ParamDicts of them, and caught
exceptions.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grad_norm_

from paramdict import ParamDict, optim

Scenario = Callable[[int, int], Any]

STEPS = 5
MAX_NORM = 0.05
ROWS = 12  # divisible by 2 and 3: every process gets as many rows
CHECKPOINT_VARIABLE = "PARAMDICT_TEST_FSDP_CHECKPOINT"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Name -> (ours, theirs, options). Shapes below shard unevenly over 2 and 3.
OPTIMIZERS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "sgd-momentum": (optim.SGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adam": (optim.Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    "adamw": (optim.AdamW, torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "rmsprop": (
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "momentum": 0.5, "centered": True},
    ),
    "adagrad": (optim.Adagrad, torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}),
    # Behind a global-norm clip that binds at every step; torch.optim's twin runs
    # `clip_grad_norm_` first.
    "clipped-adamw": (
        lambda **kw: optim.ClipGradNorm(optim.AdamW(**kw), max_norm=MAX_NORM),
        torch.optim.AdamW,
        {"lr": 0.01},
    ),
}


def model(seed: int = 0) -> nn.Sequential:
    """A float64 MLP whose tensors shard unevenly over 2 and 3 processes."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(5, 7), nn.LayerNorm(7), nn.Tanh(), nn.Linear(7, 3)
    ).double()


def batch() -> tuple[Tensor, Tensor]:
    """The full batch, the same on every process."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, 5, generator=g, dtype=torch.float64)
    y = torch.randn(ROWS, 3, generator=g, dtype=torch.float64)
    return x, y


def local_batch(rank: int, world_size: int) -> tuple[Tensor, Tensor]:
    """This process's rows of the full batch."""
    x, y = batch()
    rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
    return x[rows], y[rows]


def sharded(mesh: DeviceMesh, seed: int = 0) -> nn.Sequential:
    """`model(seed)` with each linear layer and the root sharded by FSDP2."""
    net = model(seed)
    for layer in (net[0], net[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def _local(p: ParamDict) -> ParamDict:
    return ParamDict(
        {k: cast(DTensor, v).to_local().detach().clone() for k, v in p.items()}
    )


def _full(p: ParamDict) -> ParamDict:
    return ParamDict(
        {k: cast(DTensor, v).full_tensor().detach().clone() for k, v in p.items()}
    )


def optimizers(rank: int, world_size: int) -> dict[str, Any]:
    """Five steps of each optimizer, ours and torch.optim's, on twin FSDP2 models."""
    mesh = init_device_mesh("cpu", (world_size,))
    x, y = local_batch(rank, world_size)
    results: dict[str, Any] = {}
    for name, (ours, theirs, options) in OPTIMIZERS.items():
        for differentiable in (False, True):
            net, twin = sharded(mesh), sharded(mesh)
            params = ParamDict.from_module(net)
            opt = ours(**options, differentiable=differentiable)
            state = opt.init(params)
            reference = theirs(twin.parameters(), **options)
            for _ in range(STEPS):
                grads = params.backward(F.mse_loss(net(x), y))
                new, state = opt.step(params, grads, state)
                new.to_module(net)
                net.zero_grad()
                torch.autograd.backward(F.mse_loss(twin(x), y))
                if name.startswith("clipped"):
                    clip_grad_norm_(twin.parameters(), MAX_NORM)
                reference.step()
                reference.zero_grad()
            results[f"{name}{'-differentiable' if differentiable else ''}"] = {
                "ours": _local(params),
                "theirs": _local(ParamDict.from_module(twin)),
                "full": _full(params),
                "dtensors": all(isinstance(v, DTensor) for v in new.values()),
            }
    return results


def grads(rank: int, world_size: int) -> dict[str, Any]:
    """`backward` on an FSDP2 model, beside `loss.backward()` on a twin; `grad`."""
    mesh = init_device_mesh("cpu", (world_size,))
    x, y = local_batch(rank, world_size)
    net, twin = sharded(mesh), sharded(mesh)
    params = ParamDict.from_module(net)
    got = params.backward(F.mse_loss(net(x), y))
    first, first_full = _local(got), _full(got)  # before `got` accumulates again
    torch.autograd.backward(F.mse_loss(twin(x), y))
    expected = ParamDict({k: cast(Tensor, v.grad) for k, v in twin.named_parameters()})
    # A second backward accumulates, as `loss.backward()` does.
    twice = params.backward(F.mse_loss(net(x), y))
    try:
        params.grad(F.mse_loss(net(x), y))
    except ValueError as err:
        refused: Any = err
    else:
        refused = None
    return {
        "keys": list(got),
        "param keys": list(params),
        "identity": all(got[k] is v.grad for k, v in params.items()),
        "dtensors": all(isinstance(v, DTensor) for v in got.values()),
        "ours": first,
        "theirs": _local(expected),
        "twice": _local(twice),
        "full": first_full,
        "refused": refused,
    }


def takeover(rank: int, world_size: int) -> dict[str, Any]:
    """`call` and `swapped_into` with other tensors on a never-run FSDP2 model."""
    mesh = init_device_mesh("cpu", (world_size,))
    x, _ = local_batch(rank, world_size)
    net = sharded(mesh)
    params = ParamDict.from_module(net)
    before = _local(params)
    errors: list[Any] = []
    try:
        (params * 0).call(net, x)
    except TypeError as err:
        errors.append(err)
    try:
        with (params * 0).swapped_into(net):
            net(x)
    except TypeError as err:
        errors.append(err)
    same_objects = all(ParamDict.from_module(net)[k] is v for k, v in params.items())
    after = _local(ParamDict.from_module(net))
    out = net(x).detach()
    # A module's own tensors need no swap: a never-run twin runs as itself.
    twin = sharded(mesh)
    own = ParamDict.from_module(twin).call(twin, x).detach()
    return {
        "errors": errors,
        "same objects": same_objects,
        "before": before,
        "after": after,
        "out": out,
        "own": own,
    }


def _torch_run_path() -> str:
    return os.path.join(os.environ[CHECKPOINT_VARIABLE], "torch-adamw")


def _adamw(net: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(net.parameters(), **OPTIMIZERS["adamw"][2])


def _torch_steps(
    net: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor
) -> None:
    for _ in range(STEPS):
        torch.autograd.backward(F.mse_loss(net(x), y))
        opt.step()
        opt.zero_grad()


def torch_adamw_save(rank: int, world_size: int) -> dict[str, Any]:
    """`STEPS` steps of torch.optim's AdamW, saved with torch.distributed.checkpoint."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_saver import save

    mesh = init_device_mesh("cpu", (world_size,))
    net = sharded(mesh)
    opt = _adamw(net)
    _torch_steps(net, opt, *local_batch(rank, world_size))
    saved = {
        "model": get_model_state_dict(net),
        "optim": get_optimizer_state_dict(net, opt),
    }
    save(saved, checkpoint_id=_torch_run_path())
    return {"full": _full(ParamDict.from_module(net))}


def torch_adamw_resume(rank: int, world_size: int) -> dict[str, Any]:
    """Resume the saved AdamW run in torch.optim and in paramdict; step both."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    mesh = init_device_mesh("cpu", (world_size,))
    x, y = local_batch(rank, world_size)
    twin = sharded(mesh, seed=1)
    theirs = _adamw(twin)
    model_dict = get_model_state_dict(twin)
    optim_dict = get_optimizer_state_dict(twin, theirs)
    # DCP loads into these very dicts, in place.
    load({"model": model_dict, "optim": optim_dict}, checkpoint_id=_torch_run_path())
    set_model_state_dict(twin, model_dict)
    set_optimizer_state_dict(twin, theirs, optim_dict)
    _torch_steps(twin, theirs, x, y)

    net = sharded(mesh, seed=1)
    model_state = {"model": get_model_state_dict(net)}
    load(model_state, checkpoint_id=_torch_run_path())
    set_model_state_dict(net, model_state["model"])
    params = ParamDict.from_module(net)
    opt = optim.AdamW(**OPTIMIZERS["adamw"][2])
    names = [list(params)]
    template = {
        "optim": optim.to_torch_state_dict(opt, opt.init(params), names, by_name=True)
    }
    load(template, checkpoint_id=_torch_run_path())  # resharded onto 3 processes
    state = optim.load_torch_state_dict(opt, template["optim"], params)
    start = int(state.step)
    for _ in range(STEPS):
        grads = params.backward(F.mse_loss(net(x), y))
        new, state = opt.step(params, grads, state)
        new.to_module(net)
        net.zero_grad()
    return {
        "start": start,
        "ours": _local(params),
        "theirs": _local(ParamDict.from_module(twin)),
        "full": _full(params),
    }


def _example(*extra: str) -> dict[str, Any]:
    """`examples/train_fsdp2.py --quick`, as torchrun runs it (own process group)."""
    sys.path.insert(0, str(EXAMPLES.parent))
    from examples import train_fsdp2

    path = os.environ[CHECKPOINT_VARIABLE]
    return train_fsdp2.main(["--quick", "--checkpoint", path, *extra])


def example(rank: int, world_size: int) -> dict[str, Any]:
    """Train, save a checkpoint halfway, restore it and step again."""
    return _example()


def resume(rank: int, world_size: int) -> dict[str, Any]:
    """Continue from the checkpoint `example` saved (on another world size)."""
    return _example("--resume")


SCENARIOS: dict[str, Scenario] = {
    "optimizers": optimizers,
    "grads": grads,
    "takeover": takeover,
    "torch_adamw_save": torch_adamw_save,
    "torch_adamw_resume": torch_adamw_resume,
    "example": example,
    "resume": resume,
}
