"""The optimizers from papers in every mode, each against its plain-torch reference.

Schedule-Free AdamW, AdEMAMix, Adan and SOAP (`paper_cases.ROWS`) through the
modes the built-in optimizers have: `step`, `step_`, `maximize`, parameter
groups, a schedule, `torch.compile(fullgraph=True)`, `differentiable=True`, a
`weights_only` checkpoint and `step_module`. Every comparison is float64 with
the reference of `references.py`, which the package tests
(`test_optim_paper_packages.py`, `test_references.py`) hold to the published
implementations.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import ONE_GRAPH
from paper_cases import (
    DTYPE,
    ROWS,
    Row,
    assert_equal_to_reference,
    gradients,
    reference_run,
    row_params,
    run,
    start,
)
from torch import Tensor, nn

from paramdict import ParamDict, optim

STEPS = 25


def _case_params() -> list[Any]:
    return [
        pytest.param(row, options, id=f"{row.name}-{case}")
        for row in ROWS
        for case, options in row.cases.items()
    ]


@pytest.mark.parametrize("method", ["step", "step_"])
@pytest.mark.parametrize("row", row_params())
def test_steps_equal_the_reference(row: Row, method: str) -> None:
    """25 float64 steps of `step` and of `step_` equal the reference's."""
    params = start()
    grads = gradients(params, STEPS)
    got, _ = run(row.make(), params, grads, method)
    assert_equal_to_reference(got, reference_run(row, params, grads))


@pytest.mark.parametrize(("row", "options"), _case_params())
def test_option_sets_equal_the_reference(row: Row, options: dict[str, Any]) -> None:
    """Each option set of the row (defaults included) equals the reference's."""
    params = start(2)
    grads = gradients(params, STEPS, seed=3)
    got, _ = run(row.cls(lr=row.lr, **options), params, grads)
    want = reference_run(row, params, grads, options=options)
    assert_equal_to_reference(got, want)


@pytest.mark.parametrize("row", row_params())
def test_step_and_in_place_step_agree_bitwise(row: Row) -> None:
    """`step_` writes the numbers `step` returns, state included, to the bit."""
    params = start()
    grads = gradients(params, 8)
    new, state = run(row.make(), params, grads)
    written, state_ = run(row.make(), params, grads, "step_")
    assert all(torch.equal(a, b) for a, b in zip(new.values(), written.values()))
    leaves = torch.utils._pytree.tree_leaves(state)
    leaves_ = torch.utils._pytree.tree_leaves(state_)
    assert len(leaves) == len(leaves_)
    assert all(torch.equal(a, b) for a, b in zip(leaves, leaves_, strict=True))


@pytest.mark.parametrize(("row", "options"), _case_params())
def test_step_leaves_its_inputs_unchanged(row: Row, options: dict[str, Any]) -> None:
    """`step` (lazy copies where the rule allows them) writes none of its inputs.

    Over 12 steps (SOAP refreshes its bases at its 11th call), the parameters,
    gradients and state handed to each step keep their values, and what comes
    back shares no memory with them.
    """
    opt = row.cls(lr=row.lr, **options)
    params = start(2)
    state = opt.init(params)
    for g in gradients(params, 12, seed=5):
        given = torch.utils._pytree.tree_leaves((params, g, state))
        before = [t.clone() for t in given]
        params, state = opt.step(params, g, state)
        for old, value in zip(given, before, strict=True):
            assert torch.equal(old, value)
        storages = {t.untyped_storage().data_ptr() for t in given if t.numel()}
        made = torch.utils._pytree.tree_leaves((params, state))
        assert not any(
            t.numel() and t.untyped_storage().data_ptr() in storages for t in made
        )


@pytest.mark.parametrize("row", row_params())
def test_maximize_is_the_reference_on_negated_gradients(row: Row) -> None:
    """`maximize=True` steps as the reference does on the negated gradients."""
    params = start()
    grads = gradients(params, 10)
    got, _ = run(row.make(maximize=True), params, grads)
    want = reference_run(row, params, [g.neg() for g in grads])
    assert_equal_to_reference(got, want)


@pytest.mark.parametrize("row", row_params())
def test_groups_equal_the_reference_per_group(row: Row) -> None:
    """Two groups of different rates: each equals its own reference run."""
    params = start()
    grads = gradients(params, 12)
    opt = optim.ParamGroups({"b": row.make(lr=0.05)}, default=row.make())
    got, state = run(opt, params, grads)
    assert isinstance(state, tuple)
    assert len(state) == 2
    for keys, lr in ((["b"], 0.05), (["w", "t"], row.lr)):
        part = ParamDict({k: params[k] for k in keys})
        want = reference_run(
            row, part, [ParamDict({k: g[k] for k in keys}) for g in grads], [lr] * 12
        )
        assert_equal_to_reference(ParamDict({k: got[k] for k in keys}), want)


def _cosine_rates(base_lr: float, t_max: int, steps: int) -> list[float]:
    """The rates torch's `CosineAnnealingLR` sets for `steps` steps."""
    holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(holder, T_max=t_max)
    rates = []
    for _ in range(steps):
        rates.append(float(scheduler.get_last_lr()[0]))
        holder.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("row", row_params())
def test_a_schedule_equals_the_reference_with_its_rates(row: Row) -> None:
    """`CosineAnnealingLR` as `lr` (`step_`): the reference run with torch's rates."""
    params = start()
    grads = gradients(params, 15)
    opt = row.make(lr=optim.CosineAnnealingLR(base_lr=0.05, T_max=10))
    got, state = run(opt, params, grads, "step_")
    want = reference_run(row, params, grads, _cosine_rates(0.05, 10, 15))
    assert_equal_to_reference(got, want)
    assert opt.last_lr(state) == pytest.approx(_cosine_rates(0.05, 10, 16)[-1:])


@ONE_GRAPH
@pytest.mark.parametrize("row", row_params())
def test_compiled_with_fullgraph_equals_the_reference(row: Row) -> None:
    """`torch.compile(opt.step, fullgraph=True)`: one graph, the reference's values.

    SOAP's compiled step computes its first-call and refresh branches on every
    call and selects (nothing is read on the host): 7 calls take its first call
    and two refreshes.
    """
    torch._dynamo.reset()
    params = start()
    grads = gradients(params, 7)
    opt = row.make()
    step = torch.compile(opt.step, fullgraph=True, backend="eager")
    state = opt.init(params)
    new = params
    for g in grads:
        new, state = step(new, g, state)
    torch._dynamo.reset()
    assert_equal_to_reference(new, reference_run(row, params, grads))


@pytest.mark.parametrize("row", row_params())
def test_differentiable_steps_equal_the_eager_steps(row: Row) -> None:
    """Recorded (`differentiable=True`), the values are the default mode's (an ulp)."""
    params = start()
    grads = gradients(params, 8)
    eager, _ = run(row.make(), params, grads)
    recorded, state = run(row.make(differentiable=True), params.requires_grad_(), grads)
    assert all(v.grad_fn is not None for v in recorded.values())
    # The recorded step computes its step sizes as float64 tensors, the eager
    # one as Python floats: the same numbers, a rounding apart at most.
    assert_equal_to_reference(recorded, eager, rtol=1e-15, atol=1e-16)
    del state


def _loss(values: ParamDict) -> Tensor:
    return sum((v * v).sum() for v in values.values())  # type: ignore[return-value]


@pytest.mark.parametrize("row", row_params())
def test_differentiable_meta_gradients_equal_the_references_differences(
    row: Row,
) -> None:
    """d(loss after 5 steps) by `lr` and by the start: the reference's, by differences.

    The meta-gradient runs autograd through five recorded steps; the expected
    values are central differences of the float64 reference (relative error
    about 1e-9 at these widths).
    """
    params = start()
    grads = gradients(params, 5)
    lr = torch.tensor(row.lr, dtype=DTYPE, requires_grad=True)
    opt = row.make(lr=lr, differentiable=True)
    leaves = params.clone().requires_grad_()
    new, _ = run(opt, leaves, grads)
    direction = start(7)
    by_lr, *by_start = torch.autograd.grad(_loss(new), [lr, *leaves.values()])
    along = sum(
        (g * d).sum() for g, d in zip(by_start, direction.values(), strict=True)
    )

    def reference_loss(lr: float, shift: float = 0.0) -> float:
        moved = params.add(direction, alpha=shift)
        return float(_loss(reference_run(row, moved, grads, [lr] * 5)))

    h = 1e-6 * row.lr
    by_lr_ref = (reference_loss(row.lr + h) - reference_loss(row.lr - h)) / (2 * h)
    width = 1e-5
    along_ref = (reference_loss(row.lr, width) - reference_loss(row.lr, -width)) / (
        2 * width
    )
    assert float(by_lr) == pytest.approx(by_lr_ref, rel=1e-6)
    assert float(along) == pytest.approx(along_ref, rel=1e-6)


@pytest.mark.parametrize("row", row_params())
def test_a_weights_only_checkpoint_resumes_bitwise(row: Row) -> None:
    """Saved mid-run and loaded with `weights_only=True`, the run goes on unchanged."""
    params = start()
    grads = gradients(params, 10)
    opt = row.make()
    straight, _ = run(opt, params, grads)
    resumed, state = params, opt.init(params)
    for i, g in enumerate(grads):
        if i == 4:
            buffer = io.BytesIO()
            torch.save({"params": resumed, "state": state}, buffer)
            buffer.seek(0)
            loaded = torch.load(buffer, weights_only=True)
            resumed, state = loaded["params"], loaded["state"]
            assert type(state) is opt.state_type
        resumed, state = opt.step(resumed, g, state)
    assert all(torch.equal(a, b) for a, b in zip(resumed.values(), straight.values()))


@pytest.mark.parametrize("row", row_params())
def test_step_module_equals_the_reference(row: Row) -> None:
    """`step_module` on an MLP: the reference fed the gradients at its own values."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(DTYPE)
    gen = torch.Generator().manual_seed(5)
    data = [
        (
            torch.randn(8, 3, generator=gen, dtype=DTYPE),
            torch.randn(8, 2, generator=gen, dtype=DTYPE),
        )
        for _ in range(12)
    ]
    start_values = ParamDict.from_module(model).detach().clone()
    opt = row.make()
    state = opt.init(ParamDict.from_module(model))
    for x, y in data:

        def loss(x: Tensor = x, y: Tensor = y) -> Tensor:
            return F.mse_loss(model(x), y)

        _, state = opt.step_module(model, loss, state)

    values = [v.clone() for v in start_values.values()]
    ref_state = row.init(values)
    for x, y in data:
        leaves = [v.clone().requires_grad_() for v in values]
        out = torch.func.functional_call(model, dict(zip(start_values, leaves)), (x,))
        grads = list(torch.autograd.grad(F.mse_loss(out, y), leaves))
        values, ref_state = row.step(values, grads, ref_state, lr=row.lr, **row.options)
    want = ParamDict(zip(start_values, values, strict=True))
    assert_equal_to_reference(ParamDict.from_module(model).detach(), want)


@pytest.mark.parametrize("row", row_params())
def test_a_tensor_lr_equals_the_reference(row: Row) -> None:
    """A 0-dim float64 tensor `lr` steps as the number does."""
    params = start()
    grads = gradients(params, 10)
    got, _ = run(row.make(lr=torch.tensor(row.lr, dtype=DTYPE)), params, grads, "step_")
    assert_equal_to_reference(got, reference_run(row, params, grads))


@pytest.mark.parametrize(
    "row", [p for p in row_params() if p.values[0].cls is not optim.ScheduleFreeAdamW]
)
def test_a_per_key_lr_equals_the_reference_per_key(row: Row) -> None:
    """A per-key `lr`: each entry equals a reference run at its own rate.

    Schedule-Free AdamW refuses one (its averaging weights come from one rate;
    `test_optim_paper_rules.py`): its groups average apart instead.
    """
    params = start()
    grads = gradients(params, 10)
    rates = {"w": 0.01, "b": 0.03, "t": 0.002}
    per_key = ParamDict({k: torch.tensor(r, dtype=DTYPE) for k, r in rates.items()})
    got, _ = run(row.make(lr=per_key), params, grads)
    for key, rate in rates.items():
        part = ParamDict({key: params[key]})
        want = reference_run(
            row, part, [ParamDict({key: g[key]}) for g in grads], [rate] * 10
        )
        assert_equal_to_reference(ParamDict({key: got[key]}), want)


def _curved(values: ParamDict, scale: ParamDict) -> Tensor:
    """A loss whose gradient depends on the parameters: sum(s p^2 / 2 + p^3 / 6)."""
    return sum(  # type: ignore[return-value]
        (s * v * v / 2 + v**3 / 6).sum()
        for v, s in zip(values.values(), scale.values(), strict=True)
    )


def _curved_grad(values: ParamDict, scale: ParamDict) -> ParamDict:
    """The gradient of `_curved`, written out: s p + p^2 / 2."""
    return ParamDict({k: scale[k] * v + v * v / 2 for k, v in values.items()})


@pytest.mark.parametrize("row", row_params())
def test_second_order_meta_gradient_equals_the_references_differences(
    row: Row,
) -> None:
    """MAML's case: gradients taken with `create_graph=True` at each new point.

    Four recorded steps, each on the gradient of a loss at the parameters it
    steps from; the meta-gradient by the start (along a direction) is autograd's
    through the gradients too (second order), against central differences of
    the float64 reference fed the same gradients, written out. SOAP leaves out
    the 4 x 3 matrix: its 4 x 4 factor has rank 3, so one rotated direction's
    `v` is rounding noise, where the square root's derivative is unbounded
    (as Adam's is at a zero gradient).
    """
    keys = ("b", "t") if row.cls is optim.SOAP else ("w", "b", "t")

    def start_(seed: int) -> ParamDict:
        return ParamDict({k: v for k, v in start(seed).items() if k in keys})

    scale = start_(11).map(torch.abs)
    direction = start_(7)
    opt = row.make(differentiable=True)
    leaves = start_(0).requires_grad_()
    fast, state = leaves, opt.init(leaves)
    for _ in range(4):
        grads = fast.grad(_curved(fast, scale), create_graph=True)
        fast, state = opt.step(fast, grads, state)
    (by_start,) = [leaves.grad(_loss(fast))]
    along = float(sum((by_start[k] * direction[k]).sum() for k in direction))

    def reference_loss(shift: float) -> float:
        values = start_(0).add(direction, alpha=shift)
        ref_state = row.init(list(values.values()))
        for _ in range(4):
            grads = list(_curved_grad(values, scale).values())
            stepped, ref_state = row.step(
                list(values.values()), grads, ref_state, lr=row.lr, **row.options
            )
            values = ParamDict(zip(values, stepped, strict=True))
        return float(_loss(values))

    width = 1e-5
    along_ref = (reference_loss(width) - reference_loss(-width)) / (2 * width)
    assert along == pytest.approx(along_ref, rel=1e-6)
