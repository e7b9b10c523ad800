"""The optimizers from papers against the published packages, step for step.

Each test runs where its package imports (`pip install -e '.[refs]'`:
`schedulefree`, `pytorch-optimizer`) and skips with the reason otherwise; the
plain-torch references of `test_optim_paper_modes.py` always run. Both sides
take 25 float64 steps from the same parameters on the same gradients (new at
every step) and are compared after each.

Agreement: Schedule-Free AdamW equals `schedulefree.AdamWScheduleFree` to the
bit (`y`, `z`, and our `eval_params` with its `eval()`), as the order of
operations is the package's. AdEMAMix and Adan equal `pytorch_optimizer`'s to a
few ulps (it interpolates with `lerp` where the authors' code, which ours
follows, scales and adds). SOAP, with the QR of its refreshes in float32 as
`pytorch_optimizer` computes it (`qr_dtype=torch.float32`), equals it to 1e-10
(its eigenvalue estimate is a column sum, its decay `p * (1 - lr * decay)`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from paper_cases import gradients, start
from torch import nn

from paramdict import ParamDict, optim

STEPS = 25


def _where(label: str) -> Callable[[str], str]:
    return lambda message: f"{label}: {message}"


def _against(
    package: Any,
    ours: optim.Optimizer[Any],
    *,
    rtol: float,
    atol: float,
    keys: tuple[str, ...] = ("w", "b", "t"),
    train: bool = False,
) -> tuple[Any, list[nn.Parameter], ParamDict, Any]:
    """Step `package` (a class taking the leaves) and `ours` side by side."""
    params = ParamDict({k: v for k, v in start().items() if k in keys})
    leaves = [nn.Parameter(v.clone()) for v in params.values()]
    theirs = package(leaves)
    if train:
        theirs.train()
    state = ours.init(params)
    for step, g in enumerate(gradients(params, STEPS), start=1):
        for leaf, grad in zip(leaves, g.values(), strict=True):
            leaf.grad = grad.clone()
        theirs.step()
        params, state = ours.step(params, g, state)
        for (key, value), leaf in zip(params.items(), leaves, strict=True):
            torch.testing.assert_close(
                value,
                leaf.detach(),
                rtol=rtol,
                atol=atol,
                msg=_where(f"{key} after step {step}"),
            )
    return theirs, leaves, params, state


SF: dict[str, Any] = {
    "lr": 0.01,
    "betas": (0.9, 0.999),
    "weight_decay": 0.1,
    "warmup_steps": 5,
    "r": 0.5,
    "weight_lr_power": 2.0,
}


@pytest.mark.parametrize("foreach", [True, False])
def test_schedule_free_adamw_equals_schedulefree_bitwise(foreach: bool) -> None:
    """y, z and the evaluation point equal `AdamWScheduleFree`'s, to the bit."""
    schedulefree = pytest.importorskip(
        "schedulefree", reason="the `refs` extra installs schedulefree"
    )
    opt = optim.ScheduleFreeAdamW(**SF)

    def package(leaves: list[nn.Parameter]) -> Any:
        return schedulefree.AdamWScheduleFree(leaves, foreach=foreach, **SF)

    theirs, leaves, params, state = _against(package, opt, rtol=0, atol=0, train=True)
    for leaf, z in zip(leaves, state.z.values(), strict=True):
        torch.testing.assert_close(theirs.state[leaf]["z"], z, rtol=0, atol=0)
    x = opt.eval_params(params, state)
    theirs.eval()  # moves its parameters to x
    for leaf, value in zip(leaves, x.values(), strict=True):
        torch.testing.assert_close(leaf.detach(), value, rtol=0, atol=0)


ADEMAMIX: dict[str, Any] = {
    "lr": 0.01,
    "betas": (0.9, 0.999, 0.9999),
    "alpha": 5.0,
    "t_alpha_beta3": 10,
    "weight_decay": 0.1,
}


@pytest.mark.parametrize("warmup", [10, None])
def test_ademamix_equals_pytorch_optimizer(warmup: int | None) -> None:
    """Equal to `pytorch_optimizer.AdEMAMix` (decoupled decay) to a few ulps."""
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )
    options = {**ADEMAMIX, "t_alpha_beta3": warmup}

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.AdEMAMix(leaves, weight_decouple=True, **options)

    _against(package, optim.AdEMAMix(**options), rtol=1e-12, atol=1e-14)


ADAN: dict[str, Any] = {"lr": 0.01, "betas": (0.98, 0.92, 0.99), "weight_decay": 0.1}


@pytest.mark.parametrize("no_prox", [False, True])
def test_adan_equals_pytorch_optimizer(no_prox: bool) -> None:
    """Equal to `pytorch_optimizer.Adan` to a few ulps; its `weight_decouple`."""
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.Adan(leaves, weight_decouple=no_prox, **ADAN)

    opt = optim.Adan(no_prox=no_prox, **ADAN)
    _against(package, opt, rtol=1e-12, atol=1e-14)


SOAP: dict[str, Any] = {"lr": 0.01, "betas": (0.95, 0.95), "weight_decay": 0.01}
SOAP_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "refresh every 5 steps": ({"precondition_frequency": 5}, ("w", "b", "t")),
    "1-D preconditioned": (
        {"precondition_frequency": 5, "precondition_1d": True},
        ("w", "b", "t"),
    ),
    "normalized, no bias correction": (
        {
            "precondition_frequency": 3,
            "normalize_grads": True,
            "correct_bias": False,
            "shampoo_beta": 0.9,
            "eps": 1e-30,
        },
        ("w", "b", "t"),
    ),
    # pytorch_optimizer reshapes a tensor merged into one dimension to [1]:
    # here `w` stays (4, 3) and `t` becomes (4, 3).
    "merged dims": (
        {"precondition_frequency": 5, "merge_dims": True, "max_precond_dim": 4},
        ("w", "t"),
    ),
    "dims over the maximum": (
        {"precondition_frequency": 5, "max_precond_dim": 3},
        ("w", "b", "t"),
    ),
}


@pytest.mark.parametrize("case", list(SOAP_CASES))
def test_soap_equals_pytorch_optimizer(case: str) -> None:
    """Equal to `pytorch_optimizer.SOAP` to 1e-10, its float32 QR mirrored.

    `normalized` runs with eps 1e-30, the constant the authors (and ours) add to
    the RMS, where pytorch_optimizer adds eps.
    """
    po = pytest.importorskip(
        "pytorch_optimizer", reason="the `refs` extra installs pytorch_optimizer"
    )
    options, keys = SOAP_CASES[case]
    options = {**SOAP, **options}
    renamed = {
        "max_precond_dim": "max_precondition_dim",
        "normalize_grads": "normalize_gradient",
    }
    theirs = {renamed.get(k, k): v for k, v in options.items()}

    def package(leaves: list[nn.Parameter]) -> Any:
        return po.SOAP(leaves, **theirs)

    opt = optim.SOAP(qr_dtype=torch.float32, **options)
    _against(package, opt, rtol=1e-10, atol=1e-12, keys=keys)
