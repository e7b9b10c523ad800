"""`as_torch_optimizer`: torch's optimizer interface, state dicts, and bad use.

The groups, `zero_grad`, `step(closure)`, the hooks and `add_param_group` behave
as torch.optim's; `state_dict()` is torch's format both ways (saved here, loaded
by torch's class of the same name, and back) and survives `torch.save` and
`torch.load(weights_only=True)`; bad use gets torch's errors or clearer ones, and
nothing is written then.
"""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import needs_torch
from test_torch_adapter import FUSABLE, OPTIMIZERS, assert_same, data, model, pair
from torch import Tensor, nn

from paramdict import optim


def _step(net: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    x, y = data(step)
    opt.zero_grad()
    torch.autograd.backward(F.mse_loss(net(x), y))
    opt.step()


def _snapshot(net: nn.Module, opt: torch.optim.Optimizer) -> list[Tensor]:
    """Copies of the parameters and of every tensor of the optimizer's state."""
    state = [t for s in opt.state.values() for t in s.values()]
    return [t.detach().clone() for t in [*net.parameters(), *state]]


def _unchanged(
    before: list[Tensor], net: nn.Module, opt: torch.optim.Optimizer
) -> None:
    after = _snapshot(net, opt)
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------- the interface


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_param_groups_show_every_setting_under_torchs_name(name: str) -> None:
    """One group with torch's keys and the optimizer's values; `state` by parameter."""
    net, adapter, twin, reference = pair(name, fused=name in FUSABLE)
    assert isinstance(adapter, torch.optim.Optimizer)
    (group,) = adapter.param_groups
    (theirs,) = reference.param_groups
    assert set(group) == set(theirs) | {"param_names"}
    assert {k: v for k, v in group.items() if k != "params"} == {
        **{k: v for k, v in theirs.items() if k != "params"},
        "param_names": [k for k, _ in net.named_parameters()],
    }
    assert all(a is b for a, b in zip(group["params"], net.parameters(), strict=True))
    _step(net, adapter, 0)
    _step(twin, reference, 0)
    for p, q in zip(net.parameters(), twin.parameters(), strict=True):
        ours, torchs = adapter.state[p], reference.state[q]
        assert set(ours) == set(torchs)
        for key, value in torchs.items():
            torch.testing.assert_close(
                ours[key], value, rtol=0, atol=0, check_dtype=key != "step"
            )


def test_param_groups_gives_one_group_per_group_of_param_groups() -> None:
    """`optim.ParamGroups`: torch's groups, each with its optimizer's settings."""
    net, twin = model(), model()
    groups = optim.ParamGroups(
        {"*.bias": optim.AdamW(lr=0.02, weight_decay=0.0)},
        default=optim.AdamW(lr=0.01, weight_decay=0.1, betas=(0.8, 0.99)),
    )
    adapter = optim.as_torch_optimizer(groups, net)
    torch_groups: list[dict[str, Any]] = [
        {"params": [p for n, p in twin.named_parameters() if "bias" in n]},
        {
            "params": [p for n, p in twin.named_parameters() if "bias" not in n],
            "lr": 0.01,
            "weight_decay": 0.1,
            "betas": (0.8, 0.99),
        },
    ]
    reference = torch.optim.AdamW(torch_groups, lr=0.02, weight_decay=0.0, fused=True)
    assert [g["param_names"] for g in adapter.param_groups] == [
        ["0.bias", "2.bias"],
        ["0.weight", "2.weight"],
    ]
    assert [g["lr"] for g in adapter.param_groups] == [0.02, 0.01]
    for step in range(5):
        _step(net, adapter, step)
        _step(twin, reference, step)
    assert_same(net, twin)


def test_a_default_group_without_parameters_is_an_empty_group() -> None:
    """A default that holds nothing keeps its place; the dict loads into torch."""
    net = model()
    groups = optim.ParamGroups({"*": optim.SGD(lr=0.1)}, default=optim.SGD(lr=0.2))
    adapter = optim.as_torch_optimizer(groups, net)
    assert [len(g["params"]) for g in adapter.param_groups] == [4, 0]
    _step(net, adapter, 0)
    saved = adapter.state_dict()
    adapter.load_state_dict(saved)
    torch_groups: list[dict[str, Any]] = [
        {"params": list(net.parameters())},
        {"params": []},
    ]
    twin = torch.optim.SGD(torch_groups)
    twin.load_state_dict(saved)
    assert [g["lr"] for g in twin.param_groups] == [0.1, 0.2]


def test_torch_style_groups_and_add_param_group_train_as_torch() -> None:
    """A list of dicts overrides the optimizer's settings; `add_param_group` too."""
    net, twin = model(), model()
    adapter = optim.as_torch_optimizer(
        optim.SGD(lr=0.05, momentum=0.9, fused=False),
        [{"params": net[0].parameters(), "lr": 0.1, "nesterov": True}],
    )
    reference = torch.optim.SGD(
        [{"params": twin[0].parameters(), "lr": 0.1, "nesterov": True}],
        lr=0.05,
        momentum=0.9,
    )
    for step in range(3):
        _step(net, adapter, step)
        _step(twin, reference, step)
    adapter.add_param_group({"params": net[2].parameters(), "momentum": 0.5})
    reference.add_param_group({"params": twin[2].parameters(), "momentum": 0.5})
    assert adapter.param_groups[1]["lr"] == 0.05  # the defaults fill the rest
    assert adapter.param_groups[1]["nesterov"] is False
    for step in range(3, 7):
        _step(net, adapter, step)
        _step(twin, reference, step)
    assert_same(net, twin)
    assert len(adapter.state_dict()["state"]) == 4


def test_a_rate_written_into_one_group_leaves_the_others() -> None:
    """Groups of one optimizer each hold their own settings, as torch's do."""
    net, twin = model(), model()
    adapter = optim.as_torch_optimizer(optim.Adam(lr=0.01), net[0].parameters())
    adapter.add_param_group({"params": net[2].parameters()})
    reference = torch.optim.Adam(twin[0].parameters(), lr=0.01, fused=True)
    reference.add_param_group({"params": twin[2].parameters()})
    for step in range(4):
        for opt in (adapter, reference):
            opt.param_groups[step % 2]["lr"] = 0.001 * (step + 2)
        _step(net, adapter, step)
        _step(twin, reference, step)
    assert_same(net, twin)


def test_a_refused_group_is_not_added() -> None:
    """`add_param_group` with a bad setting raises; the groups are as they were."""
    net = model()
    adapter = optim.as_torch_optimizer(optim.Adam(), net[0].parameters())
    with pytest.raises(ValueError, match=r"param_groups\[1\]: `betas\[0\]` must be in"):
        adapter.add_param_group({"params": net[2].parameters(), "betas": (1.5, 0.9)})
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        adapter.add_param_group({"params": net[0].parameters()})
    assert len(adapter.param_groups) == 1
    assert len(adapter.state) == 2
    adapter.param_groups[0]["params"].append(net[2].weight)
    with pytest.raises(ValueError, match=r"\['params'\] was changed in place"):
        adapter.step()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_is_torchs(set_to_none: bool) -> None:
    """`zero_grad` clears or zeroes every `.grad`; a zero gradient still steps."""
    net, adapter, twin, reference = pair("Adam", fused=True)
    for step in range(2):
        for module, opt in ((net, adapter), (twin, reference)):
            _step(module, opt, step)
            opt.zero_grad(set_to_none=set_to_none)
            opt.step()
    for p in net.parameters():
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is not None
            assert not p.grad.any()
    assert_same(net, twin)


def test_step_runs_the_closure_with_grad_and_returns_its_loss() -> None:
    """`step(closure)` calls it with gradients on (inside `no_grad` too)."""
    net, adapter, twin, reference = pair("SGD momentum", fused=True)
    x, y = data(0)

    def closure_of(module: nn.Module, opt: torch.optim.Optimizer) -> Any:
        def closure() -> float:
            opt.zero_grad()
            loss = F.mse_loss(module(x), y)
            torch.autograd.backward(loss)
            return float(loss.detach())

        return closure

    with torch.no_grad():
        loss = adapter.step(closure_of(net, adapter))
        expected = reference.step(closure_of(twin, reference))
    assert loss == expected
    assert_same(net, twin)


def test_a_closure_that_raises_writes_nothing() -> None:
    """The closure runs before anything is written: its error leaves all as it was."""
    net, adapter, _, _ = pair("Adam", fused=True)
    _step(net, adapter, 0)
    before = _snapshot(net, adapter)

    def closure() -> float:
        torch.autograd.backward(F.mse_loss(net(data(1)[0]), data(1)[1]))
        msg = "the batch was bad"
        raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="the batch was bad"):
        adapter.step(closure)
    _unchanged(before, net, adapter)


def test_step_hooks_run_around_each_step() -> None:
    """`register_step_pre_hook` and `register_step_post_hook`, torch's, in order."""
    net, adapter, _, _ = pair("AdamW", fused=True)
    seen: list[str] = []
    pre = adapter.register_step_pre_hook(lambda opt, args, kwargs: seen.append("pre"))
    post = adapter.register_step_post_hook(
        lambda opt, args, kwargs: seen.append(f"post {opt is adapter}")
    )
    _step(net, adapter, 0)
    pre.remove()
    post.remove()
    _step(net, adapter, 1)
    assert seen == ["pre", "post True"]


# ---------------------------------------------------------------- state dicts


def _saved(state_dict: dict[str, Any]) -> dict[str, Any]:
    """`state_dict` after `torch.save` and `torch.load(weights_only=True)`."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    loaded: dict[str, Any] = torch.load(buffer, weights_only=True)
    return loaded


def _paths() -> list[Any]:
    return [
        pytest.param(name, fused, id=f"{name}-{'fused' if fused else 'foreach'}")
        for name in OPTIMIZERS
        for fused in ((False, True) if name in FUSABLE else (False,))
    ]


@pytest.mark.parametrize(("name", "fused"), _paths())
def test_a_saved_adapter_continues_in_torch_and_back_bitwise(
    name: str, fused: bool
) -> None:
    """Adapter -> torch.save/load -> torch's class, and torch's -> the adapter."""
    net, adapter, twin, reference = pair(name, fused=fused)
    for step in range(3):
        _step(net, adapter, step)
        _step(twin, reference, step)
    ours, theirs = _saved(adapter.state_dict()), _saved(reference.state_dict())
    # Each loads the other's dict into a fresh optimizer of the other kind.
    resumed_net, resumed, resumed_twin, resumed_ref = pair(name, fused=fused)
    resumed_net.load_state_dict(twin.state_dict())
    resumed_twin.load_state_dict(net.state_dict())
    resumed.load_state_dict(theirs)
    resumed_ref.load_state_dict(ours)
    for step in range(3, 6):
        for module, opt in (
            (net, adapter),
            (twin, reference),
            (resumed_net, resumed),
            (resumed_twin, resumed_ref),
        ):
            _step(module, opt, step)
    for module in (twin, resumed_net, resumed_twin):
        assert_same(net, module)
    assert resumed.param_groups[0].get("fused") is (True if fused else None)


def test_a_scheduler_and_its_adapter_resume_together() -> None:
    """The groups keep what schedulers add (`initial_lr`); a resumed run is exact."""
    net, adapter, _, _ = pair("AdamW", fused=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(adapter, T_max=10)
    for step in range(3):
        _step(net, adapter, step)
        sched.step()
    saved = _saved({"optim": adapter.state_dict(), "sched": sched.state_dict()})
    assert saved["optim"]["param_groups"][0]["initial_lr"] == 0.01
    other = model(seed=1)
    other.load_state_dict(net.state_dict())
    resumed = optim.as_torch_optimizer(optim.AdamW(lr=0.5), other)
    resumed_sched = torch.optim.lr_scheduler.CosineAnnealingLR(resumed, T_max=10)
    resumed.load_state_dict(saved["optim"])
    resumed_sched.load_state_dict(saved["sched"])
    for step in range(3, 6):
        for module, opt, s in ((net, adapter, sched), (other, resumed, resumed_sched)):
            _step(module, opt, step)
            s.step()
    assert_same(net, other)


@pytest.mark.parametrize(
    ("ours", "theirs", "foreach"),
    [
        (optim.RAdam, torch.optim.RAdam, True),  # torch's loop rounds otherwise
        (optim.NAdam, torch.optim.NAdam, False),  # the rule rounds as the loop
    ],
    ids=["RAdam", "NAdam"],
)
def test_a_saved_dict_names_the_path_torch_continues_on(
    ours: Any, theirs: Any, foreach: bool
) -> None:
    """`foreach` left at None is saved as the path that rounds as the rule."""
    net, twin = model(), model()
    adapter = optim.as_torch_optimizer(ours(lr=0.01, weight_decay=0.1), net)
    assert adapter.param_groups[0]["foreach"] is None  # as torch's default shows it
    for step in range(3):
        _step(net, adapter, step)
    saved = _saved(adapter.state_dict())
    assert saved["param_groups"][0]["foreach"] is foreach
    twin.load_state_dict(net.state_dict())
    reference = theirs(twin.parameters())
    reference.load_state_dict(saved)
    for step in range(3, 8):
        _step(net, adapter, step)
        _step(twin, reference, step)
    assert_same(net, twin)


def test_an_optimizer_torch_has_not_saves_and_resumes() -> None:
    """Lion (no torch class): its own buffers in torch's layout, resumed bitwise."""
    net, other = model(), model()
    adapter = optim.as_torch_optimizer(optim.Lion(lr=1e-3, weight_decay=0.1), net)
    for step in range(3):
        _step(net, adapter, step)
    saved = _saved(adapter.state_dict())
    assert sorted(saved["state"][0]) == ["exp_avg", "step"]
    other.load_state_dict(net.state_dict())
    resumed = optim.as_torch_optimizer(optim.Lion(lr=1e-3, weight_decay=0.1), other)
    resumed.load_state_dict(saved)
    for step in range(3, 6):
        _step(net, adapter, step)
        _step(other, resumed, step)
    assert_same(net, other)


@pytest.mark.parametrize(
    ("donor", "taker", "match"),
    [
        ("SGD momentum", "Adam", r"lacks the settings \['amsgrad', 'betas'"),
        ("Adam", "RMSprop", r"lacks the settings \['alpha', 'centered'"),
        ("Adagrad", "SGD momentum", r"lacks the settings \['dampening', 'momentum'"),
        pytest.param(
            "Adam",
            "AdamW",
            "sets 'decoupled_weight_decay' to False",
            marks=needs_torch(2, 7, "torch.optim.Adam's `decoupled_weight_decay`"),
        ),
    ],
)
def test_another_optimizers_dict_is_refused(donor: str, taker: str, match: str) -> None:
    """A dict of another optimizer names what does not fit; nothing is loaded."""
    net, adapter, twin, reference = pair(donor, fused=False)
    _step(twin, reference, 0)
    taking_net, taking, _, _ = pair(taker, fused=False)
    _step(taking_net, taking, 0)
    before, groups = _snapshot(taking_net, taking), copy.deepcopy(taking.param_groups)
    with pytest.raises(ValueError, match=match):
        taking.load_state_dict(reference.state_dict())
    _unchanged(before, taking_net, taking)
    for now, kept in zip(taking.param_groups, groups, strict=True):
        assert {k: v for k, v in now.items() if k != "params"} == {
            k: v for k, v in kept.items() if k != "params"
        }
    del net, adapter


def test_a_dict_of_other_groups_is_refused_with_torchs_message() -> None:
    """Another number of groups, or of parameters in a group: torch's errors."""
    net, adapter, twin, reference = pair("Adam", fused=True)
    saved = adapter.state_dict()
    saved["param_groups"] = [*saved["param_groups"], saved["param_groups"][0]]
    with pytest.raises(ValueError, match="different number of parameter groups"):
        adapter.load_state_dict(saved)
    small = optim.as_torch_optimizer(optim.Adam(), net[0].parameters())
    with pytest.raises(ValueError, match="doesn't match the size"):
        small.load_state_dict(reference.state_dict())
    del twin


# ---------------------------------------------------------------- bad use


def test_bad_gradients_are_refused_and_nothing_is_written() -> None:
    """A `.grad` of another shape or dtype, or a sparse one: a clear error."""
    net, adapter, _, _ = pair("Adam", fused=True)
    _step(net, adapter, 0)
    with pytest.raises(RuntimeError, match="assign a gradient of size"):
        net[0].weight.grad = torch.zeros(3)  # torch checks an assignment
    before = _snapshot(net, adapter)
    grad = net[0].weight.grad
    assert grad is not None
    grad.data = torch.zeros(3)  # but not one through `.data`
    with pytest.raises(ValueError, match=r"'0.weight': \(3,\) torch.float32 on cpu"):
        adapter.step()
    grad.data = torch.zeros(7, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"'0.weight': \(7, 5\) torch.float64"):
        adapter.step()
    _unchanged(before, net, adapter)
    embedding = nn.Embedding(10, 3, sparse=True)
    sparse = optim.as_torch_optimizer(optim.Adam(), embedding)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match=r"the `.grad` of \['weight'\] is sparse"):
        sparse.step()


def test_a_refused_setting_writes_nothing() -> None:
    """A bad rate, beta, flag or differentiable step, a buffer not kept: refused."""
    net, adapter, _, _ = pair("Adam", fused=True)
    _step(net, adapter, 0)
    group = adapter.param_groups[0]
    before = _snapshot(net, adapter)
    for key, value, error, match in [
        ("lr", -0.1, ValueError, "`lr` must be non-negative"),
        ("betas", (0.9, 1.0), ValueError, r"`betas\[1\]` must be in \[0, 1\)"),
        ("amsgrad", True, ValueError, "max_exp_avg_sq"),
        ("differentiable", True, ValueError, "differentiable=False"),
        ("maximize", "yes", TypeError, "maximize"),
        ("eps", "small", TypeError, "`eps` must be a number"),
    ]:
        kept = group[key]
        group[key] = value
        with pytest.raises(error, match=match):
            adapter.step()
        group[key] = kept
        _unchanged(before, net, adapter)
    _step(net, adapter, 1)  # and it steps on once they are put back


def test_what_torch_refuses_is_refused() -> None:
    """A non-leaf tensor, no parameters, a parameter in two groups: torch's errors."""
    leaf = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.as_torch_optimizer(optim.SGD(), [leaf * 2])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.as_torch_optimizer(optim.SGD(), [])
    with pytest.raises(TypeError, match="should be an iterable of Tensors"):
        optim.as_torch_optimizer(optim.SGD(), leaf)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.as_torch_optimizer(optim.SGD(), [{"params": [leaf]}, {"params": [leaf]}])


@pytest.mark.parametrize(
    ("opt", "error", "match"),
    [
        (optim.ClipGradNorm(optim.AdamW(), max_norm=1.0), TypeError, "clip_grad_norm_"),
        (optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2)), TypeError, "scheduler"),
        (optim.SGD(differentiable=True), ValueError, "differentiable=False"),
    ],
    ids=["wrapper", "schedule", "differentiable"],
)
def test_an_optimizer_the_adapter_cannot_step_is_refused(
    opt: optim.Optimizer[Any], error: type[Exception], match: str
) -> None:
    """A wrapper, a paramdict schedule as `lr`, a differentiable optimizer: refused."""
    with pytest.raises(error, match=match):
        optim.as_torch_optimizer(opt, model())


def test_param_groups_needs_names_and_the_adapter_is_not_copied() -> None:
    """ParamGroups routes by name; an adapter refuses pickling with the way out."""
    groups = optim.ParamGroups({"*": optim.SGD()})
    with pytest.raises(TypeError, match="`named_parameters\\(\\)`"):
        optim.as_torch_optimizer(groups, model().parameters())
    adapter = optim.as_torch_optimizer(groups, model())
    with pytest.raises(TypeError, match="state_dict"):
        copy.deepcopy(adapter)
