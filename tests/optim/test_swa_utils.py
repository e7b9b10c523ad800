"""`WeightAverage` and `update_bn` against `torch.optim.swa_utils`, bitwise."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from _helpers import MyParams
from torch import nn
from torch.optim import swa_utils

from paramdict import ParamDict, optim

_loose: Any = optim  # untyped view of the API, to pass bad arguments
_swa: Any = swa_utils  # get_ema_multi_avg_fn is untyped


def _model(dtype: torch.dtype) -> nn.Module:
    with torch.random.fork_rng():  # seeded here, the global generator untouched
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)
        ).to(dtype)


@pytest.mark.parametrize("in_place", [False, True], ids=["update", "update_"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("average", "torch_kwargs"),
    [
        (
            optim.WeightAverage.ema(0.9),
            {"multi_avg_fn": _swa.get_ema_multi_avg_fn(0.9)},
        ),
        (
            optim.WeightAverage.ema(0.999),
            {"multi_avg_fn": _swa.get_ema_multi_avg_fn(0.999)},
        ),
        (optim.WeightAverage.swa(), {}),
    ],
    ids=["ema-0.9", "ema-0.999", "swa"],
)
def test_average_equals_averaged_model(
    average: optim.WeightAverage,
    torch_kwargs: dict[str, object],
    dtype: torch.dtype,
    in_place: bool,
) -> None:
    """100 updates equal `AveragedModel(use_buffers=True)` bitwise, buffers too."""
    model = _model(dtype)
    reference = swa_utils.AveragedModel(model, use_buffers=True, **torch_kwargs)  # type: ignore[arg-type]
    state = average.init(ParamDict.from_module(model, buffers=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    for _ in range(100):
        x = torch.randn(16, 4, generator=gen, dtype=dtype)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        reference.update_parameters(model)
        values = ParamDict.from_module(model, buffers=True)
        if in_place:
            averaged = state.averaged
            assert average.update_(state, values) is state
            assert all(
                a is b for a, b in zip(state.averaged.values(), averaged.values())
            )
        else:
            state = average.update(state, values)
    expected = ParamDict.from_module(reference.module, buffers=True)
    assert list(state.averaged) == list(expected)
    for key in expected:
        torch.testing.assert_close(state.averaged[key], expected[key], rtol=0, atol=0)
    assert int(state.n_averaged) == int(reference.n_averaged) == 100


def test_update_bn_equals_torch() -> None:
    """`update_bn` gives torch's statistics and leaves the module unchanged."""
    model = _model(torch.float64)
    gen = torch.Generator().manual_seed(2)
    loader = [
        (torch.randn(8, 4, generator=gen, dtype=torch.float64), 0) for _ in range(5)
    ]
    values = ParamDict.from_module(model, buffers=True).detach().clone()
    before = ParamDict.from_module(model, buffers=True).detach().clone()
    ours = optim.update_bn(values, model, loader)
    swa_utils.update_bn(loader, model)
    for key, value in ParamDict.from_module(model, buffers=True).items():
        torch.testing.assert_close(ours[key], value, rtol=0, atol=0)
    assert not before["1.running_mean"].equal(ours["1.running_mean"])


def test_state_round_trips_weights_only() -> None:
    """The state saves and loads with `torch.load(weights_only=True)`."""
    average = optim.WeightAverage.ema()
    state = average.update(
        average.init(ParamDict(w=torch.ones(2))), {"w": torch.zeros(2)}
    )
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=True)) is optim.AveragedState


def test_update_is_pure() -> None:
    """`update` leaves the state and the values it was given unchanged."""
    average = optim.WeightAverage.swa()
    state = average.update(
        average.init(ParamDict(w=torch.zeros(2))), {"w": torch.ones(2)}
    )
    average.update(state, {"w": torch.full((2,), 3.0)})
    torch.testing.assert_close(state.averaged["w"], torch.ones(2))


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: _loose.WeightAverage.ema(1.5), ValueError, r"Invalid decay value 1.5"),
        (
            lambda: _loose.WeightAverage.ema("0.9"),
            TypeError,
            "`decay` must be a number",
        ),
        (
            lambda: _loose.WeightAverage(kind="mean"),
            ValueError,
            "`kind` must be 'ema' or 'swa'",
        ),
        (
            lambda: _loose.WeightAverage.swa().init({"w": torch.ones(1)}),
            TypeError,
            "must be a ParamDict",
        ),
        (
            lambda: _loose.WeightAverage.swa().update(
                _loose.WeightAverage.swa().init(ParamDict(w=torch.ones(1))),
                {"v": torch.ones(1)},
            ),
            ValueError,
            "missing",
        ),
    ],
)
def test_bad_arguments_raise(build: object, error: type[Exception], match: str) -> None:
    """Bad arguments are refused as torch refuses them."""
    with pytest.raises(error, match=match):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("traced", [False, True], ids=["readable count", "meta count"])
def test_update_keeps_a_paramdict_subclass(traced: bool) -> None:
    """Both paths of `update` return the average's own ParamDict type.

    One reads the count on the host, the other keeps it on its device.
    """
    ema = optim.WeightAverage.ema(0.5)
    state = ema.init(MyParams(w=torch.zeros(2)))
    values = {"w": torch.ones(2)}
    if traced:
        state = optim.AveragedState(
            state.n_averaged.to("meta"), state.averaged.to("meta")
        )
        values = {"w": torch.ones(2, device="meta")}
    out = ema.update(state, values)
    assert type(out.averaged) is MyParams
    assert out.averaged.keys() == state.averaged.keys()
