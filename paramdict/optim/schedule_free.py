"""Schedule-Free AdamW: Adam steps on one sequence, the model at their average.

Defazio et al., 2024, "The Road Less Scheduled".
"""

from __future__ import annotations

from typing import ClassVar, TypeVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

# The public names only (`paramdict.optim.*`), from the modules defining them.
from .._paramdict import ParamDict
from . import fields
from ._hyper import Rate, check_int
from ._schedules.slot import LearningRate
from ._states import ScheduleFreeAdamWState
from ._torch_optimizer import TorchOptimizer

__all__ = ["ScheduleFreeAdamW", "ScheduleFreeAdamWState"]

P = TypeVar("P", bound=ParamDict)


@attrs.frozen(kw_only=True, eq=False, field_transformer=fields.shared_last)
class ScheduleFreeAdamW(TorchOptimizer[ScheduleFreeAdamWState]):
    """Schedule-Free AdamW: no schedule to set, the model at an average.

    The paper's iteration (Defazio et al., 2024, "The Road Less Scheduled",
    Algorithm 1 with Adam's denominator), as `schedulefree.AdamWScheduleFree`
    stores it: the parameters are the point `y` where the gradient is taken, the
    state keeps the base sequence `z`, and the point to evaluate is the average
    `x = lerp(y, z, 1 - 1 / beta1)`, returned by `eval_params(params, state)`
    without writing anything (there is no train/eval mode to switch). With
    `k` the steps taken before this one and `g` the gradient at `y`:

        lr_k   = lr * min(1, (k + 1) / warmup_steps)
        lr_max = max(lr_max, lr_k)
        w      = (k + 1) ** r * lr_max ** weight_lr_power;  c = w / sum of w
        v      = beta2 * v + (1 - beta2) * g * g
        u      = g / (sqrt(v / (1 - beta2 ** (k + 1))) + eps) + weight_decay * y
        y      = lerp(y, z, c) + lr_k * (beta1 * (1 - c) - 1) * u
        z      = z - lr_k * u

    which is the paper's `z -= lr_k * u`, `x = (1 - c) x + c z`,
    `y = (1 - beta1) z + beta1 x` on `y`. The weight decay is evaluated at `y`
    and moves both sequences. The options, defaults and order of operations are
    the package's (`lr=0.0025`), so its `y`, `z` and `x` come out the same.

    A learning rate schedule is not needed (that is the point), but `lr` may be
    one: it multiplies the warm-up. A per-key `lr` is refused: the averaging
    weights come from one learning rate, so give each rate its own group
    (`ParamGroups`), whose states average apart. The running statistics of
    BatchNorm layers are not parameters: recompute them at `x` before
    evaluating (`optim.update_bn(opt.eval_params(params, state), model,
    loader)`).

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, or a schedule.
        betas: The interpolation `beta1` between `z` and `x` (in (0, 1): `x` is
            recovered from `y` and `z` by dividing by it) and Adam's `beta2`.
        eps: Term added to the denominator.
        weight_decay: The weight decay, evaluated at `y`.
        warmup_steps: Steps of linear warm-up of the learning rate (0: none).
        r: The power of the step number in the averaging weights.
        weight_lr_power: The power of the largest learning rate so far in the
            averaging weights.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.

    Raises:
        ValueError: If `betas[0]` is 0, or an option is out of its range.
        TypeError: If `lr` is a per-key ParamDict, or an option is of the wrong
            kind.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.ScheduleFreeAdamW(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, -1.0]))
        >>> state = opt.init(params)
        >>> for g in ([3.0, -3.0], [1.0, 2.0]):
        ...     params, state = opt.step(params, {"w": torch.tensor(g)}, state)
        >>> params["w"], opt.eval_params(params, state)["w"]  # y, then x
        (tensor([ 0.8754, -0.9431]), tensor([ 0.8776, -0.9392]))
    """

    state_type: ClassVar[type[ScheduleFreeAdamWState]] = ScheduleFreeAdamWState
    decoupled_decay: ClassVar[bool] = True
    decays_in_math: ClassVar[bool] = True  # at `y`, into both sequences
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 0.0025
    betas: tuple[float, float] = fields.betas((0.9, 0.999))
    eps: float = fields.non_negative(1e-8)
    weight_decay: Rate = 0.0
    warmup_steps: int = attrs.field(
        default=0, validator=check_int(lambda n: n >= 0, "non-negative")
    )
    r: float = fields.non_negative(0.0)
    weight_lr_power: float = fields.non_negative(2.0)

    def __attrs_post_init__(self) -> None:
        """Refuse a per-key `lr`, a cycled momentum and `betas[0] == 0`."""
        super().__attrs_post_init__()
        if isinstance(self.lr, ParamDict):
            msg = (
                "`ScheduleFreeAdamW` takes one learning rate (a number, a 0-dim "
                "tensor or a schedule), not a per-key ParamDict: its averaging "
                "weights come from the rate. Give each rate its own group: "
                "`optim.ParamGroups({'*.bias': ScheduleFreeAdamW(lr=...)}, "
                "default=ScheduleFreeAdamW(lr=...))`."
            )
            raise TypeError(msg)
        if getattr(self.lr, "cycles_momentum", False):
            msg = (
                f"`ScheduleFreeAdamW` keeps `betas[0]` fixed (the average `x` is "
                f"recovered with it), and the `{type(self.lr).__name__}` given as "
                "`lr` cycles it. Pass `cycle_momentum=False` to the schedule."
            )
            raise ValueError(msg)
        if self.betas[0] == 0:
            msg = (
                "`betas[0]` must be above 0 for `ScheduleFreeAdamW`: the average "
                "`x` is recovered from `y` and `z` by dividing by it."
            )
            raise ValueError(msg)

    def init_state(self, params: ParamDict, /) -> ScheduleFreeAdamWState:
        """Return the first state: `z` a copy of the parameters, the rest zero."""
        counter = self.counter(params)
        start = params if self.differentiable else params.detach()
        return ScheduleFreeAdamWState(
            counter,
            start.clone(),
            params.zeros_like(),
            torch.zeros_like(counter),
            torch.zeros_like(counter),
        )

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: ScheduleFreeAdamWState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta2 = self.betas[1]
        host = self.host_numbers(step, lr, state.lr_max, state.weight_sum)
        numbers = self._numbers(host) if host else self._tensors(step, lr, state)
        rate, c, y_size, bias2, lr_max, weight_sum = numbers

        state.exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        denom = state.exp_avg_sq.div(bias2).sqrt_()
        # Recorded, the root's result is saved for the backward pass.
        denom = denom.add(self.eps) if self.differentiable else denom.add_(self.eps)
        update = grads.div(denom)
        weight_decay = self.rate("weight_decay", step)
        if isinstance(weight_decay, ParamDict):
            update.add_(params.mul(weight_decay))
        elif not (isinstance(weight_decay, float | int) and weight_decay == 0):
            update.add_(params, alpha=weight_decay)
        # Recorded, the interpolation saves `z`, which is written next: a copy.
        z = state.z.clone() if self.differentiable else state.z
        params.lerp_(z, c).add_(update, alpha=y_size)
        state.z.sub_(update, alpha=rate)
        for kept, value in ((state.lr_max, lr_max), (state.weight_sum, weight_sum)):
            if isinstance(value, Tensor):
                kept.copy_(value)
            else:
                kept.fill_(value)

    def _numbers(self, host: tuple[float, ...]) -> tuple[float, ...]:
        """The step's numbers, as the package computes them in Python floats."""
        beta1, beta2 = self.betas
        t, rate, lr_max, weight_sum = host
        if self.warmup_steps:
            rate *= min(1.0, t / self.warmup_steps)
        lr_max = max(lr_max, rate)
        weight = t**self.r * lr_max**self.weight_lr_power
        weight_sum += weight
        c = weight / weight_sum if weight_sum > 0 else 0.0
        y_size = rate * (beta1 * (1 - c) - 1)
        return rate, c, y_size, 1 - beta2**t, lr_max, weight_sum

    def _tensors(
        self, step: Tensor, lr: Rate, state: ScheduleFreeAdamWState
    ) -> tuple[Tensor, ...]:
        """The step's numbers as 0-dim tensors (traced, recorded, a device's)."""
        beta1, beta2 = self.betas
        # The rate and the weights in the counter's dtype (double precision).
        given = lr if isinstance(lr, Tensor) else float(cast(float, lr))
        rate = torch.as_tensor(given, dtype=step.dtype, device=step.device)
        if self.warmup_steps:
            rate = rate * torch.clamp(step / self.warmup_steps, max=1.0)
        # `where` saves the comparison only, so `lr_max` may be written after.
        lr_max = torch.where(rate > state.lr_max, rate, state.lr_max)
        weight = step**self.r * lr_max**self.weight_lr_power
        weight_sum = state.weight_sum + weight
        # c = w / sum w, 0 while the sum is 0 (a zero rate), without a 0 / 0.
        c = weight / torch.where(weight_sum > 0, weight_sum, 1.0)
        y_size = rate * (beta1 * (1 - c) - 1)
        return rate, c, y_size, 1 - beta2**step, lr_max, weight_sum

    @override
    def eval_params(self, params: P, state: ScheduleFreeAdamWState, /) -> P:
        """Return `x`, the average to evaluate the model at: `lerp(y, z, 1 - 1/beta1)`.

        `params` (`y`) and `state` are unchanged (and checked as `check_state`
        does); the result is new tensors, recorded by autograd only when the
        optimizer is differentiable. Before the first step `x` is the parameters.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ScheduleFreeAdamW(betas=(0.5, 0.999))
            >>> y = ParamDict(w=torch.tensor([2.0]))
            >>> state = opt.init(y)._replace(z=ParamDict(w=torch.tensor([1.0])))
            >>> opt.eval_params(y, state)["w"]  # y = (z + x) / 2
            tensor([3.])
        """
        self.check_state(params, state)
        with torch.set_grad_enabled(self.differentiable and torch.is_grad_enabled()):
            return params.lerp(state.z, 1 - 1 / self.betas[0])
