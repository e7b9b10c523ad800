"""Pytree flatten + unflatten: a ParamDict against a plain dict (and a TensorDict).

Each call is `leaves, spec = tree_flatten(tree)` then `tree_unflatten(leaves, spec)`
with `torch.utils._pytree`, the pytree library `torch.func` and `torch.compile`
use, on the same tensors. Part of `python -m benchmarks` (run only this with
`--only pytree`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from paramdict import ParamDict

from . import _peers
from ._agree import check_agreement
from ._report import OURS, Config, Row, Section

__all__ = ["measure"]


def _round_trip(tree: Any) -> Callable[[], object]:
    def run() -> object:
        leaves, spec = pytree.tree_flatten(tree)
        return pytree.tree_unflatten(leaves, spec)

    return run


def measure(config: Config) -> Section:
    """Time the round trip at every size."""
    section = Section(
        "pytree",
        "Pytree flatten + unflatten",
        "`torch.utils._pytree.tree_flatten`, then `tree_unflatten` of its leaves and "
        "spec, one round trip per call.",
    )
    td = _peers.load("tensordict")
    for entries, elements in config.sizes:
        gen = torch.Generator().manual_seed(0)
        plain = {
            f"layers.{i}.weight": torch.randn(elements, generator=gen)
            for i in range(entries)
        }
        candidates = {
            OURS: _round_trip(ParamDict(plain)),
            "dict": _round_trip(plain),
        }
        if td is not None:
            candidates["tensordict"] = _round_trip(td.TensorDict(plain, batch_size=[]))
        results = {name: fn() for name, fn in candidates.items()}
        if not isinstance(results[OURS], ParamDict):
            msg = f"The round trip returned {type(results[OURS]).__name__}."
            raise TypeError(msg)
        check_agreement(results, list(plain), reference=OURS)
        row = Row.from_timings(
            "flatten + unflatten", f"{entries} x {elements:,}", config.time(candidates)
        )
        section.rows.append(row)
    if td is None:
        section.notes.append(_peers.skipped("tensordict", what="tensordict"))
    return section
