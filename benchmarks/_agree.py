"""Refuse to time candidates that compute different things.

Every section runs each candidate once and checks its result against ParamDict's
before anything is timed, so a table never compares unequal work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["as_tensors", "check_agreement"]


def as_tensors(result: Any, keys: Sequence[str]) -> dict[str, Tensor]:
    """Return a candidate's result as a plain `{key: tensor}` dict.

    Mappings (ParamDicts, dicts, TensorDicts) are read by key; sequences are
    matched to `keys` in order; a single tensor is keyed `"value"`.
    """
    if isinstance(result, Tensor):
        return {"value": result}
    if isinstance(result, Mapping) or hasattr(result, "keys"):
        return {k: result[k] for k in keys}
    values = list(result)
    if len(values) != len(keys):
        msg = f"Expected {len(keys)} tensors, got {len(values)}."
        raise ValueError(msg)
    return dict(zip(keys, values))


def check_agreement(
    results: Mapping[str, Any],
    keys: Sequence[str],
    *,
    reference: str,
    rtol: float | None = None,
    atol: float | None = None,
) -> None:
    """Raise unless every result equals the `reference` candidate's, entry by entry.

    Args:
        results: Candidate name to its result.
        keys: The entry names, in order (for results given as sequences).
        reference: The candidate the others must match.
        rtol: Relative tolerance (`torch.testing.assert_close`'s default if `None`).
        atol: Absolute tolerance (likewise).

    Raises:
        AssertionError: If a result differs; the message names the candidate.
    """
    expected = as_tensors(results[reference], keys)
    for name, result in results.items():
        got = as_tensors(result, keys)
        for key in expected:
            try:
                torch.testing.assert_close(
                    got[key].detach(),
                    expected[key].detach(),
                    rtol=rtol,
                    atol=atol,
                )
            except AssertionError as err:
                msg = f"{name} differs from {reference} at {key!r}: {err}"
                raise AssertionError(msg) from err
