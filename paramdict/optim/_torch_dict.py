"""A `torch.optim` state dict as torch saved it: its entries, their kinds, their values.

`load_torch_state_dict` reads a dict that may come from anywhere (an older torch,
a hand-edited checkpoint, another optimizer); everything it reads passes through
here first, so a malformed dict is refused with a sentence naming the entry
(`state`, `param_groups[1]`, the `step` of 'weight') and the fix, never with a
raw error of the code that would have read it. torch keeps some values per
parameter that paramdict keeps once per group (the step count, NAdam's
`mu_product`, ASGD's `eta` and `mu`): `one_per_group` takes them only where
every parameter of the group agrees.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, cast

import torch
from torch import Tensor

__all__ = [
    "check_step_argument",
    "one_per_group",
    "param_groups",
    "saved_state",
    "tensor_of",
]

_FIX = "Give what `torch.optim.<Optimizer>.state_dict()` returned."


def param_groups(state_dict: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the dict's `param_groups`, each a mapping whose `params` is a list.

    Raises:
        TypeError: If `state_dict` is not a mapping, or `param_groups` (or one
            group, or its `params`) is of another kind.
        KeyError: If `param_groups` is missing (as torch's `load_state_dict`).
    """
    given: object = state_dict
    if not isinstance(given, Mapping):
        msg = f"The state dict must be a mapping, got {type(given).__name__}. {_FIX}"
        raise TypeError(msg)
    if "param_groups" not in state_dict:
        msg = f"The state dict has no 'param_groups' entry. {_FIX}"
        raise KeyError(msg)
    groups: object = state_dict["param_groups"]
    kind = type(groups).__name__
    if isinstance(groups, (str, bytes, Mapping)) or not isinstance(groups, Sequence):
        msg = (
            "The state dict's `param_groups` must be a list of groups (dicts of "
            f"settings and `params`), got {kind}. {_FIX}"
        )
        raise TypeError(msg)
    out: list[Mapping[str, Any]] = []
    for i, group in enumerate(cast("Sequence[object]", groups)):
        if not isinstance(group, Mapping):
            msg = (
                f"The state dict's `param_groups[{i}]` must be a dict of settings "
                f"and `params`, got {type(group).__name__}. {_FIX}"
            )
            raise TypeError(msg)
        entries = cast("Mapping[str, Any]", group)
        if "params" not in entries:
            msg = (
                f"The state dict's `param_groups[{i}]` has no 'params' entry (the "
                f"indices or names of its parameters). {_FIX}"
            )
            raise KeyError(msg)
        ids: object = entries["params"]
        kind = type(ids).__name__
        if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Sequence):
            msg = (
                f"The state dict's `param_groups[{i}]['params']` must be a list of "
                f"parameter indices (or names), got {kind}. {_FIX}"
            )
            raise TypeError(msg)
        listed = cast("Sequence[object]", ids)
        bad = [
            p for p in listed if isinstance(p, bool) or not isinstance(p, (int, str))
        ]
        if bad:
            msg = (
                f"The state dict's `param_groups[{i}]['params']` must hold parameter "
                f"indices (ints) or names (strs), got {bad[0]!r}. {_FIX}"
            )
            raise TypeError(msg)
        out.append(entries)
    return out


def saved_state(state_dict: Mapping[str, Any]) -> Mapping[Any, Mapping[str, Any]]:
    """Return the dict's `state`: each parameter's entries, by index or name.

    Raises:
        KeyError: If `state` is missing (as torch's `load_state_dict`).
        TypeError: If `state` or one parameter's state is not a mapping.
    """
    if "state" not in state_dict:
        msg = (
            "The state dict has no 'state' entry (a fresh optimizer's holds an "
            f"empty one). {_FIX}"
        )
        raise KeyError(msg)
    state: object = state_dict["state"]
    if not isinstance(state, Mapping):
        msg = (
            "The state dict's `state` must be a dict from parameter index (or name) "
            f"to that parameter's state, got {type(state).__name__}. {_FIX}"
        )
        raise TypeError(msg)
    entries = cast("Mapping[object, object]", state)
    for key, value in entries.items():
        if not isinstance(value, Mapping):
            msg = (
                f"The state dict's `state[{key!r}]` must be a dict of that "
                f"parameter's buffers, got {type(value).__name__}. {_FIX}"
            )
            raise TypeError(msg)
    return cast("Mapping[Any, Mapping[str, Any]]", state)


def tensor_of(value: object, what: str) -> Tensor:
    """Return a saved buffer or count as a tensor (not a copy), checking its kind.

    Raises:
        TypeError: If `value` is neither a tensor nor a real number, or a tensor
            of another layout than torch's dense one.
        ValueError: If it is a tensor without data (on the meta device).
    """
    if isinstance(value, Tensor):
        if value.is_meta:
            msg = (
                f"The state dict's {what} is on the meta device, which holds no "
                "values. Save the state dict from a run on a real device (or load "
                "it with `map_location=` onto one)."
            )
            raise ValueError(msg)
        if value.layout != torch.strided:
            msg = (
                f"The state dict's {what} is a {value.layout} tensor; torch.optim "
                "saves dense ones. Give it as `.to_dense()`."
            )
            raise TypeError(msg)
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        msg = (
            f"The state dict's {what} must be a tensor or a number, got "
            f"{type(value).__name__}. {_FIX}"
        )
        raise TypeError(msg)
    return torch.as_tensor(float(value), dtype=torch.float64)


def _count(value: Tensor, what: str) -> float:
    """Return a saved step count as a float, checking that it is one."""
    if value.numel() != 1 or value.is_complex():
        msg = (
            f"The state dict's {what} must be one real number, got a tensor of "
            f"shape {tuple(value.shape)} and {value.dtype}. {_FIX}"
        )
        raise TypeError(msg)
    number = float(value.detach().cpu().reshape(()))
    if not (math.isfinite(number) and number >= 0 and number == int(number)):
        msg = (
            f"The state dict's {what} is {number!r}; a step count is a whole number "
            "at least 0. The checkpoint is damaged: save it again, or set the "
            "count it should hold."
        )
        raise ValueError(msg)
    return number


def one_per_group(
    field: str, saved: Mapping[str, Mapping[str, Any]], names: Sequence[str]
) -> Tensor | None:
    """Return the value of the per-parameter `field` that the group's names share.

    torch keeps `field` (the step count, NAdam's `mu_product`, ...) for each
    parameter; paramdict keeps one per group. None where no parameter has it
    (a fresh state). A step count must be a whole number at least 0.

    Raises:
        TypeError: If a value is not a tensor or number.
        ValueError: If the parameters' values differ, or some parameters have
            the value and others none (torch would start those afresh); the
            message names them.
    """
    found = {
        n: saved[n][field] for n in names if saved.get(n, {}).get(field) is not None
    }
    if not found:
        return None
    values = {n: tensor_of(v, f"`{field}` of {n!r}").detach() for n, v in found.items()}
    if field == "step":
        numbers = {n: _count(v, f"`step` of {n!r}") for n, v in values.items()}
    else:
        numbers = {}
        for n, v in values.items():
            if v.numel() != 1 or v.is_complex() or v.dtype == torch.bool:
                msg = (
                    f"The state dict's `{field}` of {n!r} must be one real number, "
                    f"got a tensor of shape {tuple(v.shape)} and {v.dtype}. {_FIX}"
                )
                raise TypeError(msg)
            numbers[n] = float(v.cpu().reshape(()))
    lacking = sorted(set(names) - set(found))
    distinct = sorted({x for x in numbers.values() if not math.isnan(x)})
    nans = sorted(n for n, x in numbers.items() if math.isnan(x))
    if lacking or len(distinct) + bool(nans) > 1:

        def shown(x: float) -> str:
            return str(int(x)) if field == "step" else repr(x)

        parts = [
            f"{sorted(n for n, x in numbers.items() if x == value)} have "
            f"`{field}` {shown(value)}"
            for value in distinct
        ]
        if nans:
            parts.append(f"{nans} have `{field}` nan")
        if lacking:
            start = " (torch would start them at step 0)" if field == "step" else ""
            parts.append(f"{lacking} have no state{start}")
        msg = (
            f"torch keeps `{field}` for each parameter and paramdict one per group, "
            f"and the group's parameters differ: {'; '.join(parts)}. A state that "
            "continues torch's run exactly cannot be built. Load a checkpoint "
            f"whose parameters share one `{field}` (set it in the state dict to "
            "continue from one count deliberately)."
        )
        raise ValueError(msg)
    if field == "step":  # an int64 count of an older torch, read as torch reads it
        return torch.tensor(next(iter(numbers.values())), dtype=torch.float64)
    return next(iter(values.values())).reshape(())


def check_step_argument(step: object) -> None:
    """Raise unless `step` (of `load_torch_state_dict`) is None or a count."""
    if step is None:
        return
    if isinstance(step, bool) or not isinstance(step, int):
        msg = (
            f"`step` must be None or the number of steps taken (an int), got "
            f"{type(step).__name__}."
        )
        raise TypeError(msg)
    if step < 0:
        msg = f"`step` must be at least 0 (the number of steps taken), got {step}."
        raise ValueError(msg)
