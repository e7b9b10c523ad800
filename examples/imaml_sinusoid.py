"""iMAML on sinusoid regression (Rajeswaran et al., 2019), keyed end to end.

The tasks, network and evaluation are those of `examples/maml_sinusoid.py`
(imported from it). Each task's adapted weights are steps of gradient descent with
backtracking on the support loss plus a proximal term `lam/2 |phi - theta|^2`; the
meta-gradient is the implicit one, `lam (H + lam I)^-1 grad L_query`, from
`implicit_proximal` (keyed Hessian-vector products and conjugate gradients), so no
inner step is kept in memory. Run it with

    python examples/imaml_sinusoid.py                 # the full run: 15-25 minutes
    python examples/imaml_sinusoid.py --quick         # seconds: a smoke test

It prints the query MSE on 600 new tasks before and after adaptation, the time per
meta-iteration of iMAML and of second-order MAML side by side, and writes a plot
like the MAML demo's. All data is generated from the seed.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from examples.maml_sinusoid import (
    EVAL_QUERIES,
    EVAL_TASKS,
    META_BATCH,
    META_LR,
    SHOTS,
    Tasks,
    _positive,
    _Progress,
    format_table,
    inner_step,
    make_model,
    mse,
    sample_tasks,
    save_plot,
)
from paramdict import CGInfo, ParamDict, implicit_proximal, optim

INNER_STEPS = 25  # gradient steps on the proximal inner objective, per task
INNER_LR = 0.01  # their largest step size (the MAML demo's); backtracking halves it
LAM = 1.0  # the proximal strength: the inner problem is L(phi) + LAM/2 |phi - theta|^2
CG_STEPS = 5  # conjugate-gradient iterations per meta-gradient (as in the paper)
ITERATIONS = 10_000  # the MAML demo's
QUICK_ITERATIONS = 20


# --------------------------------------------------------------------------- iMAML


def task_losses(params: ParamDict, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Return every task's MSE; `params` hold one set of weights per task."""
    return torch.func.vmap(mse, in_dims=(0, None, 0, 0))(params, model, x, y)


def proximal_objectives(
    fast: ParamDict, params: ParamDict, model: nn.Module, tasks: Tasks, /, *, lam: float
) -> Tensor:
    """Return every task's inner objective, `L(phi) + lam/2 |phi - params|^2`."""
    distances = torch.stack(
        [d.flatten(1).pow(2).sum(1) for d in (fast - params).values()]
    ).sum(0)
    support = task_losses(fast, model, tasks.x_support, tasks.y_support)
    return support + lam / 2 * distances


@dataclass(frozen=True)
class Descent:
    """Where the inner loop stands: every task's weights, step size and objective."""

    fast: ParamDict
    step_size: Tensor
    objective: Tensor


def _per_task(values: Tensor, like: Tensor) -> Tensor:
    """Return `values` (one per task) shaped to broadcast against `like`."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def start_descent(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
) -> Descent:
    """Return the inner loop's start: every task at `params`, step size `inner_lr`."""
    anchor = params.detach()
    fast = anchor.map(lambda t: t.expand(len(tasks), *t.shape))
    with torch.no_grad():
        objective = proximal_objectives(fast, anchor, model, tasks, lam=lam)
    step_size = torch.full_like(objective, inner_lr)
    return Descent(fast, step_size, objective)


def proximal_step(
    state: Descent,
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
    backtrack: bool = True,
) -> Descent:
    """Return the inner loop after one gradient step with backtracking, per task.

    Each task tries `phi - s g`, `g` the gradient of its proximal objective and
    `s` its step size, and keeps it if the objective drops by at least
    `s/2 |g|^2` (Armijo's condition, met by every `s <= 1/L` where the objective
    is `L`-smooth); then `s` doubles, up to `inner_lr`. Otherwise the task stays
    where it is and `s` halves. So no task's objective ever increases, however
    sharp the meta-learned start; a fixed step diverges once the curvature
    exceeds `2/inner_lr - lam`. `backtrack=False` takes that fixed step
    `inner_lr` every time, accepted or not. The tasks run at once under
    `torch.func.vmap`; nothing is recorded for autograd: the meta-gradient does
    not go through these steps.
    """
    anchor = params.detach()
    task_grads = torch.func.vmap(torch.func.grad(mse), in_dims=(0, None, 0, 0))
    with torch.no_grad():
        fast, size = state.fast, state.step_size
        grads = task_grads(fast, model, tasks.x_support, tasks.y_support)
        grads = grads + lam * (fast - anchor)
        trial = fast.map(lambda f, g: f - _per_task(size, g) * g, grads)
        objective = proximal_objectives(trial, anchor, model, tasks, lam=lam)
        if not backtrack:
            return Descent(trial, size, objective)
        squares = torch.stack([g.flatten(1).pow(2).sum(1) for g in grads.values()])
        accept = objective <= state.objective - size / 2 * squares.sum(0)
        fast = trial.map(lambda t, f: torch.where(_per_task(accept, t), t, f), fast)
        return Descent(
            fast,
            torch.where(accept, (2 * size).clamp(max=inner_lr), size / 2),
            torch.where(accept, objective, state.objective),
        )


def adapt(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    steps: int = INNER_STEPS,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
    backtrack: bool = True,
) -> ParamDict:
    """Return every task's adapted weights: `steps` proximal steps from `params`."""
    last = deque(
        descent(
            params,
            model,
            tasks,
            steps=steps,
            inner_lr=inner_lr,
            lam=lam,
            backtrack=backtrack,
        ),
        maxlen=1,  # only the final weights are kept: iMAML's memory does not grow
    )
    return last.pop().fast


def descent(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    steps: int,
    inner_lr: float,
    lam: float,
    backtrack: bool,
) -> Iterator[Descent]:
    """Yield the inner loop's start and its state after each of `steps` steps."""
    state = start_descent(params, model, tasks, inner_lr=inner_lr, lam=lam)
    yield state
    for _ in range(steps):
        state = proximal_step(
            state,
            params,
            model,
            tasks,
            inner_lr=inner_lr,
            lam=lam,
            backtrack=backtrack,
        )
        yield state


def meta_loss(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    steps: int = INNER_STEPS,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
    cg_steps: int = CG_STEPS,
    on_solve: Callable[[CGInfo], object] | None = None,
    backtrack: bool = True,
) -> Tensor:
    """Return iMAML's objective: the mean query loss at the adapted weights.

    Its gradient with respect to `params` is the implicit meta-gradient: the
    adapted weights are declared the solution of the proximal inner problem, whose
    loss is the sum of the tasks' support losses (one block of the Hessian per
    task).
    """
    fast = adapt(
        params,
        model,
        tasks,
        steps=steps,
        inner_lr=inner_lr,
        lam=lam,
        backtrack=backtrack,
    )

    def support_loss(phi: ParamDict) -> Tensor:
        return task_losses(phi, model, tasks.x_support, tasks.y_support).sum()

    fast = implicit_proximal(
        fast, params, loss=support_loss, lam=lam, maxiter=cg_steps, on_solve=on_solve
    )
    return task_losses(fast, model, tasks.x_query, tasks.y_query).mean()


def maml_loss(
    params: ParamDict, model: nn.Module, tasks: Tasks, /, *, steps: int
) -> Tensor:
    """Return second-order MAML's objective with `steps` inner SGD steps, unrolled.

    The MAML demo's `inner_step` (lr 0.01) repeated, every step kept in the graph:
    the baseline whose memory grows with the inner steps.
    """
    fast = params
    for step in range(steps):
        fast = inner_step(
            fast, model, tasks.x_support, tasks.y_support, per_task=step > 0
        )
    return task_losses(fast, model, tasks.x_query, tasks.y_query).mean()


def train(
    model: nn.Module,
    /,
    *,
    iterations: int,
    generator: torch.Generator,
    steps: int = INNER_STEPS,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
    cg_steps: int = CG_STEPS,
    meta_batch: int = META_BATCH,
    backtrack: bool = True,
) -> tuple[float, list[CGInfo]]:
    """Meta-train `model` in place; return the final running meta-loss and CG infos."""
    params = ParamDict.from_module(model)
    meta_optimizer = optim.Adam(lr=META_LR)
    state = meta_optimizer.init(params)
    progress = _Progress(iterations)
    solves: list[CGInfo] = []
    for _ in range(iterations):
        tasks = sample_tasks(meta_batch, generator=generator)
        loss = meta_loss(
            params,
            model,
            tasks,
            steps=steps,
            inner_lr=inner_lr,
            lam=lam,
            cg_steps=cg_steps,
            on_solve=solves.append,
            backtrack=backtrack,
        )
        meta_grads = params.grad(loss)  # the implicit meta-gradient, keyed
        params, state = meta_optimizer.step(params, meta_grads, state)
        progress.update(loss.item())
    progress.close()
    params.to_module(model)
    return progress.running_loss, solves


# --------------------------------------------------------------------------- evaluation


def evaluate(
    params: ParamDict,
    model: nn.Module,
    tasks: Tasks,
    /,
    *,
    steps: int,
    inner_lr: float = INNER_LR,
    lam: float = LAM,
    backtrack: bool = True,
) -> Tensor:
    """Return every task's query MSE after 0, 1, ..., `steps` proximal inner steps.

    Row `k` of the `(steps + 1, tasks)` result is after `k` steps.
    """
    with torch.no_grad():
        errors = [
            torch.func.vmap(mse, in_dims=(None, None, 0, 0))(
                params.detach(), model, tasks.x_query, tasks.y_query
            )
        ]
        states = descent(
            params,
            model,
            tasks,
            steps=steps,
            inner_lr=inner_lr,
            lam=lam,
            backtrack=backtrack,
        )
        for state in itertools.islice(states, 1, None):  # the start is row 0 above
            errors.append(task_losses(state.fast, model, tasks.x_query, tasks.y_query))
    return torch.stack(errors)


def time_per_iteration(
    model: nn.Module, tasks: Tasks, /, *, steps: Sequence[int], rounds: int
) -> dict[str, float]:
    """Return the median seconds of one meta-gradient, iMAML and MAML, per setting.

    The candidates run interleaved, `rounds` times each, on the same meta-batch.
    """
    params = ParamDict.from_module(model)
    candidates: dict[str, Callable[[], Tensor]] = {
        "MAML, 1 step (the MAML demo)": lambda: maml_loss(params, model, tasks, steps=1)
    }
    for n in steps:
        candidates[f"MAML, {n} steps"] = functools.partial(
            maml_loss, params, model, tasks, steps=n
        )
        candidates[f"iMAML, {n} steps"] = functools.partial(
            meta_loss, params, model, tasks, steps=n
        )
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, loss in candidates.items():
            start = time.perf_counter()
            params.grad(loss())
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


# --------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Return the command-line options (see `--help`)."""
    parser = argparse.ArgumentParser(
        description="iMAML on sinusoid regression (Rajeswaran et al., 2019)."
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
        "--inner-steps",
        type=_positive,
        default=INNER_STEPS,
        metavar="N",
        help=f"proximal inner steps, in training and evaluation (default "
        f"{INNER_STEPS})",
    )
    parser.add_argument(
        "--inner-lr",
        type=float,
        default=INNER_LR,
        metavar="LR",
        help=f"the largest inner step size; backtracking halves it per task "
        f"where needed (default {INNER_LR})",
    )
    parser.add_argument(
        "--lam",
        type=float,
        default=LAM,
        metavar="LAM",
        help=f"the proximal strength (default {LAM})",
    )
    parser.add_argument(
        "--cg-steps",
        type=_positive,
        default=CG_STEPS,
        metavar="N",
        help=f"conjugate-gradient iterations per meta-gradient (default {CG_STEPS})",
    )
    parser.add_argument(
        "--fixed-step",
        action="store_true",
        help="take the fixed step --inner-lr in the inner loop, without "
        "backtracking (diverges once the meta-learned start is too sharp)",
    )
    parser.add_argument(
        "--threads", type=_positive, default=1, metavar="N", help="CPU threads"
    )
    parser.add_argument(
        "--eval-tasks",
        type=_positive,
        default=EVAL_TASKS,
        metavar="N",
        help=f"new tasks to evaluate on (default {EVAL_TASKS})",
    )
    parser.add_argument(
        "--plot",
        default="imaml_sinusoid.png",
        metavar="PATH",
        help="where to write the PNG (default imaml_sinusoid.png)",
    )
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument(
        "--no-timing",
        action="store_true",
        help="skip the time-per-meta-iteration comparison with MAML",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds: a smoke test"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Meta-train, evaluate, print the tables, write the plot; return 0."""
    args = parse_args(argv)
    iterations = args.iterations or (QUICK_ITERATIONS if args.quick else ITERATIONS)
    torch.set_num_threads(args.threads)
    # The MAML demo's three streams from one seed: the same initial weights and the
    # same evaluation tasks as `maml_sinusoid.py --seed S`.
    root = torch.Generator().manual_seed(args.seed)
    init_seed, train_seed, eval_seed = torch.randint(2**62, (3,), generator=root)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(init_seed))
        model = make_model()

    steps = args.inner_steps
    how = (
        f"fixed step {args.inner_lr}"
        if args.fixed_step
        else f"step <= {args.inner_lr}, backtracking"
    )
    print(f"iMAML on sinusoid regression: MLP 1-40-40-1 (ReLU), K = {SHOTS}")
    print(
        f"  {iterations:,} meta-iterations, meta-batch of {META_BATCH} tasks; "
        f"{steps} inner steps ({how}) on the support loss + {args.lam}/2 "
        "|phi - theta|^2"
    )
    print(
        f"  implicit meta-gradient: {args.cg_steps} CG iterations; "
        f"paramdict.optim.Adam lr {META_LR}; seed {args.seed}, {args.threads} "
        "thread(s)"
    )
    start = time.perf_counter()
    running, solves = train(
        model,
        iterations=iterations,
        generator=torch.Generator().manual_seed(int(train_seed)),
        steps=steps,
        inner_lr=args.inner_lr,
        lam=args.lam,
        cg_steps=args.cg_steps,
        backtrack=not args.fixed_step,
    )
    elapsed = time.perf_counter() - start
    print(
        f"meta-training took {elapsed:.1f} s ({1000 * elapsed / iterations:.1f} ms "
        f"per meta-iteration); final running meta-loss {running:.3f}"
    )
    last = solves[-100:]
    shrink = statistics.median(s.residual_norms[-1] / s.residual_norms[0] for s in last)
    print(
        f"CG over the last {len(last)} meta-iterations: final / initial residual "
        f"norm {shrink:.3g} (median) after {args.cg_steps} iterations"
    )

    tasks = sample_tasks(
        args.eval_tasks,
        generator=torch.Generator().manual_seed(int(eval_seed)),
        queries=EVAL_QUERIES,
    )
    params = ParamDict.from_module(model)
    errors = evaluate(
        params,
        model,
        tasks,
        steps=steps,
        inner_lr=args.inner_lr,
        lam=args.lam,
        backtrack=not args.fixed_step,
    )
    print(
        f"\nQuery MSE on {len(tasks)} new tasks ({SHOTS} support and {EVAL_QUERIES} "
        "query points each), mean and 95% CI:"
    )
    print(format_table(errors))

    if not args.no_timing:
        rounds = 3 if args.quick else 15
        batch = sample_tasks(META_BATCH, generator=torch.Generator().manual_seed(1))
        medians = time_per_iteration(
            model, batch, steps=(5, steps) if steps != 5 else (5,), rounds=rounds
        )
        print(f"\nTime per meta-iteration ({META_BATCH} tasks, medians of {rounds}):")
        for name, seconds in medians.items():
            print(f"  {name:<32}{1000 * seconds:>8.1f} ms")

    if not args.no_plot:
        title = (
            f"iMAML ({iterations:,} meta-iterations, {steps} proximal steps): "
            f"adapting to new sinusoids from K = {SHOTS} points"
        )
        anchor = params.detach()
        states: list[Descent] = []

        def step(fast: ParamDict, some: Tasks, per_task: bool) -> ParamDict:
            # `save_plot` calls this once per step, `per_task=False` first.
            if not per_task:
                states[:] = [
                    start_descent(
                        anchor, model, some, inner_lr=args.inner_lr, lam=args.lam
                    )
                ]
            states[0] = proximal_step(
                states[0],
                anchor,
                model,
                some,
                inner_lr=args.inner_lr,
                lam=args.lam,
                backtrack=not args.fixed_step,
            )
            return states[0].fast

        if save_plot(
            args.plot,
            params,
            model,
            tasks,
            errors,
            title=title,
            adapt=step,
            label="iMAML",
        ):
            print(f"\nWrote {args.plot}")
        else:
            print("\nNo plot: matplotlib is missing (pip install paramdict[examples])")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
