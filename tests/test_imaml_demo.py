"""The iMAML example runs, and its pieces do what they say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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
