"""The iMAML example runs, and its pieces do what they say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from examples import imaml_sinusoid as demo
from examples import maml_sinusoid as maml
from paramdict import ParamDict


def test_quick_run_prints_the_tables(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--quick` trains, evaluates and times both methods."""
    argv = ["--quick", "--eval-tasks", "20", "--inner-steps", "6"]
    assert demo.main([*argv, "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "after 6 steps" in out
    assert "iMAML, 6 steps" in out
    assert "MAML, 1 step (the MAML demo)" in out


def test_adapt_solves_the_proximal_problem() -> None:
    """Many proximal steps drive the inner objective's gradient towards zero."""
    torch.manual_seed(0)
    model = maml.make_model().double()
    params = ParamDict.from_module(model).detach()
    tasks = maml.sample_tasks(
        3, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    task_grads = torch.func.vmap(torch.func.grad(maml.mse), in_dims=(0, None, 0, 0))

    def residual(steps: int) -> float:
        fast = demo.adapt(params, model, tasks, steps=steps, inner_lr=0.01, lam=2.0)
        g = task_grads(fast, model, tasks.x_support, tasks.y_support)
        return float((g + 2.0 * (fast - params)).norm())

    assert residual(400) < 0.1 * residual(1)


def _float64_problem() -> tuple[nn.Module, ParamDict, maml.Tasks]:
    """The demo's network in float64, its weights, and 3 tasks."""
    torch.manual_seed(0)
    model = maml.make_model().double()
    params = ParamDict.from_module(model).detach()
    tasks = maml.sample_tasks(
        3, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    return model, params, tasks


def _plain_descent(
    model: nn.Module, params: ParamDict, tasks: maml.Tasks, lr: float, lam: float
) -> list[dict[str, torch.Tensor]]:
    """Five fixed steps of proximal gradient descent, task by task, in plain torch."""
    names = list(params)
    adapted = []
    for i in range(len(tasks)):
        phi = [params[k].clone() for k in names]
        for _ in range(5):
            leaves = [p.requires_grad_() for p in phi]
            out = torch.func.functional_call(
                model, dict(zip(names, leaves)), (tasks.x_support[i],)
            )
            loss = torch.nn.functional.mse_loss(out, tasks.y_support[i])
            grads = torch.autograd.grad(loss, leaves)
            phi = [
                (p - lr * (g + lam * (p - params[k]))).detach()
                for p, g, k in zip(leaves, grads, names)
            ]
        adapted.append(dict(zip(names, phi)))
    return adapted


def test_small_steps_are_plain_proximal_gradient_descent() -> None:
    """Below `1/L` every step is accepted: plain gradient descent, task by task."""
    model, params, tasks = _float64_problem()
    lr, lam = 1e-3, 2.0
    state = demo.start_descent(params, model, tasks, inner_lr=lr, lam=lam)
    for _ in range(5):
        state = demo.proximal_step(state, params, model, tasks, inner_lr=lr, lam=lam)
    torch.testing.assert_close(state.step_size, torch.full((3,), lr).double())
    for i, expected in enumerate(_plain_descent(model, params, tasks, lr, lam)):
        for k, p in expected.items():
            torch.testing.assert_close(state.fast[k][i], p, rtol=1e-12, atol=1e-12)


def test_fixed_step_takes_every_step() -> None:
    """`backtrack=False` is plain gradient descent even where a step overshoots."""
    model, params, tasks = _float64_problem()
    lr, lam = 0.2, 1.0
    fast = demo.adapt(
        params, model, tasks, steps=5, inner_lr=lr, lam=lam, backtrack=False
    )
    backtracked = demo.adapt(params, model, tasks, steps=5, inner_lr=lr, lam=lam)
    assert not torch.allclose(fast.to_vector(), backtracked.to_vector())
    for i, expected in enumerate(_plain_descent(model, params, tasks, lr, lam)):
        for k, p in expected.items():
            torch.testing.assert_close(fast[k][i], p, rtol=1e-10, atol=1e-10)


def test_backtracking_never_increases_the_objective() -> None:
    """A step size far above `2/L` still descends: no task's objective goes up."""
    model, params, tasks = _float64_problem()
    lr, lam = 1.0, 1.0
    state = demo.start_descent(params, model, tasks, inner_lr=lr, lam=lam)
    objectives = [state.objective]
    for _ in range(30):
        state = demo.proximal_step(state, params, model, tasks, inner_lr=lr, lam=lam)
        torch.testing.assert_close(
            state.objective,
            demo.proximal_objectives(state.fast, params, model, tasks, lam=lam),
        )
        objectives.append(state.objective)
    values = torch.stack(objectives)
    assert bool(values.isfinite().all())
    assert bool((values[1:] <= values[:-1]).all())
    assert bool((values[-1] < values[0]).all())
    # A plain step of that size overshoots: some task's objective goes up.
    start = demo.start_descent(params, model, tasks, inner_lr=lr, lam=lam)
    task_grads = torch.func.vmap(torch.func.grad(maml.mse), in_dims=(0, None, 0, 0))
    plain = start.fast - lr * task_grads(
        start.fast, model, tasks.x_support, tasks.y_support
    )
    after = demo.proximal_objectives(plain, params, model, tasks, lam=lam)
    assert bool((after > start.objective).any())


def test_maml_loss_with_one_step_is_the_demo_meta_loss() -> None:
    """The unrolled baseline at one step is the MAML demo's objective."""
    torch.manual_seed(0)
    model = maml.make_model().double()
    params = ParamDict.from_module(model)
    tasks = maml.sample_tasks(
        4, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    )
    torch.testing.assert_close(
        demo.maml_loss(params, model, tasks, steps=1),
        maml.meta_loss(params, model, tasks),
    )
