"""Converting state on a torch without the counterpart: refused, naming the release.

paramdict supports torch from 2.6, while torch.optim.Muon came in 2.9 and
torch.optim.Adam's `decoupled_weight_decay` in 2.7. These tests take the newer
piece away from the installed torch (any release), so they run everywhere.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from paramdict import ParamDict, optim


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2))


class _AdamOf26(torch.optim.Optimizer):
    """torch.optim.Adam's settings in torch 2.6: no `decoupled_weight_decay`."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        defaults = {
            "lr": 1e-3,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 0.0,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
        }
        super().__init__(params, {**defaults, **kwargs})


_AdamOf26.__name__ = _AdamOf26.__qualname__ = "Adam"


def test_muon_conversion_without_torch_muon_names_the_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without torch.optim.Muon, both directions name torch 2.9 and change nothing."""
    monkeypatch.delattr(torch.optim, "Muon", raising=False)
    model = _model()
    params = ParamDict.from_module(model).select("*weight")
    opt = optim.Muon(lr=0.02)
    state = opt.init(params)
    names = [["0.weight"]]
    match = r"torch\.optim\.Muon, which torch 2\.9 added.*Install torch>=2\.9"
    with pytest.raises(TypeError, match=match):
        optim.to_torch_state_dict(opt, state, names)
    saved = {"state": {}, "param_groups": [{"params": [0], "lr": 0.02}]}
    with pytest.raises(TypeError, match=match):
        optim.load_torch_state_dict(opt, saved, params, names)
    assert saved == {"state": {}, "param_groups": [{"params": [0], "lr": 0.02}]}


def test_decoupled_adam_on_a_torch_without_the_setting_points_to_adamw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adam(decoupled_weight_decay=True) names torch 2.7 and AdamW; False converts."""
    monkeypatch.setattr(torch.optim, "Adam", _AdamOf26)
    model = _model()
    params = ParamDict.from_module(model)
    decoupled = optim.Adam(lr=0.1, weight_decay=0.1, decoupled_weight_decay=True)
    match = (
        r"Adam\(decoupled_weight_decay=True\).*which torch 2\.7 added.*"
        r"Install torch>=2\.7.*optim\.AdamW"
    )
    with pytest.raises(ValueError, match=match):
        optim.to_torch_state_dict(decoupled, decoupled.init(params), model)

    plain = optim.Adam(lr=0.1, weight_decay=0.1, fused=False)
    exported = optim.to_torch_state_dict(plain, plain.init(params), model)
    assert "decoupled_weight_decay" not in exported["param_groups"][0]
    with pytest.raises(ValueError, match=match):
        optim.load_torch_state_dict(decoupled, exported, params, model)
    loaded = optim.load_torch_state_dict(plain, exported, params, model)
    assert type(loaded) is type(plain.init(params))
