"""Parameter groups sharing one schedule: its state stored once, torch's rates kept."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import ONE_GRAPH
from optim_cases import batches, forward, make_model
from torch import Tensor, nn
from torch.optim import lr_scheduler as tls
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim


def _schedule() -> optim.SequentialLR:
    return optim.SequentialLR(
        base_lr=0.01,
        schedulers=[
            optim.LinearLR(start_factor=0.1, total_iters=2),
            optim.CosineAnnealingLR(T_max=4, eta_min=1e-3),
        ],
        milestones=[2],
    )


def _matrix(name: str, tensor: Tensor) -> bool:
    return tensor.dim() >= 2


def _recipe(*, by_pattern: bool = False) -> optim.ParamGroups[optim.AdamState]:
    """The nanoGPT AdamW recipe: decay and no-decay groups given one schedule."""
    schedule = _schedule()
    decay: str | Callable[[str, Tensor], bool] = "*.weight" if by_pattern else _matrix
    return optim.ParamGroups(
        {decay: optim.AdamW(lr=schedule, weight_decay=0.1)},
        default=optim.AdamW(lr=schedule, weight_decay=0.0),
    )


def _separate() -> optim.ParamGroups[optim.AdamState]:
    """The same recipe with a schedule object of its own in each group."""
    return optim.ParamGroups(
        {_matrix: optim.AdamW(lr=_schedule(), weight_decay=0.1)},
        default=optim.AdamW(lr=_schedule(), weight_decay=0.0),
    )


def _torch_run(steps: int) -> tuple[dict[str, Tensor], list[list[float]]]:
    """Train the same recipe with torch.optim.AdamW and torch's SequentialLR."""
    model = make_model(torch.float64)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=0.01,
    )
    warm = tls.LinearLR(opt, start_factor=0.1, total_iters=2)
    cosine = tls.CosineAnnealingLR(opt, T_max=4, eta_min=1e-3)
    sched = tls.SequentialLR(opt, [warm, cosine], milestones=[2])
    rates: list[list[float]] = []
    for x, y in batches(torch.float64, steps):
        rates.append([float(r) for r in sched.get_last_lr()])
        opt.zero_grad()
        torch.autograd.backward(F.mse_loss(model(x), y))
        opt.step()
        sched.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, rates


def _grads(params: ParamDict, x: Tensor, y: Tensor) -> ParamDict:
    def loss(p: ParamDict) -> Tensor:
        return F.mse_loss(forward(p, x), y)

    grads: ParamDict = torch.func.grad(loss)(params)
    return grads


def _run(
    opt: optim.Optimizer[Any], steps: int, *, in_place: bool = False, state: Any = None
) -> tuple[ParamDict, Any, list[list[float]]]:
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    state = opt.init(params) if state is None else state
    rates: list[list[float]] = []
    for x, y in batches(torch.float64, steps):
        rates.append(opt.last_lr(state))
        grads = _grads(params, x, y)
        step = opt.step_ if in_place else opt.step
        params, state = step(params, grads, state)
    return params, state, rates


def _saved_size(obj: object) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getbuffer().nbytes


def test_shared_schedule_state_is_stored_once() -> None:
    """Two groups given one schedule keep its state in the first group only."""
    params = ParamDict.from_module(make_model())
    state = _recipe().init(params)
    separate = _separate().init(params)
    assert isinstance(state[0].schedule, optim.ScheduleState)
    assert state[1].schedule == ()
    assert isinstance(separate[1].schedule, optim.ScheduleState)
    assert _saved_size(state) < _saved_size(separate)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_shared_schedule_matches_torch(in_place: bool) -> None:
    """The recipe's rates equal torch's scheduler's; its parameters torch.optim's."""
    expected, torch_rates = _torch_run(6)
    params, state, rates = _run(_recipe(), 6, in_place=in_place)
    separate, _, _ = _run(_separate(), 6, in_place=in_place)
    torch.testing.assert_close(dict(params), dict(separate), rtol=0, atol=0)
    torch.testing.assert_close(dict(params), expected)
    assert rates == torch_rates
    assert state[1].schedule == ()
    assert int(state[0].schedule.last_epoch) == 6


@ONE_GRAPH
def test_compiled_shared_schedule_equals_eager() -> None:
    """A compiled step of the recipe equals the eager one."""
    torch._dynamo.reset()
    opt = _recipe()
    compiled = torch.compile(opt.step, fullgraph=True, backend="eager")
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    state = opt.init(params)
    expected, _, _ = _run(_recipe(), 4)
    for x, y in batches(torch.float64, 4):
        grads = _grads(params, x, y)
        params, state = compiled(params, grads, state)
    torch._dynamo.reset()
    torch.testing.assert_close(dict(params), dict(expected), rtol=0, atol=0)
    assert state[1].schedule == ()


def _keeperless(schedule: optim.StepLR) -> optim.ParamGroups[optim.SGDState]:
    """Groups whose first holder of `schedule` ("0.bias" again) gets no keys."""
    return optim.ParamGroups(
        {"0.bias": optim.SGD(lr=0.5), ("0.bias",): optim.SGD(lr=schedule)},
        default=optim.SGD(lr=schedule),
    )


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_shared_schedule_advances_when_its_first_group_has_no_keys(
    in_place: bool,
) -> None:
    """The stored schedule state advances with the groups that do step."""
    schedule = optim.StepLR(base_lr=0.1, step_size=2, gamma=0.5)
    params, state, rates = _run(_keeperless(schedule), 5, in_place=in_place)
    plain = optim.ParamGroups(
        {"0.bias": optim.SGD(lr=0.5)}, default=optim.SGD(lr=schedule)
    )
    expected, expected_state, expected_rates = _run(plain, 5, in_place=in_place)
    torch.testing.assert_close(dict(params), dict(expected), rtol=0, atol=0)
    assert [r[1:] for r in rates] == [r[1:] + r[1:] for r in expected_rates]
    assert state[2].schedule == ()
    torch.testing.assert_close(state[1].schedule, expected_state[1].schedule)


def _clone(x: object) -> object:
    return x.clone() if isinstance(x, Tensor) else x


def _copied_per_group(state: tuple[optim.AdamState, ...]) -> Iterator[Any]:
    """Yield `state` as saved before: each group holding its own schedule state."""
    first = state[0].schedule
    yield state[0]
    for sub in state[1:]:
        yield sub._replace(schedule=pytree.tree_map(_clone, first))


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_state_with_a_schedule_copy_per_group_still_steps(in_place: bool) -> None:
    """A state saved with one schedule copy per group steps as the stored-once one."""
    opt = _recipe()
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    old = tuple(_copied_per_group(opt.init(params)))
    assert isinstance(old[1].schedule, optim.ScheduleState)
    got, state, _ = _run(opt, 3, in_place=in_place, state=old)
    expected, _, _ = _run(_separate(), 3, in_place=in_place)
    torch.testing.assert_close(dict(got), dict(expected), rtol=0, atol=0)
    assert state[1].schedule == ()


def test_state_missing_the_stored_schedule_is_refused() -> None:
    """A state whose first sharing group lacks the schedule state is refused."""
    opt = _recipe()
    params = ParamDict.from_module(make_model())
    state = opt.init(params)
    bad = (state[0]._replace(schedule=()), state[1])
    before = [t.clone() for t in params.values()]
    with pytest.raises(ValueError, match=r"must be the state of `AdamW`'s `Sequential"):
        opt.step_(params, params.zeros_like(), bad)
    torch.testing.assert_close(list(params.values()), before, rtol=0, atol=0)


def test_groups_sharing_a_plateau_reduce_together() -> None:
    """`step_schedule` moves a shared plateau once, for every group sharing it."""
    plateau = optim.ReduceLROnPlateau(base_lr=0.1, patience=0)
    opt = optim.ParamGroups(
        {"*bias": optim.SGD(lr=plateau)}, default=optim.SGD(lr=plateau)
    )
    state = opt.init(ParamDict.from_module(make_model()))
    for loss in (1.0, 1.0, 1.0):
        state = opt.step_schedule(state, loss)
    assert state[1].schedule == ()
    assert opt.last_lr(state) == pytest.approx([0.001, 0.001])


def test_shared_schedule_round_trips_through_torch_state_dicts() -> None:
    """Export to torch.optim and load back: the state is stored once again."""
    schedule = optim.StepLR(base_lr=0.1, step_size=2, gamma=0.5)
    opt = optim.ParamGroups(
        {_matrix: optim.AdamW(lr=schedule)}, default=optim.AdamW(lr=schedule)
    )
    params, state, _ = _run(opt, 3)
    names = [[k for k, v in params.items() if v.dim() >= 2]]
    names.append([k for k in params if k not in names[0]])
    named = dict(make_model(torch.float64).named_parameters())
    theirs = torch.optim.AdamW([{"params": [named[k] for k in g]} for g in names])
    sched = tls.StepLR(theirs, step_size=2, gamma=0.5)
    theirs.load_state_dict(optim.to_torch_state_dict(opt, state, names))
    sched.load_state_dict(optim.to_torch_scheduler_state_dict(opt, state))
    assert sched.get_last_lr() == [0.05, 0.05]
    back = optim.load_torch_state_dict(
        opt, theirs.state_dict(), params, names, scheduler=sched.state_dict()
    )
    assert back[1].schedule == ()
    torch.testing.assert_close(back, state, rtol=0, atol=0)


def test_torch_groups_with_other_rates_refuse_one_shared_schedule() -> None:
    """Torch's groups with different base rates cannot share one schedule object."""
    model: nn.Module = make_model()
    weights = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups: list[dict[str, Any]] = [{"params": weights}, {"params": rest, "lr": 0.2}]
    theirs = torch.optim.SGD(groups, lr=0.1)
    sched = tls.StepLR(theirs, step_size=2)
    schedule = optim.StepLR(base_lr=0.1, step_size=2)
    opt = optim.ParamGroups(
        {_matrix: optim.SGD(lr=schedule)}, default=optim.SGD(lr=schedule)
    )
    params = ParamDict.from_module(model)
    names = [[k for k, v in params.items() if v.dim() >= 2]]
    names.append([k for k in params if k not in names[0]])
    with pytest.raises(
        ValueError, match=r"Group 1's settings differ .* 'initial_lr' 0.2 \(saved\)"
    ):
        optim.load_torch_state_dict(
            opt, theirs.state_dict(), params, names, scheduler=sched.state_dict()
        )


@pytest.mark.parametrize("by_pattern", [False, True], ids=["predicate", "pattern"])
@ONE_GRAPH
def test_fresh_groups_compile_once(by_pattern: bool) -> None:
    """A compiled step of groups never routed eagerly runs again without recompiling."""
    torch._dynamo.reset()
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    # Another instance's state: this one first routes the keys while traced.
    state = _recipe(by_pattern=by_pattern).init(params)
    opt = _recipe(by_pattern=by_pattern)
    compiled = torch.compile(opt.step, fullgraph=True, backend="eager")
    expected, _, _ = _run(_recipe(by_pattern=by_pattern), 3)
    for i, (x, y) in enumerate(batches(torch.float64, 3)):
        grads = _grads(params, x, y)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            params, state = compiled(params, grads, state)
    opt.init(params)  # routed eagerly now: the compiled step is kept all the same
    x, y = next(batches(torch.float64, 1))
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(params, _grads(params, x, y), state)
    torch._dynamo.reset()
    torch.testing.assert_close(dict(params), dict(expected), rtol=0, atol=0)
