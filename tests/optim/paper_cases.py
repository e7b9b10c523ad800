"""The optimizers from papers (no torch.optim counterpart), each with its reference.

One row per optimizer: the `paramdict.optim` class with a configuration that
turns on most of its options, and the plain-torch reference of `references.py`
that it must equal step for step. `reference_run` runs a reference on keyed
parameters, so every mode test compares with the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from references import (
    adan_init,
    adan_step,
    ademamix_init,
    ademamix_step,
    schedule_free_adamw_init,
    schedule_free_adamw_step,
    soap_init,
    soap_step,
)
from torch import Tensor

from paramdict import ParamDict, optim

DTYPE = torch.float64


@dataclass(frozen=True)
class Row:
    """One optimizer and its reference."""

    name: str
    cls: Callable[..., optim.TorchOptimizer[Any]]
    options: dict[str, Any]
    """Options beside `lr`, on both sides (the reference takes the same names)."""
    init: Callable[[list[Tensor]], Any]
    step: Callable[..., tuple[list[Tensor], Any]]
    lr: float = 0.01
    cases: dict[str, dict[str, Any]] = field(default_factory=dict)
    """More option sets checked against the reference, by id."""

    def make(self, **overrides: Any) -> optim.TorchOptimizer[Any]:
        """Return the optimizer with the row's options (and `lr`), overridden."""
        return self.cls(**{"lr": self.lr, **self.options, **overrides})


ROWS: list[Row] = [
    Row(
        "schedule_free_adamw",
        optim.ScheduleFreeAdamW,
        {"weight_decay": 0.1, "warmup_steps": 5, "r": 0.5, "betas": (0.9, 0.99)},
        schedule_free_adamw_init,
        schedule_free_adamw_step,
        cases={
            "defaults": {},
            "power-1-eps": {"weight_lr_power": 1.0, "eps": 1e-3},
        },
    ),
    Row(
        "ademamix",
        optim.AdEMAMix,
        {"alpha": 5.0, "t_alpha_beta3": 10, "weight_decay": 0.1},
        ademamix_init,
        ademamix_step,
        cases={
            "defaults": {},
            "no-warmup-betas": {"betas": (0.8, 0.99, 0.999), "alpha": 8.0},
        },
    ),
    Row(
        "adan",
        optim.Adan,
        {"weight_decay": 0.1},
        adan_init,
        adan_step,
        cases={
            "defaults": {},
            "no-prox-betas": {
                "no_prox": True,
                "weight_decay": 0.05,
                "betas": (0.9, 0.9, 0.95),
            },
        },
    ),
    Row(
        "soap",
        optim.SOAP,
        {"precondition_frequency": 3, "weight_decay": 0.1},
        soap_init,
        soap_step,
        cases={
            "defaults": {},
            "1d-normalized-no-bias-correction": {
                "precondition_frequency": 4,
                "precondition_1d": True,
                "normalize_grads": True,
                "correct_bias": False,
                "shampoo_beta": 0.8,
            },
            "merged-bounded": {
                "precondition_frequency": 2,
                "merge_dims": True,
                "max_precond_dim": 4,
            },
            "float32-bases": {
                "precondition_frequency": 3,
                "eigh_dtype": torch.float32,
                "qr_dtype": torch.float32,
            },
        },
    ),
]


def row_params() -> list[Any]:
    """Return the rows as pytest parameters, by name."""
    return [pytest.param(row, id=row.name) for row in ROWS]


def start(seed: int = 0) -> ParamDict:
    """Return float64 parameters of a matrix, a vector and a 3-D tensor."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"w": (4, 3), "b": (3,), "t": (2, 2, 3)}
    return ParamDict(
        {k: torch.randn(s, generator=gen, dtype=DTYPE) for k, s in shapes.items()}
    )


def gradients(params: ParamDict, steps: int, seed: int = 1) -> list[ParamDict]:
    """Return `steps` random gradients keyed like `params` (new at every step)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        params.map(lambda v: torch.randn(v.shape, generator=gen, dtype=v.dtype))
        for _ in range(steps)
    ]


def reference_run(
    row: Row,
    params: ParamDict,
    grads: Sequence[ParamDict],
    lrs: Sequence[Any] | None = None,
    *,
    options: dict[str, Any] | None = None,
) -> ParamDict:
    """Run the row's reference from `params` on `grads`; return the parameters.

    `lrs` gives the rate of each step (default: the row's `lr` at every step);
    `options` replace the row's.
    """
    rates = [row.lr] * len(grads) if lrs is None else list(lrs)
    merged = row.options if options is None else options
    values = [v.detach().clone() for v in params.values()]
    state = row.init(values)
    for g, lr in zip(grads, rates, strict=True):
        values, state = row.step(values, list(g.values()), state, lr=lr, **merged)
    return ParamDict(zip(params, values, strict=True))


def run(
    opt: optim.Optimizer[Any],
    params: ParamDict,
    grads: Sequence[ParamDict],
    method: str = "step",
) -> tuple[ParamDict, Any]:
    """Step `opt` from `params` over `grads`; return the parameters and state."""
    state = opt.init(params)
    if method == "step_":
        params = params.clone()
    for g in grads:
        params, state = getattr(opt, method)(params, g, state)
    return params, state


def assert_equal_to_reference(
    got: ParamDict, want: ParamDict, *, rtol: float = 1e-13, atol: float = 1e-15
) -> None:
    """Assert keyed agreement to a few float64 ulps (the rules' own rounding)."""
    torch.testing.assert_close(
        {k: v.detach() for k, v in got.items()}, dict(want), rtol=rtol, atol=atol
    )
