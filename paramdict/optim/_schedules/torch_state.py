"""Schedule positions to and from `torch.optim.lr_scheduler` state dicts.

The schedule says what its state holds (its counters by torch's names, the
schedules it wraps); only what one torch class keeps its own way is mapped by
class: `ReduceLROnPlateau`'s counters and missing `base_lrs`, `CyclicLR`'s
`_scale_fn_custom`, and `ChainedScheduler`'s position (its last scheduler's).
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (the schedules' own `_advance`, and ParamGroups' members, of this package)
import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import attrs
import torch
from torch import Tensor

from .._groups import ParamGroups
from .._optimizer import Optimizer
from .base import LRSchedule, ScheduleState, _bad_fields
from .chain import ChainedScheduler
from .cyclic import CyclicLR
from .numbers import check_rate
from .plateau import PlateauState, ReduceLROnPlateau
from .slot import Schedule, is_schedule

__all__ = ["load_torch_scheduler_state_dict", "to_torch_scheduler_state_dict"]

_PLATEAU_COUNTERS = ("best", "num_bad_epochs", "cooldown_counter")


_KEPT_OTHERWISE = frozenset(
    {
        "base_lr",
        "min_lr",
        "max_lr",
        "step_size_up",
        "base_momentum",
        "max_momentum",
        "pct_start",
        "anneal_strategy",
        "div_factor",
        "final_div_factor",
        "three_phase",
        "swa_lr",
    }
)
"""Settings torch's schedulers keep under other names (`base_lrs`, `total_size`)."""


def _f64(value: Any, key: str) -> Tensor:
    """Return a saved number (or one-element real tensor) as a 0-dim float64."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(value, Tensor):
        ok = (
            value.numel() == 1
            and not value.is_meta
            and value.dtype != torch.bool
            and not value.is_complex()
        )
    if not ok:
        got = (
            f"a {value.dtype} tensor of shape {tuple(value.shape)}"
            f"{' on the meta device' if value.is_meta else ''}"
            if isinstance(value, Tensor)
            else type(value).__name__
        )
        msg = (
            f"The scheduler state dict's `{key}` must be a number, got {got}. Give "
            "the `state_dict()` of torch's scheduler."
        )
        raise TypeError(msg)
    return torch.as_tensor(float(value), dtype=torch.float64)


def _number(value: Tensor) -> float | int:
    """Return a float64 tensor as torch's scheduler keeps it: int when integral."""
    x = float(value)
    return int(x) if math.isfinite(x) and x == int(x) else x


def _entry(state_dict: Mapping[str, Any], key: str, name: str) -> Any:
    if key not in state_dict:
        msg = (
            f"The scheduler state dict has no {key!r}; it is not a {name}'s. Give "
            f"the `state_dict()` of torch's {name}."
        )
        raise ValueError(msg)
    return state_dict[key]


def _listed(value: object) -> list[Any]:
    """Return a list or tuple of torch's state dict as a list; else an empty one."""
    if isinstance(value, (list, tuple)):
        return list(cast("Iterable[Any]", value))
    return []


def _mapping(value: object, name: str) -> Mapping[str, Any]:
    """Return a child's saved state, checking that it is a mapping."""
    if not isinstance(value, Mapping):
        msg = (
            f"The scheduler state dict's `_schedulers` must hold each scheduler's "
            f"state dict, got {type(value).__name__}. Give the `state_dict()` of "
            f"torch's {name}."
        )
        raise TypeError(msg)
    return cast("Mapping[str, Any]", value)


def _per_group(state_dict: Mapping[str, Any], key: str, group: int, name: str) -> Any:
    values = _listed(_entry(state_dict, key, name))
    if not 0 <= group < len(values):
        msg = (
            f"The scheduler state dict's {key!r} has no entry for group {group}; "
            "give the group index of torch's optimizer the schedule drives."
        )
        raise ValueError(msg)
    return values[group]


def _check_settings(schedule: object, state_dict: Mapping[str, Any]) -> None:
    """Raise if a setting torch keeps under the schedule's name is off."""
    differ: list[str] = []
    missing: list[str] = []
    klass: Any = type(schedule)
    simple = (int, float, str)
    for field in attrs.fields(klass):
        mine = getattr(schedule, field.name)
        if not isinstance(mine, simple) or field.name in _KEPT_OTHERWISE:
            continue
        if field.name not in state_dict:
            missing.append(field.name)
        elif isinstance(theirs := state_dict[field.name], simple) and mine != theirs:
            differ.append(f"{field.name!r} {theirs!r} (saved) and {mine!r} (ours)")
    if missing:
        name = type(schedule).__name__
        msg = (
            f"The scheduler state dict has no {sorted(missing)}; it is not a "
            f"{name}'s. Give the `state_dict()` of torch's {name}."
        )
        raise ValueError(msg)
    if differ:
        msg = (
            f"The scheduler state dict's settings differ from the "
            f"{type(schedule).__name__}'s: {', '.join(sorted(differ))}. Build the "
            "schedule with the saved settings."
        )
        raise ValueError(msg)


def _check_cycle(schedule: CyclicLR, state_dict: Mapping[str, Any], group: int) -> None:
    """Raise unless the saved `base_lrs` and `max_lrs` are the `CyclicLR`'s rates."""
    name = type(schedule).__name__
    for key, mine in (("base_lrs", schedule.base_lr), ("max_lrs", schedule.max_lr)):
        saved = _f64(_per_group(state_dict, key, group, name), key)
        if float(saved) != float(mine):
            msg = (
                f"The scheduler state dict's {key!r} holds {float(saved)!r} for "
                f"group {group}, and the CyclicLR {float(mine)!r}: torch's would "
                f"cycle with the saved one. Build the CyclicLR with "
                f"`{key[:-1]}={float(saved)!r}`."
            )
            raise ValueError(msg)


def load_torch_scheduler_state_dict(
    schedule: Schedule, state_dict: Mapping[str, Any], /, *, group: int = 0
) -> ScheduleState | PlateauState:
    """Return the state of `schedule` at a torch scheduler's position.

    `state_dict` is `scheduler.state_dict()` of torch's scheduler of the same
    class. The state takes `last_epoch`, the group's `base_lrs` and `_last_lr`,
    the counters (`T_cur`, `T_i`; `best`, `num_bad_epochs`, `cooldown_counter`)
    and the children of composed schedules; a cycled momentum is its value at
    `last_epoch`. Nothing is changed.

    Args:
        schedule: The paramdict schedule, configured as torch's scheduler.
        state_dict: torch's scheduler state dict.
        group: The index of the optimizer's parameter group to read.

    Returns:
        The schedule's state, as `schedule.init()` returns it, at torch's position.

    Raises:
        TypeError: If `schedule` is not a paramdict schedule.
        ValueError: If a setting torch saved differs from the schedule's, or an
            entry is missing; the message names it.

    Example:
        >>> import torch
        >>> from paramdict import optim
        >>> torch_opt = torch.optim.SGD([torch.zeros(1)], lr=1.0)
        >>> theirs = torch.optim.lr_scheduler.StepLR(torch_opt, step_size=2, gamma=0.5)
        >>> for _ in range(3):
        ...     torch_opt.step()
        ...     theirs.step()
        >>> schedule = optim.StepLR(base_lr=1.0, step_size=2, gamma=0.5)
        >>> state = optim.load_torch_scheduler_state_dict(schedule, theirs.state_dict())
        >>> state.last_epoch, state.lr
        (tensor(3., dtype=torch.float64), tensor(0.5000, dtype=torch.float64))
    """
    if not is_schedule(schedule):
        msg = (
            f"`schedule` must be a paramdict schedule (`optim.StepLR(...)`, ...), "
            f"got {type(schedule).__name__}."
        )
        raise TypeError(msg)
    given: object = state_dict
    if not isinstance(given, Mapping):
        msg = (
            "The scheduler state dict must be a mapping, got "
            f"{type(given).__name__}. Give the `state_dict()` of torch's scheduler."
        )
        raise TypeError(msg)
    state = _load(schedule, state_dict, group)
    _, bad = _bad_fields(state)
    if bad:
        names = ", ".join(f"`{b}`" for b in sorted(bad))
        msg = (
            f"The scheduler state dict gives the {type(schedule).__name__} invalid "
            f"values for {names}: each must be finite and at least 0 (`best` may "
            "be infinite). The checkpoint is damaged: save it again."
        )
        raise ValueError(msg)
    return state


def _load(
    schedule: Schedule, state_dict: Mapping[str, Any], group: int
) -> ScheduleState | PlateauState:
    """`load_torch_scheduler_state_dict`, before the values are checked."""
    name = type(schedule).__name__
    _check_settings(schedule, state_dict)
    if isinstance(schedule, CyclicLR):
        _check_cycle(schedule, state_dict, group)
    last_lr = _f64(_per_group(state_dict, "_last_lr", group, name), "_last_lr")
    last_epoch = (
        None  # torch's keeps no count of its own: its position is its last child's
        if isinstance(schedule, ChainedScheduler)
        else _f64(_entry(state_dict, "last_epoch", name), "last_epoch")
    )
    if isinstance(schedule, ReduceLROnPlateau):  # torch's attributes, one by one
        assert last_epoch is not None  # not a ChainedScheduler
        counters = [_f64(_entry(state_dict, k, name), k) for k in _PLATEAU_COUNTERS]
        return PlateauState(last_epoch, last_lr, *counters)
    base = None
    if type(schedule).takes_base:
        # SequentialLR keeps no `base_lrs`: its children started from them.
        holder = state_dict
        if "base_lrs" not in holder and "_schedulers" in holder:
            holder = (_listed(holder["_schedulers"]) or [holder])[0]
        base = _f64(_per_group(holder, "base_lrs", group, name), "base_lrs")
        check_rate("base_lrs", base)  # named as the dict names it
    template = schedule.init(base)
    counters_t = tuple(
        _f64(_entry(state_dict, k, name), k) for k in schedule._counter_names
    )
    children = template.children
    if children:
        saved = _listed(_entry(state_dict, "_schedulers", name))
        kids = schedule._schedulers
        if len(saved) != len(kids):
            msg = (
                f"The scheduler state dict holds {len(saved)} schedulers and the "
                f"{name} {len(kids)}; give the same schedulers in the same order."
            )
            raise ValueError(msg)
        children = tuple(
            cast("ScheduleState", _load(kid, _mapping(sub, name), group))
            for kid, sub in zip(kids, saved, strict=True)
        )
        if last_epoch is None:  # a ChainedScheduler's
            last_epoch = children[-1].last_epoch.clone()
    if last_epoch is None:
        msg = (
            f"The scheduler state dict holds no schedulers and the {name} "
            f"{len(schedule._schedulers)}; give the same schedulers in the same order."
        )
        raise ValueError(msg)
    momentum = template.momentum
    if momentum is not None and float(last_epoch) > 0:
        before = template._replace(last_epoch=last_epoch - 1)
        cyclic: LRSchedule = schedule
        momentum = cyclic._advance(before, last_lr).momentum
    return template._replace(
        last_epoch=last_epoch,
        base_lr=template.base_lr if base is None else base,
        lr=last_lr,
        momentum=momentum,
        counters=counters_t or template.counters,
        children=children,
    )


def _slots(opt: Optimizer[Any], state: Any) -> list[tuple[Schedule, Any]]:
    """Return each group's schedule and schedule state, in torch's group order."""
    if isinstance(opt, ParamGroups):
        members: list[Optimizer[Any]] = cast("Any", opt)._members()
        full: tuple[Any, ...] = cast("Any", opt)._full(state)  # shared ones handed out
        return [
            pair
            for member, sub in zip(members, full, strict=True)
            for pair in _slots(member, sub)
        ]
    lr = getattr(opt, "lr", None)
    if not is_schedule(lr):
        msg = (
            f"{type(opt).__name__}'s `lr` is a rate, not a schedule; a torch "
            "scheduler drives every group. Give each group a schedule as `lr`."
        )
        raise ValueError(msg)
    return [(lr, state.schedule)]


def _position(schedule: Schedule, slot: Any, groups: int) -> dict[str, Any]:
    """Return the position entries (one group's) of `schedule` at `slot`."""
    out: dict[str, Any] = {"last_epoch": _number(slot.last_epoch)}
    if "lr_lambda" in attrs.fields_dict(type(schedule)):
        # `LambdaLR`, `MultiplicativeLR`: torch's `load_state_dict` pops the state
        # of its functions, one per group (None: a plain function).
        out["lr_lambdas"] = [None] * groups
    if isinstance(schedule, ReduceLROnPlateau):
        out.update({k: _number(getattr(slot, k)) for k in _PLATEAU_COUNTERS})
        out["best"] = float(slot.best)
        return out
    out["_step_count"] = out["last_epoch"] + 1
    out["_is_initial"] = out["last_epoch"] == 0
    if isinstance(schedule, CyclicLR):
        out["_scale_fn_custom"] = None  # torch's `load_state_dict` pops it
    names = schedule._counter_names
    out.update(zip(names, map(_number, slot.counters), strict=True))
    if slot.children:
        kids = schedule._schedulers
        out["_schedulers"] = [
            {**_position(kid, child, groups), "_last_lr": [float(child.lr)]}
            for kid, child in zip(kids, slot.children, strict=True)
        ]
    return out


def to_torch_scheduler_state_dict(opt: Optimizer[Any], state: Any, /) -> dict[str, Any]:
    """Return the position of `opt`'s schedules as a torch scheduler state dict.

    `scheduler.load_state_dict` of torch's scheduler of the same class (built
    on the optimizer that loaded `to_torch_state_dict(opt, state, ...)`) accepts
    it and continues from there; `base_lrs` and `_last_lr` hold one entry per
    group, in torch's group order. `state` is unchanged.

    Args:
        opt: The paramdict optimizer; every group's `lr` is a schedule.
        state: Its state.

    Returns:
        The scheduler's position entries.

    Raises:
        ValueError: If a group's `lr` is a rate, or the groups' schedules are
            at different positions.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> opt = optim.SGD(lr=optim.StepLR(base_lr=1.0, step_size=2, gamma=0.5))
        >>> params = ParamDict(w=torch.zeros(1))
        >>> state = opt.init(params)
        >>> for _ in range(3):
        ...     params, state = opt.step(params, params, state)
        >>> position = optim.to_torch_scheduler_state_dict(opt, state)
        >>> position["last_epoch"], position["_last_lr"]
        (3, [0.5])
    """
    slots = _slots(opt, state)
    positions = [_position(schedule, slot, len(slots)) for schedule, slot in slots]
    out = positions[0]
    differ = {
        k for p in positions[1:] for k in out if k != "_schedulers" and p[k] != out[k]
    }
    if differ:
        msg = (
            f"The groups' schedules differ in {sorted(differ)}; one torch "
            "scheduler keeps one position for every group. Step them together."
        )
        raise ValueError(msg)
    out["_last_lr"] = [float(slot.lr) for _, slot in slots]
    if not isinstance(slots[0][0], ReduceLROnPlateau):
        out["base_lrs"] = [float(slot.base_lr) for _, slot in slots]
    return out
