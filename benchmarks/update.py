"""The parameter update and the global norm: ParamDict against plain torch and peers.

Candidates, at every size, each computing the same values from the same tensors:

- `ParamDict`: `p - lr * g`, `p.sub(g, alpha=lr)`, `p.norm()`;
- `dict comprehension`: `{k: p[k] - lr * g[k] for k in p}` on plain dicts, and
  `{k: torch.sub(p[k], g[k], alpha=lr) for k in p}`;
- `per-entry loop`: `torch.stack([v.norm() for v in p.values()])`, then its norm;
- `tensordict`: the same arithmetic on `TensorDict`s of the same entries;
- `foreach (lists)`: bare `torch._foreach_*` calls on prepared lists, the floor;
- `foreach + dict`: the floor plus `dict(zip(keys, ...))`, a keyed result.

`p - lr * g, recorded` is the same update with `p` requiring grad, so autograd
records it (as in a MAML inner step); there ParamDict runs per entry on CPU, which
keeps less memory alive for the backward pass than the foreach kernels do.

Part of `python -m benchmarks` (run only this with `--only update`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from paramdict import ParamDict

from . import _peers
from ._agree import check_agreement
from ._report import OURS, Config, Row, Section, Target, ratio_target

__all__ = ["measure"]

LR = 0.01
TARGET_SIZE = (160, 64)
"""The size of the suite-wide targets (and of the toolkit's, with `FEW_LARGE`)."""
FEW_LARGE = (8, 1600)
"""Few, large entries: where a fixed per-call cost shows most."""


def _data(entries: int, elements: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    gen = torch.Generator().manual_seed(0)

    def make() -> dict[str, Tensor]:
        return {
            f"layers.{i}.weight": torch.randn(elements, generator=gen)
            for i in range(entries)
        }

    return make(), make()


def _candidates(
    entries: int, elements: int
) -> tuple[list[str], dict[str, dict[str, Callable[[], object]]]]:
    """Return the keys and, per case, the candidates at one size."""
    pd, gd = _data(entries, elements)
    keys = list(pd)
    values, grads = list(pd.values()), list(gd.values())
    p, g = ParamDict(pd), ParamDict(gd)

    def floor_update() -> list[Tensor]:
        return list(torch._foreach_sub(values, torch._foreach_mul(grads, LR)))

    def floor_sub() -> list[Tensor]:
        return list(torch._foreach_sub(values, grads, alpha=LR))

    def floor_norm() -> Tensor:
        norms = torch.stack(torch._foreach_norm(values))
        out: Tensor = torch.linalg.vector_norm(norms)
        return out

    def stacked_norm() -> Tensor:
        norms = torch.stack([v.norm() for v in pd.values()])
        out: Tensor = torch.linalg.vector_norm(norms)
        return out

    cases: dict[str, dict[str, Callable[[], object]]] = {
        "p - lr * g": {
            OURS: lambda: p - LR * g,
            "dict comprehension": lambda: {k: pd[k] - LR * gd[k] for k in pd},
            "foreach (lists)": floor_update,
            "foreach + dict": lambda: dict(zip(keys, floor_update())),
        },
        "p.sub(g, alpha=lr)": {
            OURS: lambda: p.sub(g, alpha=LR),
            "dict comprehension": lambda: {
                k: torch.sub(pd[k], gd[k], alpha=LR) for k in pd
            },
            "foreach (lists)": floor_sub,
            "foreach + dict": lambda: dict(zip(keys, floor_sub())),
        },
        "p.norm()": {
            OURS: p.norm,
            "per-entry loop": stacked_norm,
            "foreach (lists)": floor_norm,
        },
    }
    # The same update while autograd records it (the MAML inner step): `p` requires
    # grad. ParamDict then runs per entry on CPU, to save memory (see `_foreach`).
    rp = ParamDict({k: v.detach().requires_grad_() for k, v in pd.items()})
    rd = dict(rp)
    rvalues = list(rd.values())
    cases["p - lr * g, recorded"] = {
        OURS: lambda: rp - LR * g,
        "dict comprehension": lambda: {k: rd[k] - LR * gd[k] for k in rd},
        "foreach + dict": lambda: dict(
            zip(keys, torch._foreach_sub(rvalues, torch._foreach_mul(grads, LR)))
        ),
    }
    td = _peers.load("tensordict")
    if td is not None:
        tp: Any = td.TensorDict(pd, batch_size=[])
        tg: Any = td.TensorDict(gd, batch_size=[])
        cases["p - lr * g"]["tensordict"] = lambda: tp - LR * tg
        cases["p.sub(g, alpha=lr)"]["tensordict"] = lambda: tp.sub(tg, alpha=LR)
    return keys, cases


def _targets(
    rows: dict[tuple[str, tuple[int, int]], Row],
    size: tuple[int, int],
    *,
    floor: bool,
) -> list[Target]:
    """The update targets at one size; with `floor`, also against bare foreach."""
    at = f"{size[0]} x {size[1]:,}"
    sub = rows.get(("p.sub(g, alpha=lr)", size))
    targets = []
    if floor:
        targets.append(
            ratio_target(
                f"`p.sub(g, alpha=lr)` within 1.10x of bare foreach (lists), {at}",
                sub,
                OURS,
                "foreach (lists)",
                1.10,
            )
        )
    return [
        *targets,
        ratio_target(
            f"`p.sub(g, alpha=lr)` within 1.10x of bare foreach + dict, {at}",
            sub,
            OURS,
            "foreach + dict",
            1.10,
        ),
        ratio_target(
            f"`p - lr * g` at least 1.3x faster than the dict comprehension, {at}",
            rows.get(("p - lr * g", size)),
            "dict comprehension",
            OURS,
            1.3,
            at_least=True,
        ),
        ratio_target(
            f"`p.norm()` at least 3x faster than stacking per-entry norms, {at}",
            rows.get(("p.norm()", size)),
            "per-entry loop",
            OURS,
            3.0,
            at_least=True,
        ),
    ]


def measure(config: Config) -> Section:
    """Time every case at every size; check the update targets at two sizes."""
    section = Section(
        "update",
        "Update and norm",
        "Each call evaluates the expression on the same float32 inputs, "
        f"`lr = {LR}`, without autograd except in the `recorded` rows (where `p` "
        "requires grad). `foreach (lists)` is the bare kernels on prepared lists, "
        "with `lr` a Python number, and no keys.",
    )
    rows: dict[tuple[str, tuple[int, int]], Row] = {}
    for entries, elements in config.sizes:
        keys, cases = _candidates(entries, elements)
        for case, candidates in cases.items():
            check_agreement(
                {name: fn() for name, fn in candidates.items()}, keys, reference=OURS
            )
            row = Row.from_timings(
                case, f"{entries} x {elements:,}", config.time(candidates)
            )
            rows[case, (entries, elements)] = row
            section.rows.append(row)
    if _peers.load("tensordict") is None:
        section.notes.append(_peers.skipped("tensordict", what="tensordict"))
    for size in (TARGET_SIZE, FEW_LARGE):
        section.targets += _targets(rows, size, floor=size == TARGET_SIZE)
    return section
