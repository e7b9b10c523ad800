"""A `torch.optim` state dict as torch saved it: its entries, their kinds, their values.

Everything `load_torch_state_dict` reads passes through here first, so a malformed
dict (an older torch's, a hand-edited one, another optimizer's) is refused with a
sentence naming the entry and the fix, never with a raw error of the code that
would have read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, cast

import torch
from torch import Tensor

from ._torch_optimizer import TorchOptimizer

__all__ = [
    "NO_STEP",
    "check_entries",
    "check_first_buffers",
    "check_step_argument",
    "one_per_group",
    "param_groups",
    "saved_state",
    "tensor_of",
]

_FIX = "Give what `torch.optim.<Optimizer>.state_dict()` returned."

NO_STEP = frozenset({"SGD", "Muon"})
"""The optimizers whose torch state keeps no step count."""


def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, Mapping))


def param_groups(state_dict: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Return the dict's `param_groups`, each a mapping whose `params` is a list."""
    given: object = state_dict
    if not isinstance(given, Mapping):
        msg = f"The state dict must be a mapping, got {type(given).__name__}. {_FIX}"
        raise TypeError(msg)
    if "param_groups" not in state_dict:
        msg = f"The state dict has no 'param_groups' entry. {_FIX}"
        raise KeyError(msg)
    groups: object = state_dict["param_groups"]
    if not _is_list(groups):
        msg = (
            "The state dict's `param_groups` must be a list of groups (dicts of "
            f"settings and `params`), got {type(groups).__name__}. {_FIX}"
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
        if not _is_list(ids):
            msg = (
                f"The state dict's `param_groups[{i}]['params']` must be a list of "
                f"parameter indices (or names), got {type(ids).__name__}. {_FIX}"
            )
            raise TypeError(msg)
        bad = [
            p
            for p in cast("Sequence[object]", ids)
            if isinstance(p, bool) or not isinstance(p, (int, str))
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
    """Return the dict's `state`: each parameter's entries, by index or name."""
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
    for key, value in cast("Mapping[object, object]", state).items():
        if not isinstance(value, Mapping):
            msg = (
                f"The state dict's `state[{key!r}]` must be a dict of that "
                f"parameter's buffers, got {type(value).__name__}. {_FIX}"
            )
            raise TypeError(msg)
    return cast("Mapping[Any, Mapping[str, Any]]", state)


def tensor_of(value: object, what: str) -> Tensor:
    """Return a saved buffer or count as a tensor (not a copy), checking its kind."""
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


def _number(value: Tensor, field: str, what: str) -> float:
    """Return a saved per-parameter number (a whole count for `step`)."""
    boolean = field != "step" and value.dtype == torch.bool
    if value.numel() != 1 or value.is_complex() or boolean:
        msg = (
            f"The state dict's {what} must be one real number, got a tensor of "
            f"shape {tuple(value.shape)} and {value.dtype}. {_FIX}"
        )
        raise TypeError(msg)
    number = float(value.cpu().reshape(()))
    if field == "step" and not (
        math.isfinite(number) and number >= 0 and number == int(number)
    ):
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
    """Return the one value of the per-parameter `field` the group's names share.

    None where no parameter has it (a fresh state).
    """
    found = {
        n: saved[n][field] for n in names if saved.get(n, {}).get(field) is not None
    }
    if not found:
        return None
    values = {n: tensor_of(v, f"`{field}` of {n!r}").detach() for n, v in found.items()}
    numbers = {n: _number(v, field, f"`{field}` of {n!r}") for n, v in values.items()}
    lacking = sorted(set(names) - set(found))
    distinct = sorted({x for x in numbers.values() if not math.isnan(x)})
    nans = sorted(n for n, x in numbers.items() if math.isnan(x))
    if lacking or len(distinct) + bool(nans) > 1:
        parts = [
            f"{sorted(n for n, x in numbers.items() if x == value)} have "
            f"`{field}` {str(int(value)) if field == 'step' else repr(value)}"
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


def check_entries(
    opt: TorchOptimizer[Any],
    saved: Mapping[str, Mapping[str, Any]],
    template: Any,
    fields: list[str],
    per_key: set[str],
) -> None:
    """Raise if a parameter with some state lacks an entry torch's step reads.

    SGD alone starts a missing or `None` momentum buffer afresh.
    """
    kind = type(opt).__name__
    for name in sorted(n for n, entries in saved.items() if entries):
        needed = [
            f
            for f in fields
            if (name in getattr(template, f) if f in per_key else True)
            and not (f == "step" and kind in NO_STEP)
            and not (f == "momentum_buffer" and kind == "SGD")
        ]
        missing = [f for f in needed if f not in saved[name]]
        if missing:
            msg = (
                f"The state of {name!r} has no {missing} but other entries; "
                f"torch's {kind} reads them at its next step. Save the state dict "
                "again with `state_dict()`, or drop the parameter's state to "
                "start it afresh."
            )
            raise KeyError(msg)
        empty = [f for f in needed if saved[name][f] is None]
        if empty:
            msg = (
                f"The state of {name!r} holds None as {empty}; torch's {kind} "
                "needs tensors there. Save the state dict again with `state_dict()`."
            )
            raise TypeError(msg)


def check_first_buffers(
    opt: TorchOptimizer[Any], saved: Mapping[str, Mapping[str, Any]], names: list[str]
) -> None:
    """Raise if torch's SGD would start some damped buffers otherwise than paramdict."""
    if getattr(opt, "dampening", 0) == 0:
        return
    held = [n for n in names if saved.get(n, {}).get("momentum_buffer") is not None]
    lacking = sorted(set(names) - set(held))
    if held and lacking:
        msg = (
            f"The state dict holds momentum buffers for {sorted(held)} and none for "
            f"{lacking}: torch's SGD starts a damped buffer as a copy of the next "
            "gradient, and paramdict's one step count per group cannot start some "
            "buffers and continue others. Load a checkpoint in which every "
            "parameter of the group has taken a step (or none has)."
        )
        raise ValueError(msg)
