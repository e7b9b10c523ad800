"""Functional optimizers on ParamDicts that match `torch.optim`.

Each optimizer is an immutable configuration (an attrs class, validated when
built) with the hyperparameter names and defaults of its `torch.optim`
counterpart, and two pure methods:

    state = opt.init(params)
    params, state = opt.step(params, grads, state)

Nothing is changed in place: `step` returns new ParamDicts and a new state. The
state is a typed `NamedTuple` of step counter and keyed buffers: a pytree for
`torch.func` and `torch.compile`, and a value for `torch.save` that
`torch.load(weights_only=True)` accepts.

Two modes, chosen by the `differentiable` flag of the configuration:

- default: the update runs without autograd; the new parameters are fresh leaves
  that require grad where the old ones did, so long training loops keep no graph.
- `differentiable=True`: the update is recorded by autograd, so a meta-loss can be
  differentiated through the steps (MAML with Adam, learned learning rates).

Learning rates and weight decays may be numbers, 0-dim tensors (learnable) or
ParamDicts of per-key values. `ParamGroups` gives different settings to keys
matched by pattern, `ClipGradNorm` clips by global norm in front of any optimizer,
and `Optimizer.step_module` trains an `nn.Module` in place.

Example:
    >>> import torch
    >>> from paramdict import ParamDict, optim
    >>> params = ParamDict(w=torch.tensor([1.0, -1.0], requires_grad=True))
    >>> opt = optim.Adam(lr=0.1)
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     grads = params.grad((params["w"] ** 2).sum())
    ...     params, state = opt.step(params, grads, state)
    >>> params["w"], params["w"].is_leaf, int(state.step)
    (tensor([ 0.7016, -0.7016], requires_grad=True), True, 3)
"""

from __future__ import annotations

from . import fields
from ._accumulate import MultiSteps, MultiStepsState
from ._binding import Bound
from ._clip import ClipGradNorm
from ._groups import ParamGroups
from ._hyper import Rate
from ._optimizer import Optimizer
from ._registry import register_state
from ._schedules.base import LRSchedule, ScheduleState
from ._schedules.chain import ChainedScheduler, SequentialLR
from ._schedules.cyclic import CyclicLR, OneCycleLR
from ._schedules.plateau import PlateauState, ReduceLROnPlateau
from ._schedules.slot import LearningRate, SlotState
from ._schedules.swa import SWALR
from ._schedules.torch_state import (
    load_torch_scheduler_state_dict,
    to_torch_scheduler_state_dict,
)
from ._torch_adapter import TorchAdapter, as_torch_optimizer
from ._torch_export import to_torch_state_dict
from ._torch_optimizer import TorchOptimizer
from ._torch_state import load_torch_state_dict
from .adadelta import Adadelta, AdadeltaState
from .adafactor import Adafactor, AdafactorState
from .adagrad import Adagrad, AdagradState
from .adam import Adam, AdamState, AdamW
from .adamax import Adamax, AdamaxState
from .adan import Adan, AdanState
from .ademamix import AdEMAMix, AdEMAMixState
from .asgd import ASGD, ASGDState
from .lbfgs import LBFGS, LBFGSState
from .lion import Lion, LionState
from .lr_scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    MultiplicativeLR,
    MultiStepLR,
    PolynomialLR,
    StepLR,
)
from .muon import Muon, MuonState
from .nadam import NAdam, NAdamState
from .radam import RAdam, RAdamState
from .rmsprop import RMSprop, RMSpropState
from .rprop import Rprop, RpropState
from .schedule_free import ScheduleFreeAdamW, ScheduleFreeAdamWState
from .sgd import SGD, SGDState
from .soap import SOAP, SOAPState
from .swa_utils import AveragedState, WeightAverage, update_bn

__all__ = [
    "ASGD",
    "LBFGS",
    "SGD",
    "SOAP",
    "SWALR",
    "ASGDState",
    "AdEMAMix",
    "AdEMAMixState",
    "Adadelta",
    "AdadeltaState",
    "Adafactor",
    "AdafactorState",
    "Adagrad",
    "AdagradState",
    "Adam",
    "AdamState",
    "AdamW",
    "Adamax",
    "AdamaxState",
    "Adan",
    "AdanState",
    "AveragedState",
    "Bound",
    "ChainedScheduler",
    "ClipGradNorm",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LBFGSState",
    "LRSchedule",
    "LambdaLR",
    "LearningRate",
    "LinearLR",
    "Lion",
    "LionState",
    "MultiStepLR",
    "MultiSteps",
    "MultiStepsState",
    "MultiplicativeLR",
    "Muon",
    "MuonState",
    "NAdam",
    "NAdamState",
    "OneCycleLR",
    "Optimizer",
    "ParamGroups",
    "PlateauState",
    "PolynomialLR",
    "RAdam",
    "RAdamState",
    "RMSprop",
    "RMSpropState",
    "Rate",
    "ReduceLROnPlateau",
    "Rprop",
    "RpropState",
    "SGDState",
    "SOAPState",
    "ScheduleFreeAdamW",
    "ScheduleFreeAdamWState",
    "ScheduleState",
    "SequentialLR",
    "SlotState",
    "StepLR",
    "TorchAdapter",
    "TorchOptimizer",
    "WeightAverage",
    "as_torch_optimizer",
    "fields",
    "load_torch_scheduler_state_dict",
    "load_torch_state_dict",
    "register_state",
    "to_torch_scheduler_state_dict",
    "to_torch_state_dict",
    "update_bn",
]
