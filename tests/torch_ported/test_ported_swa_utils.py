"""PyTorch's `test/optim/test_swa_utils.py`, on `WeightAverage` and `update_bn`.

`torch.optim.swa_utils.AveragedModel` wraps a module and averages it in place;
here `WeightAverage.ema(decay)` / `WeightAverage.swa()` average a ParamDict
(`init`, then `update` once per step), and `update_bn(values, module, loader)`
returns the values with fresh BatchNorm statistics, the module unchanged.
Upstream's expected values are written out the same way; where a torch
`AveragedModel` runs beside, the average equals it bit for bit.

Upstream tests not ported, with the reason:

- The CUDA halves of `test_averaged_model_all_devices` (`device=` of the
  average differing from the model's): `WeightAverage` keeps the average on the
  devices `init` saw; the mixed-device case is kept, skipped without a GPU.
- `test_averaged_model_state_dict` and `test_averaged_model_default_avg_fn_picklable`
  check torch's module `state_dict` and pickling of `AveragedModel`; the
  counterparts here (the state through `torch.save(weights_only=True)`, the
  average pickled) are `test_state_round_trips_and_continues` and
  `test_average_pickles`.
- The `avg_fn=` half of `test_averaged_model_exponential`: an averaging
  function per tensor is torch's second spelling of the same EMA, which
  `WeightAverage.ema` has once.
"""

from __future__ import annotations

import io
import itertools
import pickle
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import swa_utils
from torch.utils.data import DataLoader, TensorDataset

from paramdict import ParamDict, optim

_swa: Any = swa_utils  # get_ema_multi_avg_fn is untyped
N_UPDATES = 10


def _dnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 5, kernel_size=3),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=2),
        nn.BatchNorm2d(5, momentum=0.3),
        nn.Conv2d(5, 2, kernel_size=3),
        nn.ReLU(),
        nn.Linear(5, 5),
        nn.ReLU(),
        nn.Linear(5, 10),
    )


def _expected_average(
    history: list[torch.Tensor], ema: bool, decay: float
) -> torch.Tensor:
    """Upstream's closed form of the average of `history`, oldest first."""
    n = len(history)
    total = torch.zeros_like(history[0])
    for i, value in enumerate(history):
        if ema:
            total += value * decay ** (n - i - 1) * ((1 - decay) if i > 0 else 1.0)
        else:
            total += value / n
    return total


@pytest.mark.parametrize("ema", [True, False], ids=["ema", "swa"])
def test_averaged_model_all_devices(ema: bool) -> None:
    """`test_averaged_model_all_devices` on the CPU: the closed form, and torch's."""
    # Upstream averages with `get_swa_multi_avg_fn()` (a `lerp` by `1 / (n + 1)`),
    # which rounds apart from `AveragedModel`'s default running mean; the average
    # here equals the default bitwise and the `lerp` one to float tolerance.
    decay = 0.999
    with torch.random.fork_rng():  # seeded here, the global generator untouched
        torch.manual_seed(0)
        dnn = _dnn()
    average = optim.WeightAverage.ema(decay) if ema else optim.WeightAverage.swa()
    multi = _swa.get_ema_multi_avg_fn(decay) if ema else _swa.get_swa_multi_avg_fn()
    reference = swa_utils.AveragedModel(dnn, multi_avg_fn=multi)
    default = swa_utils.AveragedModel(dnn) if not ema else reference
    state = average.init(ParamDict.from_module(dnn))
    history: dict[str, list[torch.Tensor]] = {k: [] for k, _ in dnn.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    for _ in range(N_UPDATES):
        with torch.no_grad():
            for key, p in dnn.named_parameters():
                p.add_(torch.randn(p.shape, generator=gen))
                history[key].append(p.detach().clone())
        reference.update_parameters(dnn)
        if default is not reference:
            default.update_parameters(dnn)
        state = average.update(state, ParamDict.from_module(dnn))
    assert int(state.n_averaged) == N_UPDATES
    upstream = ParamDict.from_module(reference.module)
    theirs = ParamDict.from_module(default.module)
    for key, values in history.items():
        torch.testing.assert_close(
            state.averaged[key], _expected_average(values, ema, decay)
        )
        torch.testing.assert_close(state.averaged[key], upstream[key])
        assert torch.equal(state.averaged[key], theirs[key])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("ema", [True, False], ids=["ema", "swa"])
def test_averaged_model_mixed_device(ema: bool) -> None:
    """`test_averaged_model_mixed_device`: each average stays on its tensor's device."""
    dnn = nn.Sequential(nn.Conv2d(1, 5, kernel_size=3), nn.Linear(5, 10))
    dnn[0].cuda()
    average = optim.WeightAverage.ema(0.999) if ema else optim.WeightAverage.swa()
    state = average.init(ParamDict.from_module(dnn))
    history: dict[str, list[torch.Tensor]] = {k: [] for k, _ in dnn.named_parameters()}
    for _ in range(N_UPDATES):
        with torch.no_grad():
            for key, p in dnn.named_parameters():
                p.add_(torch.randn_like(p))
                history[key].append(p.detach().clone())
        state = average.update(state, ParamDict.from_module(dnn))
    for key, values in history.items():
        assert state.averaged[key].device == values[0].device
        torch.testing.assert_close(
            state.averaged[key], _expected_average(values, ema, 0.999)
        )


@pytest.mark.parametrize("use_buffers", [True, False], ids=["buffers", "parameters"])
def test_averaged_model_exponential(use_buffers: bool) -> None:
    """`test_averaged_model_exponential`: EMA 0.9, buffers averaged when asked."""
    decay = 0.9
    with torch.random.fork_rng():
        torch.manual_seed(0)
        dnn = nn.Sequential(
            nn.Conv2d(1, 5, kernel_size=3),
            nn.BatchNorm2d(5, momentum=0.3),
            nn.Linear(5, 10),
        )
    average = optim.WeightAverage.ema(decay)
    reference = swa_utils.AveragedModel(
        dnn, multi_avg_fn=_swa.get_ema_multi_avg_fn(decay), use_buffers=use_buffers
    )
    state = average.init(ParamDict.from_module(dnn, buffers=use_buffers))
    named = itertools.chain(
        dnn.named_parameters(), dnn.named_buffers() if use_buffers else ()
    )
    tensors = {k: v for k, v in named if v.dim() > 0}  # upstream skips 0-dim ones
    expected: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(1)
    for _ in range(N_UPDATES):
        with torch.no_grad():
            for key, p in tensors.items():
                p.add_(torch.randn(p.shape, generator=gen))
                previous = expected.get(key)
                expected[key] = (
                    p.detach().clone()
                    if previous is None
                    else previous * decay + p * (1 - decay)
                )
        reference.update_parameters(dnn)
        state = average.update(state, ParamDict.from_module(dnn, buffers=use_buffers))
    theirs = ParamDict.from_module(reference.module, buffers=True)
    for key, value in expected.items():
        torch.testing.assert_close(state.averaged[key], value)
        assert torch.equal(state.averaged[key], theirs[key])
    assert ("1.running_mean" in state.averaged) == use_buffers


def test_state_round_trips_and_continues() -> None:
    """A saved average loads with `weights_only=True` and goes on identically."""
    dnn = nn.Sequential(nn.Conv2d(1, 5, kernel_size=3), nn.Linear(5, 10))
    average = optim.WeightAverage.swa()
    state = average.init(ParamDict.from_module(dnn))
    gen = torch.Generator().manual_seed(1)
    for _ in range(N_UPDATES):
        with torch.no_grad():
            for p in dnn.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        state = average.update(state, ParamDict.from_module(dnn))
    buffer = io.BytesIO()
    torch.save(
        {"n_averaged": state.n_averaged, "averaged": dict(state.averaged)}, buffer
    )
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    restored = optim.AveragedState(loaded["n_averaged"], ParamDict(loaded["averaged"]))
    values = ParamDict.from_module(dnn)
    a, b = average.update(state, values), average.update(restored, values)
    assert torch.equal(a.n_averaged, b.n_averaged)
    for key in a.averaged:
        assert torch.equal(a.averaged[key], b.averaged[key])


def test_average_pickles() -> None:
    """The averaging rule and its state pickle, as `AveragedModel` does."""
    dnn = nn.Sequential(
        nn.Conv2d(1, 5, kernel_size=3), nn.BatchNorm2d(5), nn.Linear(5, 5)
    )
    average = optim.WeightAverage.swa()
    state = average.init(ParamDict.from_module(dnn, buffers=True))
    again = pickle.loads(pickle.dumps(average))
    assert again == average
    copied = pickle.loads(pickle.dumps(state))
    assert list(copied.averaged) == list(state.averaged)


class _DNN(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.n_features = 100
        self.fc1 = nn.Linear(features, self.n_features)
        self.bn = nn.BatchNorm1d(self.n_features)

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc1(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bn(self.fc1(x))
        return out


class _CNN(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.n_features = 10
        self.conv1 = nn.Conv2d(channels, self.n_features, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(self.n_features, momentum=0.3)

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv1(x)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.bn(self.conv1(x))
        return out


def _loaders(x: torch.Tensor) -> tuple[DataLoader[Any], DataLoader[Any]]:
    y = torch.rand(x.shape[0], generator=torch.Generator().manual_seed(2))
    dl_x = DataLoader(
        TensorDataset(x),
        batch_size=5,
        shuffle=True,
        generator=torch.Generator().manual_seed(3),
    )
    dl_xy = DataLoader(
        TensorDataset(x, y),
        batch_size=5,
        shuffle=True,
        generator=torch.Generator().manual_seed(4),
    )
    return dl_x, dl_xy


def _check_update_bn(net: Any, x: torch.Tensor) -> None:
    """Upstream's `_test_update_bn`: the statistics of the layer's inputs."""
    dl_x, dl_xy = _loaders(x)
    with torch.no_grad():
        pre = net.pre(x)
    if pre.dim() == 4:
        pre = pre.transpose(1, 3)
    pre = pre.contiguous().view(-1, net.n_features)
    mean = pre.mean(dim=0)
    var = (pre**2).mean(dim=0) - mean**2
    values = ParamDict.from_module(net, buffers=True)
    before = {k: v.detach().clone() for k, v in values.items()}
    fresh = optim.update_bn(values, net, dl_xy)
    torch.testing.assert_close(fresh["bn.running_mean"], mean)
    torch.testing.assert_close(fresh["bn.running_var"], var, atol=1e-1, rtol=0)
    # Again from reset statistics, and with the loader of inputs alone.
    reset = ParamDict(
        {
            **fresh,
            "bn.running_mean": torch.zeros_like(mean),
            "bn.running_var": torch.ones_like(var),
        }
    )
    for loader in (dl_xy, dl_x):
        again = optim.update_bn(reset, net, loader)
        torch.testing.assert_close(again["bn.running_mean"], mean)
        torch.testing.assert_close(again["bn.running_var"], var, atol=1e-1, rtol=0)
    # The module and the values given are unchanged.
    for key, value in ParamDict.from_module(net, buffers=True).items():
        assert torch.equal(value, before[key])
    assert net.training


def test_update_bn_dnn() -> None:
    """`test_update_bn_dnn`: a Linear layer into BatchNorm1d."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = _DNN(5).train()
    _check_update_bn(
        net, torch.rand(100, 5, generator=torch.Generator().manual_seed(1))
    )


def test_update_bn_cnn() -> None:
    """`test_update_bn_cnn`: a convolution into BatchNorm2d."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = _CNN(3).train()
    x = torch.rand(100, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    _check_update_bn(net, x)


def test_bn_update_eval_momentum() -> None:
    """`test_bn_update_eval_momentum`: the module stays in eval mode, momentum kept."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = _CNN(3).eval()
    dl_x, _ = _loaders(
        torch.rand(100, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    )
    fresh = optim.update_bn(ParamDict.from_module(net, buffers=True), net, dl_x)
    assert not net.training
    assert net.bn.momentum == 0.3
    running_mean = net.bn.running_mean
    assert running_mean is not None
    assert not torch.equal(fresh["bn.running_mean"], running_mean)
