import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from matplotlib.figure import Figure
from torch import Tensor

from examples import maml_sinusoid as demo
from paramdict import ParamDict

Weights = tuple[Tensor, ...]


def _forward(weights: Weights, x: Tensor) -> Tensor:
    """The 1-40-40-1 ReLU MLP written out with plain tensors."""
    w0, b0, w1, b1, w2, b2 = weights
    hidden = torch.relu(x @ w0.T + b0)
    hidden = torch.relu(hidden @ w1.T + b1)
    return hidden @ w2.T + b2


def _mse(weights: Weights, x: Tensor, y: Tensor) -> Tensor:
    return ((_forward(weights, x) - y) ** 2).mean()


def _reference_meta_gradient(
    weights: Weights, tasks: demo.Tasks, *, inner_lr: float, first_order: bool
) -> Weights:
    """MAML's meta-gradient with tuples, a loop and `torch.autograd.grad` only."""
    losses = []
    for t in range(len(tasks)):
        inner = _mse(weights, tasks.x_support[t], tasks.y_support[t])
        grads = torch.autograd.grad(inner, weights, create_graph=not first_order)
        fast = tuple(w - inner_lr * g for w, g in zip(weights, grads))
        losses.append(_mse(fast, tasks.x_query[t], tasks.y_query[t]))
    return torch.autograd.grad(torch.stack(losses).mean(), weights)


def _float64_setup() -> tuple[torch.nn.Module, ParamDict, Weights, demo.Tasks]:
    torch.manual_seed(0)
    model = demo.make_model().double()
    params = ParamDict.from_module(model)
    weights = tuple(p.detach().clone().requires_grad_() for p in params.values())
    tasks = demo.sample_tasks(
        5, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    return model, params, weights, tasks


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_meta_gradient_equals_plain_torch_second_order(batching: demo.Batching) -> None:
    """The demo's meta-gradient is the second-order one, computed in plain torch."""
    model, params, weights, tasks = _float64_setup()
    got = demo.meta_gradient(params, model, tasks, inner_lr=0.01, batching=batching)
    want = _reference_meta_gradient(weights, tasks, inner_lr=0.01, first_order=False)
    assert list(got) == [name for name, _ in model.named_parameters()]
    torch.testing.assert_close(got, dict(zip(params, want)))


@pytest.mark.parametrize("batching", ["vmap", "loop"])
def test_first_order_meta_gradient_is_first_order(batching: demo.Batching) -> None:
    """`first_order=True` gives the first-order reference, unlike the default."""
    model, params, weights, tasks = _float64_setup()
    first = demo.meta_gradient(
        params, model, tasks, inner_lr=0.01, first_order=True, batching=batching
    )
    want = _reference_meta_gradient(weights, tasks, inner_lr=0.01, first_order=True)
    torch.testing.assert_close(first, dict(zip(params, want)))
    second = demo.meta_gradient(params, model, tasks, inner_lr=0.01, batching=batching)
    with pytest.raises(AssertionError, match="not close"):
        torch.testing.assert_close(first, second, rtol=1e-3, atol=1e-6)


def test_meta_gradient_leaves_grad_untouched() -> None:
    """`meta_gradient` returns the gradient without accumulating into `.grad`."""
    model, params, _, tasks = _float64_setup()
    demo.meta_gradient(params, model, tasks)
    assert all(p.grad is None for p in model.parameters())


def test_meta_loss_rejects_unknown_batching() -> None:
    """An unknown `batching` is a ValueError naming the choices."""
    model, params, _, tasks = _float64_setup()
    with pytest.raises(ValueError, match="`batching` must be 'vmap' or 'loop'"):
        demo.meta_loss(params, model, tasks, batching="scan")  # type: ignore[arg-type]  # the wrong value under test


def test_sample_tasks_follow_the_benchmark() -> None:
    """Tasks have the paper's ranges, exact sinusoid targets, and repeat per seed."""
    tasks = demo.sample_tasks(
        200, generator=torch.Generator().manual_seed(3), queries=7
    )
    assert tasks.x_support.shape == (200, 10, 1)
    assert tasks.x_query.shape == (200, 7, 1)
    assert tasks.amplitude.min() >= 0.1
    assert tasks.amplitude.max() <= 5.0
    assert tasks.phase.min() >= 0.0
    assert tasks.phase.max() <= math.pi
    for x in (tasks.x_support, tasks.x_query):
        assert x.min() >= -5.0
        assert x.max() <= 5.0
    t = 17
    amplitude, phase = tasks.amplitude[t].item(), tasks.phase[t].item()
    expected = amplitude * torch.sin(tasks.x_query[t] - phase)
    torch.testing.assert_close(tasks.y_query[t], expected)
    again = demo.sample_tasks(
        200, generator=torch.Generator().manual_seed(3), queries=7
    )
    torch.testing.assert_close(again.y_support, tasks.y_support, rtol=0, atol=0)


def test_evaluate_equals_plain_sgd_steps() -> None:
    """Row k of `evaluate` is each task's query MSE after k plain SGD steps."""
    model, params, weights, tasks = _float64_setup()
    errors = demo.evaluate(params, model, tasks, steps=3, inner_lr=0.1)
    assert errors.shape == (4, len(tasks))
    for t in range(len(tasks)):
        fast = weights
        for step in range(4):
            query = _mse(fast, tasks.x_query[t], tasks.y_query[t])
            torch.testing.assert_close(errors[step, t], query.detach())
            loss = _mse(fast, tasks.x_support[t], tasks.y_support[t])
            grads = torch.autograd.grad(loss, fast)
            fast = tuple(w - 0.1 * g for w, g in zip(fast, grads))


def test_quick_run_prints_table_and_writes_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--quick` trains, prints the results table and writes the PNG it names."""
    path = tmp_path / "maml.png"
    threads = torch.get_num_threads()
    try:
        status = demo.main(["--quick", "--plot", str(path)])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert status == 0
    assert "batched with torch.func.vmap, second-order" in out
    for row in ("before adaptation", "after 1 step", "after 10 steps"):
        assert row in out
    assert f"Wrote {path}" in out
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_labels_every_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each panel of the plot names its x and y axes and has a title."""
    saved: list[Figure] = []
    savefig = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(self)
        savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    model, params, _, tasks = _float64_setup()
    errors = demo.evaluate(params, model, tasks, steps=2, inner_lr=0.01)
    path = tmp_path / "plot.png"
    assert demo.save_plot(path, params, model, tasks, errors, title="t", shown=3)
    assert path.exists()
    (fig,) = saved
    axes = fig.get_axes()
    assert len(axes) == 4  # three tasks and the error curve
    for ax in axes:
        assert ax.get_title()
        assert ax.get_xlabel(), ax.get_title()
        assert ax.get_ylabel(), ax.get_title()


def test_runs_without_tqdm_and_matplotlib(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the optional extras it prints progress lines and skips the plot."""
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "maml.png"
    threads = torch.get_num_threads()
    argv = ["--iterations", "20", "--eval-tasks", "20", "--plot", str(path)]
    try:
        status = demo.main([*argv, "--inner-steps", "2", "--batching", "loop"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert status == 0
    assert "one by one in a loop" in out
    assert "    20/20  meta-loss" in out
    assert "after 2 steps" in out
    assert "No plot: matplotlib is missing" in out
    assert not path.exists()


def test_cli_rejects_zero_inner_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """`--inner-steps 0` is refused with a message, before any training."""
    with pytest.raises(SystemExit, match="2"):
        demo.main(["--inner-steps", "0"])
    assert "must be a positive integer, got 0" in capsys.readouterr().err


def test_docs_page_quotes_the_script_word_for_word() -> None:
    """Every Python block of docs/maml.md is a verbatim excerpt of the script."""
    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "maml.md").read_text(encoding="utf-8")
    script = (root / "examples" / "maml_sinusoid.py").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    assert any("def inner_step(" in block for block in blocks)
    stale = [block.splitlines()[0] for block in blocks if block not in script]
    assert not stale, f"docs/maml.md blocks not in the script: {stale}"
