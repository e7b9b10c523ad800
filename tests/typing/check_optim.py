"""Never run: mypy checks that paramdict.optim keeps precise types."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import assert_type

import paramdict
from paramdict import ParamDict, optim


class MyParams(ParamDict):
    __slots__ = ()


def check_configs(t: Tensor, p: ParamDict) -> None:
    assert_type(optim.SGD(lr=0.1, momentum=0.9, nesterov=True), optim.SGD)
    assert_type(optim.Adam(lr=t, betas=(0.9, 0.99), amsgrad=True), optim.Adam)
    assert_type(optim.AdamW(lr=p, weight_decay=0.0), optim.AdamW)
    assert_type(optim.RMSprop(centered=True, differentiable=True), optim.RMSprop)
    assert_type(optim.Adagrad(lr_decay=0.01), optim.Adagrad)
    assert_type(
        optim.Adam().lr,
        float | Tensor | ParamDict | optim.LRSchedule | optim.ReduceLROnPlateau,
    )
    assert_type(optim.Adam().betas, tuple[float, float])
    assert_type(optim.SGD().differentiable, bool)
    rate: optim.Rate = t
    sgd: optim.Optimizer[optim.SGDState] = optim.SGD(lr=rate)
    assert_type(sgd.init(p), optim.SGDState)
    assert_type(paramdict.optim.Adam(), optim.Adam)


def check_init(p: ParamDict) -> None:
    assert_type(optim.SGD().init(p), optim.SGDState)
    assert_type(optim.Adam().init(p), optim.AdamState)
    assert_type(optim.AdamW().init(p), optim.AdamState)
    assert_type(optim.RMSprop().init(p), optim.RMSpropState)
    assert_type(optim.Adagrad().init(p), optim.AdagradState)


def check_step(p: ParamDict, q: MyParams, g: ParamDict, d: dict[str, Tensor]) -> None:
    adam = optim.Adam()
    assert_type(adam.step(p, g, adam.init(p)), tuple[ParamDict, optim.AdamState])
    assert_type(adam.step(q, d, adam.init(q)), tuple[MyParams, optim.AdamState])
    sgd = optim.SGD()
    assert_type(sgd.step(q, g, sgd.init(q)), tuple[MyParams, optim.SGDState])
    rms = optim.RMSprop()
    assert_type(rms.step(p, g, rms.init(p)), tuple[ParamDict, optim.RMSpropState])
    ada = optim.Adagrad()
    assert_type(ada.step(p, g, ada.init(p)), tuple[ParamDict, optim.AdagradState])


def check_state(s: optim.AdamState, r: optim.RMSpropState) -> None:
    assert_type(s.step, Tensor)
    assert_type(s.exp_avg, ParamDict)
    assert_type(s.exp_avg_sq, ParamDict)
    assert_type(s.max_exp_avg_sq, ParamDict)
    assert_type(s._replace(step=s.step + 1), optim.AdamState)
    assert_type(r.square_avg, ParamDict)
    assert_type(optim.SGDState(torch.zeros(()), ParamDict()).momentum_buffer, ParamDict)
    assert_type(optim.AdagradState(torch.zeros(()), ParamDict()).sum, ParamDict)


def check_combinators(p: ParamDict, q: MyParams, g: ParamDict) -> None:
    groups = optim.ParamGroups(
        {"*.bias": optim.AdamW(weight_decay=0.0), ("a.*", "b.*"): optim.Adam()},
        default=optim.AdamW(),
    )
    assert_type(groups, optim.ParamGroups[optim.AdamState])
    assert_type(groups.init(p), tuple[optim.AdamState, ...])
    assert_type(
        groups.step(q, g, groups.init(q)), tuple[MyParams, tuple[optim.AdamState, ...]]
    )
    clipped = optim.ClipGradNorm(optim.SGD(), max_norm=1.0)
    assert_type(clipped, optim.ClipGradNorm[optim.SGDState])
    assert_type(clipped.init(p), optim.SGDState)
    assert_type(clipped.step(p, g, clipped.init(p)), tuple[ParamDict, optim.SGDState])
    mixed: optim.ParamGroups[Any] = optim.ParamGroups(
        {"w": optim.SGD()}, default=optim.Adagrad()
    )
    assert_type(mixed.init(p), tuple[Any, ...])


def check_step_module(m: nn.Module, x: Tensor) -> None:
    opt = optim.Adam()
    state = opt.init(ParamDict.from_module(m))
    assert_type(
        opt.step_module(m, lambda: m(x).sum(), state), tuple[Tensor, optim.AdamState]
    )


def check_muon(p: ParamDict, q: MyParams, g: ParamDict, t: Tensor) -> None:
    muon = optim.Muon(lr=t, nesterov=False, adjust_lr_fn="match_rms_adamw")
    assert_type(muon, optim.Muon)
    assert_type(muon.ns_coefficients, tuple[float, float, float])
    assert_type(muon.init(p), optim.MuonState)
    assert_type(muon.step(q, g, muon.init(q)), tuple[MyParams, optim.MuonState])
    state = muon.init(p)
    assert_type(state.step, Tensor)
    assert_type(state.momentum_buffer, ParamDict)
    recipe = optim.ParamGroups({"*.weight": optim.Muon()}, default=optim.Muon())
    assert_type(recipe.init(p), tuple[optim.MuonState, ...])


def check_adafactor(p: ParamDict, q: MyParams, g: ParamDict, t: Tensor) -> None:
    ada = optim.Adafactor(lr=t, beta2_decay=-0.5, eps=(None, 1e-3), d=2.0)
    assert_type(ada, optim.Adafactor)
    assert_type(ada.eps, tuple[float | None, float])
    assert_type(ada.init(p), optim.AdafactorState)
    assert_type(ada.step(q, g, ada.init(q)), tuple[MyParams, optim.AdafactorState])
    state = ada.init(p)
    assert_type(state.step, Tensor)
    assert_type(state.row_var, ParamDict)
    assert_type(state.col_var, ParamDict)
    assert_type(state.variance, ParamDict)


def check_papers(p: ParamDict, q: MyParams, g: ParamDict, t: Tensor) -> None:
    free = optim.ScheduleFreeAdamW(lr=t, warmup_steps=10, r=0.5)
    assert_type(free.init(p), optim.ScheduleFreeAdamWState)
    assert_type(
        free.step(q, g, free.init(q)), tuple[MyParams, optim.ScheduleFreeAdamWState]
    )
    assert_type(free.eval_params(q, free.init(q)), MyParams)
    assert_type(free.init(p).weight_sum, Tensor)
    mix = optim.AdEMAMix(betas=(0.9, 0.999, 0.9999), t_alpha_beta3=100)
    assert_type(mix.betas, tuple[float, float, float])
    assert_type(mix.alpha_at(t), float | Tensor)
    assert_type(mix.init(p).exp_avg_slow, ParamDict)
    adan = optim.Adan(no_prox=True)
    assert_type(adan.step_(q, g, adan.init(q)), tuple[MyParams, optim.AdanState])
    assert_type(adan.host_numbers(t, 0.1), tuple[float, ...] | None)
    soap = optim.SOAP(precondition_frequency=5, qr_dtype=torch.float32)
    assert_type(soap.init(p).gg, tuple[ParamDict, ...])
    assert_type(soap.layout(t), tuple[tuple[int, ...], list[int | None]])
    groups = optim.ParamGroups({"*.bias": optim.AdamW()}, default=optim.AdamW())
    assert_type(groups.eval_params(q, groups.init(q)), MyParams)


def check_lbfgs(p: ParamDict, q: MyParams) -> None:
    opt = optim.LBFGS(line_search_fn="strong_wolfe", history_size=10)
    assert_type(opt, optim.LBFGS)
    assert_type(opt.init(p), optim.LBFGSState)
    assert_type(
        opt.step(q, lambda x: x["w"].sum(), opt.init(q)),
        tuple[MyParams, optim.LBFGSState],
    )
    state = opt.init(p)
    assert_type(state.n_iter, int)
    assert_type(state.old_dirs, tuple[Tensor, ...])
    assert_type(state.d, Tensor | None)
    assert_type(state.H_diag, float | Tensor)


def check_torch_family(t: Tensor, p: ParamDict, q: MyParams, g: ParamDict) -> None:
    nadam = optim.NAdam(lr=t, momentum_decay=4e-3, decoupled_weight_decay=True)
    assert_type(nadam, optim.NAdam)
    assert_type(nadam.init(p), optim.NAdamState)
    assert_type(nadam.step(q, g, nadam.init(q)), tuple[MyParams, optim.NAdamState])
    radam = optim.RAdam(lr=p, decoupled_weight_decay=True)
    assert_type(radam, optim.RAdam)
    assert_type(radam.init(p), optim.RAdamState)
    assert_type(radam.step(p, g, radam.init(p)), tuple[ParamDict, optim.RAdamState])
    adamax = optim.Adamax(betas=(0.9, 0.99))
    assert_type(adamax, optim.Adamax)
    assert_type(adamax.init(p), optim.AdamaxState)
    assert_type(adamax.step(p, g, adamax.init(p)), tuple[ParamDict, optim.AdamaxState])
    adadelta = optim.Adadelta(rho=0.9, differentiable=True)
    assert_type(adadelta, optim.Adadelta)
    assert_type(adadelta.init(p), optim.AdadeltaState)
    assert_type(
        adadelta.step(p, g, adadelta.init(p)), tuple[ParamDict, optim.AdadeltaState]
    )
    rprop = optim.Rprop(etas=(0.5, 1.2), step_sizes=(1e-6, 50.0))
    assert_type(rprop, optim.Rprop)
    assert_type(rprop.init(p), optim.RpropState)
    assert_type(rprop.step(q, g, rprop.init(q)), tuple[MyParams, optim.RpropState])
    asgd = optim.ASGD(lambd=1e-4, alpha=0.75, t0=1e6)
    assert_type(asgd, optim.ASGD)
    assert_type(asgd.init(p), optim.ASGDState)
    assert_type(asgd.step(p, g, asgd.init(p)), tuple[ParamDict, optim.ASGDState])


def check_torch_family_states(
    n: optim.NAdamState,
    r: optim.RAdamState,
    m: optim.AdamaxState,
    d: optim.AdadeltaState,
    rp: optim.RpropState,
    a: optim.ASGDState,
) -> None:
    assert_type(n.step, Tensor)
    assert_type(n.mu_product, Tensor)
    assert_type(n.exp_avg, ParamDict)
    assert_type(n.exp_avg_sq, ParamDict)
    assert_type(r.exp_avg, ParamDict)
    assert_type(r.exp_avg_sq, ParamDict)
    assert_type(m.exp_avg, ParamDict)
    assert_type(m.exp_inf, ParamDict)
    assert_type(d.square_avg, ParamDict)
    assert_type(d.acc_delta, ParamDict)
    assert_type(rp.prev, ParamDict)
    assert_type(rp.step_size, ParamDict)
    assert_type(a.eta, Tensor | ParamDict)
    assert_type(a.mu, Tensor)
    assert_type(a.ax, ParamDict)
    assert_type(a._replace(step=a.step + 1), optim.ASGDState)


def check_torch_state_dicts(p: ParamDict, m: nn.Module, sd: dict[str, Any]) -> None:
    adam = optim.Adam()
    state = optim.load_torch_state_dict(adam, sd, p, m)
    assert_type(state, optim.AdamState)
    assert_type(optim.load_torch_state_dict(adam, sd, p), optim.AdamState)
    assert_type(optim.to_torch_state_dict(adam, state, [["w"]]), dict[str, Any])
    assert_type(optim.to_torch_state_dict(adam, state, m, by_name=True), dict[str, Any])
    groups = optim.ParamGroups({"*.bias": optim.Adam()}, default=optim.Adam())
    assert_type(
        optim.load_torch_state_dict(groups, sd, p, [["b"], ["w"]]),
        tuple[optim.AdamState, ...],
    )
    scheduled = optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2))
    sgd_state = optim.load_torch_state_dict(scheduled, sd, p, m, scheduler=sd, step=3)
    assert_type(sgd_state, optim.SGDState)
    assert_type(
        optim.load_torch_scheduler_state_dict(optim.StepLR(step_size=2), sd, group=1),
        optim.ScheduleState | optim.PlateauState,
    )
    assert_type(
        optim.to_torch_scheduler_state_dict(scheduled, sgd_state), dict[str, Any]
    )
