"""Shared pieces of the optimizer tests: the case table, a small MLP, data, runners.

`TABLE` is the one list of optimizers every optimizer test reads: adding an
optimizer to the library adds one row here (its classes, the option sets its
trajectories are checked with, and one configuration with most options on). The
optimizer benchmarks (`benchmarks/optim.py`, `benchmarks/optim_scale.py`) read it
too, through `benchmarks/_table.py`: each row's `bench` is its benchmark entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from _torch_versions import needs_torch, torch_optimizer
from torch import Tensor, nn

from paramdict import ParamDict, optim

STEPS = 100

# torch.optim's classes that are newer than the oldest torch supported: on an older
# torch, making one skips the test (`torch_optimizer`), and the tests of the class
# itself are marked.
TorchMuon = torch_optimizer("Muon", 2, 9)
_MUON = needs_torch(2, 9, "torch.optim.Muon")


# torch.optim.Adam's `decoupled_weight_decay`, newer than the oldest torch supported.
_DECOUPLED = needs_torch(2, 7, "torch.optim.Adam's `decoupled_weight_decay`")


@dataclass(frozen=True)
class Bench:
    """How the optimizer benchmarks time a row's optimizer.

    The reports' figures depend on these values: changing one changes what a
    benchmark measures, so earlier figures no longer compare.
    """

    options: dict[str, Any] = field(default_factory=dict)
    """Options of both classes in every benchmark (empty: their defaults)."""
    name: str = ""
    """The name in the reports and for `--optimizers` ("": the class's name)."""
    torchopt: str = ""
    """torchopt's function for the same update, timed beside it where torchopt is
    installed ("": torchopt has none)."""


@dataclass(frozen=True)
class Case:
    """One optimizer of the library, as every optimizer test sees it."""

    name: str
    ours: Callable[..., optim.Optimizer[Any]]
    theirs: Callable[..., torch.optim.Optimizer]
    rich: dict[str, Any]
    """One configuration with most options on (modes, state, compile, hostile)."""
    trajectories: dict[str, dict[str, Any]]
    """Option sets checked against torch.optim, by case id."""
    foreach: tuple[str, ...]
    """Trajectory ids also checked against torch's foreach implementation."""
    tensor_lr: dict[str, Any] = field(default_factory=dict)
    """Options beside a 0-dim tensor `lr` for the tensor-lr trajectory."""
    fused: tuple[str, ...] = ()
    """Trajectory ids whose `step_` runs torch's fused kernel (CPU): checked
    bitwise against torch.optim with `fused=True`; any other id is checked
    bitwise against `step`."""
    classes: tuple[type[Any], type[Any]] | None = None
    """`(ours, theirs)` classes when `ours`/`theirs` are factories around them."""
    matrices_only: bool = False
    """The optimizer takes 2-D entries only (the hostile tests use matrices)."""
    in_torch: bool = True
    """`theirs` is torch.optim's own class, whose state dicts `to_torch_state_dict`
    and `load_torch_state_dict` convert (False: a reference written in the tests)."""
    second_order: bool = False
    """torch.optim differentiates through its step (`differentiable=True`): the
    second-order tests compare meta-gradients with it."""
    bfloat16: bool = False
    """The rule computes in bfloat16 (Muon's Newton-Schulz iterations): under vmap
    a batched bfloat16 matmul rounds otherwise than one matrix at a time."""
    marks: dict[str, Any] = field(default_factory=dict)
    """pytest marks by trajectory id, and under `"class"` for the row's classes
    (a torch.optim reference that needs a newer torch than the oldest supported)."""
    bench: Bench = field(default_factory=Bench)
    """The row's benchmark entry (its classes, with these options)."""

    def mark(self, key: str) -> Any:
        """Return the marks of trajectory `key` (or `"class"`), `()` if none."""
        return self.marks.get(key, ())

    def make(self) -> optim.Optimizer[Any]:
        """Return the rich configuration."""
        return self.ours(**self.rich)


def muon_on_weights(**kwargs: Any) -> optim.Optimizer[Any]:
    """Muon on the MLP's weight matrices; the biases stay as they are."""
    lr = kwargs.get("lr")
    if isinstance(lr, ParamDict):
        kwargs = {**kwargs, "lr": lr.select("*weight")}
    return optim.ParamGroups(
        {"*weight": optim.Muon(**kwargs)},
        default=optim.SGD(lr=0.0, differentiable=kwargs.get("differentiable", False)),
    )


def torch_muon_on_weights(params: Any, **kwargs: Any) -> torch.optim.Optimizer:
    """torch.optim.Muon on the 2-D parameters; the others get no optimizer.

    `params` is a list of tensors or of parameter groups (dicts with "params").
    """
    params = list(params)
    if params and isinstance(params[0], dict):
        groups = [g for g in params if all(p.dim() == 2 for p in g["params"])]
        return TorchMuon(groups, **kwargs)
    return TorchMuon([p for p in params if p.dim() == 2], **kwargs)


class TorchLion(torch.optim.Optimizer):
    """Lion in plain torch (torch has none): the reference of the `lion` row.

    The paper's update with decoupled decay:
    `p *= 1 - lr * weight_decay`, `p -= lr * sign(lerp(m, g, 1 - beta1))`,
    `m = lerp(m, g, 1 - beta2)`. Like torch's own optimizers it has two
    implementations: one parameter at a time (the default), and with
    `foreach=True` one `torch._foreach_*` call per operation over all parameters,
    the fastest Lion plain torch offers, which the benchmarks time against ours.
    It has no fused kernel, so it takes no `fused`.
    """

    def __init__(
        self,
        params: Any,
        lr: float | Tensor = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "weight_decay": weight_decay,
            "maximize": maximize,
            "foreach": foreach,
            "differentiable": differentiable,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Take one Lion step on every parameter with a gradient."""
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
            grads: list[Tensor] = [p.grad for p in params]
            avgs: list[Tensor] = [self.state[p]["exp_avg"] for p in params]
            lion = _foreach_lion if group["foreach"] else _single_tensor_lion
            lion(params, grads, avgs, group)


def _single_tensor_lion(
    params: list[Tensor], grads: list[Tensor], avgs: list[Tensor], group: Any
) -> None:
    """`TorchLion`'s step one parameter at a time."""
    lr, wd = group["lr"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    for p, grad, exp_avg in zip(params, grads, avgs, strict=True):
        if group["maximize"]:
            grad = -grad
        p.mul_(1 - lr * wd)
        p.sub_(lr * torch.lerp(exp_avg, grad, 1 - beta1).sign())
        exp_avg.lerp_(grad, 1 - beta2)


def _foreach_lion(
    params: list[Tensor], grads: list[Tensor], avgs: list[Tensor], group: Any
) -> None:
    """`TorchLion`'s step with one foreach call per operation over all parameters.

    The benchmarks' figures for Lion's torch candidate are these calls: the decay
    (when set), the direction's lerp and sign, the update and the moment's lerp.
    """
    lr, wd = group["lr"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    if group["maximize"]:
        grads = list(torch._foreach_neg(grads))
    if wd != 0:
        torch._foreach_mul_(params, 1 - lr * wd)
    direction = torch._foreach_lerp(avgs, grads, 1 - beta1)
    torch._foreach_sign_(direction)
    if isinstance(lr, Tensor):  # `alpha` takes a number only
        torch._foreach_mul_(direction, lr)
        torch._foreach_sub_(params, direction)
    else:
        torch._foreach_add_(params, direction, alpha=-lr)
    torch._foreach_lerp_(avgs, grads, 1 - beta2)


# One row per optimizer. Adding an optimizer: one row here.
TABLE: list[Case] = [
    Case(
        "sgd",
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        {
            "sgd": {"lr": 0.05},
            "sgd-momentum": {"lr": 0.05, "momentum": 0.9},
            "sgd-dampening": {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
            "sgd-nesterov": {"lr": 0.05, "momentum": 0.9, "nesterov": True},
            "sgd-weight-decay": {"lr": 0.05, "weight_decay": 0.1},
            "sgd-maximize": {
                "lr": 0.01,
                "momentum": 0.5,
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("sgd-maximize", "sgd-dampening"),
        {"momentum": 0.9, "weight_decay": 0.1},
        ("sgd", "sgd-momentum", "sgd-nesterov", "sgd-weight-decay", "sgd-maximize"),
        bench=Bench({"lr": 1e-3, "momentum": 0.9}, name="SGD momentum", torchopt="sgd"),
    ),
    Case(
        "adam",
        optim.Adam,
        torch.optim.Adam,
        {"lr": 0.01, "amsgrad": True, "weight_decay": 0.01},
        {
            "adam": {"lr": 0.01},
            "adam-betas-eps": {"lr": 0.01, "betas": (0.5, 0.9), "eps": 1e-3},
            "adam-amsgrad": {"lr": 0.01, "amsgrad": True},
            "adam-weight-decay": {"lr": 0.01, "weight_decay": 0.1},
            "adam-decoupled": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "decoupled_weight_decay": True,
            },
            "adam-maximize": {"lr": 0.01, "maximize": True},
        },
        ("adam-weight-decay",),
        {"weight_decay": 0.1},
        (
            "adam",
            "adam-betas-eps",
            "adam-amsgrad",
            "adam-weight-decay",
            "adam-decoupled",
            "adam-maximize",
        ),
        second_order=True,
        marks={"adam-decoupled": _DECOUPLED, "class": _DECOUPLED},
        bench=Bench({"lr": 1e-3}, torchopt="adam"),
    ),
    Case(
        "adamw",
        optim.AdamW,
        torch.optim.AdamW,
        {"lr": 0.01, "maximize": True, "amsgrad": True},
        {
            "adamw": {"lr": 0.01},
            "adamw-amsgrad-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "amsgrad": True,
                "maximize": True,
            },
        },
        ("adamw-amsgrad-maximize",),
        fused=("adamw", "adamw-amsgrad-maximize"),
        bench=Bench({"lr": 1e-3}, torchopt="adamw"),
    ),
    Case(
        "rmsprop",
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "centered": True, "momentum": 0.9, "weight_decay": 0.01},
        {
            "rmsprop": {"lr": 0.01},
            "rmsprop-centered": {"lr": 0.01, "centered": True},
            "rmsprop-momentum": {"lr": 0.01, "momentum": 0.9},
            "rmsprop-centered-momentum": {
                "lr": 0.01,
                "centered": True,
                "momentum": 0.9,
                "alpha": 0.9,
            },
            "rmsprop-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("rmsprop-centered-momentum",),
        {"centered": True},
        bench=Bench({"lr": 1e-3}, torchopt="rmsprop"),
    ),
    Case(
        "adagrad",
        optim.Adagrad,
        torch.optim.Adagrad,
        {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01, "maximize": True},
        {
            "adagrad": {"lr": 0.1},
            "adagrad-lr-decay": {"lr": 0.1, "lr_decay": 0.05},
            "adagrad-initial-eps": {
                "lr": 0.1,
                "initial_accumulator_value": 0.5,
                "eps": 1e-3,
            },
            "adagrad-weight-decay-maximize": {
                "lr": 0.1,
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("adagrad-weight-decay-maximize",),
        {"lr_decay": 0.05},
        (
            "adagrad",
            "adagrad-lr-decay",
            "adagrad-initial-eps",
            "adagrad-weight-decay-maximize",
        ),
        bench=Bench({"lr": 1e-3}, torchopt="adagrad"),
    ),
    Case(
        "adafactor",
        optim.Adafactor,
        torch.optim.Adafactor,
        {"lr": 0.01, "weight_decay": 0.01, "maximize": True, "d": 2.0},
        {
            "adafactor": {},
            "adafactor-decay-eps-d": {
                "lr": 0.05,
                "beta2_decay": -0.5,
                "eps": (1e-3, 1e-2),
                "d": 1.5,
            },
            "adafactor-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("adafactor-weight-decay-maximize",),
        {"weight_decay": 0.05},
        bench=Bench({"lr": 1e-3}),
    ),
    Case(
        "muon",
        muon_on_weights,
        torch_muon_on_weights,
        {"lr": 0.02, "weight_decay": 0.01, "adjust_lr_fn": "match_rms_adamw"},
        {
            "muon": {"lr": 0.02},
            "muon-plain-momentum": {"lr": 0.02, "nesterov": False, "momentum": 0.9},
            "muon-ns": {
                "lr": 0.02,
                "ns_steps": 3,
                "ns_coefficients": (2.0, -1.5, 0.5),
                "eps": 1e-5,
            },
            "muon-match-rms-adamw": {
                "lr": 0.01,
                "adjust_lr_fn": "match_rms_adamw",
                "weight_decay": 0.0,
            },
            "muon-original": {"lr": 0.02, "adjust_lr_fn": "original", "momentum": 0},
        },
        (),
        {"weight_decay": 0.05},
        classes=(optim.Muon, TorchMuon),
        matrices_only=True,
        bfloat16=True,
        marks={"class": _MUON},
        bench=Bench({"lr": 1e-3}),
    ),
    Case(
        "nadam",
        optim.NAdam,
        torch.optim.NAdam,
        {"lr": 0.01, "weight_decay": 0.01, "momentum_decay": 0.01, "maximize": True},
        {
            "nadam": {"lr": 0.01},
            "nadam-betas-eps-momentum-decay": {
                "lr": 0.01,
                "betas": (0.5, 0.9),
                "eps": 1e-3,
                "momentum_decay": 0.1,
            },
            "nadam-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
            },
            "nadam-decoupled": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "decoupled_weight_decay": True,
            },
        },
        ("nadam-weight-decay-maximize", "nadam-decoupled"),
        {"weight_decay": 0.1},
        second_order=True,
        bench=Bench({"lr": 1e-3}),
    ),
    Case(
        "radam",
        optim.RAdam,
        torch.optim.RAdam,
        {"lr": 0.01, "weight_decay": 0.01, "decoupled_weight_decay": True},
        {
            "radam": {"lr": 0.01},
            "radam-betas-eps": {"lr": 0.01, "betas": (0.5, 0.9), "eps": 1e-3},
            "radam-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
            },
            "radam-decoupled": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "decoupled_weight_decay": True,
            },
        },
        ("radam-weight-decay-maximize", "radam-decoupled"),
        {"weight_decay": 0.1},
        second_order=True,
        bench=Bench({"lr": 1e-3}, torchopt="radam"),
    ),
    Case(
        "adamax",
        optim.Adamax,
        torch.optim.Adamax,
        {"lr": 0.01, "weight_decay": 0.01, "maximize": True},
        {
            "adamax": {"lr": 0.01},
            "adamax-betas-eps": {"lr": 0.01, "betas": (0.5, 0.9), "eps": 1e-3},
            "adamax-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("adamax-weight-decay-maximize",),
        {"weight_decay": 0.1},
        second_order=True,
        bench=Bench({"lr": 1e-3}, torchopt="adamax"),
    ),
    Case(
        "adadelta",
        optim.Adadelta,
        torch.optim.Adadelta,
        {"lr": 0.5, "rho": 0.8, "weight_decay": 0.01, "maximize": True},
        {
            "adadelta": {},
            "adadelta-lr-rho-eps": {"lr": 0.5, "rho": 0.5, "eps": 1e-4},
            "adadelta-weight-decay-maximize": {
                "weight_decay": 0.1,
                "maximize": True,
            },
        },
        ("adadelta-weight-decay-maximize",),
        {"weight_decay": 0.1},
        second_order=True,
        bench=Bench({"lr": 1.0}, torchopt="adadelta"),
    ),
    Case(
        "rprop",
        optim.Rprop,
        torch.optim.Rprop,
        {"lr": 0.01, "etas": (0.4, 1.5), "step_sizes": (1e-4, 0.1), "maximize": True},
        {
            "rprop": {"lr": 0.01},
            "rprop-etas-step-sizes": {
                "lr": 0.01,
                "etas": (0.3, 1.5),
                "step_sizes": (1e-3, 0.05),
            },
            "rprop-maximize": {"lr": 0.01, "maximize": True},
        },
        ("rprop-etas-step-sizes",),
        {"etas": (0.3, 1.5)},
        second_order=True,
        bench=Bench({"lr": 1e-3}),
    ),
    Case(
        "asgd",
        optim.ASGD,
        torch.optim.ASGD,
        {"lr": 0.05, "lambd": 0.01, "t0": 2, "weight_decay": 0.01, "maximize": True},
        {
            "asgd": {"lr": 0.05},
            "asgd-lambd-alpha-t0": {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 20},
            "asgd-weight-decay-maximize": {
                "lr": 0.01,
                "weight_decay": 0.1,
                "maximize": True,
                "t0": 50,
            },
        },
        # torch's foreach ASGD rounds its step size differently from its default
        # (single-tensor) ASGD (8e-8 apart in float64 here): not compared.
        (),
        {"lambd": 0.01, "t0": 10},
        second_order=True,
        bench=Bench({"lr": 1e-3}),
    ),
    Case(
        "lion",
        optim.Lion,
        TorchLion,
        {"lr": 0.01, "betas": (0.8, 0.95), "weight_decay": 0.1, "maximize": True},
        {
            "lion": {"lr": 1e-3},
            "lion-betas": {"lr": 1e-3, "betas": (0.5, 0.9)},
            "lion-weight-decay-maximize": {
                "lr": 1e-3,
                "weight_decay": 0.5,
                "maximize": True,
            },
        },
        ("lion", "lion-weight-decay-maximize"),
        {"weight_decay": 0.1},
        in_torch=False,
        bench=Bench({"lr": 1e-4, "weight_decay": 0.1}),
    ),
]


def wrapped() -> list[tuple[str, optim.Optimizer[Any]]]:
    """Return the combinators around optimizers of the table, by id."""
    return [
        (
            "groups",
            optim.ParamGroups(
                {"*.bias": optim.Adam(lr=0.1)}, default=optim.AdamW(lr=0.01)
            ),
        ),
        ("clip", optim.ClipGradNorm(optim.RMSprop(lr=0.01), max_norm=0.1)),
    ]


def configured(*, combinators: bool = True) -> list[Any]:
    """Return each row's rich configuration (and the combinators) as parameters."""
    rows = [(case.name, case.make()) for case in TABLE]
    if combinators:
        rows += wrapped()
    return [pytest.param(opt, id=name) for name, opt in rows]


def trajectory_params(*, foreach_only: bool = False) -> list[Any]:
    """Return `(ours, theirs, kwargs)` for each trajectory option set, with marks."""
    return [
        pytest.param(case.ours, case.theirs, kwargs, id=name, marks=case.mark(name))
        for case in TABLE
        for name, kwargs in case.trajectories.items()
        if not foreach_only or name in case.foreach
    ]


def unfused(ours: Callable[..., Any]) -> dict[str, Any]:
    """Return `{"fused": False}` for the classes with a fused kernel, else `{}`.

    Passed to compare the rule (torch.optim's foreach arithmetic) with torch's
    default and foreach paths; by default those classes call the fused kernel.
    """
    if not (isinstance(ours, type) and attrs.has(ours)):
        return {}
    return {"fused": False} if "fused" in attrs.fields_dict(ours) else {}


def fused_trajectory_params() -> list[Any]:
    """Return the trajectory cases that a fused kernel can take (`fused=True`).

    Every case of the classes with a `fused` field, except SGD with both momentum
    and dampening (refused with `fused=True`; `fused=None` runs the rule).
    """
    return [
        param
        for param in trajectory_params()
        if unfused(param.values[0])
        and not (param.values[2].get("momentum") and param.values[2].get("dampening"))
    ]


def classes() -> list[Any]:
    """Return `(ours, theirs)` for each row."""
    return [
        pytest.param(*pair, id=pair[0].__name__, marks=case.mark("class"))
        for case in TABLE
        for pair in [case.classes or (case.ours, case.theirs)]
    ]


def tensor_lr_params(*, fused_only: bool = False) -> list[Any]:
    """Return `(ours, theirs, kwargs)` for the tensor-lr trajectory of each row.

    `fused_only`: the rows whose classes have a fused kernel, which takes a 0-dim
    tensor `lr` as torch.optim's `fused=True` does.
    """
    return [
        pytest.param(case.ours, case.theirs, case.tensor_lr, id=case.name)
        for case in TABLE
        if not fused_only or unfused(case.ours)
    ]


# (rtol, atol) per dtype; atol only matters for entries near zero.
TOLERANCE = {torch.float32: (1e-6, 1e-7), torch.float64: (1e-12, 1e-13)}


def assert_matches(
    actual: Mapping[str, Tensor], expected: Mapping[str, Tensor], dtype: torch.dtype
) -> None:
    """Assert that two keyed results agree within the dtype's tolerance."""
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(dict(actual), dict(expected), rtol=rtol, atol=atol)


def make_model(dtype: torch.dtype = torch.float32, device: str = "cpu") -> nn.Module:
    """Return the same small MLP every time (4 -> 8 -> 3, tanh)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(device, dtype)


def batches(
    dtype: torch.dtype = torch.float32, steps: int = STEPS, device: str = "cpu"
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield the same `steps` regression batches every time (drawn on the CPU)."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator, dtype=dtype)
        y = torch.randn(16, 3, generator=generator, dtype=dtype)
        yield x.to(device), y.to(device)


def forward(params: ParamDict, x: Tensor) -> Tensor:
    """Run the MLP of `make_model` with `params`: the module's own operations."""
    hidden = torch.tanh(F.linear(x, params["0.weight"], params["0.bias"]))
    return F.linear(hidden, params["2.weight"], params["2.bias"])


def run_torch(
    make: Callable[[nn.Module], torch.optim.Optimizer],
    dtype: torch.dtype = torch.float32,
    *,
    steps: int = STEPS,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    device: str = "cpu",
) -> dict[str, Tensor]:
    """Train with a torch.optim optimizer the usual way; return the parameters."""
    model = make_model(dtype, device)
    opt = make(model)
    for x, y in batches(dtype, steps, device):
        opt.zero_grad()
        torch.autograd.backward(F.mse_loss(model(x), y))
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def run_ours(
    opt: optim.Optimizer[Any],
    dtype: torch.dtype = torch.float32,
    *,
    steps: int = STEPS,
    in_place: bool = False,
    device: str = "cpu",
) -> ParamDict:
    """Train with a paramdict optimizer on keyed params; return the parameters.

    Each step is `step`, or with `in_place` `step_`.
    """
    params = ParamDict.from_module(make_model(dtype, device))
    state = opt.init(params)
    step = opt.step_ if in_place else opt.step
    for x, y in batches(dtype, steps, device):
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = step(params, grads, state)
    return params
