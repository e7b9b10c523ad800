"""The holes the optimizer fuzzers found, one test each: refused by name, unchanged.

Found by `test_fuzz_optim.py` and `test_fuzz_schedules.py`; each case here is
the smallest input that showed it.
"""

from __future__ import annotations

import copy
import math
from typing import Any, cast

import pytest
import torch
from _unchanged import Case, check, unique_ids
from torch import Tensor
from torch.optim import lr_scheduler

from paramdict import ParamDict, optim

F64 = torch.float64


def _params() -> ParamDict:
    return ParamDict(w=torch.tensor([1.0, -2.0, 3.0]), b=torch.tensor([0.5, 0.25]))


def _grads() -> ParamDict:
    return ParamDict(w=torch.tensor([0.1, 0.2, -0.3]), b=torch.tensor([1.0, -1.0]))


def _meta() -> Tensor:
    return torch.zeros((), dtype=F64, device="meta")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: optim.SGD(dampening=10**400), "`dampening` is too large for a float"),
        (lambda: optim.Adam(lr=10**400), "`lr` is too large for a float"),
        (
            lambda: optim.Muon(ns_coefficients=(10**400, 1.0, 1.0)),
            "`ns_coefficients` is too large for a float",
        ),
    ],
    ids=["SGD dampening", "Adam lr", "Muon ns_coefficients"],
)
def test_an_int_too_large_for_a_float_is_refused_by_name(
    build: Any, match: str
) -> None:
    """An option of 400 digits: a `ValueError` naming it, not a bare OverflowError."""
    with pytest.raises(ValueError, match=match):
        build()


def _sparse_params() -> tuple[Any, ...]:
    opt = optim.SGD(lr=0.1)
    params = ParamDict(w=torch.tensor([1.0, 0.0, 2.0]).to_sparse())
    state = opt.init(_params().select("w"))
    return opt, params, ParamDict(w=torch.ones(3)), state


def _empty_params() -> tuple[Any, ...]:
    opt = optim.SGD(lr=0.1, momentum=0.9)
    return opt, ParamDict(), _grads(), opt.init(ParamDict())


def _meta_scalar(make: Any, field: str) -> Any:
    def build() -> tuple[Any, ...]:
        opt = make()
        state = opt.init(_params())._replace(**{field: _meta()})
        return opt, _params(), _grads(), state

    return build


def _step(opt: Any, p: Any, g: Any, s: Any) -> None:
    opt.step(p, g, s)


def _step_(opt: Any, p: Any, g: Any, s: Any) -> None:
    opt.step_(p, g, s)


STEP_CASES = unique_ids(
    [
        Case(
            f"{what} {name}",
            build,
            call,
            error,
            match,
        )
        for name, call in (("step", _step), ("step_", _step_))
        for what, build, error, match in (
            (
                "sparse params",
                _sparse_params,
                TypeError,
                r"\['w'\] are not .*`\.to_dense\(\)`",
            ),
            (
                "no params, gradients for 'w' and 'b'",
                _empty_params,
                ValueError,
                r"Keys differ in `step` \(params and grads\): unexpected \['b', 'w'\]",
            ),
            (
                "ASGD eta on meta",
                _meta_scalar(optim.ASGD, "eta"),
                ValueError,
                "The state's `eta` is on meta, the parameters on cpu",
            ),
            (
                "ASGD mu on meta",
                _meta_scalar(optim.ASGD, "mu"),
                ValueError,
                "The state's `mu` is on meta, the parameters on cpu",
            ),
            (
                "NAdam mu_product on meta",
                _meta_scalar(optim.NAdam, "mu_product"),
                ValueError,
                "The state's `mu_product` is on meta, the parameters on cpu",
            ),
        )
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in STEP_CASES])
def test_steps_refuse_what_the_fuzzer_found(case: Case) -> None:
    """Each refused by name before anything is written."""
    check(case)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (
            lambda: optim.StepLR(step_size=1, base_lr=cast(Any, "0.1")),
            TypeError,
            "`base_lr` must be a number",
        ),
        (
            lambda: optim.StepLR(step_size=1, base_lr=torch.ones(2)),
            ValueError,
            "`base_lr`, a schedule's base learning rate, must be",
        ),
        (
            lambda: optim.StepLR(step_size=1, base_lr=cast(Any, _params())),
            TypeError,
            "`base_lr`, a schedule's base learning rate",
        ),
        (
            lambda: optim.StepLR(step_size=1, base_lr=10**400),
            ValueError,
            "`base_lr` is too large for a float",
        ),
        (
            lambda: optim.ChainedScheduler(schedulers=cast(Any, None)),
            TypeError,
            "`schedulers` must be a list or a tuple, got NoneType",
        ),
        (
            lambda: optim.SequentialLR(
                schedulers=[optim.LinearLR()], milestones=cast(Any, 3)
            ),
            TypeError,
            "`milestones` must be a list or a tuple, got int",
        ),
        (
            lambda: optim.ChainedScheduler(schedulers=[0.5]),
            TypeError,
            r"`schedulers\[0\]` is a float",
        ),
    ],
    ids=[
        "base_lr str",
        "base_lr vector",
        "base_lr ParamDict",
        "base_lr 10**400",
        "schedulers None",
        "milestones int",
        "schedulers[0] float",
    ],
)
def test_schedule_options_are_refused_by_name(
    build: Any, error: type[Exception], match: str
) -> None:
    """The error names the option as the constructor spells it."""
    with pytest.raises(error, match=match):
        build()


def _schedule_meta(field: str) -> tuple[Any, ...]:
    schedule = optim.ReduceLROnPlateau(patience=0)
    state = schedule.step(schedule.init(0.1), 2.0)
    return schedule, state._replace(**{field: _meta()})


@pytest.mark.parametrize("field", ["best", "lr", "num_bad_epochs", "last_epoch"])
def test_a_plateau_state_on_meta_is_refused(field: str) -> None:
    """A field on the meta device holds no value (a raw `.item()` error before)."""
    check(
        Case(
            field,
            lambda: _schedule_meta(field),
            lambda s, state: s.step(state, 1.0),
            ValueError,
            f"holds tensors on the meta device in `{field}`",
        )
    )


def test_a_schedule_state_on_meta_is_refused() -> None:
    """The same for a schedule's `lr`, on its own and inside an optimizer's state."""
    schedule = optim.StepLR(base_lr=0.1, step_size=1)
    state = schedule.init()._replace(lr=_meta())
    with pytest.raises(ValueError, match="meta device in `lr`"):
        schedule.step(state)
    opt = optim.SGD(lr=schedule)
    inner = opt.init(_params())
    slot: Any = inner.schedule
    check(
        Case(
            "in SGD",
            lambda: (
                _params(),
                inner._replace(schedule=slot._replace(lr=_meta())),
            ),
            lambda p, s: opt.step_(p, _grads(), s),
            ValueError,
            r"meta device in `schedule\.lr`",
        )
    )


def _cyclic_dict(**changes: Any) -> dict[str, Any]:
    o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    theirs = lr_scheduler.CyclicLR(o, base_lr=0.05, max_lr=0.5, step_size_up=2)
    o.step()
    theirs.step()
    return {**theirs.state_dict(), **changes}


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"base_lrs": [0.01]}, r"'base_lrs' holds 0\.01 for group 0"),
        ({"max_lrs": [1.0]}, r"'max_lrs' holds 1\.0 for group 0"),
        ({"base_lrs": None}, "'base_lrs' has no entry for group 0"),
    ],
    ids=["base_lrs", "max_lrs", "base_lrs None"],
)
def test_cyclic_rates_that_differ_from_the_schedule_are_refused(
    changes: dict[str, Any], match: str
) -> None:
    """A `CyclicLR` dict whose saved rates differ from the schedule's is refused."""
    schedule = optim.CyclicLR(base_lr=0.05, max_lr=0.5, step_size_up=2)
    with pytest.raises((ValueError, TypeError), match=match):
        optim.load_torch_scheduler_state_dict(schedule, _cyclic_dict(**changes))


def test_cyclic_rates_that_agree_load_as_torch_continues() -> None:
    """The control: torch's own dict loads, and the next rate is torch's."""
    schedule = optim.CyclicLR(base_lr=0.05, max_lr=0.5, step_size_up=2)
    state: Any = optim.load_torch_scheduler_state_dict(schedule, _cyclic_dict())
    o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    theirs = lr_scheduler.CyclicLR(o, base_lr=0.05, max_lr=0.5, step_size_up=2)
    for _ in range(2):
        o.step()
        theirs.step()
    assert float(schedule.step(state).lr) == o.param_groups[0]["lr"]


def test_a_saved_base_rate_is_named_as_the_dict_names_it() -> None:
    """A NaN in torch's `base_lrs` is refused naming `base_lrs`."""
    o = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    saved = {**lr_scheduler.StepLR(o, step_size=1).state_dict(), "base_lrs": [math.nan]}
    with pytest.raises(ValueError, match="`base_lrs` must be finite"):
        optim.load_torch_scheduler_state_dict(optim.StepLR(step_size=1), saved)


def _averaged(change: Any) -> tuple[Any, ...]:
    average = optim.WeightAverage(kind="ema", decay=0.9)
    state = average.update(average.init(_params()), _grads())
    averaged = dict(state.averaged)
    averaged["w"] = change(averaged["w"])
    return average, state._replace(averaged=ParamDict(averaged)), _grads()


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (
            lambda t: t.to_sparse(),
            TypeError,
            r"`averaged` must hold dense tensors; \['w'\]",
        ),
        (
            lambda t: torch.empty_like(t, device="meta"),
            ValueError,
            r"`averaged` is on the meta device at \['w'\]",
        ),
    ],
    ids=["sparse", "meta"],
)
def test_an_average_that_cannot_take_the_values_is_refused(
    change: Any, error: type[Exception], match: str
) -> None:
    """A sparse average (a raw kernel error before) or one on meta (values dropped)."""
    check(
        Case(
            "averaged",
            lambda: _averaged(change),
            lambda a, s, v: a.update(s, v),
            error,
            match,
        )
    )


@pytest.mark.parametrize("value", [math.nan, -0.1], ids=["nan", "-0.1"])
def test_a_tensor_rate_torch_refuses_is_refused(value: float) -> None:
    """A 0-dim CPU tensor `lr` is read once, as torch.optim reads it, and refused."""
    with pytest.raises(ValueError, match="Invalid learning rate"):
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=torch.tensor(value))
    with pytest.raises(ValueError, match="`lr` must be finite and non-negative"):
        optim.AdamW(lr=torch.tensor(value))


def test_an_infinite_tensor_rate_is_refused_as_the_number_is() -> None:
    """`lr=inf` is refused as a number; as a 0-dim tensor too."""
    with pytest.raises(ValueError, match="`lr` must be finite"):
        optim.AdamW(lr=math.inf)
    with pytest.raises(ValueError, match="`lr` must be finite and non-negative"):
        optim.AdamW(lr=torch.tensor(math.inf))


@pytest.mark.parametrize("field", ["last_epoch", "num_bad_epochs", "cooldown_counter"])
def test_a_fractional_count_in_a_schedule_state_is_refused(field: str) -> None:
    """A count of 1.5 (torch's schedulers count in ints) is refused, not stepped."""
    plateau = optim.ReduceLROnPlateau(patience=0)
    state = plateau.init(0.1)._replace(**{field: torch.tensor(1.5, dtype=F64)})
    with pytest.raises(ValueError, match=f"invalid values in `{field}`.*whole number"):
        plateau.step(state, 1.0)
    step = optim.StepLR(base_lr=0.1, step_size=1)
    with pytest.raises(ValueError, match="invalid values in `last_epoch`"):
        step.step(step.init()._replace(last_epoch=torch.tensor(1.5, dtype=F64)))


@pytest.mark.parametrize(
    ("groups", "default", "match"),
    [
        ({"w": optim.SGD()}, "sgd", r"got `default`: str\."),
        ({"w": None}, None, r"got the group 'w': NoneType\."),
        (
            {("w", "b"): torch.optim.SGD, "x": optim.SGD()},
            torch.optim.Adam,
            r"got the group \('w', 'b'\): type; `default`: type\.",
        ),
    ],
    ids=["default", "group", "both"],
)
def test_param_groups_name_the_member_that_is_not_an_optimizer(
    groups: Any, default: Any, match: str
) -> None:
    """A group or `default` that is not an optimizer: the error says which."""
    with pytest.raises(TypeError, match=match):
        optim.ParamGroups(groups, default=default)


def _adam_dict(cls: Any = torch.optim.Adam) -> tuple[list[Tensor], dict[str, Any]]:
    leaves = [t.clone().requires_grad_() for t in _params().values()]
    theirs = cls(leaves, lr=0.1)
    for leaf in leaves:
        leaf.grad = torch.ones_like(leaf)
    theirs.step()
    return leaves, copy.deepcopy(theirs.state_dict())


def _edited(edit: Any, cls: Any = torch.optim.Adam) -> Any:
    def build() -> tuple[Any, ...]:
        _, saved = _adam_dict(cls)
        edit(saved)
        return saved, _params()

    return build


def _load(opt: Any) -> Any:
    def call(saved: Any, params: Any) -> None:
        optim.load_torch_state_dict(opt, saved, params, [["w", "b"]])

    return call


LOAD_CASES = unique_ids(
    [
        Case(
            "params=None",
            lambda: (_adam_dict()[1], None),
            _load(optim.Adam(lr=0.1)),
            TypeError,
            "`params` must be the ParamDict .* got NoneType",
        ),
        Case(
            "a group without params",
            _edited(lambda sd: sd["param_groups"][0].pop("params")),
            _load(optim.Adam(lr=0.1)),
            KeyError,
            r"`param_groups\[0\]` has no 'params' entry",
        ),
        Case(
            "a group without lr",
            _edited(lambda sd: sd["param_groups"][0].pop("lr")),
            _load(optim.Adam(lr=0.1)),
            KeyError,
            r"Group 0 of the state dict has no settings \['lr'\]",
        ),
        Case(
            "exp_avg None",
            _edited(lambda sd: sd["state"][0].update(exp_avg=None)),
            _load(optim.Adam(lr=0.1)),
            TypeError,
            r"The state of 'w' holds None as \['exp_avg'\]",
        ),
        Case(
            "exp_avg missing",
            _edited(lambda sd: sd["state"][0].pop("exp_avg")),
            _load(optim.Adam(lr=0.1)),
            KeyError,
            r"The state of 'w' has no \['exp_avg'\] but other entries",
        ),
        Case(
            "RAdam's dict into NAdam",
            _edited(lambda sd: None, torch.optim.RAdam),
            _load(optim.NAdam(lr=0.1)),
            KeyError,
            r"no settings \['momentum_decay'\]; NAdam reads them",
        ),
        Case(
            "NAdam's dict without mu_product",
            _edited(lambda sd: sd["state"][1].pop("mu_product"), torch.optim.NAdam),
            _load(optim.NAdam(lr=0.1)),
            KeyError,
            r"The state of 'b' has no \['mu_product'\]",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in LOAD_CASES])
def test_load_refuses_what_torch_cannot_step(case: Case) -> None:
    """A dict torch loads but cannot step (KeyError, crash): refused, unchanged."""
    check(case)


def test_sgd_without_a_momentum_buffer_still_loads_as_torch_starts_it() -> None:
    """A missing or None SGD momentum buffer starts afresh, as in torch."""
    leaves = [t.clone().requires_grad_() for t in _params().values()]
    theirs = torch.optim.SGD(leaves, lr=0.1, momentum=0.9)
    for leaf in leaves:
        leaf.grad = torch.ones_like(leaf)
    theirs.step()
    saved = copy.deepcopy(theirs.state_dict())
    saved["state"][0]["momentum_buffer"] = None
    opt = optim.SGD(lr=0.1, momentum=0.9)
    state = optim.load_torch_state_dict(opt, saved, _params(), [["w", "b"]], step=0)
    assert sorted(state.momentum_buffer) == ["b", "w"]


def test_export_names_a_names_that_is_not_a_sequence() -> None:
    """`to_torch_state_dict(..., names=None)`: a TypeError naming `names`."""
    opt = optim.Adam()
    with pytest.raises(TypeError, match=r"`names` must be a module .* Got NoneType"):
        optim.to_torch_state_dict(opt, opt.init(_params()), cast(Any, None))


def test_warm_restarts_refuse_an_eta_min_no_float_holds() -> None:
    """`eta_min=10**400`: refused by name (torch's first step overflows)."""
    with pytest.raises(ValueError, match=r"`eta_min` is too large for a float"):
        optim.CosineAnnealingWarmRestarts(T_0=2, eta_min=10**400)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(OverflowError):
        lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2, eta_min=10**400)


def test_a_composed_schedule_names_the_child_state_that_is_not_its_own() -> None:
    """A `ChainedScheduler` state whose children are dicts: the message names them."""
    schedule = optim.ChainedScheduler(
        base_lr=0.1,
        schedulers=(optim.StepLR(step_size=2), optim.ExponentialLR(gamma=0.9)),
    )
    state = schedule.init()
    children = tuple(cast(Any, c._asdict()) for c in state.children)
    bad = state._replace(children=children)
    with pytest.raises(ValueError, match=r"`children\[0\]` \(a dict\) is not what"):
        schedule.step(bad)


def test_an_integer_average_takes_torchs_formula_on_the_values_as_given() -> None:
    """An int64 average with float values (NaN among them): torch's `avg_fn`, promoting.

    `AveragedModel.update_parameters` computes `decay * avg + (1 - decay) * value`
    on the tensors as given and copies the result into the average.
    """
    average = optim.WeightAverage.ema(0.9)
    values = ParamDict(w=torch.tensor([1.5, math.nan, -2.0]))
    state = average.init(ParamDict(w=torch.tensor([4, 8, -6])))
    state = average.update(state, values.map(lambda v: v.nan_to_num()))
    held = state.averaged["w"].clone()
    new = average.update(state, values).averaged["w"]
    swa_utils: Any = torch.optim.swa_utils  # unannotated
    avg_fn = swa_utils.get_ema_avg_fn(0.9)
    expected = torch.empty_like(held).copy_(avg_fn(held, values["w"], torch.tensor(1)))
    assert torch.equal(new, expected)


def test_asgd_steps_meta_parameters_as_the_other_optimizers_do() -> None:
    """Meta parameters step to meta parameters of the same metadata.

    torch's ASGD reads a number of each parameter's state, which a meta tensor
    does not have, so the fuzzer's reference keeps only the metadata there; the
    other optimizers step meta tensors in torch and in paramdict alike.
    """
    from _optim_fuzz import OPTIMIZERS, torch_step

    spec = next(s for s in OPTIMIZERS if s.name == "ASGD")
    params = ParamDict(w=torch.zeros(3, device="meta"))
    grads = ParamDict(w=torch.zeros(3, device="meta"))
    opt = spec.make()
    state = opt.init(params)._replace(ax=params)
    new, _ = opt.step(params, grads, state)
    theirs = torch_step(spec, params, grads, state)
    assert list(theirs) == ["w"]
    for got in (new["w"], theirs["w"]):
        assert got.is_meta
        assert (got.shape, got.dtype) == (torch.Size([3]), torch.float32)
    # The limit is torch's own: its ASGD cannot step meta parameters at all.
    w = torch.zeros(3, device="meta", requires_grad=True)
    w.grad = torch.zeros(3, device="meta")
    with pytest.raises(RuntimeError, match="on meta tensors"):
        torch.optim.ASGD([w], lr=0.1, t0=1).step()
