"""The Adam family: Adam, AdamW, NAdam, RAdam and Adamax.

Adaptive moment estimation with L2 or decoupled weight decay, Nesterov momentum
(NAdam), a rectified variance (RAdam) and the infinity norm (Adamax). The shared
pieces are written once: the running moments and the weight-decay prologue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, TypeVar

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from . import _fused
from ._base import HasStep, TorchOptimizer
from ._hyper import (
    Rate,
    check_betas,
    check_fused,
    check_non_negative,
    product,
    quotient,
    state_scalar_dtype,
)
from ._kernels import Kernels
from ._protocol import register_state
from ._scheduled import LearningRate, SlotState

S = TypeVar("S", bound=HasStep)

__all__ = [
    "Adam",
    "AdamState",
    "AdamW",
    "Adamax",
    "AdamaxState",
    "NAdam",
    "NAdamState",
    "RAdam",
    "RAdamState",
]


@register_state
class AdamState(NamedTuple):
    """The state of `Adam` and `AdamW`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        max_exp_avg_sq: The running maximum of `exp_avg_sq` (AMSGrad); empty
            unless `amsgrad=True`.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adam(betas=(0.5, 0.5))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, 2.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"], state.exp_avg_sq["w"]
        (tensor([1., 1.]), tensor([2., 2.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    max_exp_avg_sq: ParamDict
    schedule: SlotState = ()


def _check_flag(instance: object, attribute: Any, value: Any) -> None:
    """Raise `TypeError` unless `value` is True or False, naming the argument."""
    if not isinstance(value, bool):
        msg = f"`{attribute.name}` must be True or False, got {value!r}."
        raise TypeError(msg)


def _moments(
    betas: tuple[float | Tensor, float],
    exp_avg: ParamDict,
    exp_avg_sq: ParamDict,
    grads: ParamDict,
    ops: Kernels,
) -> tuple[ParamDict, ParamDict]:
    """Return the updated running averages of the gradient and its square."""
    beta1, beta2 = betas
    exp_avg = ops.lerp(exp_avg, grads, 1 - beta1)
    exp_avg_sq = ops.mul(exp_avg_sq, beta2)
    exp_avg_sq = ops.addcmul(exp_avg_sq, grads, grads, 1 - beta2)
    return exp_avg, exp_avg_sq


def _decayed(
    opt: TorchOptimizer[S],
    decoupled: bool,
    params: ParamDict,
    grads: ParamDict,
    step: Tensor,
    lr: Rate,
    ops: Kernels,
) -> tuple[ParamDict, ParamDict]:
    """Return `(params, grads)` after `maximize` and the weight decay.

    Decoupled decay multiplies the parameters by `1 - lr * weight_decay` (`lr`
    as the rule read it, scheduled or not); else the decay is the L2 term of the
    prologue.
    """
    if not decoupled:
        return params, opt.prologue(params, grads, step, ops)
    if opt.maximize:
        grads = ops.neg(grads)
    return ops.decay(params, lr, opt.rate("weight_decay", step)), grads


class _AdamFamily(TorchOptimizer[AdamState]):
    """The shared state and rule of Adam and AdamW."""

    __slots__ = ()

    state_type: ClassVar[type[AdamState]] = AdamState
    buffer_options: ClassVar[Mapping[str, str]] = {"max_exp_avg_sq": "amsgrad=True"}

    betas: tuple[float, float]
    eps: float
    amsgrad: bool
    fused: bool | None

    def _decoupled(self) -> bool:
        """Whether the weight decay is decoupled (applied to the parameters)."""
        raise NotImplementedError

    def init_state(self, params: ParamDict, /) -> AdamState:
        """Return the first state: step 0 and zero moments.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            An `AdamState`; `max_exp_avg_sq` is empty unless `amsgrad=True`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.Adam().init(ParamDict(w=torch.ones(2)))
            >>> state.step, state.exp_avg["w"], len(state.max_exp_avg_sq)
            (tensor(0., dtype=torch.float64), tensor([0., 0.]), 0)
        """
        return AdamState(
            self.counter(params),
            params.zeros_like(),
            params.zeros_like(),
            params.zeros_like() if self.amsgrad else ParamDict(),
        )

    @override
    def _fused_rates(self, params: ParamDict, state: AdamState) -> list[float] | None:
        return _fused.fused_rates(self, params, state)

    @override
    def _step_fused(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdamState,
        rates: list[float],
    ) -> AdamState:
        step = self.next_step(state)
        _fused.adam_(
            params,
            grads,
            state.exp_avg,
            state.exp_avg_sq,
            state.max_exp_avg_sq,
            step,
            amsgrad=self.amsgrad,
            lr=rates[0],
            betas=self.betas,
            weight_decay=rates[1],
            eps=self.eps,
            maximize=self.maximize,
            decoupled=self._decoupled(),
        )
        state.step.copy_(step)  # last: a kernel that raises leaves it as it was
        return state

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: AdamState, ops: Kernels, /
    ) -> tuple[ParamDict, AdamState]:
        beta1, beta2 = self.cycled("betas", state)
        step = self.next_step(state)
        lr = self.rate("lr", step, state)
        params, grads = _decayed(self, self._decoupled(), params, grads, step, lr, ops)
        exp_avg, exp_avg_sq = _moments(
            (beta1, beta2), state.exp_avg, state.exp_avg_sq, grads, ops
        )
        max_exp_avg_sq = state.max_exp_avg_sq
        second = exp_avg_sq
        if self.amsgrad:
            max_exp_avg_sq = ops.maximum(max_exp_avg_sq, exp_avg_sq)
            second = max_exp_avg_sq
        # Bias corrections in double precision from the step tensor: the numbers
        # torch.optim computes with Python floats, without reading the step on the host.
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step).sqrt()
        step_size = -quotient(lr, bias_correction1)
        denom = ops.div(ops.sqrt(ops.borrowed(second)), bias_correction2_sqrt)
        denom = ops.add(denom, self.eps)
        # torch's `addcdiv(m, denom, value=step_size)`; a tensor `step_size`
        # multiplies `m` first, as torch does with a tensor rate.
        new_params = ops.addcdiv(params, exp_avg, denom, step_size)
        new_state = AdamState(
            step, exp_avg, exp_avg_sq, max_exp_avg_sq, self.next_schedule(state)
        )
        return new_params, new_state


@attrs.frozen(kw_only=True, eq=False)
class Adam(_AdamFamily):
    """Adam, the functional `torch.optim.Adam`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adam`, so a run
    gives the same parameters. The bias corrections are computed in double
    precision from a step-count tensor, so nothing is read back to the host and
    `torch.compile` does not specialize on the step.

    The attributes below are the constructor's keyword arguments. Configurations
    are immutable and compared by identity (hyperparameters may be tensors).

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule such as `optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`.
        betas: Coefficients of the running averages of the gradient and its
            square, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Weight decay: added to the gradient as an L2 penalty, or
            applied to the parameters with `decoupled_weight_decay=True`; a
            number, a 0-dim tensor or a ParamDict of per-key values.
        amsgrad: Use the running maximum of the second moment (AMSGrad).
        maximize: Maximize the objective instead of minimizing it.
        decoupled_weight_decay: Decay the parameters directly (then this is
            `AdamW`).
        differentiable: Keep the autograd graph through `step` (see `step`).
        fused: Which kernels an eager, non-differentiable step uses. `None`
            (the default): torch's fused kernel wherever the step allows it
            (every entry float32 or float64 on one device that has the kernel,
            number or CPU-scheduled rates), bitwise `torch.optim` with
            `fused=True`, and the
            foreach rule otherwise. `False`: always the foreach rule, bitwise
            `torch.optim` with `foreach=True`. `True`: the fused kernel, and a
            step it cannot take is refused (not with `differentiable=True`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.Adam(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.9000, 2.1000])
    """

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = 0.0
    amsgrad: bool = False
    maximize: bool = False
    decoupled_weight_decay: bool = False
    differentiable: bool = False
    fused: bool | None = attrs.field(default=None, validator=check_fused)

    def _decoupled(self) -> bool:
        return self.decoupled_weight_decay


@attrs.frozen(kw_only=True, eq=False)
class AdamW(_AdamFamily):
    """AdamW, the functional `torch.optim.AdamW`: Adam with decoupled weight decay.

    The parameters are multiplied by `1 - lr * weight_decay` before the Adam
    update, as in `torch.optim.AdamW`; everything else is `Adam`: both are the
    same rule of the Adam family, AdamW with `decoupled_weight_decay` always on.
    The attributes below are the constructor's keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule such as `optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`.
        betas: Coefficients of the running averages, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Decoupled weight decay: a number, a 0-dim tensor or a
            ParamDict of per-key values (e.g. zero for biases).
        amsgrad: Use the running maximum of the second moment (AMSGrad).
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).
        fused: Which kernels an eager, non-differentiable step uses. `None`
            (the default): torch's fused kernel wherever the step allows it
            (every entry float32 or float64 on one device that has the kernel,
            number or CPU-scheduled rates), bitwise `torch.optim` with
            `fused=True`, and the
            foreach rule otherwise. `False`: always the foreach rule, bitwise
            `torch.optim` with `foreach=True`. `True`: the fused kernel, and a
            step it cannot take is refused (not with `differentiable=True`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.AdamW(lr=0.1, weight_decay=0.5)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([0.0])}, state)
        >>> params["w"]
        tensor([0.9500])
    """

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = 1e-2
    amsgrad: bool = False
    maximize: bool = False
    differentiable: bool = False
    fused: bool | None = attrs.field(default=None, validator=check_fused)

    def _decoupled(self) -> bool:
        return True


@register_state
class NAdamState(NamedTuple):
    """The state of `NAdam`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        mu_product: The product of the momentum coefficients so far, a 0-dim
            tensor in torch.optim's dtype for it (float32 unless the default
            dtype is float64).
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.NAdam()
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.mu_product
        tensor(0.4501)
    """

    step: Tensor
    mu_product: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


def _momentum(beta1: float | Tensor, step: Tensor, momentum_decay: float) -> Tensor:
    """Return NAdam's momentum coefficient `mu` for `step`, in double precision."""
    return beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))


@attrs.frozen(kw_only=True, eq=False)
class NAdam(TorchOptimizer[NAdamState]):
    """NAdam, the functional `torch.optim.NAdam`: Adam with Nesterov momentum.

    Same hyperparameters, defaults and arithmetic as `torch.optim.NAdam`, so a
    run gives the same parameters. The momentum schedule
    `mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))` is computed in
    double precision from the step-count tensor, and `mu_product` is kept in
    torch.optim's dtype for it, so the rounding is torch's. The attributes below
    are the constructor's keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule (`CyclicLR` and `OneCycleLR` cycle the first beta too).
        betas: Coefficients of the running averages of the gradient and its
            square, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Weight decay: an L2 penalty added to the gradient, or
            applied to the parameters with `decoupled_weight_decay=True`.
        momentum_decay: The decay of the momentum schedule.
        decoupled_weight_decay: Decay the parameters directly, as AdamW does
            (NAdamW).
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If `lr`, `eps`, `weight_decay` or `momentum_decay` is
            negative or a beta is outside [0, 1); the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.NAdam(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.8944, 2.1056])
    """

    state_type: ClassVar[type[NAdamState]] = NAdamState

    lr: LearningRate = 2e-3
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = 0.0
    momentum_decay: float = attrs.field(default=4e-3, validator=check_non_negative)
    decoupled_weight_decay: bool = attrs.field(default=False, validator=_check_flag)
    maximize: bool = False
    differentiable: bool = False

    def init_state(self, params: ParamDict, /) -> NAdamState:
        """Return the first state: step 0, `mu_product` 1 and zero moments.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            A `NAdamState`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.NAdam().init(ParamDict(w=torch.ones(2)))
            >>> state.mu_product, state.exp_avg["w"]
            (tensor(1.), tensor([0., 0.]))
        """
        counter = self.counter(params)
        mu_product = torch.ones(
            (), dtype=state_scalar_dtype(counter.device), device=counter.device
        )
        return NAdamState(counter, mu_product, params.zeros_like(), params.zeros_like())

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: NAdamState, ops: Kernels, /
    ) -> tuple[ParamDict, NAdamState]:
        beta1, beta2 = self.cycled("betas", state)
        step = self.next_step(state)
        lr = self.rate("lr", step, state)
        decoupled = self.decoupled_weight_decay
        params, grads = _decayed(self, decoupled, params, grads, step, lr, ops)
        mu = _momentum(beta1, step, self.momentum_decay)
        mu_next = _momentum(beta1, step + 1, self.momentum_decay)
        # torch multiplies its stored `mu_product` in place, in that tensor's dtype.
        mu_product = state.mu_product * mu.to(state.mu_product.dtype)
        exp_avg, exp_avg_sq = _moments(
            (beta1, beta2), state.exp_avg, state.exp_avg_sq, grads, ops
        )
        bias_correction2 = 1 - beta2**step
        denom = ops.sqrt(ops.div(ops.borrowed(exp_avg_sq), bias_correction2))
        denom = ops.add(denom, self.eps)
        # The two step sizes, from the stored product read at double precision.
        product_now = mu_product.to(step.dtype)
        grad_size = quotient(product(lr, -(1.0 - mu)), 1.0 - product_now)
        avg_size = quotient(product(lr, -mu_next), 1.0 - product_now * mu_next)
        new_params = ops.addcdiv(params, grads, denom, grad_size)
        new_params = ops.addcdiv(new_params, exp_avg, denom, avg_size)
        new_state = NAdamState(
            step, mu_product, exp_avg, exp_avg_sq, self.next_schedule(state)
        )
        return new_params, new_state


@register_state
class RAdamState(NamedTuple):
    """The state of `RAdam`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.RAdam(betas=(0.5, 0.5))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.full_like(2.0), opt.init(params))
        >>> state.exp_avg["w"], state.exp_avg_sq["w"]
        (tensor([1., 1.]), tensor([2., 2.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False)
class RAdam(TorchOptimizer[RAdamState]):
    """RAdam, the functional `torch.optim.RAdam`: Adam with a rectified variance.

    Same hyperparameters, defaults and arithmetic as `torch.optim.RAdam`, so a
    run gives the same parameters. While the variance estimate is unreliable
    (the approximated moving-average length `rho_t` is at most 5) the step is
    the bias-corrected momentum alone; after that it is rectified Adam. The
    choice is made on the step-count tensor, so nothing is read back to the
    host. The attributes below are the constructor's keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule (`CyclicLR` and `OneCycleLR` cycle the first beta too).
        betas: Coefficients of the running averages, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Weight decay: an L2 penalty added to the gradient, or
            applied to the parameters with `decoupled_weight_decay=True`.
        decoupled_weight_decay: Decay the parameters directly, as AdamW does.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.RAdam(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.7000, 2.3000])
    """

    state_type: ClassVar[type[RAdamState]] = RAdamState

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = 0.0
    decoupled_weight_decay: bool = attrs.field(default=False, validator=_check_flag)
    maximize: bool = False
    differentiable: bool = False

    def init_state(self, params: ParamDict, /) -> RAdamState:
        """Return the first state: step 0 and zero moments.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            A `RAdamState`.

        Example:
            >>> from paramdict import optim
            >>> optim.RAdam().init(ParamDict(w=torch.ones(2))).exp_avg_sq["w"]
            tensor([0., 0.])
        """
        return RAdamState(
            self.counter(params), params.zeros_like(), params.zeros_like()
        )

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: RAdamState, ops: Kernels, /
    ) -> tuple[ParamDict, RAdamState]:
        beta1, beta2 = self.cycled("betas", state)
        step = self.next_step(state)
        lr = self.rate("lr", step, state)
        decoupled = self.decoupled_weight_decay
        params, grads = _decayed(self, decoupled, params, grads, step, lr, ops)
        exp_avg, exp_avg_sq = _moments(
            (beta1, beta2), state.exp_avg, state.exp_avg_sq, grads, ops
        )
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        # The length of the approximated moving average, and its maximum.
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        rectified = rho_t > 5.0
        # Where `rho_t <= 5` the rectification is undefined: 1 keeps it finite
        # (and its gradient zero) in the branch that is not taken.
        rect = torch.where(
            rectified,
            (rho_t - 4)
            * (rho_t - 2)
            * rho_inf
            / ((rho_inf - 4) * (rho_inf - 2) * rho_t),
            1.0,
        ).sqrt()
        # torch's `exp_avg / bias_correction1 * lr [* adaptive_lr * rect]`.
        momentum = ops.mul(ops.div(ops.borrowed(exp_avg), bias_correction1), lr)
        adaptive = ops.add(ops.sqrt(ops.borrowed(exp_avg_sq)), self.eps)
        # `bias_correction2 ** 0.5 / t` is `reciprocal(t) * bias_correction2 ** 0.5`.
        adaptive = ops.mul(ops.reciprocal(adaptive), bias_correction2.sqrt())
        full = ops.mul(ops.mul(ops.borrowed(momentum), adaptive), rect)
        update = ops.where(rectified, full, momentum)
        new_params = ops.sub_scaled(params, update, 1)
        return new_params, RAdamState(
            step, exp_avg, exp_avg_sq, self.next_schedule(state)
        )


@register_state
class AdamaxState(NamedTuple):
    """The state of `Adamax`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_inf: The exponentially weighted infinity norm of the gradients.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adamax(betas=(0.5, 0.5), eps=0.0)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, -3.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"], state.exp_inf["w"]
        (tensor([ 1.0000, -1.5000]), tensor([2., 3.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_inf: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False)
class Adamax(TorchOptimizer[AdamaxState]):
    """Adamax, the functional `torch.optim.Adamax`: Adam with the infinity norm.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adamax`, so a
    run gives the same parameters. The second moment is replaced by an
    exponentially weighted infinity norm, `max(beta2 * exp_inf, |g| + eps)`.
    The attributes below are the constructor's keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule (`CyclicLR` and `OneCycleLR` cycle the first beta too).
        betas: Coefficients of the running average and of the infinity norm,
            each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: L2 penalty added to the gradient; a number, a 0-dim tensor
            or a ParamDict of per-key values.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.Adamax(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.9000, 2.1000])
    """

    state_type: ClassVar[type[AdamaxState]] = AdamaxState

    lr: LearningRate = 2e-3
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = 0.0
    maximize: bool = False
    differentiable: bool = False

    def init_state(self, params: ParamDict, /) -> AdamaxState:
        """Return the first state: step 0, zero average and norm.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            An `AdamaxState`.

        Example:
            >>> from paramdict import optim
            >>> optim.Adamax().init(ParamDict(w=torch.ones(2))).exp_inf["w"]
            tensor([0., 0.])
        """
        return AdamaxState(
            self.counter(params), params.zeros_like(), params.zeros_like()
        )

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: AdamaxState, ops: Kernels, /
    ) -> tuple[ParamDict, AdamaxState]:
        beta1, beta2 = self.cycled("betas", state)
        step = self.next_step(state)
        grads = self.prologue(params, grads, step, ops)
        exp_avg = ops.lerp(state.exp_avg, grads, 1 - beta1)
        norm = ops.add(ops.abs(grads), self.eps)
        exp_inf = ops.maximum(ops.mul(state.exp_inf, beta2), norm)
        clr = quotient(self.rate("lr", step, state), 1 - beta1**step)
        new_params = ops.addcdiv(params, exp_avg, exp_inf, -clr)
        return new_params, AdamaxState(
            step, exp_avg, exp_inf, self.next_schedule(state)
        )
