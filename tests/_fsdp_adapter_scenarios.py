"""FSDP2 scenarios through `optim.as_torch_optimizer`, run by `test_fsdp_adapter.py`.

The scenarios of `_fsdp_scenarios` with the adapter where torch's optimizer was:
the same sharded models, the same loop (`backward`, a clip where the name says
so, `step`, `zero_grad`), and torch.distributed.checkpoint's optimizer state
dicts taken from and given to the adapter as to torch's optimizers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from _fsdp_scenarios import (
    OPTIMIZERS,
    STEPS,
    _full,
    _local,
    local_batch,
    sharded,
)
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.utils import clip_grad_norm_

from paramdict import ParamDict, optim

Scenario = Any

CHECKPOINT_VARIABLE = "PARAMDICT_TEST_FSDP_ADAPTER_CHECKPOINT"
MAX_NORM = 0.05
ADAMW = OPTIMIZERS["adamw"][2]


def _train(
    net: nn.Module, opt: torch.optim.Optimizer, rank: int, world_size: int, name: str
) -> None:
    x, y = local_batch(rank, world_size)
    for _ in range(STEPS):
        torch.autograd.backward(F.mse_loss(net(x), y))
        if name.startswith("clipped"):
            clip_grad_norm_(net.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()


def _ours(name: str, net: nn.Module) -> torch.optim.Optimizer:
    """The paramdict optimizer of `name` behind the adapter; a clip is the loop's."""
    ours, _, options = OPTIMIZERS[name]
    if name.startswith("clipped"):
        return optim.as_torch_optimizer(optim.AdamW(**options), net)
    return optim.as_torch_optimizer(ours(**options), net)


def optimizers(rank: int, world_size: int) -> dict[str, Any]:
    """Five steps of each optimizer, through the adapter and torch.optim's."""
    mesh = init_device_mesh("cpu", (world_size,))
    results: dict[str, Any] = {}
    for name, (_, theirs, options) in OPTIMIZERS.items():
        net, twin = sharded(mesh), sharded(mesh)
        adapter = _ours(name, net)
        reference = theirs(twin.parameters(), **options)
        _train(net, adapter, rank, world_size, name)
        _train(twin, reference, rank, world_size, name)
        params = ParamDict.from_module(net)
        results[name] = {
            "ours": _local(params),
            "theirs": _local(ParamDict.from_module(twin)),
            "full": _full(params),
            "same objects": all(
                p is q
                for p, q in zip(adapter.param_groups[0]["params"], params.values())
            ),
        }
    return results


def _path() -> str:
    return os.path.join(os.environ[CHECKPOINT_VARIABLE], "adapter-adamw")


def adapter_save(rank: int, world_size: int) -> dict[str, Any]:
    """AdamW through the adapter, its state read and saved by torch's DCP."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_saver import save

    mesh = init_device_mesh("cpu", (world_size,))
    net, twin = sharded(mesh), sharded(mesh)
    adapter = optim.as_torch_optimizer(optim.AdamW(**ADAMW), net)
    reference = torch.optim.AdamW(twin.parameters(), **ADAMW)
    _train(net, adapter, rank, world_size, "adamw")
    _train(twin, reference, rank, world_size, "adamw")
    ours = get_optimizer_state_dict(net, adapter)
    theirs = get_optimizer_state_dict(twin, reference)
    save({"model": get_model_state_dict(net), "optim": ours}, checkpoint_id=_path())

    def local(osd: Any) -> dict[str, dict[str, torch.Tensor]]:
        return {
            fqn: {k: getattr(v, "to_local", lambda v=v: v)() for k, v in entry.items()}
            for fqn, entry in osd["state"].items()
        }

    return {
        "ours": local(ours),
        "theirs": local(theirs),
        "full": _full(ParamDict.from_module(net)),
    }


def adapter_resume(rank: int, world_size: int) -> dict[str, Any]:
    """Resume the adapter's DCP checkpoint in torch's AdamW and in the adapter."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    mesh = init_device_mesh("cpu", (world_size,))
    runs: dict[str, Any] = {}
    for kind in ("ours", "theirs"):
        net = sharded(mesh, seed=1)
        opt: torch.optim.Optimizer = (
            optim.as_torch_optimizer(optim.AdamW(lr=0.5), net)
            if kind == "ours"
            else torch.optim.AdamW(net.parameters(), lr=0.5)
        )
        model_dict = get_model_state_dict(net)
        optim_dict = get_optimizer_state_dict(net, opt)
        load({"model": model_dict, "optim": optim_dict}, checkpoint_id=_path())
        set_model_state_dict(net, model_dict)
        set_optimizer_state_dict(net, opt, optim_dict)
        start = [g["lr"] for g in opt.param_groups]
        _train(net, opt, rank, world_size, "adamw")
        runs[kind] = (net, start)
    (net, start), (twin, _) = runs["ours"], runs["theirs"]
    params = ParamDict.from_module(net)
    return {
        "lr": start,
        "ours": _local(params),
        "theirs": _local(ParamDict.from_module(twin)),
        "full": _full(params),
    }


SCENARIOS: dict[str, Scenario] = {
    "optimizers": optimizers,
    "adapter_save": adapter_save,
    "adapter_resume": adapter_resume,
}
