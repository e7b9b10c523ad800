"""Hostile torch.optim state dicts: what does not fit is refused by name, unchanged.

Each case builds a torch.optim state dict (or a scheduler's), the parameters and
the names fresh, tampers with one thing (another optimizer's or configuration's
dict, parameters missing or extra, another group split, a buffer of another shape
or dtype), and checks that the conversion raises a message naming it and leaves
every operand bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _torch_versions import torch_at_least
from _unchanged import Case, check, unique_ids
from torch import nn

from paramdict import ParamDict, optim

NAMES = [["weight", "bias"]]


def _trained(make: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> Any:
    """Return the state dict of `make`'s optimizer after one step on a Linear."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = make(list(model.parameters()))
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    return opt.state_dict()


# torch 2.7's AdamW saves `decoupled_weight_decay` (True) in its groups; 2.6's
# has no such setting, so only the weight decay differs from Adam's.
_DECOUPLED_SAVED = (
    r"'decoupled_weight_decay' True \(saved\) and False \(ours\), "
    if torch_at_least(2, 7)
    else ""
)


def _adam() -> Any:
    return _trained(lambda p: torch.optim.Adam(p, lr=0.1))


def _sgd(p: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(p, lr=0.1)


def _params() -> ParamDict:
    torch.manual_seed(0)
    return ParamDict.from_module(nn.Linear(3, 2)).detach()


def _load(
    opt: optim.Optimizer[Any],
    edit: Callable[[Any], Any] = lambda sd: sd,
    *,
    names: Any = None,
    params: Callable[[], ParamDict] = _params,
    saved: Callable[[], Any] = _adam,
    **kwargs: Any,
) -> tuple[Callable[[], tuple[Any, ...]], Callable[..., Any]]:
    """Return a builder of `(state_dict, params, names)` and the loading call."""

    def build() -> tuple[Any, ...]:
        return edit(saved()), params(), NAMES if names is None else names

    def call(sd: Any, p: ParamDict, n: Any) -> Any:
        return optim.load_torch_state_dict(opt, sd, p, n, **kwargs)

    return build, call


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Any], Any]:
    """Return an edit that puts `value` at `path` of a state dict."""

    def edit(sd: Any) -> Any:
        target = sd
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return sd

    return edit


def _case(
    name: str, parts: tuple[Any, Any], error: type[Exception], match: str
) -> Case:
    build, call = parts
    return Case(name, build, call, error, match)


SPLIT = optim.ParamGroups({"bias": optim.Adam(lr=0.1)}, default=optim.Adam(lr=0.1))


def _two_groups() -> Any:
    return _trained(
        lambda p: torch.optim.Adam([{"params": [p[1]]}, {"params": [p[0]]}], lr=0.1)
    )


LOAD_CASES = unique_ids(
    [
        _case(
            "another-class",
            _load(
                optim.Adam(lr=0.1),
                saved=lambda: _trained(
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)
                ),
            ),
            ValueError,
            r"settings \['dampening', 'momentum', 'nesterov'\] that Adam does not "
            r"take.*Use that optimizer",
        ),
        _case(
            "adamw-into-adam",
            _load(
                optim.Adam(lr=0.1),
                saved=lambda: _trained(lambda p: torch.optim.AdamW(p, lr=0.1)),
            ),
            ValueError,
            _DECOUPLED_SAVED
            + r"'weight_decay' 0.01 \(saved\) and 0.0 \(ours\)\. Build the optimizer",
        ),
        _case(
            "another-lr",
            _load(optim.Adam(lr=0.2)),
            ValueError,
            r"Group 0's settings differ.*'lr' 0.1 \(saved\) and 0.2 \(ours\)",
        ),
        _case(
            "amsgrad-buffers",
            _load(
                optim.Adam(lr=0.1),
                _set(("param_groups", 0, "amsgrad"), False),
                saved=lambda: _trained(
                    lambda p: torch.optim.Adam(p, lr=0.1, amsgrad=True)
                ),
            ),
            ValueError,
            r"holds buffers \['max_exp_avg_sq'\] that Adam does not keep",
        ),
        _case(
            "missing-parameter",
            _load(
                optim.Adam(lr=0.1),
                params=lambda: _params() | ParamDict(extra=torch.zeros(1)),
            ),
            ValueError,
            r"missing \['extra'\], unexpected \[\]",
        ),
        _case(
            "extra-parameter",
            _load(optim.Adam(lr=0.1), params=lambda: _params().select("weight")),
            ValueError,
            r"missing \[\], unexpected \['bias'\]",
        ),
        _case(
            "group-count",
            _load(optim.Adam(lr=0.1), names=[["weight"], ["bias"]]),
            ValueError,
            r"1 parameter group\(s\) and `names` 2",
        ),
        _case(
            "group-size",
            _load(optim.Adam(lr=0.1), names=[["weight"]]),
            ValueError,
            r"Group 0 of the state dict holds 2 parameters and `names` gives 1",
        ),
        _case(
            "two-groups-into-one-optimizer",
            _load(optim.Adam(lr=0.1), names=[["bias"], ["weight"]], saved=_two_groups),
            ValueError,
            r"2 parameter groups and Adam one.*ParamGroups",
        ),
        _case(
            "groups-in-another-order",
            _load(SPLIT, names=[["weight"], ["bias"]], saved=_two_groups),
            ValueError,
            r"Group 0 of the state dict holds \['weight'\] and group 0 of the "
            r"ParamGroups \['bias'\]",
        ),
        _case(
            "buffer-shape",
            _load(optim.Adam(lr=0.1), _set(("state", 0, "exp_avg"), torch.zeros(5))),
            ValueError,
            r"`exp_avg` of 'weight' has shape \(5,\) and paramdict's \(2, 3\)",
        ),
        _case(
            "buffer-dtype",
            _load(
                optim.Adam(lr=0.1),
                _set(("state", 1, "exp_avg_sq"), torch.zeros(2, dtype=torch.int64)),
            ),
            ValueError,
            r"`exp_avg_sq` of 'bias' has dtype torch.int64",
        ),
        _case(
            "foreign-buffer",
            _load(
                optim.Adam(lr=0.1),
                _set(("state", 0, "momentum_buffer"), torch.zeros(2, 3)),
            ),
            ValueError,
            r"'weight' holds buffers \['momentum_buffer'\]",
        ),
        _case(
            "stray-index",
            _load(optim.Adam(lr=0.1), _set(("state", 7), {})),
            ValueError,
            r"indices \['7'\] that no group lists",
        ),
        _case(
            "no-param-groups",
            _load(optim.Adam(lr=0.1), lambda sd: {"state": sd["state"]}),
            KeyError,
            r"no 'param_groups' entry",
        ),
        _case(
            "names-a-string",
            _load(optim.Adam(lr=0.1), names="weight"),
            TypeError,
            r"`names` must be a module or a sequence of groups",
        ),
        _case(
            "no-counterpart",
            _load(optim.ClipGradNorm(optim.Adam(lr=0.1), max_norm=1.0)),
            TypeError,
            r"ClipGradNorm has no torch.optim counterpart",
        ),
        _case(
            "schedule-without-scheduler",
            _load(optim.Adam(lr=optim.StepLR(base_lr=0.1, step_size=2))),
            ValueError,
            r"`lr` is a schedule; give torch's scheduler state dict as `scheduler=`",
        ),
        _case(
            "no-state",
            _load(optim.Adam(lr=0.1), lambda sd: {"param_groups": sd["param_groups"]}),
            KeyError,
            r"no 'state' entry",
        ),
        *[
            _case(
                f"step-{label}",
                _load(optim.Adam(lr=0.1), _set(("state", 0, "step"), value)),
                ValueError,
                rf"`step` of 'weight' is {shown}; a step count is a whole number",
            )
            for label, value, shown in [
                ("nan", torch.tensor(math.nan), "nan"),
                ("negative", torch.tensor(-1.0), r"-1\.0"),
                ("fraction", torch.tensor(1.5), r"1\.5"),
                ("inf", torch.tensor(math.inf), "inf"),
            ]
        ],
        _case(
            "step-a-string",
            _load(optim.Adam(lr=0.1), _set(("state", 0, "step"), "three")),
            TypeError,
            r"`step` of 'weight' must be a tensor or a number, got str",
        ),
        _case(
            "step-a-vector",
            _load(optim.Adam(lr=0.1), _set(("state", 1, "step"), torch.ones(2))),
            TypeError,
            r"`step` of 'bias' must be one real number",
        ),
        _case(
            "meta-buffer",
            _load(
                optim.Adam(lr=0.1),
                _set(("state", 0, "exp_avg"), torch.empty(2, 3, device="meta")),
            ),
            ValueError,
            r"`exp_avg` of 'weight' is on the meta device",
        ),
        _case(
            "sparse-buffer",
            _load(
                optim.Adam(lr=0.1),
                _set(("state", 0, "exp_avg"), torch.zeros(2, 3).to_sparse()),
            ),
            TypeError,
            r"`exp_avg` of 'weight' is a torch.sparse_coo tensor",
        ),
        _case(
            "buffer-a-string",
            _load(optim.Adam(lr=0.1), _set(("state", 1, "exp_avg_sq"), "zeros")),
            TypeError,
            r"`exp_avg_sq` of 'bias' must be a tensor or a number, got str",
        ),
        _case(
            "state-a-list",
            _load(optim.Adam(lr=0.1), lambda sd: sd | {"state": [sd["state"][0]]}),
            TypeError,
            r"`state` must be a dict from parameter index",
        ),
        _case(
            "parameter-state-a-list",
            _load(optim.Adam(lr=0.1), _set(("state", 1), [torch.ones(2)])),
            TypeError,
            r"`state\[1\]` must be a dict of that parameter's buffers",
        ),
        _case(
            "param-groups-a-string",
            _load(optim.Adam(lr=0.1), _set(("param_groups",), "groups")),
            TypeError,
            r"`param_groups` must be a list of groups",
        ),
        _case(
            "group-a-string",
            _load(optim.Adam(lr=0.1), _set(("param_groups", 0), "lr=0.1")),
            TypeError,
            r"`param_groups\[0\]` must be a dict of settings",
        ),
        _case(
            "group-params-a-string",
            _load(optim.Adam(lr=0.1), _set(("param_groups", 0, "params"), "01")),
            TypeError,
            r"`param_groups\[0\]\['params'\]` must be a list",
        ),
        _case(
            "group-params-floats",
            _load(optim.Adam(lr=0.1), _set(("param_groups", 0, "params"), [0.0, 1.0])),
            TypeError,
            r"must hold parameter indices \(ints\) or names \(strs\), got 0\.0",
        ),
        _case(
            "steps-differ",
            _load(optim.Adam(lr=0.1), _set(("state", 1, "step"), torch.tensor(5.0))),
            ValueError,
            r"torch keeps `step` for each parameter and paramdict one per group.*"
            r"\['weight'\] have `step` 1; \['bias'\] have `step` 5",
        ),
        _case(
            "state-deleted",
            _load(optim.Adam(lr=0.1), lambda sd: sd | {"state": {0: sd["state"][0]}}),
            ValueError,
            r"\['bias'\] have no state \(torch would start them at step 0\)",
        ),
        _case(
            "mu-products-differ",
            _load(
                optim.NAdam(lr=0.1),
                _set(("state", 1, "mu_product"), torch.tensor(0.5)),
                saved=lambda: _trained(lambda p: torch.optim.NAdam(p, lr=0.1)),
            ),
            ValueError,
            r"`mu_product`.*\['bias'\] have `mu_product` 0\.5",
        ),
        _case(
            "damped-buffers-missing",
            _load(
                optim.SGD(lr=0.1, momentum=0.9, dampening=0.5),
                lambda sd: sd | {"state": {0: sd["state"][0]}},
                saved=lambda: _trained(
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.5)
                ),
            ),
            ValueError,
            r"momentum buffers for \['weight'\] and none for \['bias'\]",
        ),
        _case(
            "step-argument-negative",
            _load(optim.SGD(lr=0.1), saved=lambda: _trained(_sgd), step=-1),
            ValueError,
            r"`step` must be at least 0",
        ),
        _case(
            "step-argument-a-float",
            _load(optim.SGD(lr=0.1), saved=lambda: _trained(_sgd), step=2.0),
            TypeError,
            r"`step` must be None or the number of steps taken \(an int\), got float",
        ),
        _case(
            "not-a-mapping",
            _load(optim.Adam(lr=0.1), lambda sd: list(sd.items())),
            TypeError,
            r"The state dict must be a mapping, got list",
        ),
        _case(
            "scheduler-for-a-rate",
            _load(optim.Adam(lr=0.1), scheduler={"last_epoch": 1}),
            ValueError,
            r"`scheduler` is given but a group's `lr` is a rate",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in LOAD_CASES])
def test_torch_state_dict_that_does_not_fit_is_refused(case: Case) -> None:
    """A torch state dict that does not fit is refused by name; nothing changes."""
    check(case)


def _step_lr_state() -> Any:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    opt.step()
    scheduler.step()
    return scheduler.state_dict()


SCHEDULER_CASES = unique_ids(
    [
        Case(
            "another-schedule",
            lambda: (_step_lr_state(),),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.CosineAnnealingLR(base_lr=0.1, T_max=3), sd
            ),
            ValueError,
            r"no \['T_max', 'eta_min'\]; it is not a CosineAnnealingLR's",
        ),
        Case(
            "another-setting",
            lambda: (_step_lr_state(),),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=4), sd
            ),
            ValueError,
            r"'step_size' 3 \(saved\) and 4 \(ours\)",
        ),
        Case(
            "no-such-group",
            lambda: (_step_lr_state(),),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd, group=1
            ),
            ValueError,
            r"'_last_lr' has no entry for group 1",
        ),
        Case(
            "last-epoch-a-string",
            lambda: (_step_lr_state() | {"last_epoch": "three"},),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd
            ),
            TypeError,
            r"The scheduler state dict's `last_epoch` must be a number, got str",
        ),
        Case(
            "last-epoch-nan",
            lambda: (_step_lr_state() | {"last_epoch": math.nan},),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd
            ),
            ValueError,
            r"gives the StepLR invalid values for `last_epoch`",
        ),
        Case(
            "last-lr-negative",
            lambda: (_step_lr_state() | {"_last_lr": [-0.1]},),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd
            ),
            ValueError,
            r"invalid values for `lr`",
        ),
        Case(
            "base-lr-on-meta",
            lambda: (_step_lr_state() | {"base_lrs": [torch.ones((), device="meta")]},),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd
            ),
            TypeError,
            r"`base_lrs` must be a number, got a torch.float32 tensor of shape \(\) on "
            r"the meta device",
        ),
        Case(
            "scheduler-dict-a-list",
            lambda: ([1, 2],),
            lambda sd: optim.load_torch_scheduler_state_dict(
                optim.StepLR(base_lr=0.1, step_size=3), sd
            ),
            TypeError,
            r"The scheduler state dict must be a mapping, got list",
        ),
        Case(
            "not-a-schedule",
            lambda: (_step_lr_state(),),
            lambda sd: optim.load_torch_scheduler_state_dict(0.1, sd),  # type: ignore[arg-type]  # hostile on purpose
            TypeError,
            r"must be a paramdict schedule",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in SCHEDULER_CASES])
def test_torch_scheduler_state_dict_that_does_not_fit_is_refused(case: Case) -> None:
    """A scheduler state dict of another schedule or setting is refused by name."""
    check(case)


EXPORT_CASES = unique_ids(
    [
        Case(
            "unnamed-parameter",
            lambda: (optim.Adam(lr=0.1).init(_params()),),
            lambda state: optim.to_torch_state_dict(
                optim.Adam(lr=0.1), state, [["weight"]]
            ),
            ValueError,
            r"parameters \['bias'\] that `names` does not give",
        ),
        Case(
            "names-the-state-lacks",
            lambda: (optim.Adam(lr=0.1).init(_params().select("weight")),),
            lambda state: optim.to_torch_state_dict(optim.Adam(lr=0.1), state, NAMES),
            ValueError,
            r"`names` gives parameters \['bias'\] that the state does not hold",
        ),
        Case(
            "group-count",
            lambda: (SPLIT.init(_params()),),
            lambda state: optim.to_torch_state_dict(SPLIT, state, NAMES),
            ValueError,
            r"`names` gives 1 groups and the ParamGroups has 2",
        ),
        Case(
            "per-key-rate",
            lambda: (_params(),),
            lambda p: optim.to_torch_state_dict(
                optim.Adam(lr=p.map(lambda t: t.new_full((), 0.1))),
                optim.Adam(lr=0.1).init(p),
                NAMES,
            ),
            TypeError,
            r"The setting 'lr' of Adam is ParamDict",
        ),
        Case(
            "nan-step",
            lambda: (_stepped(optim.Adam(lr=0.1))._replace(step=_f64(math.nan)),),
            lambda state: optim.to_torch_state_dict(optim.Adam(lr=0.1), state, NAMES),
            ValueError,
            r"The state's `step` must be a whole number >= 0, got nan",
        ),
        Case(
            "string-buffer",
            lambda: (_stepped(optim.Adam(lr=0.1))._replace(exp_avg="exp_avg"),),
            lambda state: optim.to_torch_state_dict(optim.Adam(lr=0.1), state, NAMES),
            TypeError,
            r"The state's `exp_avg` must be a ParamDict keyed like the parameters",
        ),
        Case(
            "none-scalar",
            lambda: (_stepped(optim.NAdam(lr=0.1))._replace(mu_product=None),),
            lambda state: optim.to_torch_state_dict(optim.NAdam(lr=0.1), state, NAMES),
            TypeError,
            r"The state's `mu_product` must be a 0-dim floating-point tensor",
        ),
        Case(
            "0-dim-moment-beside-a-full-one",
            lambda: (_zero_dim(_stepped(optim.Adam(lr=0.1)), "exp_avg_sq"),),
            lambda state: optim.to_torch_state_dict(optim.Adam(lr=0.1), state, NAMES),
            ValueError,
            r"The state's `exp_avg_sq` must match the parameters",
        ),
        Case(
            "0-dim-buffer-against-the-module",
            lambda: (_zero_dim(_stepped(optim.SGD(momentum=0.9)), "momentum_buffer"),),
            lambda state: optim.to_torch_state_dict(
                optim.SGD(momentum=0.9), state, _module()
            ),
            ValueError,
            r"The state's `momentum_buffer` must match the parameters",
        ),
        Case(
            "adafactor-vector-row",
            lambda: (_flat_rows(_stepped(optim.Adafactor(lr=0.1))),),
            lambda state: optim.to_torch_state_dict(
                optim.Adafactor(lr=0.1), state, NAMES
            ),
            ValueError,
            r"`row_var`.*'weight'",
        ),
        Case(
            "groups-at-different-positions",
            lambda: (
                optim.ParamGroups(
                    {"bias": optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2))},
                    default=optim.SGD(lr=0.1),
                ),
            ),
            lambda opt: optim.to_torch_scheduler_state_dict(opt, opt.init(_params())),
            ValueError,
            r"SGD's `lr` is a rate, not a schedule",
        ),
    ]
)


def _module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


def _stepped(opt: optim.Optimizer[Any]) -> Any:
    """`opt`'s state after one step on `_params()`."""
    params = _params()
    return opt.step(params, params.ones_like(), opt.init(params))[1]


def _f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def _zero_dim(state: Any, field: str) -> Any:
    """`state` with each entry of `field` summed to a 0-dim tensor."""
    buffer: ParamDict = getattr(state, field)
    return state._replace(**{field: buffer.map(lambda v: v.sum())})


def _flat_rows(state: Any) -> Any:
    """An Adafactor state whose `row_var` entries lost their trailing dimension."""
    return state._replace(row_var=state.row_var.map(lambda v: v.squeeze(-1)))


@pytest.mark.parametrize("case", [c.param() for c in EXPORT_CASES])
def test_export_that_does_not_fit_is_refused(case: Case) -> None:
    """An export whose names, settings or state do not fit is refused by name."""
    check(case)
