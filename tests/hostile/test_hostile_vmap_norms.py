"""Per-sample gradients through norm layers under vmap: allowed; their gradient is not.

torch's own `test_update_batch_norm` pattern (a vmapped `torch.func.grad` of a
loss that runs a BatchNorm in training mode through `functional_call`, the
parameters requiring grad) is first order and right; through `ParamDict.call` it
must work the same. Only a second derivative through those gradients, which
torch's vmap rule gets wrong, is refused, at the moment it is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict

D = torch.float64
SAMPLES, BATCH = 4, 5


@pytest.fixture(autouse=True)
def _own_random_state() -> Iterator[None]:
    """Seed each test and give the global generator back as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def _model(norm: Callable[[int], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 6), norm(6), nn.Tanh(), nn.Linear(6, 2))
    with torch.no_grad():  # affine weights away from 1, so their gradients matter
        norm_layer = model[1]
        if isinstance(norm_layer.weight, Tensor) and isinstance(
            norm_layer.bias, Tensor
        ):
            norm_layer.weight.uniform_(0.5, 1.5)
            norm_layer.bias.uniform_(-0.5, 0.5)
    return model.to(D)


NORMS = [
    pytest.param(
        lambda n: nn.BatchNorm1d(n, track_running_stats=False), id="BatchNorm1d"
    ),
    pytest.param(
        lambda n: torch.func.replace_all_batch_norm_modules_(nn.BatchNorm1d(n)),
        id="replaced-BatchNorm1d",
    ),
    pytest.param(lambda n: nn.LayerNorm(n), id="LayerNorm"),
]


def _data() -> tuple[Tensor, Tensor]:
    x = torch.randn(SAMPLES, BATCH, 3, dtype=D)
    y = torch.randn(SAMPLES, BATCH, 2, dtype=D)
    return x, y


def _reference(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """Per-sample gradients in plain torch: a loop of `torch.autograd.grad`."""
    names = [n for n, _ in model.named_parameters()]
    rows: list[tuple[Tensor, ...]] = []
    for s in range(SAMPLES):
        weights = {
            n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()
        }
        out = torch.func.functional_call(model, weights, (x[s],))
        rows.append(torch.autograd.grad(F.mse_loss(out, y[s]), list(weights.values())))
    return {n: torch.stack([row[i] for row in rows]) for i, n in enumerate(names)}


@pytest.mark.parametrize("norm", NORMS)
def test_per_sample_gradients_through_call_equal_plain_torch(
    norm: Callable[[int], nn.Module],
) -> None:
    """vmap(grad) through `call`, params requiring grad: plain torch's, to 1e-12."""
    model = _model(norm).train()
    params = ParamDict.from_module(model)
    assert all(v.requires_grad for v in params.values())
    x, y = _data()

    def loss(p: ParamDict, x_s: Tensor, y_s: Tensor) -> Tensor:
        return F.mse_loss(p.call(model, x_s), y_s)

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    want = _reference(model, x, y)
    assert grads.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(grads[key].detach(), value, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("norm", NORMS)
def test_per_sample_gradients_equal_torch_functional_call(
    norm: Callable[[int], nn.Module],
) -> None:
    """The same through `call` as through torch's `functional_call`, bitwise."""
    model = _model(norm).train()
    params = ParamDict.from_module(model)
    x, y = _data()

    def ours(p: ParamDict, x_s: Tensor, y_s: Tensor) -> Tensor:
        return F.mse_loss(p.call(model, x_s), y_s)

    def theirs(p: dict[str, Tensor], x_s: Tensor, y_s: Tensor) -> Tensor:
        out = torch.func.functional_call(model, p, (x_s,))
        return F.mse_loss(out, y_s)

    got = torch.func.vmap(torch.func.grad(ours), in_dims=(None, 0, 0))(params, x, y)
    want: Any = torch.func.vmap(torch.func.grad(theirs), in_dims=(None, 0, 0))(
        dict(params), x, y
    )
    for key in params:
        torch.testing.assert_close(
            got[key].detach(), want[key].detach(), rtol=0, atol=0
        )


@pytest.mark.parametrize("norm", NORMS)
def test_second_derivative_of_per_sample_gradients_refused(
    norm: Callable[[int], nn.Module],
) -> None:
    """Differentiating the vmapped gradients raises, naming the layer and the loop."""
    model = _model(norm).train()
    params = ParamDict.from_module(model)
    x, y = _data()

    def loss(p: ParamDict, x_s: Tensor, y_s: Tensor) -> Tensor:
        return F.mse_loss(p.call(model, x_s), y_s)

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    penalty = sum((g**2).sum() for g in grads.values())
    with pytest.raises(
        ValueError, match=r"the layer '1'(?s:.*)create_graph=True"
    ) as info:
        params.grad(penalty, allow_unused=True)
    assert "silently wrong" in str(info.value)
    assert all(p.grad is None for p in model.parameters())
