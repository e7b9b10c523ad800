"""Parameter groups by key pattern, and per-key rates, against torch param groups."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from optim_cases import TABLE, assert_matches, make_model, run_ours, run_torch
from torch import nn

from paramdict import ParamDict, optim

DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64], ids=["float32", "float64"]
)


def _split(model: nn.Module, pattern: str) -> tuple[list[nn.Parameter], ...]:
    matched = [p for k, p in model.named_parameters() if k.endswith(pattern)]
    rest = [p for k, p in model.named_parameters() if not k.endswith(pattern)]
    return matched, rest


@DTYPES
def test_no_weight_decay_for_biases_matches_torch_groups(dtype: torch.dtype) -> None:
    """AdamW without decay on "*.bias" equals torch.optim.AdamW with two groups."""

    def make(model: nn.Module) -> torch.optim.Optimizer:
        biases, weights = _split(model, ".bias")
        groups: list[dict[str, Any]] = [
            {"params": biases, "weight_decay": 0.0},
            {"params": weights},
        ]
        return torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1)

    opt = optim.ParamGroups(
        {"*.bias": optim.AdamW(lr=0.01, weight_decay=0.0)},
        default=optim.AdamW(lr=0.01, weight_decay=0.1),
    )
    assert_matches(run_ours(opt, dtype), run_torch(make, dtype), dtype)


@DTYPES
def test_decay_chosen_by_predicate_matches_torch_groups(dtype: torch.dtype) -> None:
    """Decay for tensors of 2 or more dims, chosen by a predicate, equals torch's."""

    def make(model: nn.Module) -> torch.optim.Optimizer:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        rest = [p for p in model.parameters() if p.dim() < 2]
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": 0.1},
            {"params": rest, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=0.01)

    def matrix(name: str, tensor: torch.Tensor) -> bool:
        return tensor.dim() >= 2

    opt = optim.ParamGroups(
        {matrix: optim.AdamW(lr=0.01, weight_decay=0.1)},
        default=optim.AdamW(lr=0.01, weight_decay=0.0),
    )
    assert_matches(run_ours(opt, dtype), run_torch(make, dtype), dtype)


def test_an_exact_name_is_never_read_as_a_pattern() -> None:
    """A group named "a[0]" takes the key "a[0]", not "a0" as fnmatch would."""
    params = ParamDict({"a[0]": torch.ones(2), "a0": torch.ones(2), "b": torch.ones(2)})
    opt = optim.ParamGroups(
        {"a[0]": optim.SGD(lr=0.5), "a*": optim.SGD(lr=0.25)}, default=optim.SGD()
    )
    grads = ParamDict({k: torch.ones(2) for k in params})
    new, _ = opt.step(params, grads, opt.init(params))
    torch.testing.assert_close(new["a[0]"], torch.full((2,), 0.5))
    torch.testing.assert_close(new["a0"], torch.full((2,), 0.75))
    torch.testing.assert_close(new["b"], torch.full((2,), 0.999))


def test_predicate_that_chooses_nothing_is_refused() -> None:
    """A predicate true for no key is an error naming it."""
    params = ParamDict.from_module(make_model())

    def cube(name: str, tensor: torch.Tensor) -> bool:
        return tensor.dim() == 3

    opt = optim.ParamGroups({cube: optim.SGD()}, default=optim.SGD())
    with pytest.raises(ValueError, match=r"predicates \['.*cube'\] match no key"):
        opt.init(params)


@DTYPES
def test_sgd_groups_with_their_own_settings_match_torch(dtype: torch.dtype) -> None:
    """Groups may differ in every hyperparameter, as torch's groups may."""

    def make(model: nn.Module) -> torch.optim.Optimizer:
        first = [p for k, p in model.named_parameters() if k.startswith("0.")]
        second = [p for k, p in model.named_parameters() if k.startswith("2.")]
        return torch.optim.SGD(
            [
                {"params": first, "lr": 0.1, "nesterov": True},
                {"params": second, "lr": 0.02, "dampening": 0.5},
            ],
            momentum=0.9,
        )

    opt = optim.ParamGroups(
        {
            "0.*": optim.SGD(lr=0.1, momentum=0.9, nesterov=True),
            "2.*": optim.SGD(lr=0.02, momentum=0.9, dampening=0.5),
        }
    )
    assert_matches(run_ours(opt, dtype), run_torch(make, dtype), dtype)


def test_per_key_rates_match_one_torch_group_per_parameter() -> None:
    """`lr` and `weight_decay` as ParamDicts act like one torch group per key."""
    rates = {"0.weight": 0.05, "0.bias": 0.2, "2.weight": 0.01, "2.bias": 0.1}
    decays = {"0.weight": 0.1, "0.bias": 0.0, "2.weight": 0.3, "2.bias": 0.0}

    def make(model: nn.Module) -> torch.optim.Optimizer:
        groups = [
            {"params": [p], "lr": rates[k], "weight_decay": decays[k]}
            for k, p in model.named_parameters()
        ]
        return torch.optim.Adam(groups)

    dtype = torch.float64
    opt = optim.Adam(
        lr=ParamDict((k, torch.tensor(v, dtype=dtype)) for k, v in rates.items()),
        weight_decay=ParamDict(
            (k, torch.tensor(v, dtype=dtype)) for k, v in decays.items()
        ),
    )
    assert_matches(run_ours(opt, dtype), run_torch(make, dtype), dtype)


def _rows() -> list[Any]:
    return [
        pytest.param(case.ours, case.theirs, next(iter(case.trajectories.values())))
        for case in TABLE
    ]


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), _rows())
def test_per_key_lr_matches_torch_groups_for_every_optimizer(
    ours: Any, theirs: Any, kwargs: dict[str, Any]
) -> None:
    """A per-key `lr` equals one torch group per parameter, for every table row."""
    rates = {"0.weight": 0.02, "0.bias": 0.04, "2.weight": 0.01, "2.bias": 0.03}
    options = {k: v for k, v in kwargs.items() if k != "lr"}

    def make(model: nn.Module) -> torch.optim.Optimizer:
        groups = [{"params": [p], "lr": rates[k]} for k, p in model.named_parameters()]
        return theirs(groups, **options)  # type: ignore[no-any-return]  # a class

    dtype = torch.float64
    lr = ParamDict((k, torch.tensor(v, dtype=dtype)) for k, v in rates.items())
    assert_matches(
        run_ours(ours(lr=lr, **options), dtype), run_torch(make, dtype), dtype
    )


def test_first_matching_group_takes_a_key() -> None:
    """Each key goes to the first group that matches it, then to the default."""
    params = ParamDict.from_module(make_model())
    opt = optim.ParamGroups(
        {
            ("2.*", "*.bias"): optim.SGD(lr=0.1),
            "0.*": optim.SGD(lr=0.2, momentum=0.5),
        }
    )
    first, second = opt.init(params)
    assert first.momentum_buffer == ParamDict()
    assert list(second.momentum_buffer) == ["0.weight"]
    new, _ = opt.step(params, params, (first, second))
    assert list(new) == list(params)
    torch.testing.assert_close(new["0.bias"], params["0.bias"] * 0.9)
    torch.testing.assert_close(new["0.weight"], params["0.weight"] * 0.8)


def test_a_group_left_without_keys_keeps_its_state() -> None:
    """A default that matches nothing steps fine; its state is passed along."""
    params = ParamDict(w=torch.ones(2), b=torch.ones(1))
    opt = optim.ParamGroups({"*": optim.Adam(lr=0.1)}, default=optim.Adam())
    state = opt.init(params)
    new, new_state = opt.step(params, params, state)
    assert new_state[1] is state[1]
    assert int(new_state[0].step) == 1
    torch.testing.assert_close(new["w"], torch.full((2,), 0.9))


def test_pattern_that_matches_nothing_is_refused() -> None:
    """A misspelled pattern is an error naming it, not a silent no-op."""
    params = ParamDict.from_module(make_model())
    opt = optim.ParamGroups({"*.bais": optim.SGD()}, default=optim.SGD())
    with pytest.raises(ValueError, match=r"patterns \['\*\.bais'\] match no key"):
        opt.init(params)


def test_keys_without_group_need_a_default() -> None:
    """Without `default`, every key must match a group; the others are named."""
    params = ParamDict.from_module(make_model())
    opt = optim.ParamGroups({"*.bias": optim.SGD()})
    with pytest.raises(
        ValueError, match=r"keys \['0\.weight', '2\.weight'\] match no group"
    ):
        opt.init(params)


def test_groups_must_agree_on_differentiable() -> None:
    """Mixing differentiable and default groups would be a third mode: refused."""
    with pytest.raises(ValueError, match="share one `differentiable` setting"):
        optim.ParamGroups(
            {"*.bias": optim.SGD(differentiable=True)}, default=optim.SGD()
        )


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ({3: optim.SGD()}, r"pattern or a non-empty tuple of patterns"),
        ({("*", 3): optim.SGD()}, r"or a predicate on \(name, tensor\), got"),
        ({(): optim.SGD()}, r"pattern or a non-empty tuple of patterns"),
        (
            {"*": torch.optim.SGD},
            r"needs a paramdict optimizer .* got the group '\*': type",
        ),
    ],
)
def test_groups_of_the_wrong_kind_are_refused(groups: Any, match: str) -> None:
    """Group keys must be patterns and values paramdict optimizers."""
    with pytest.raises(TypeError, match=match):
        optim.ParamGroups(groups)


def test_state_of_another_optimizer_is_refused() -> None:
    """A state with the wrong number of groups is an error, before any work."""
    params = ParamDict(w=torch.ones(2), b=torch.ones(1))
    opt = optim.ParamGroups({"b": optim.SGD()}, default=optim.SGD())
    with pytest.raises(ValueError, match="state has 1 entries but these ParamGroups"):
        opt.step(params, params, (optim.SGD().init(params),))


def test_groups_are_differentiable_when_their_optimizers_are() -> None:
    """The meta-gradient flows through every group of a differentiable split."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0], requires_grad=True)
    params = ParamDict(w=w, b=b)
    opt = optim.ParamGroups(
        {"w": optim.SGD(lr=0.5, differentiable=True)},
        default=optim.SGD(lr=0.25, differentiable=True),
    )
    assert opt.differentiable
    grads = params.grad((params**2).sum(), create_graph=True)
    new, _ = opt.step(params, grads, opt.init(params))
    # new_w = w - 0.5 * 2 w = 0, new_b = b - 0.25 * 2 b = b / 2
    meta = params.grad(new.sum())
    torch.testing.assert_close(meta["w"], torch.zeros(2))
    torch.testing.assert_close(meta["b"], torch.tensor([0.5]))
