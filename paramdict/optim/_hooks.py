"""The optional hooks of every optimizer: schedules, rates, counts, eval points."""

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

        torch's `scheduler.step(metrics)`; the wrappers hand it to the
        optimizers they hold. `state` is unchanged.

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

        torch's `scheduler.get_last_lr()`: one entry per group (`ParamGroups`,
        then the default), or per key for a per-key rate. It reads tensors to
        the host: call it outside a compiled step.

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

        `MultiSteps` counts the inner optimizer's steps. It reads the host.

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

        For most optimizers, `params` itself. `ScheduleFreeAdamW` keeps the
        gradient point `y` as its parameters and evaluates at the average `x`,
        computed from `y` and the state. Nothing is written, so evaluating
        mid-training needs no switch of mode.

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
