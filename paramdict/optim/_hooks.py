"""The optional hooks of every optimizer: schedules, rates, counts, eval points.

Each default but `eval_params`'s refuses with a message naming the hook to
implement; `TorchOptimizer` implements them, and the wrappers (`ParamGroups`,
`ClipGradNorm`, `MultiSteps`) hand them to the optimizers they hold.
`eval_params` returns the parameters themselves unless an optimizer evaluates
elsewhere (`ScheduleFreeAdamW`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from torch import Tensor

from .._paramdict import ParamDict

__all__ = ["OptionalHooks"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


class OptionalHooks(Generic[S]):
    """`takes_metric`, `step_schedule`, `last_lr`, `step_count`, `eval_params`."""

    __slots__ = ()

    @property
    def takes_metric(self) -> bool:
        """Whether `step_schedule` applies: a `ReduceLROnPlateau` learning rate."""
        return False

    def step_schedule(self, state: S, metrics: float | Tensor, /) -> S:
        """Return `state` after its `ReduceLROnPlateau` schedule saw `metrics`.

        The one explicit call for a schedule that reacts to a metric (torch's
        `scheduler.step(metrics)`); `TorchOptimizer` implements it, and
        `ParamGroups`, `ClipGradNorm` and `MultiSteps` hand it to the optimizers
        they hold. `state` is unchanged.

        Args:
            state: The optimizer's state.
            metrics: The metric: a number or a one-element tensor.

        Returns:
            The new state.

        Raises:
            ValueError: If no learning rate here is a `ReduceLROnPlateau`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1))
            >>> state = opt.step_schedule(opt.init(ParamDict(w=torch.ones(1))), 0.5)
            >>> state.schedule.best
            tensor(0.5000, dtype=torch.float64)
        """
        msg = (
            f"`step_schedule` takes a metric for a `ReduceLROnPlateau` learning "
            f"rate, and this `{type(self).__name__}` has none."
        )
        raise ValueError(msg)

    def last_lr(self, state: S, /) -> list[float]:
        """Return the learning rate of each group for the next step.

        torch's `scheduler.get_last_lr()`, read from `state` whatever wraps the
        optimizer: `TorchOptimizer` implements it, and `ParamGroups` (one entry
        per group, then the default), `ClipGradNorm` and `MultiSteps` ask the
        optimizers they hold. A per-key learning rate gives one entry per key.
        It reads tensors to the host: call it outside a compiled step.

        Args:
            state: The optimizer's state.

        Returns:
            The learning rates, as Python floats.

        Raises:
            TypeError: If this optimizer has no learning rate to report.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.AdamW(lr=optim.StepLR(base_lr=0.1, step_size=1))
            >>> params = ParamDict(w=torch.ones(1))
            >>> _, state = opt.step(params, {"w": torch.ones(1)}, opt.init(params))
            >>> opt.last_lr(state), opt.step_count(state)
            ([0.010000000000000002], 1)
        """
        msg = (
            f"`{type(self).__name__}` does not report a learning rate: implement "
            "`last_lr` on it."
        )
        raise TypeError(msg)

    def step_count(self, state: S, /) -> int:
        """Return how many steps the optimizer has taken (torch's `state["step"]`).

        Gradient accumulation (`MultiSteps`) counts the inner optimizer's steps;
        `ParamGroups` the steps of its groups. It reads a tensor to the host.

        Args:
            state: The optimizer's state.

        Returns:
            The number of steps taken.

        Raises:
            TypeError: If this optimizer keeps no step count.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.MultiSteps(optim.SGD(lr=0.1), every_k=2)
            >>> opt.step_count(opt.init(ParamDict(w=torch.ones(1))))
            0
        """
        msg = (
            f"`{type(self).__name__}` keeps no step count: implement `step_count` "
            "on it."
        )
        raise TypeError(msg)

    def eval_params(self, params: P, state: S, /) -> P:
        """Return the parameters to evaluate the model at, given the state.

        The gradients of a step are taken at `params`. For most optimizers that
        is also the point to evaluate (validate, test, export), and `params` is
        returned as it is. An optimizer that takes its gradients elsewhere than
        at the point it converges to overrides this: `ScheduleFreeAdamW` keeps
        the gradient point `y` as its parameters and evaluates at the average
        `x`, computed from `y` and the state. It is a function: nothing is
        written, so evaluating in the middle of training, or saving a
        checkpoint, needs no switch of mode. The wrappers (`ParamGroups`,
        `ClipGradNorm`, `MultiSteps`) ask the optimizers they hold, key by key.

        Args:
            params: The parameters, as `step` returns them.
            state: The optimizer's state for them.

        Returns:
            The parameters to evaluate at: `params` itself, or new tensors (not
            recorded by autograd unless the optimizer is differentiable).

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.ones(2))
            >>> opt = optim.AdamW()
            >>> opt.eval_params(params, opt.init(params)) is params
            True
        """
        del state
        return params
