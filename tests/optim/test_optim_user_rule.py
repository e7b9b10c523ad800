"""An optimizer paramdict does not ship, written as the tutorial teaches, in every mode.

AdaBelief (Zhuang et al., 2020) is written here with public imports only, its
rule in ParamDict arithmetic (`docs/tutorials/optimizer.md` writes the same
class), and run through the whole matrix against a reference in plain torch:
`step`, `step_`, parameter groups, a schedule, `torch.compile(fullgraph=True)`,
`differentiable=True` (a meta-gradient) and a `weights_only` checkpoint.
"""

from __future__ import annotations

import io
from typing import Any, ClassVar, NamedTuple

import attrs
import pytest
import torch
from _torch_versions import ONE_GRAPH
from torch import Tensor

from paramdict import ParamDict, optim


@optim.register_state
class AdaBeliefState(NamedTuple):
    """The step count, the running mean of the gradient and its belief."""

    step: Tensor
    exp_avg: ParamDict
    exp_avg_var: ParamDict
    schedule: optim.SlotState = ()


@attrs.frozen(kw_only=True, eq=False, field_transformer=optim.fields.shared_last)
class AdaBelief(optim.TorchOptimizer[AdaBeliefState]):
    """AdaBelief: Adam whose second moment tracks the gradient's deviation."""

    state_type: ClassVar[type[AdaBeliefState]] = AdaBeliefState
    decoupled_decay: ClassVar[bool] = True

    lr: optim.LearningRate = 1e-3
    betas: tuple[float, float] = optim.fields.betas((0.9, 0.999))
    eps: float = optim.fields.non_negative(1e-16)
    weight_decay: optim.Rate = 0.0

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdaBeliefState,
        step: Tensor,
        lr: optim.Rate,
        /,
    ) -> None:
        """Write one AdaBelief step into the parameters and the state."""
        beta1, beta2 = self.betas
        state.exp_avg.lerp_(grads, 1 - beta1)
        deviation = grads.sub(state.exp_avg)
        state.exp_avg_var.mul_(beta2).addcmul_(deviation, deviation, value=1 - beta2)
        state.exp_avg_var.add_(self.eps)
        bias1 = 1 - beta1**step
        bias2 = 1 - beta2**step
        denom = state.exp_avg_var.div(bias2).sqrt().add(self.eps)
        params.addcdiv_(state.exp_avg, denom, value=-lr / bias1)


def _reference(
    values: list[Tensor],
    grads: list[list[Tensor]],
    lrs: list[Any],
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-16,
    weight_decay: float = 0.0,
) -> list[Tensor]:
    """AdaBelief in plain torch, tensor by tensor, one rate per step."""
    beta1, beta2 = betas
    values = [v.clone() for v in values]
    m = [torch.zeros_like(v) for v in values]
    s = [torch.zeros_like(v) for v in values]
    for t, (gs, lr) in enumerate(zip(grads, lrs, strict=True), start=1):
        for i, g in enumerate(gs):
            values[i] = values[i] * (1 - lr * weight_decay)
            m[i] = beta1 * m[i] + (1 - beta1) * g
            s[i] = beta2 * s[i] + (1 - beta2) * (g - m[i]) ** 2 + eps
            m_hat = m[i] / (1 - beta1**t)
            s_hat = s[i] / (1 - beta2**t)
            values[i] = values[i] - lr * m_hat / (s_hat.sqrt() + eps)
    return values


def _problem(steps: int = 6) -> tuple[ParamDict, list[ParamDict]]:
    gen = torch.Generator().manual_seed(0)
    params = ParamDict(
        w=torch.randn(4, 3, generator=gen, dtype=torch.float64),
        b=torch.randn(3, generator=gen, dtype=torch.float64),
    )
    grads = [
        params.map(lambda v: torch.randn(v.shape, generator=gen, dtype=v.dtype))
        for _ in range(steps)
    ]
    return params, grads


def _close(got: ParamDict, want: list[Tensor]) -> None:
    for value, ref in zip(got.values(), want, strict=True):
        torch.testing.assert_close(value.detach(), ref, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", ["step", "step_"])
def test_steps_equal_the_reference(method: str) -> None:
    """`step` and `step_`, with decoupled weight decay, equal plain torch."""
    params, grads = _problem()
    expected = _reference(
        list(params.values()),
        [list(g.values()) for g in grads],
        [0.01] * len(grads),
        weight_decay=0.1,
    )
    opt = AdaBelief(lr=0.01, weight_decay=0.1)
    params = params.clone()
    state = opt.init(params)
    for g in grads:
        params, state = getattr(opt, method)(params, g, state)
    _close(params, expected)


def test_groups_equal_the_reference_per_group() -> None:
    """Two groups of different rates: each equals its own reference."""
    params, grads = _problem()
    opt = optim.ParamGroups({"b": AdaBelief(lr=0.05)}, default=AdaBelief(lr=0.01))
    state = opt.init(params)
    new = params
    for g in grads:
        new, state = opt.step(new, g, state)
    for key, lr in (("w", 0.01), ("b", 0.05)):
        (want,) = _reference(
            [params[key]], [[g[key]] for g in grads], [lr] * len(grads)
        )
        torch.testing.assert_close(new[key], want, rtol=1e-12, atol=1e-14)


def test_a_schedule_equals_the_reference_with_its_rates() -> None:
    """A `StepLR` rate: the reference run with torch's scheduler's rates."""
    params, grads = _problem()
    schedule = optim.StepLR(base_lr=0.1, step_size=2, gamma=0.5)
    lrs = [0.1 * 0.5 ** (i // 2) for i in range(len(grads))]
    expected = _reference(list(params.values()), [list(g.values()) for g in grads], lrs)
    opt = AdaBelief(lr=schedule)
    state = opt.init(params)
    new = params
    for g in grads:
        new, state = opt.step_(new.clone(), g, state)
    _close(new, expected)


@ONE_GRAPH
def test_compiled_with_fullgraph_equals_the_reference() -> None:
    """`torch.compile(opt.step, fullgraph=True)`: one graph, the reference's values."""
    torch._dynamo.reset()
    params, grads = _problem(4)
    expected = _reference(
        list(params.values()), [list(g.values()) for g in grads], [0.01] * 4
    )
    opt = AdaBelief(lr=0.01)
    step = torch.compile(opt.step, fullgraph=True, backend="eager")
    state = opt.init(params)
    new = params
    for g in grads:
        new, state = step(new, g, state)
    torch._dynamo.reset()
    _close(new, expected)


def test_differentiable_meta_gradient_equals_the_reference() -> None:
    """With `differentiable=True`, d(loss after 3 steps)/d(lr) is the reference's."""
    params, grads = _problem(3)

    def ours(lr: Tensor) -> Tensor:
        opt = AdaBelief(lr=lr, differentiable=True)
        new, state = params, opt.init(params)
        for g in grads:
            new, state = opt.step(new, g, state)
        return sum((v**2).sum() for v in new.values())  # type: ignore[return-value]

    def theirs(lr: Tensor) -> Tensor:
        out = _reference(
            list(params.values()), [list(g.values()) for g in grads], [lr] * 3
        )
        return sum((v**2).sum() for v in out)  # type: ignore[return-value]

    lr = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
    (mine,) = torch.autograd.grad(ours(lr), lr)
    (want,) = torch.autograd.grad(theirs(lr), lr)
    torch.testing.assert_close(mine, want, rtol=1e-10, atol=1e-14)


def test_a_weights_only_checkpoint_resumes_bitwise() -> None:
    """Saved mid-run and loaded with `weights_only=True`, the run goes on unchanged."""
    params, grads = _problem()
    opt = AdaBelief(lr=0.01)
    straight, state = params, opt.init(params)
    for g in grads:
        straight, state = opt.step(straight, g, state)
    resumed, state = params, opt.init(params)
    for i, g in enumerate(grads):
        if i == 3:
            buffer = io.BytesIO()
            torch.save((resumed, state), buffer)
            buffer.seek(0)
            resumed, state = torch.load(buffer, weights_only=True)
        resumed, state = opt.step(resumed, g, state)
    for a, b in zip(resumed.values(), straight.values(), strict=True):
        assert torch.equal(a, b)
