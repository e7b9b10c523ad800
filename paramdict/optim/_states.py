"""The states of the optimizers: NamedTuples of tensors and ParamDicts.

Apart from the optimizers (which load on first use), so that importing
`paramdict.optim` registers them all with pytrees and `torch.load`, for a
`weights_only=True` load; each keeps its optimizer's module name, which its
pickles carry (`register_state_as`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ._registry import register_state_as

if TYPE_CHECKING:
    from torch import Tensor

    from .._paramdict import ParamDict
    from ._lbfgs_checks import Layout
    from ._schedules.states import SlotState

__all__ = [
    "ASGDState",
    "AdEMAMixState",
    "AdadeltaState",
    "AdafactorState",
    "AdagradState",
    "AdamState",
    "AdamaxState",
    "AdanState",
    "AveragedState",
    "LBFGSState",
    "LionState",
    "MultiStepsState",
    "MuonState",
    "NAdamState",
    "RAdamState",
    "RMSpropState",
    "RpropState",
    "SGDState",
    "SOAPState",
    "ScheduleFreeAdamWState",
]


@register_state_as("paramdict.optim.adadelta")
class AdadeltaState(NamedTuple):
    """The state of `Adadelta`: two running averages between `step` and `schedule`.

    Attributes:
        square_avg: The running average of the squared gradients.
        acc_delta: The running average of the squared updates.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adadelta(rho=0.5)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> state = opt.step(params, params.full_like(2.0), opt.init(params))[1]
        >>> state.square_avg["w"]
        tensor([2., 2.])
    """

    step: Tensor
    square_avg: ParamDict
    acc_delta: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.adafactor")
class AdafactorState(NamedTuple):
    """The state of `Adafactor`; `step` and `schedule` as in `AdamState`.

    Attributes:
        row_var: Per matrix (its keys only), the running mean of the squared
            gradient over the last dimension (its shape with that dimension 1).
        col_var: Per matrix, the same over the second-to-last dimension.
        variance: Per other entry (fewer than two dimensions), the running mean
            of the squared gradient.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.ones(2, 3), b=torch.ones(3))
        >>> state = optim.Adafactor().init(params)
        >>> state.row_var["w"].shape, state.col_var["w"].shape, list(state.variance)
        (torch.Size([2, 1]), torch.Size([1, 3]), ['b'])
    """

    step: Tensor
    row_var: ParamDict
    col_var: ParamDict
    variance: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.adagrad")
class AdagradState(NamedTuple):
    """The state of `Adagrad`: `step`, `sum` and `schedule` (see `TorchOptimizer`).

    Attributes:
        sum: The accumulated squared gradients, keyed like the parameters.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adagrad(initial_accumulator_value=0.5)
        >>> grads = ParamDict(w=torch.tensor([2.0, 3.0]))
        >>> state = opt.init(grads)
        >>> state.sum["w"], opt.step(grads, grads, state)[1].sum["w"]
        (tensor([0.5000, 0.5000]), tensor([4.5000, 9.5000]))
    """

    step: Tensor
    sum: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.adam")
class AdamState(NamedTuple):
    """The state of `Adam` and `AdamW`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        max_exp_avg_sq: The running maximum of `exp_avg_sq`; empty unless `amsgrad`.
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


@register_state_as("paramdict.optim.adamax")
class AdamaxState(NamedTuple):
    """The state of `Adamax`: `AdamState`'s `step`, `exp_avg`, `schedule`; `exp_inf`.

    Attributes:
        exp_inf: The exponentially weighted infinity norm of the gradients.

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


@register_state_as("paramdict.optim.adan")
class AdanState(NamedTuple):
    """The state of `Adan`; `step` and `schedule` as in `AdamState`.

    Attributes:
        exp_avg: The running average of the gradients.
        exp_avg_diff: The running average of the gradients' changes.
        exp_avg_sq: The running average of the squared Nesterov gradients.
        prev_grad: The previous step's gradients (zero before the first: no change).

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adan()
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.prev_grad["w"], state.exp_avg_diff["w"]
        (tensor([1., 1.]), tensor([0., 0.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_diff: ParamDict
    exp_avg_sq: ParamDict
    prev_grad: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.ademamix")
class AdEMAMixState(NamedTuple):
    """The state of `AdEMAMix`; `step` and `schedule` as in `AdamState`.

    Attributes:
        exp_avg_fast: The fast running average of the gradients (Adam's `m`).
        exp_avg_slow: The slow running average of the gradients (no bias correction).
        exp_avg_sq: The running average of the squared gradients.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.AdEMAMix(betas=(0.5, 0.5, 0.75))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.exp_avg_fast["w"], state.exp_avg_slow["w"]
        (tensor([0.5000, 0.5000]), tensor([0.2500, 0.2500]))
    """

    step: Tensor
    exp_avg_fast: ParamDict
    exp_avg_slow: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.asgd")
class ASGDState(NamedTuple):
    """The state of `ASGD`; `step` and `schedule` as in `AdamState`.

    Attributes:
        eta: The step size of the next step: a 0-dim tensor (per key with a per-key
            `lr`) in torch.optim's dtype for it (float32 unless the default dtype
            is float64), which keeps its rounding.
        mu: The averaging coefficient of the next step, a 0-dim tensor alike.
        ax: The running average of the parameters, keyed like them.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.ASGD(lr=0.5, lambd=0.0)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.eta, state.mu, state.ax["w"]
        (tensor(0.5000), tensor(1.), tensor([0.5000, 1.5000]))
    """

    step: Tensor
    eta: Tensor | ParamDict
    mu: Tensor
    ax: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.lbfgs")
class LBFGSState(NamedTuple):
    """The state of `LBFGS`, with `torch.optim.LBFGS`'s names.

    Attributes:
        func_evals: The number of closure evaluations so far.
        n_iter: The number of iterations so far.
        d: The last search direction (flat), or None before the first step.
        t: The last step size along `d`.
        old_dirs: The gradient differences `y` kept (at most `history_size`).
        old_stps: The steps `s` kept.
        ro: `1 / (y . s)` for each kept pair.
        H_diag: The scale of the initial inverse-Hessian estimate.
        prev_flat_grad: The last flat gradient.
        prev_loss: The last loss (negated under `maximize`, as torch keeps it).
        layout: The keys and shapes of the parameters the flat vectors stand
            for (checked at every step; `()` in a state saved without it).

    Example:
        >>> from paramdict import optim
        >>> opt = optim.LBFGS(max_iter=3)
        >>> params = ParamDict(w=torch.tensor([1.0, -2.0]))
        >>> loss = lambda p: (p["w"] ** 2).sum()
        >>> params, state = opt.step(params, loss, opt.init(params))
        >>> state.n_iter, len(state.old_dirs)
        (2, 1)
    """

    func_evals: int
    n_iter: int
    d: Tensor | None
    t: float | Tensor | None
    old_dirs: tuple[Tensor, ...]
    old_stps: tuple[Tensor, ...]
    ro: tuple[Tensor, ...]
    H_diag: float | Tensor
    prev_flat_grad: Tensor | None
    prev_loss: float | None
    layout: Layout = ()


@register_state_as("paramdict.optim.lion")
class LionState(NamedTuple):
    """The state of `Lion`; `step` and `schedule` as in `AdamState`.

    Attributes:
        exp_avg: The running average of the gradients, keyed like the parameters.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Lion(betas=(0.5, 0.5))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = {"w": torch.tensor([2.0, -2.0])}
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"]
        tensor([ 1., -1.])
    """

    step: Tensor
    exp_avg: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.muon")
class MuonState(NamedTuple):
    """The state of `Muon`: `step`, a momentum buffer and `schedule`.

    Attributes:
        momentum_buffer: The momentum buffer, keyed like the parameters.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Muon(momentum=0.5)
        >>> params = ParamDict(w=torch.ones(2, 2))
        >>> _, state = opt.step(params, params, opt.init(params))
        >>> state.momentum_buffer["w"]
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000]])
    """

    step: Tensor
    momentum_buffer: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.nadam")
class NAdamState(NamedTuple):
    """The state of `NAdam`: `AdamState`'s fields but `max_exp_avg_sq`; `mu_product`.

    Attributes:
        mu_product: The product of the momentum coefficients so far, a 0-dim
            tensor in torch.optim's dtype for it (as `ASGDState.mu`).

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


@register_state_as("paramdict.optim.radam")
class RAdamState(NamedTuple):
    """The state of `RAdam`: `AdamState`'s fields but `max_exp_avg_sq`.

    Example:
        >>> from paramdict import optim
        >>> optim.RAdamState._fields
        ('step', 'exp_avg', 'exp_avg_sq', 'schedule')
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.rmsprop")
class RMSpropState(NamedTuple):
    """The state of `RMSprop`; `step` and `schedule` are as in `TorchOptimizer`.

    Attributes:
        square_avg: The running average of the squared gradients.
        momentum_buffer: The momentum buffer; empty when `momentum == 0`.
        grad_avg: The running average of the gradients; empty unless `centered`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.RMSprop(alpha=0.5, centered=True)
        >>> grads = ParamDict(w=torch.ones(2))
        >>> state = opt.step(grads, grads * 2, opt.init(grads))[1]
        >>> state.square_avg["w"], state.grad_avg["w"], len(state.momentum_buffer)
        (tensor([2., 2.]), tensor([1., 1.]), 0)
    """

    step: Tensor
    square_avg: ParamDict
    momentum_buffer: ParamDict
    grad_avg: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.rprop")
class RpropState(NamedTuple):
    """The state of `Rprop`: `step`, `prev`, `step_size`, `schedule`.

    Attributes:
        prev: The previous step's gradient (zero where its sign flipped).
        step_size: The per-entry step sizes, starting at `lr`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Rprop(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, -2.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.prev["w"], state.step_size["w"]
        (tensor([ 2., -2.]), tensor([0.1000, 0.1000]))
    """

    step: Tensor
    prev: ParamDict
    step_size: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.schedule_free")
class ScheduleFreeAdamWState(NamedTuple):
    """The state of `ScheduleFreeAdamW`; `step` and `schedule` as in `AdamState`.

    Attributes:
        z: The base sequence `z` (the Adam iterates), keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        weight_sum: The sum of the averaging weights so far, a 0-dim tensor.
        lr_max: The largest learning rate so far (warm-up included), a 0-dim
            tensor; the averaging weights are computed from it.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.ScheduleFreeAdamW(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> state = opt.init(params)
        >>> torch.equal(state.z["w"], params["w"]), state.weight_sum
        (True, tensor(0., dtype=torch.float64))
    """

    step: Tensor
    z: ParamDict
    exp_avg_sq: ParamDict
    weight_sum: Tensor
    lr_max: Tensor
    schedule: SlotState = ()


@register_state_as("paramdict.optim.sgd")
class SGDState(NamedTuple):
    """The state of `SGD`; `step` and `schedule` as in `AdamState`.

    Attributes:
        momentum_buffer: The momentum buffer; empty when `momentum == 0`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.SGD(lr=0.1, momentum=0.9)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([1.0, 1.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.step, state.momentum_buffer["w"]
        (tensor(1., dtype=torch.float64), tensor([1., 1.]))
    """

    step: Tensor
    momentum_buffer: ParamDict
    schedule: SlotState = ()


@register_state_as("paramdict.optim.soap")
class SOAPState(NamedTuple):
    """The state of `SOAP`; `schedule` as in `AdamState`.

    Attributes:
        step: The number of calls, a 0-dim tensor (the first builds the
            preconditioner, so Adam's step count is one less).
        exp_avg: The running average of the gradients, in the parameters' basis.
        exp_avg_sq: The running average of the squared gradients, in the eigenbasis.
        gg: Per dimension `i` (of the shape the preconditioner sees), a ParamDict
            of the Kronecker factors (`d_i x d_i`, the running average of the
            gradient's Gram matrix along `i`) of the entries it preconditions.
        q: The eigenbases of `gg`, laid out alike.

    Example:
        >>> from paramdict import optim
        >>> state = optim.SOAP().init(ParamDict(w=torch.ones(3, 2), b=torch.ones(2)))
        >>> [list(factors) for factors in state.gg], state.gg[1]["w"].shape
        ([['w'], ['w']], torch.Size([2, 2]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    gg: tuple[ParamDict, ...]
    q: tuple[ParamDict, ...]
    schedule: SlotState = ()


@register_state_as("paramdict.optim._accumulate")
class MultiStepsState(NamedTuple):
    """The state of `MultiSteps`.

    Attributes:
        mini_step: Calls since the inner optimizer last stepped, a 0-dim tensor
            in `[0, every_k)`.
        acc_grads: The gradients summed since then, keyed like the parameters;
            at `mini_step` 0, values left over that the next call writes over.
        inner_state: The wrapped optimizer's state.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=2)
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> _, state = opt.step(params, {"w": torch.tensor([3.0])}, opt.init(params))
        >>> state.mini_step, state.acc_grads["w"]
        (tensor(1., dtype=torch.float64), tensor([3.]))
    """

    mini_step: Tensor
    acc_grads: ParamDict
    inner_state: Any


@register_state_as("paramdict.optim.swa_utils")
class AveragedState(NamedTuple):
    """The state of a `WeightAverage`: the average and how many values it holds.

    Attributes:
        n_averaged: The number of `update` calls, a 0-dim `int64` tensor (torch's
            `AveragedModel.n_averaged`).
        averaged: The running average, keyed like the averaged values.

    Example:
        >>> from paramdict import optim
        >>> swa = optim.WeightAverage.swa()
        >>> state = swa.init(ParamDict(w=torch.zeros(2)))
        >>> state = swa.update(state, ParamDict(w=torch.ones(2)))
        >>> state.n_averaged, state.averaged["w"]
        (tensor(1), tensor([1., 1.]))
    """

    n_averaged: Tensor
    averaged: ParamDict
