"""MAML on sinusoid regression (Finn et al., 2017, section 5.1), keyed end to end.

Every task is a sinusoid `y = A sin(x - phi)` with `A ~ U[0.1, 5]`, `phi ~ U[0, pi]`
and `x ~ U[-5, 5]`. A 1-40-40-1 ReLU network is meta-trained so that one SGD step on
K = 10 points of a task it has never seen fits that task. Run it with

    python examples/maml_sinusoid.py                 # the full run: a few minutes
    python examples/maml_sinusoid.py --quick         # seconds: a smoke test
    python examples/maml_sinusoid.py --first-order   # first-order MAML, to compare

It prints the query MSE on 600 new tasks before and after adaptation and writes a
plot like the paper's Figures 2 and 3. All data is generated from the seed.

A meta-batch's tasks run batched with `torch.func.vmap` (the default, the fastest
for this small MLP) or in a Python loop (`--batching loop`); for this network both
give the same meta-gradient. Not for every network: with BatchNorm or LayerNorm in
training mode, torch 2.13 differentiates the vmapped inner step wrongly at second
order, so `ParamDict.call` refuses it and the loop is the way (see "BatchNorm in
inner loops" in docs/tutorials/maml.md).
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict, optim

Batching = Literal["vmap", "loop"]

SHOTS = 10  # K: support points per task, and query points per task in training
INNER_LR = 0.01  # the inner SGD step, in training and at evaluation
META_LR = 0.001  # Adam, the meta-optimizer
META_BATCH = 25  # tasks per meta-iteration
ITERATIONS = 10_000
QUICK_ITERATIONS = 200
EVAL_TASKS = 600
EVAL_QUERIES = 100  # query points per evaluation task, for a precise per-task MSE
AMPLITUDE = (0.1, 5.0)
PHASE = (0.0, math.pi)
X_RANGE = (-5.0, 5.0)


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class Tasks:
    """A batch of sinusoid tasks: their amplitudes and phases, support and query sets.

    Every tensor has a leading task dimension; points have shape `(tasks, n, 1)`.
    """

    amplitude: Tensor
    phase: Tensor
    x_support: Tensor
    y_support: Tensor
    x_query: Tensor
    y_query: Tensor

    def __len__(self) -> int:
        return self.amplitude.shape[0]

    def curve(self, x: Tensor, /) -> Tensor:
        """Return every task's true function at `x`, shaped `(tasks, n, 1)`."""
        return sinusoid(self.amplitude, self.phase, x)

    def first(self, count: int, /) -> Tasks:
        """Return the first `count` tasks; `self` is unchanged."""
        return Tasks(
            self.amplitude[:count],
            self.phase[:count],
            self.x_support[:count],
            self.y_support[:count],
            self.x_query[:count],
            self.y_query[:count],
        )


def sinusoid(amplitude: Tensor, phase: Tensor, x: Tensor) -> Tensor:
    """Return `amplitude * sin(x - phase)` for every task, shaped `(tasks, n, 1)`.

    `amplitude` and `phase` have shape `(tasks,)`; `x` is `(n, 1)`, shared by the
    tasks, or `(tasks, n, 1)`.
    """
    return amplitude[:, None, None] * torch.sin(x - phase[:, None, None])


def sample_tasks(
    count: int,
    /,
    *,
    generator: torch.Generator,
    shots: int = SHOTS,
    queries: int = SHOTS,
    dtype: torch.dtype = torch.float32,
) -> Tasks:
    """Draw `count` new tasks, with `shots` support and `queries` query points each."""

    def uniform(bounds: tuple[float, float], *shape: int) -> Tensor:
        low, high = bounds
        return low + (high - low) * torch.rand(shape, generator=generator, dtype=dtype)

    amplitude = uniform(AMPLITUDE, count)
    phase = uniform(PHASE, count)
    x_support = uniform(X_RANGE, count, shots, 1)
    x_query = uniform(X_RANGE, count, queries, 1)
    return Tasks(
        amplitude,
        phase,
        x_support,
        sinusoid(amplitude, phase, x_support),
        x_query,
        sinusoid(amplitude, phase, x_query),
    )


# --------------------------------------------------------------------------- model


def make_model() -> nn.Sequential:
    """Return the paper's regressor: an MLP 1-40-40-1 with ReLU, freshly initialized."""
    return nn.Sequential(
        nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
    )


def predict(params: ParamDict, model: nn.Module, x: Tensor) -> Tensor:
    """Return `model(x)` computed with `params` in place of the model's own."""
    out: Tensor = params.call(model, x)
    return out


def mse(params: ParamDict, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Return the mean squared error of `model`, run with `params`, on `(x, y)`."""
    return F.mse_loss(predict(params, model, x), y)


# --------------------------------------------------------------------------- MAML


def inner_step(
    params: ParamDict,
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    /,
    *,
    inner_lr: float = INNER_LR,
    create_graph: bool = True,
    per_task: bool = False,
) -> ParamDict:
    """Return every task's fast weights after one SGD step on its `(x, y)`.

    The tasks run at once under `torch.func.vmap`. `params` are shared by all tasks,
    or with `per_task=True` hold one set per task along a leading dimension; the
    result always does. `create_graph=False` makes the step first order.
    """
    task_grads = torch.func.vmap(
        torch.func.grad(mse), in_dims=(0 if per_task else None, None, 0, 0)
    )
    # `torch.func.grad` computes the inner gradients either way; whether the outer
    # autograd records that computation is what separates second from first order.
    with torch.set_grad_enabled(create_graph):
        grads: ParamDict = task_grads(params, model, x, y)  # one per task, keyed
    return params - inner_lr * grads  # broadcasts: shared weights, per-task steps


def meta_loss(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    inner_lr: float = INNER_LR,
    first_order: bool = False,
    batching: Batching = "vmap",
) -> Tensor:
    """Return MAML's objective: the mean query loss after one inner step per task.

    `batching="loop"` adapts the tasks one after the other in Python, `"vmap"` all
    at once; `first_order=True` treats the inner gradients as constants. Both give
    the same meta-gradient for this MLP; a network with BatchNorm or LayerNorm
    needs the loop at second order (`call` refuses the vmapped step).
    """
    if batching not in ("vmap", "loop"):
        msg = f"`batching` must be 'vmap' or 'loop', got {batching!r}."
        raise ValueError(msg)
    if batching == "loop":
        losses = []
        for x, y, x_query, y_query in zip(
            tasks.x_support, tasks.y_support, tasks.x_query, tasks.y_query
        ):
            loss = mse(params, model, x, y)
            grads = params.grad(loss, create_graph=not first_order)
            fast = params - inner_lr * grads
            losses.append(mse(fast, model, x_query, y_query))
        return torch.stack(losses).mean()
    fast = inner_step(
        params,
        model,
        tasks.x_support,
        tasks.y_support,
        inner_lr=inner_lr,
        create_graph=not first_order,
    )
    task_mse = torch.func.vmap(mse, in_dims=(0, None, 0, 0))
    return task_mse(fast, model, tasks.x_query, tasks.y_query).mean()


def meta_gradient(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    inner_lr: float = INNER_LR,
    first_order: bool = False,
    batching: Batching = "vmap",
) -> ParamDict:
    """Return the gradient of `meta_loss` with respect to `params`, keyed the same."""
    loss = meta_loss(
        params,
        model,
        tasks,
        inner_lr=inner_lr,
        first_order=first_order,
        batching=batching,
    )
    return params.grad(loss)


class _Progress:
    """Show meta-training progress with the running meta-loss (mean of the last 100).

    A tqdm bar when tqdm is installed, else a printed line every tenth of the way.
    """

    def __init__(self, total: int) -> None:
        self._total = total
        self._done = 0
        self._recent: deque[float] = deque(maxlen=100)
        self._bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc="meta-training", unit="it")

    @property
    def running_loss(self) -> float:
        return sum(self._recent) / max(len(self._recent), 1)

    def update(self, loss: float) -> None:
        self._recent.append(loss)
        self._done += 1
        if self._bar is not None:
            if self._done % 50 == 0 or self._done == self._total:
                self._bar.set_postfix_str(f"meta-loss {self.running_loss:.3f}")
            self._bar.update()
        elif self._done % max(self._total // 10, 1) == 0:
            print(f"  {self._done:>6}/{self._total}  meta-loss {self.running_loss:.3f}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def train(
    model: nn.Module,
    /,
    *,
    iterations: int,
    generator: torch.Generator,
    first_order: bool = False,
    batching: Batching = "vmap",
    meta_batch: int = META_BATCH,
    inner_lr: float = INNER_LR,
    meta_lr: float = META_LR,
) -> float:
    """Meta-train `model` in place; return the final running meta-loss."""
    params = ParamDict.from_module(model)  # the module's weights, keyed by name
    meta_optimizer = optim.Adam(lr=meta_lr)
    state = meta_optimizer.init(params)
    progress = _Progress(iterations)
    for _ in range(iterations):
        tasks = sample_tasks(meta_batch, generator=generator)
        loss = meta_loss(
            params,
            model,
            tasks,
            inner_lr=inner_lr,
            first_order=first_order,
            batching=batching,
        )
        meta_grads = params.grad(loss)  # the meta-gradient, keyed like params
        params, state = meta_optimizer.step(params, meta_grads, state)
        progress.update(loss.item())
    progress.close()
    params.to_module(model)  # copy the meta-trained weights into the module
    return progress.running_loss


# --------------------------------------------------------------------------- evaluation


def evaluate(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    steps: int,
    inner_lr: float = INNER_LR,
) -> Tensor:
    """Return every task's query MSE after 0, 1, ..., `steps` inner SGD steps.

    All steps use the task's same K support points. Row `k` of the
    `(steps + 1, tasks)` result is after `k` steps.
    """
    with torch.no_grad():
        errors = [
            torch.func.vmap(mse, in_dims=(None, None, 0, 0))(
                params, model, tasks.x_query, tasks.y_query
            )
        ]
        fast = params
        for step in range(steps):
            fast = inner_step(
                fast,
                model,
                tasks.x_support,
                tasks.y_support,
                inner_lr=inner_lr,
                create_graph=False,
                per_task=step > 0,
            )
            task_mse = torch.func.vmap(mse, in_dims=(0, None, 0, 0))
            errors.append(task_mse(fast, model, tasks.x_query, tasks.y_query))
    return torch.stack(errors)


def mean_and_interval(errors: Tensor, /) -> tuple[Tensor, Tensor]:
    """Return the mean over tasks (the last dim) and its 95% half-width, 1.96 std/√n."""
    count = errors.shape[-1]
    return errors.mean(-1), 1.96 * errors.std(-1) / math.sqrt(count)


def format_table(errors: Tensor, /) -> str:
    """Return the results table: query MSE before, after 1 and after the last step."""
    mean, half = mean_and_interval(errors)
    steps = errors.shape[0] - 1
    rows = [("before adaptation", 0)]
    rows += [(f"after {s} step" + ("s" if s > 1 else ""), s) for s in {1, steps} if s]
    lines = [f"{'':<20}{'query MSE':>10}  95% CI", "-" * 38]
    for label, s in sorted(rows, key=lambda row: row[1]):
        lines.append(f"{label:<20}{mean[s].item():>10.3f}  ± {half[s].item():.3f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- plot


def save_plot(
    path: Path,
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    errors: Tensor,
    /,
    *,
    title: str,
    inner_lr: float = INNER_LR,
    shown: int = 3,
    adapt: Callable[[ParamDict, Tasks, bool], ParamDict] | None = None,
    label: str = "MAML",
) -> bool:
    """Plot a few tasks and the MSE-vs-steps curve, like the paper's Figures 2-3.

    Each task panel shows the true sinusoid, its K support points and the
    prediction before adaptation, after 1 and after the last inner step; the last
    panel shows the mean query MSE (95% interval) against the inner steps. One
    inner step is `adapt(fast, tasks, per_task)` (an SGD step of `inner_step` by
    default); `label` names the method. Return whether the PNG was written (not
    when matplotlib is missing).
    """
    try:
        import matplotlib as mpl
    except ImportError:
        return False
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    steps = errors.shape[0] - 1
    some = tasks.first(shown)
    grid = torch.linspace(*X_RANGE, 200, dtype=tasks.x_query.dtype).unsqueeze(-1)
    with torch.no_grad():
        curves = {0: predict(params, model, grid).expand(shown, -1, -1)}
        fast = params
        for step in range(1, steps + 1):
            if adapt is not None:
                fast = adapt(fast, some, step > 1)
            else:
                fast = inner_step(
                    fast,
                    model,
                    some.x_support,
                    some.y_support,
                    inner_lr=inner_lr,
                    create_graph=False,
                    per_task=step > 1,
                )
            if step in (1, steps):
                curves[step] = torch.func.vmap(predict, in_dims=(0, None, None))(
                    fast, model, grid
                )
    truth = some.curve(grid)

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), layout="constrained")
    panels = list(axes.flat)
    styles = {0: (":", "tab:green"), 1: ("--", "tab:orange"), steps: ("-", "tab:red")}
    for i, ax in enumerate(panels[:shown]):
        ax.plot(grid[:, 0], truth[i, :, 0], color="black", lw=1.5, label="true")
        for step, curve in curves.items():
            line, color = styles[step]
            label = "before" if step == 0 else f"after {step} step" + "s" * (step > 1)
            ax.plot(grid[:, 0], curve[i, :, 0], line, color=color, label=label)
        ax.scatter(
            some.x_support[i, :, 0],
            some.y_support[i, :, 0],
            marker="^",
            color="tab:blue",
            zorder=3,
            label=f"K={some.x_support.shape[1]} points",
        )
        ax.set_title(
            f"A = {some.amplitude[i].item():.2f}, φ = {some.phase[i].item():.2f}"
        )
        ax.set_xlabel("x")
        ax.set_ylabel("y")
        ax.set_ylim(-5.5, 5.5)
    panels[0].legend(loc="lower left", fontsize="small")

    mean, half = mean_and_interval(errors)
    ax = panels[-1]
    x_steps = torch.arange(steps + 1)
    ax.plot(x_steps, mean, "o-", color="tab:red", label=label)
    ax.fill_between(x_steps, mean - half, mean + half, color="tab:red", alpha=0.2)
    for step in sorted({0, 1, steps}):
        ax.annotate(
            f"{mean[step].item():.3f}",
            (step, mean[step].item()),
            xytext=(6, 6),
            textcoords="offset points",
        )
    ax.set_title(f"query MSE on {errors.shape[1]} new tasks (95% interval)")
    ax.set_xlabel("inner gradient steps")
    ax.set_xlim(-0.5, steps + 1)
    ax.set_ylabel("mean squared error")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- CLI


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be a positive integer, got {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (see `--help`)."""
    parser = argparse.ArgumentParser(
        description="MAML on sinusoid regression (Finn et al., 2017), with ParamDict."
    )
    parser.add_argument(
        "--iterations",
        type=_positive,
        metavar="N",
        help=f"meta-iterations (default {ITERATIONS:,}; {QUICK_ITERATIONS} with "
        "--quick)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="S", help="random seed (default 0)"
    )
    parser.add_argument(
        "--first-order",
        action="store_true",
        help="first-order MAML: treat the inner gradients as constants",
    )
    parser.add_argument(
        "--inner-steps",
        type=_positive,
        metavar="N",
        default=10,
        help="inner steps at evaluation (default 10)",
    )
    parser.add_argument(
        "--threads",
        type=_positive,
        default=1,
        metavar="N",
        help="CPU threads (default 1)",
    )
    parser.add_argument(
        "--batching",
        choices=get_args(Batching),
        default="vmap",
        help="run a meta-batch's tasks batched with torch.func.vmap (default, "
        "fastest for this small MLP) or one by one in a Python loop (the choice "
        "for conv nets, and the only second-order one with BatchNorm)",
    )
    parser.add_argument(
        "--eval-tasks",
        type=_positive,
        metavar="N",
        default=EVAL_TASKS,
        help=f"new tasks to evaluate on (default {EVAL_TASKS})",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PATH",
        default=Path("maml_sinusoid.png"),
        help="where to write the PNG (default maml_sinusoid.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds: a smoke test"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Meta-train, evaluate, print the results table, write the plot; return 0."""
    args = parse_args(argv)
    iterations = args.iterations or (QUICK_ITERATIONS if args.quick else ITERATIONS)
    torch.set_num_threads(args.threads)
    # Three independent streams from one seed: initial weights, training tasks,
    # evaluation tasks. The evaluation tasks depend on the seed alone.
    root = torch.Generator().manual_seed(args.seed)
    init_seed, train_seed, eval_seed = torch.randint(2**62, (3,), generator=root)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(init_seed))
        model = make_model()

    order = "first-order" if args.first_order else "second-order"
    how = {"vmap": "batched with torch.func.vmap", "loop": "one by one in a loop"}
    print("MAML on sinusoid regression: MLP 1-40-40-1 (ReLU), K = 10, one inner step")
    print(
        f"  {iterations:,} meta-iterations, meta-batch of {META_BATCH} tasks "
        f"{how[args.batching]}, {order} meta-gradient"
    )
    print(
        f"  inner SGD lr {INNER_LR}, paramdict.optim.Adam lr {META_LR}; seed "
        f"{args.seed}, {args.threads} thread(s)"
    )
    start = time.perf_counter()
    running = train(
        model,
        iterations=iterations,
        generator=torch.Generator().manual_seed(int(train_seed)),
        first_order=args.first_order,
        batching=args.batching,
    )
    elapsed = time.perf_counter() - start
    print(f"meta-training took {elapsed:.1f} s; final running meta-loss {running:.3f}")

    tasks = sample_tasks(
        args.eval_tasks,
        generator=torch.Generator().manual_seed(int(eval_seed)),
        queries=EVAL_QUERIES,
    )
    params = ParamDict.from_module(model)
    errors = evaluate(params, model, tasks, steps=args.inner_steps)
    print(
        f"\nQuery MSE on {len(tasks)} new tasks ({SHOTS} support and {EVAL_QUERIES} "
        "query points each), mean and 95% CI:"
    )
    print(format_table(errors))

    if not args.no_plot:
        title = (
            f"MAML ({order}, {iterations:,} meta-iterations): "
            f"adapting to new sinusoids from K = {SHOTS} points"
        )
        if save_plot(args.plot, params, model, tasks, errors, title=title):
            print(f"\nWrote {args.plot}")
        else:
            print(
                "\nNo plot: matplotlib is missing "
                "(pip install 'torch-paramdict[examples]')"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
