"""Configurations: torch.optim's names and defaults, validation, immutability."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from _torch_versions import torch_at_least
from optim_cases import classes

from paramdict import ParamDict, optim

SHARED = ("differentiable", "capturable")
"""Options every optimizer of ours takes, also where torch's class has none."""


def _newer_than_torch(ours: type[Any], name: str) -> bool:
    """Whether `name` is a hyperparameter that the installed torch.optim lacks."""
    return ours is optim.LBFGS and name == "maximize" and not torch_at_least(2, 14)


@pytest.mark.parametrize(("ours", "theirs"), classes())
def test_hyperparameters_are_torchs_names_and_defaults(
    ours: type[Any], theirs: type[torch.optim.Optimizer]
) -> None:
    """Every hyperparameter is named and defaulted as in torch.optim."""
    signature = inspect.signature(theirs)
    for field in attrs.fields(ours):
        if not field.init:
            continue  # not a constructor argument (Muon's fixed `maximize=False`)
        if field.name in SHARED and field.name not in signature.parameters:
            continue  # ours for every optimizer; torch.optim.Muon has none
        if _newer_than_torch(ours, field.name):
            continue
        assert field.name in signature.parameters, field.name
        expected = signature.parameters[field.name].default
        assert field.default == expected, field.name
    # Everything of torch's that changes the arithmetic is here too; the rest
    # selects torch's kernels (foreach, fused) or CUDA-graph capture.
    implementation = {"params", "foreach", "fused", "capturable"}
    missing = set(signature.parameters) - implementation - set(attrs.fields_dict(ours))
    assert not missing


@pytest.mark.parametrize(("ours", "theirs"), classes())
def test_default_configuration_is_torchs_defaults(
    ours: type[Any], theirs: Callable[..., torch.optim.Optimizer]
) -> None:
    """A default configuration holds the values of torch.optim's `defaults`."""
    # 2-D: torch.optim.Muon refuses anything else.
    reference = theirs([torch.zeros(2, 2, requires_grad=True)])
    config = ours()
    for field in attrs.fields(ours):
        if not field.init:
            continue  # not a constructor argument (Muon's fixed `maximize=False`)
        if field.name in SHARED and field.name not in reference.defaults:
            continue  # ours for every optimizer; torch's Muon and Adafactor have none
        if _newer_than_torch(ours, field.name):
            continue
        assert getattr(config, field.name) == reference.defaults[field.name], field.name


BAD_VALUES = [
    (optim.SGD, {"lr": -0.1}, ValueError, r"`lr` must be non-negative, got -0\.1"),
    (optim.SGD, {"momentum": -1}, ValueError, r"`momentum` must be non-negative"),
    (optim.SGD, {"weight_decay": -1}, ValueError, r"`weight_decay` must be non-neg"),
    (
        optim.SGD,
        {"nesterov": True},
        ValueError,
        r"`nesterov=True` needs `momentum > 0` and `dampening == 0`",
    ),
    (
        optim.SGD,
        {"nesterov": True, "momentum": 0.9, "dampening": 0.1},
        ValueError,
        r"dampening=0\.1",
    ),
    (optim.SGD, {"lr": "0.1"}, TypeError, r"`lr` must be a number, a 0-dim tensor"),
    (optim.SGD, {"lr": True}, TypeError, r"`lr` must be a number"),
    (optim.SGD, {"dampening": None}, TypeError, r"`dampening` must be a number"),
    (
        optim.SGD,
        {"lr": torch.ones(2)},
        ValueError,
        r"`lr` must be a 0-dim tensor .* got shape \(2,\)\. For per-entry values",
    ),
    (
        optim.SGD,
        {"lr": torch.tensor(1)},
        TypeError,
        r"`lr` must be a floating-point tensor, got torch\.int64",
    ),
    (optim.Adam, {"betas": (1.0, 0.999)}, ValueError, r"`betas\[0\]` must be in"),
    (optim.Adam, {"betas": (0.9, -0.1)}, ValueError, r"`betas\[1\]` must be in"),
    (optim.Adam, {"betas": (0.9,)}, TypeError, r"`betas` must be a pair of numbers"),
    (optim.Adam, {"eps": -1e-8}, ValueError, r"`eps` must be non-negative"),
    (optim.AdamW, {"weight_decay": -0.01}, ValueError, r"`weight_decay` must be"),
    (optim.RMSprop, {"alpha": 1.5}, ValueError, r"`alpha` must be in \[0, 1\]"),
    (optim.RMSprop, {"momentum": -0.5}, ValueError, r"`momentum` must be non-neg"),
    (optim.Adagrad, {"lr_decay": -1}, ValueError, r"`lr_decay` must be non-neg"),
    (
        optim.Adagrad,
        {"initial_accumulator_value": -1},
        ValueError,
        r"`initial_accumulator_value` must be non-negative",
    ),
]


@pytest.mark.parametrize(("cls", "kwargs", "error", "match"), BAD_VALUES)
def test_invalid_hyperparameters_are_refused_by_name(
    cls: type[Any], kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad hyperparameter raises at construction, naming the argument."""
    with pytest.raises(error, match=match):
        cls(**kwargs)


def test_configurations_are_immutable() -> None:
    """Setting a hyperparameter on a configuration raises."""
    opt = optim.Adam()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        opt.lr = 0.1  # type: ignore[misc]  # the point of the test


def test_hyperparameters_are_keyword_only() -> None:
    """Hyperparameters are options: passing one by position is a TypeError."""
    with pytest.raises(TypeError, match="positional"):
        optim.SGD(0.1)  # type: ignore[arg-type, call-arg]  # the point of the test


def test_repr_shows_every_hyperparameter() -> None:
    """The repr reads like the call that built the configuration."""
    assert repr(optim.SGD(lr=0.1, momentum=0.9)) == (
        "SGD(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=0.0, "
        "nesterov=False, maximize=False, capturable=False, differentiable=False, "
        "fused=None)"
    )


def test_per_key_rate_with_other_keys_is_refused_by_init() -> None:
    """A per-key learning rate must have the parameters' keys, named if not."""
    params = ParamDict(w=torch.zeros(2), b=torch.zeros(1))
    opt = optim.SGD(lr=ParamDict(w=torch.tensor(0.1), c=torch.tensor(0.1)))
    with pytest.raises(
        ValueError, match=r"missing \['b'\], unexpected \['c'\].*one value per param"
    ):
        opt.init(params)


def test_gradients_with_other_keys_are_refused_by_step() -> None:
    """Gradients must have the parameters' keys; the message names the others."""
    params = ParamDict(w=torch.zeros(2), b=torch.zeros(1))
    opt = optim.Adam()
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['x'\]"):
        opt.step(params, {"w": torch.zeros(2), "x": torch.zeros(1)}, state)


def test_gradients_in_another_order_are_aligned() -> None:
    """A gradient mapping in any key order updates the right entries."""
    params = ParamDict(w=torch.zeros(2), b=torch.zeros(1))
    opt = optim.SGD(lr=1.0)
    new, _ = opt.step(
        params,
        {"b": torch.tensor([1.0]), "w": torch.tensor([2.0, 3.0])},
        opt.init(params),
    )
    assert list(new) == ["w", "b"]
    torch.testing.assert_close(new["w"], torch.tensor([-2.0, -3.0]))
    torch.testing.assert_close(new["b"], torch.tensor([-1.0]))


def test_complex_or_integer_parameters_are_refused() -> None:
    """Only real floating-point tensors are optimized; others are named."""
    params = ParamDict(
        w=torch.zeros(2),
        z=torch.zeros(2, dtype=torch.complex64),
        n=torch.zeros(1).long(),
    )
    with pytest.raises(TypeError, match=r"\['n', 'z'\] are not"):
        optim.Adam().init(params)


def test_subclasses_keep_their_type_through_step() -> None:
    """A ParamDict subclass comes back from `step` as that subclass."""

    class Weights(ParamDict):
        __slots__ = ()

    params = Weights(w=torch.zeros(2))
    opt = optim.RMSprop(momentum=0.5)
    new, _ = opt.step(params, {"w": torch.ones(2)}, opt.init(params))
    assert type(new) is Weights


def _flag_options() -> list[tuple[type[Any], str]]:
    """Every (optimizer, option) whose default is True or False."""
    found: list[tuple[type[Any], str]] = []
    for name in optim.__all__:
        cls = getattr(optim, name)
        if isinstance(cls, type) and issubclass(cls, optim.TorchOptimizer):
            for field in attrs.fields(cls):
                if field.init and isinstance(field.default, bool):
                    found.append((cls, field.name))
    return found


@pytest.mark.parametrize(
    ("cls", "option"), _flag_options(), ids=lambda v: getattr(v, "__name__", v)
)
def test_every_flag_option_refuses_a_non_bool(cls: type[Any], option: str) -> None:
    """`Adam(amsgrad="yes")` and the like are refused, naming the option."""
    with pytest.raises(TypeError, match=rf"`{option}` must be True or False"):
        cls(**{option: "yes"})
