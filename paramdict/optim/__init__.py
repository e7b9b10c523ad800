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

import importlib
from typing import TYPE_CHECKING, Any

# Loaded with the package: the states, registered with `torch.load` and pytrees,
# so a saved state loads with `weights_only=True` before any optimizer is used.
from ._registry import register_state
from ._schedules.states import PlateauState, ScheduleState, SlotState
from ._states import (
    AdadeltaState,
    AdafactorState,
    AdagradState,
    AdamaxState,
    AdamState,
    AdanState,
    AdEMAMixState,
    ASGDState,
    AveragedState,
    LBFGSState,
    LionState,
    MultiStepsState,
    MuonState,
    NAdamState,
    RAdamState,
    RMSpropState,
    RpropState,
    ScheduleFreeAdamWState,
    SGDState,
    SOAPState,
)

if TYPE_CHECKING:
    from . import fields
    from . import lr_scheduler as lr_scheduler
    from . import swa_utils as swa_utils
    from ._accumulate import MultiSteps
    from ._binding import Bound
    from ._clip import ClipGradNorm
    from ._groups import ParamGroups
    from ._hyper import Rate
    from ._optimizer import Optimizer
    from ._schedules.base import LRSchedule
    from ._schedules.chain import ChainedScheduler, SequentialLR
    from ._schedules.cyclic import CyclicLR, OneCycleLR
    from ._schedules.plateau import ReduceLROnPlateau
    from ._schedules.slot import LearningRate
    from ._schedules.swa import SWALR
    from ._schedules.torch_state import (
        load_torch_scheduler_state_dict,
        to_torch_scheduler_state_dict,
    )
    from ._torch_adapter import TorchAdapter, as_torch_optimizer
    from ._torch_export import to_torch_state_dict
    from ._torch_optimizer import TorchOptimizer
    from ._torch_state import load_torch_state_dict
    from .adadelta import Adadelta
    from .adafactor import Adafactor
    from .adagrad import Adagrad
    from .adam import Adam, AdamW
    from .adamax import Adamax
    from .adan import Adan
    from .ademamix import AdEMAMix
    from .asgd import ASGD
    from .lbfgs import LBFGS
    from .lion import Lion
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
    from .muon import Muon
    from .nadam import NAdam
    from .radam import RAdam
    from .rmsprop import RMSprop
    from .rprop import Rprop
    from .schedule_free import ScheduleFreeAdamW
    from .sgd import SGD
    from .soap import SOAP
    from .swa_utils import WeightAverage, update_bn

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


_LAZY_MODULES = {
    ".fields": ("fields",),
    "._accumulate": ("MultiSteps",),
    "._binding": ("Bound",),
    "._clip": ("ClipGradNorm",),
    "._groups": ("ParamGroups",),
    "._hyper": ("Rate",),
    "._optimizer": ("Optimizer",),
    "._schedules.base": ("LRSchedule",),
    "._schedules.chain": ("ChainedScheduler", "SequentialLR"),
    "._schedules.cyclic": ("CyclicLR", "OneCycleLR"),
    "._schedules.plateau": ("ReduceLROnPlateau",),
    "._schedules.slot": ("LearningRate",),
    "._schedules.swa": ("SWALR",),
    "._schedules.torch_state": (
        "load_torch_scheduler_state_dict",
        "to_torch_scheduler_state_dict",
    ),
    "._torch_adapter": ("TorchAdapter", "as_torch_optimizer"),
    "._torch_export": ("to_torch_state_dict",),
    "._torch_optimizer": ("TorchOptimizer",),
    "._torch_state": ("load_torch_state_dict",),
    ".adadelta": ("Adadelta",),
    ".adafactor": ("Adafactor",),
    ".adagrad": ("Adagrad",),
    ".adam": ("Adam", "AdamW"),
    ".adamax": ("Adamax",),
    ".adan": ("Adan",),
    ".ademamix": ("AdEMAMix",),
    ".asgd": ("ASGD",),
    ".lbfgs": ("LBFGS",),
    ".lion": ("Lion",),
    ".lr_scheduler": (
        "ConstantLR",
        "CosineAnnealingLR",
        "CosineAnnealingWarmRestarts",
        "ExponentialLR",
        "LambdaLR",
        "LinearLR",
        "MultiplicativeLR",
        "MultiStepLR",
        "PolynomialLR",
        "StepLR",
    ),
    ".muon": ("Muon",),
    ".nadam": ("NAdam",),
    ".radam": ("RAdam",),
    ".rmsprop": ("RMSprop",),
    ".rprop": ("Rprop",),
    ".schedule_free": ("ScheduleFreeAdamW",),
    ".sgd": ("SGD",),
    ".soap": ("SOAP",),
    ".swa_utils": ("WeightAverage", "update_bn"),
}
"""The names loaded on first use, by module. Loading them all takes about 65 ms
after `import torch` (attrs, and building the optimizers' attrs classes); the
package without them imports in about 12 ms (`python -m benchmarks --only import`)."""

_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}
_SUBMODULES = frozenset(
    m[1:] for m in _LAZY_MODULES if not m.startswith("._") and "." not in m[1:]
)
"""The public submodules (`optim.lr_scheduler.StepLR`, as `torch.optim`'s)."""


if not TYPE_CHECKING:  # checkers read the imports above: a misspelt name stays an error

    def __getattr__(name: str) -> Any:
        if name in _SUBMODULES:  # importing it binds the name
            return importlib.import_module(f".{name}", __name__)
        if name not in _LAZY:
            msg = f"module {__name__!r} has no attribute {name!r}"
            raise AttributeError(msg)
        module = importlib.import_module(_LAZY[name], __name__)
        # Bound here, so the next use is a plain lookup (importing a submodule,
        # `fields`, binds its name itself).
        if name not in globals():
            globals()[name] = getattr(module, name)
        return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
