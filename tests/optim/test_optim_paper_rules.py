"""What is particular to each optimizer from a paper: its options, state and hooks.

The evaluation point (`eval_params`, the optimizers' hook for a point to
evaluate other than the parameters, which Schedule-Free AdamW uses), the
warm-up schedules of AdEMAMix, SOAP's layout of factors and its state check,
and the refusals of bad options, each naming the option.
"""

from __future__ import annotations

import io
import math
from typing import Any

import pytest
import torch
from _torch_versions import ONE_GRAPH
from paper_cases import DTYPE, gradients, reference_run, row_params, run, start
from references import ademamix_alpha, ademamix_beta3

from paramdict import ParamDict, optim

# ---------------------------------------------------------------- eval_params


def test_eval_params_of_an_optimizer_is_its_parameters() -> None:
    """Every optimizer but Schedule-Free evaluates at the parameters themselves."""
    params = start()
    optimizers: list[optim.Optimizer[Any]] = [
        optim.AdamW(),
        optim.SOAP(),
        optim.SGD(lr=0.1),
    ]
    for opt in optimizers:
        assert opt.eval_params(params, opt.init(params)) is params


def _schedule_free_run(steps: int = 12) -> tuple[Any, ParamDict, Any]:
    opt = optim.ScheduleFreeAdamW(lr=0.05, warmup_steps=4, r=0.5, weight_decay=0.01)
    params, state = run(opt, start(), gradients(start(), steps))
    return opt, params, state


def test_schedule_free_eval_point_is_the_weighted_average_of_z() -> None:
    """The point is sum_t w_t z_t / sum_t w_t, w_t = t ** r * lr_max_t ** 2."""
    opt = optim.ScheduleFreeAdamW(lr=0.05, warmup_steps=4, r=0.5, weight_decay=0.01)
    params = start()
    state = opt.init(params)
    total: ParamDict = params.zeros_like()
    weights = 0.0
    for t, g in enumerate(gradients(params, 12), start=1):
        params, state = opt.step(params, g, state)
        weight = t**0.5 * float(state.lr_max) ** 2
        total = total.add(state.z, alpha=weight)
        weights += weight
    assert float(state.weight_sum) == pytest.approx(weights, rel=1e-15)
    x = opt.eval_params(params, state)
    torch.testing.assert_close(dict(x), dict(total.div(weights)), rtol=1e-12, atol=0)


def test_schedule_free_eval_point_writes_nothing() -> None:
    """`eval_params` returns new tensors; the parameters and state are unchanged."""
    opt, params, state = _schedule_free_run()
    before = [t.clone() for t in torch.utils._pytree.tree_leaves((params, state))]
    x = opt.eval_params(params, state)
    after = torch.utils._pytree.tree_leaves((params, state))
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert not any(a is b for a, b in zip(x.values(), params.values()))
    assert not any(v.requires_grad for v in x.values())


def test_schedule_free_eval_point_before_a_step_is_the_parameters() -> None:
    """Before any step, x = y = z."""
    opt = optim.ScheduleFreeAdamW()
    params = start()
    x = opt.eval_params(params, opt.init(params))
    torch.testing.assert_close(dict(x), dict(params), rtol=0, atol=0)


def test_schedule_free_eval_point_of_a_loaded_checkpoint() -> None:
    """A checkpoint saved mid-training evaluates where the run it came from does."""
    opt, params, state = _schedule_free_run()
    buffer = io.BytesIO()
    torch.save((params, state), buffer)
    buffer.seek(0)
    loaded_params, loaded_state = torch.load(buffer, weights_only=True)
    x = opt.eval_params(loaded_params, loaded_state)
    want = opt.eval_params(params, state)
    assert all(torch.equal(a, b) for a, b in zip(x.values(), want.values()))


def test_wrappers_hand_eval_params_to_the_optimizers_they_hold() -> None:
    """`ParamGroups` merges its groups' points; `ClipGradNorm`, `MultiSteps` pass on."""
    schedule_free = optim.ScheduleFreeAdamW(lr=0.05)
    params = start()
    grads = gradients(params, 3)
    groups: optim.ParamGroups[Any] = optim.ParamGroups(
        {"b": optim.AdamW(lr=0.05)}, default=schedule_free
    )
    new, state = run(groups, params, grads)
    x = groups.eval_params(new, state)
    assert list(x) == list(new)
    assert x["b"] is new["b"]
    rest = ParamDict({k: new[k] for k in ("w", "t")})
    want = schedule_free.eval_params(rest, state[1])
    for k in ("w", "t"):
        assert torch.equal(x[k], want[k])
    assert not torch.equal(x["w"], new["w"])

    plain: optim.ParamGroups[Any] = optim.ParamGroups(
        {"b": optim.AdamW()}, default=optim.SGD(lr=0.1)
    )
    assert plain.eval_params(params, plain.init(params)) is params

    for wrapper in (
        optim.ClipGradNorm(schedule_free, max_norm=1.0),
        optim.MultiSteps(schedule_free, every_k=1),
    ):
        new, state = run(wrapper, params, grads)
        inner = state.inner_state if isinstance(state, optim.MultiStepsState) else state
        want = schedule_free.eval_params(new, inner)
        got = wrapper.eval_params(new, state)
        assert all(torch.equal(a, b) for a, b in zip(got.values(), want.values()))


def test_eval_params_refuses_another_state() -> None:
    """A state for other parameters is refused, naming the buffer."""
    opt, _, state = _schedule_free_run(2)
    with pytest.raises(ValueError, match="`z`"):
        opt.eval_params(ParamDict(w=torch.zeros(2, dtype=DTYPE)), state)


def test_differentiable_eval_point_is_recorded() -> None:
    """With `differentiable=True` the evaluation point keeps the graph."""
    opt = optim.ScheduleFreeAdamW(lr=0.05, differentiable=True)
    params = start().requires_grad_()
    new, state = run(opt, params, gradients(params, 2))
    x = opt.eval_params(new, state)
    assert all(v.grad_fn is not None for v in x.values())


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: optim.ScheduleFreeAdamW(lr=ParamDict(w=torch.tensor(0.1))),
            TypeError,
            "not a per-key ParamDict.*ParamGroups",
        ),
        (
            lambda: optim.ScheduleFreeAdamW(betas=(0.0, 0.9)),
            ValueError,
            r"`betas\[0\]` must be above 0",
        ),
        (
            lambda: optim.ScheduleFreeAdamW(
                lr=optim.OneCycleLR(max_lr=0.1, total_steps=10)
            ),
            ValueError,
            "cycle_momentum=False",
        ),
        (
            lambda: optim.ScheduleFreeAdamW(warmup_steps=-1),
            ValueError,
            "`warmup_steps` must be non-negative",
        ),
        (
            lambda: optim.ScheduleFreeAdamW(warmup_steps=2.5),  # type: ignore[arg-type]
            TypeError,
            "`warmup_steps` must be an int",
        ),
        (
            lambda: optim.AdEMAMix(betas=(0.9, 0.999)),  # type: ignore[arg-type]
            TypeError,
            "`betas` must be three numbers",
        ),
        (
            lambda: optim.AdEMAMix(betas=(0.9, 0.999, 1.0)),
            ValueError,
            r"`betas\[2\]` must be in \[0, 1\)",
        ),
        (
            lambda: optim.AdEMAMix(t_alpha_beta3=0),
            ValueError,
            "`t_alpha_beta3` must be positive",
        ),
        (
            lambda: optim.Adan(betas=(0.9, "a", 0.9)),  # type: ignore[arg-type]
            TypeError,
            "`betas` must be",
        ),
        (
            lambda: optim.Adan(no_prox=1),  # type: ignore[arg-type]
            TypeError,
            "`no_prox` must be True or False",
        ),
        (
            lambda: optim.SOAP(precondition_frequency=0),
            ValueError,
            "`precondition_frequency` must be at least 1",
        ),
        (
            lambda: optim.SOAP(shampoo_beta=1.0),
            ValueError,
            r"`shampoo_beta` must be in \[0, 1\)",
        ),
        (
            lambda: optim.SOAP(qr_dtype=torch.int64),
            TypeError,
            "`qr_dtype` must be None or a floating dtype",
        ),
    ],
)
def test_bad_options_are_refused_by_name(make: Any, error: type, match: str) -> None:
    """A bad option is refused when the optimizer is built, naming the option."""
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("row", row_params())
def test_a_per_key_weight_decay_equals_the_reference_per_key(row: Any) -> None:
    """A per-key `weight_decay`: each entry equals a reference run with its own."""
    params = start()
    grads = gradients(params, 8)
    decays = {"w": 0.1, "b": 0.0, "t": 0.3}
    per_key = ParamDict({k: torch.tensor(d, dtype=DTYPE) for k, d in decays.items()})
    opt = row.make(weight_decay=per_key)
    got, _ = run(opt, params, grads)
    for key, decay in decays.items():
        part = ParamDict({key: params[key]})
        want = reference_run(
            row,
            part,
            [ParamDict({key: g[key]}) for g in grads],
            options={**row.options, "weight_decay": decay},
        )
        torch.testing.assert_close(got[key], want[key], rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------- AdEMAMix


def test_ademamix_warmups_are_the_references() -> None:
    """`alpha_at` and `beta3_at` are the warm-up schedules of the paper."""
    opt = optim.AdEMAMix(betas=(0.9, 0.999, 0.9999), alpha=8.0, t_alpha_beta3=100)
    for t in (1, 25, 50, 99, 100, 250):
        step = torch.tensor(float(t), dtype=DTYPE)
        assert float(opt.alpha_at(step)) == pytest.approx(
            ademamix_alpha(t, 8.0, 100), rel=1e-15
        )
        assert float(opt.beta3_at(step, 0.9)) == pytest.approx(
            ademamix_beta3(t, 0.9, 0.9999, 100), rel=1e-15
        )
    plain = optim.AdEMAMix(alpha=8.0)
    step = torch.tensor(3.0, dtype=DTYPE)
    assert plain.alpha_at(step) == 8.0
    assert plain.beta3_at(step, 0.9) == 0.9999
    middle_beta3 = opt.beta3_at(torch.tensor(50.0, dtype=DTYPE), 0.9)
    half_life = math.log(0.5) / math.log(float(middle_beta3))
    middle = (math.log(0.5) / math.log(0.9) + math.log(0.5) / math.log(0.9999)) / 2
    assert half_life == pytest.approx(middle, rel=1e-9)


def test_adan_first_step_takes_no_change_of_gradient() -> None:
    """Step 1: the change average stays 0 and the previous gradient is stored."""
    opt = optim.Adan(lr=0.01)
    params = start()
    (g,) = gradients(params, 1)
    _, state = opt.step(params, g, opt.init(params))
    assert all(bool((v == 0).all()) for v in state.exp_avg_diff.values())
    assert all(torch.equal(a, b) for a, b in zip(state.prev_grad.values(), g.values()))


# ---------------------------------------------------------------- SOAP


def test_soap_first_call_builds_the_preconditioner_only() -> None:
    """The first call fills the factors and bases and leaves the rest as it was."""
    opt = optim.SOAP(lr=0.1, shampoo_beta=0.8)
    params = start()
    (g,) = gradients(params, 1)
    new, state = opt.step(params, g, opt.init(params))
    assert all(torch.equal(a, b) for a, b in zip(new.values(), params.values()))
    assert all(bool((v == 0).all()) for v in state.exp_avg.values())
    left, right = state.gg[0]["w"], state.gg[1]["w"]
    torch.testing.assert_close(left, 0.2 * g["w"] @ g["w"].T, rtol=1e-14, atol=0)
    torch.testing.assert_close(right, 0.2 * g["w"].T @ g["w"], rtol=1e-14, atol=0)
    basis = state.q[0]["w"]
    eigenvalues = torch.diag(basis.T @ left @ basis)
    assert bool((eigenvalues[:-1] >= eigenvalues[1:]).all())
    assert [list(factors) for factors in state.gg] == [["w", "t"], ["w", "t"], ["t"]]


def test_soap_layout_follows_the_options() -> None:
    """Merged dimensions, a bound on their size, and vectors on request."""
    value = torch.zeros(2, 2, 3)
    assert optim.SOAP().layout(value) == ((2, 2, 3), [2, 2, 3])
    assert optim.SOAP(merge_dims=True, max_precond_dim=4).layout(value) == (
        (4, 3),
        [4, 3],
    )
    assert optim.SOAP(max_precond_dim=2).layout(value) == ((2, 2, 3), [2, 2, None])
    assert optim.SOAP().layout(torch.zeros(5)) == ((5,), [None])
    assert optim.SOAP(precondition_1d=True).layout(torch.zeros(5)) == ((5,), [5])


def test_soap_refuses_a_state_of_other_options() -> None:
    """A state laid out for other options is refused, naming the field, unwritten."""
    params = start()
    state = optim.SOAP().init(params)
    before = [t.clone() for t in torch.utils._pytree.tree_leaves(state)]
    opt = optim.SOAP(precondition_1d=True)
    with pytest.raises(ValueError, match="The state's `gg` does not fit"):
        opt.step_(params.clone(), gradients(params, 1)[0], state)
    after = torch.utils._pytree.tree_leaves(state)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with pytest.raises(ValueError, match="The state's `q` does not fit"):
        opt.check_state(params, opt.init(params)._replace(q=state.q))


def test_soap_bases_stay_orthonormal_through_refreshes() -> None:
    """Every basis is orthonormal after 12 calls with a refresh every 2 steps."""
    opt = optim.SOAP(lr=0.01, precondition_frequency=2)
    _, state = run(opt, start(), gradients(start(), 12))
    for bases in state.q:
        for q in bases.values():
            eye = torch.eye(q.shape[0], dtype=DTYPE)
            torch.testing.assert_close(q.T @ q, eye, rtol=0, atol=1e-13)


# ---------------------------------------------------------------- host_numbers


@ONE_GRAPH
def test_host_numbers_are_floats_only_where_reading_is_free() -> None:
    """Eager: floats; a rate that requires grad, per key or compiled: None."""
    step = torch.tensor(3.0, dtype=DTYPE)
    rate = torch.tensor(0.5, dtype=DTYPE)
    assert optim.Adan().host_numbers(step, rate, 0.25) == (3.0, 0.5, 0.25)
    recorded = optim.Adan(differentiable=True)
    assert recorded.host_numbers(step, rate) == (3.0, 0.5)
    assert recorded.host_numbers(step, rate.clone().requires_grad_()) is None
    per_key = ParamDict(w=torch.tensor(0.1))
    assert optim.Adan().host_numbers(step, per_key) is None

    opt = optim.Adan()

    def traced(step: torch.Tensor) -> torch.Tensor:
        host = opt.host_numbers(step, 0.1)
        return step + (1.0 if host is None else 0.0)

    torch._dynamo.reset()
    compiled = torch.compile(traced, fullgraph=True, backend="eager")
    assert float(compiled(step)) == 4.0
    assert float(traced(step)) == 3.0
    torch._dynamo.reset()
