"""Step sizes as Python floats where torch.optim computes them so (eager, CPU).

The Adam family's rules read the step counter on the host when that is free and
compute bias corrections and step sizes with Python floats, as torch's default
(single-tensor) implementations do: the same numbers, so the trajectories are
torch's bit for bit, and a step size reaches `addcdiv` as a number (one pass
over memory fewer than a 0-dim tensor, which multiplies its operand first).
Traced, differentiable, per-key or with a tensor `lr` the rules keep computing
on tensors (checked against torch within rounding elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from optim_cases import run_ours, run_torch
from torch.utils._python_dispatch import TorchDispatchMode

from paramdict import ParamDict, optim
from paramdict.optim._hyper import host_numbers

# (ours, theirs, options): rules that compute their step sizes on the host.
RULES = [
    pytest.param(optim.Adam, torch.optim.Adam, {}, id="adam"),
    pytest.param(
        optim.Adam,
        torch.optim.Adam,
        {"amsgrad": True, "weight_decay": 0.1, "maximize": True},
        id="adam-amsgrad",
    ),
    pytest.param(optim.AdamW, torch.optim.AdamW, {"weight_decay": 0.1}, id="adamw"),
    pytest.param(optim.Adamax, torch.optim.Adamax, {}, id="adamax"),
    pytest.param(
        optim.Adamax,
        torch.optim.Adamax,
        {"weight_decay": 0.1, "maximize": True},
        id="adamax-decay",
    ),
    pytest.param(optim.NAdam, torch.optim.NAdam, {}, id="nadam"),
    pytest.param(
        optim.NAdam,
        torch.optim.NAdam,
        {"decoupled_weight_decay": True, "weight_decay": 0.1, "momentum_decay": 0.01},
        id="nadam-decoupled",
    ),
]


def _rule(ours: Callable[..., optim.Optimizer[Any]], **options: Any) -> Any:
    """`ours` running its rule (Adam and AdamW would take the fused kernel)."""
    if ours in (optim.Adam, optim.AdamW):
        options["fused"] = False
    return ours(**options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(("ours", "theirs", "options"), RULES)
def test_the_rule_is_torch_s_default_path_bit_for_bit(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    options: dict[str, Any],
    in_place: bool,
    dtype: torch.dtype,
) -> None:
    """100 steps of the MLP give torch.optim's default path's bytes (CPU)."""
    expected = run_torch(lambda m: theirs(m.parameters(), **options), dtype)
    actual = run_ours(_rule(ours, **options), dtype, in_place=in_place)
    torch.testing.assert_close(dict(actual), expected, rtol=0, atol=0)


def test_host_numbers_reads_only_what_is_free() -> None:
    """Numbers and 0-dim CPU tensors are read; anything else keeps the tensors."""
    step = torch.tensor(4.0, dtype=torch.float64)
    assert host_numbers(False, step, 0.5, torch.tensor(0.75)) == (4.0, 0.5, 0.75)
    # Differentiable: read as torch's differentiable steps read them, unless
    # autograd records the value (a learned rate stays a tensor).
    assert host_numbers(True, step, 0.5) == (4.0, 0.5)
    assert host_numbers(True, step, torch.tensor(0.5, requires_grad=True)) is None
    assert host_numbers(False, step, ParamDict(w=torch.tensor(0.5))) is None
    assert host_numbers(False, torch.tensor(4.0, device="meta")) is None

    def traced(x: torch.Tensor) -> Any:
        return torch.tensor(host_numbers(False, x) is None)

    assert torch.func.vmap(traced)(torch.ones(3)).all()


class _Scalars(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves this base untyped
    """Record the operations of a block that make a 0-dim tensor."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped torch base
        self.made: set[str] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            self.made.add(str(func))
        return out


@pytest.mark.parametrize(("ours", "theirs", "options"), RULES)
def test_an_eager_step_computes_no_scalar_tensor_chain(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    options: dict[str, Any],
) -> None:
    """The bias corrections and step sizes are no 0-dim tensor arithmetic.

    What is left: the counter's `+ 1` (and NAdam's kept `mu_product *= mu`),
    the rates the kernels take as tensors (`full`) and the state's write-back.
    """
    del theirs
    opt = _rule(ours, **options)
    params = ParamDict(w=torch.randn(3, 2), b=torch.randn(2))
    state = opt.init(params)
    grads = params.ones_like()
    params, state = opt.step_(params, grads, state)
    with _Scalars() as scalars:
        opt.step_(params, grads, state)
    left = {"aten.add.Tensor", "aten.full.default", "aten.copy_.default"}
    if ours is optim.NAdam:
        left.add("aten.mul_.Tensor")
    assert scalars.made <= left


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    choice=st.sampled_from(["adam", "adamw", "adamax", "nadam"]),
    lr=st.floats(1e-4, 0.5),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.5, 0.9999),
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
    maximize=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    in_place=st.booleans(),
)
def test_host_step_sizes_are_torch_s_for_any_hyperparameters(
    choice: str,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    maximize: bool,
    dtype: torch.dtype,
    in_place: bool,
) -> None:
    """Random rates and betas: 20 steps are torch.optim's default path, bit for bit.

    `differentiable=True` runs torch's differentiable arithmetic instead (Adam's
    bias corrections on a float32 step tensor), which at rates such as 0.5 drifts
    from the default path as torch's own does: it is compared with torch's
    differentiable step in `test_optim_differentiable_torch.py`.
    """
    ours, theirs = {
        "adam": (optim.Adam, torch.optim.Adam),
        "adamw": (optim.AdamW, torch.optim.AdamW),
        "adamax": (optim.Adamax, torch.optim.Adamax),
        "nadam": (optim.NAdam, torch.optim.NAdam),
    }[choice]
    options: dict[str, Any] = {
        "lr": lr,
        "betas": (beta1, beta2),
        "weight_decay": weight_decay,
        "maximize": maximize,
    }
    expected = run_torch(lambda m: theirs(m.parameters(), **options), dtype, steps=20)
    actual = run_ours(_rule(ours, **options), dtype, steps=20, in_place=in_place)
    torch.testing.assert_close(dict(actual), expected, rtol=0, atol=0)
