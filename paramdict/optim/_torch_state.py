"""Optimizer states from `torch.optim` state dicts, and what both directions share.

`load_torch_state_dict` continues a torch.optim run; `_torch_export.py` is the
inverse. torch's parameter groups are those of `ParamGroups`, in its order (its
groups, then its default).
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamGroups' routing and members, of this package)
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard, TypeVar, cast

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .._paramdict import ParamDict
from ._groups import ParamGroups, subset
from ._optimizer import Optimizer
from ._schedules.base import ScheduleState
from ._schedules.cyclic import CyclicLR, OneCycleLR
from ._schedules.slot import is_schedule
from ._schedules.swa import SWALR
from ._schedules.torch_state import load_torch_scheduler_state_dict
from ._torch_dict import (
    NO_STEP,
    check_entries,
    check_first_buffers,
    check_step_argument,
    one_per_group,
    param_groups,
    saved_state,
    tensor_of,
)
from ._torch_optimizer import TorchOptimizer
from ._torch_paths import FLAGS, torch_flags
from ._torch_since import check_class_exists, check_settings_exist

S = TypeVar("S")

Names = nn.Module | Sequence[Sequence[str]]


def counterpart(opt: object) -> bool:
    """Whether `opt` has a `torch.optim` class of its name whose state converts."""
    name = type(opt).__name__
    cls = getattr(torch.optim, name, None)
    return (
        name != "LBFGS"
        and isinstance(cls, type)
        and issubclass(cls, torch.optim.Optimizer)
    )


def _torch_class(opt: object) -> type[torch.optim.Optimizer]:
    """Return torch.optim's class of the same name as `opt`'s."""
    name, converts = type(opt).__name__, counterpart(opt)
    cls = getattr(torch.optim, name, None)
    if cls is None and isinstance(opt, TorchOptimizer):
        check_class_exists(name)
    if not (converts and isinstance(opt, TorchOptimizer)):
        msg = (
            f"{name} has no torch.optim counterpart whose state converts; give "
            "one of paramdict's torch.optim optimizers (`optim.AdamW(...)`, ...) "
            "or `optim.ParamGroups` of them."
        )
        raise TypeError(msg)
    return cast("type[torch.optim.Optimizer]", cls)


_DEFAULTS: dict[type[torch.optim.Optimizer], dict[str, Any]] = {}  # by class, not name


def _defaults(cls: type[torch.optim.Optimizer]) -> Mapping[str, Any]:
    """Return the group settings torch's `cls` starts from (its `defaults`)."""
    if cls not in _DEFAULTS:
        maker: Any = cls
        _DEFAULTS[cls] = dict(maker([torch.zeros(2, 2, requires_grad=True)]).defaults)
    return _DEFAULTS[cls]


def _group_names(names: Names) -> list[list[str]]:
    """Return the ordered names of each group (a module is one group)."""
    if isinstance(names, nn.Module):
        return [[name for name, _ in names.named_parameters()]]
    given: object = names
    if (
        not isinstance(given, Sequence)
        or isinstance(given, str)
        or not all(
            isinstance(group, Sequence) and not isinstance(group, str)
            for group in given
        )
    ):
        msg = (
            "`names` must be a module or a sequence of groups, each a sequence of "
            "parameter names; wrap one group's names in a list: `[names]`. Got "
            f"{type(given).__name__}."
        )
        raise TypeError(msg)
    return [list(group) for group in names]


def _scheduled(opt: TorchOptimizer[Any]) -> bool:
    return is_schedule(opt.lr)


def _cycled(opt: TorchOptimizer[Any], name: str) -> bool:
    """Return whether the `lr` schedule sets the setting `name` too."""
    lr = opt.lr
    return name in ("momentum", "betas") and is_schedule(lr) and lr.cycles_momentum


def _hyperparameters(opt: TorchOptimizer[Any], state: Any) -> dict[str, Any]:
    """Return the group settings of torch's class for `opt`'s configuration."""
    cls = _torch_class(opt)
    defaults = _defaults(cls)
    check_settings_exist(opt, cls, defaults)
    flags = torch_flags(opt, state, defaults)
    group: dict[str, Any] = {}
    for name, default in defaults.items():
        if name in flags:
            group[name] = flags[name]
            continue
        value = getattr(opt, name, default)
        if name == "lr" and _scheduled(opt):
            group["lr"] = float(state.schedule.lr)
            group.update(_schedule_settings(opt.lr, state.schedule))
            continue
        if _cycled(opt, name):
            value = opt.cycled(name, state)
            value = (float(value[0]), value[1]) if name == "betas" else float(value)
        if isinstance(value, ParamDict) or not isinstance(
            value, (int, float, bool, str, tuple, Tensor, type(None))
        ):
            msg = (
                f"The setting {name!r} of {type(opt).__name__} is "
                f"{type(value).__name__}; torch.optim's param_groups take one "
                "number per group. Give a number or a 0-dim tensor."
            )
            raise TypeError(msg)
        group[name] = value
    return group


def _schedule_settings(schedule: object, slot: Any) -> dict[str, float]:
    """Return the entries torch's scheduler keeps in each parameter group."""
    if isinstance(schedule, OneCycleLR):
        initial = schedule.max_lr / schedule.div_factor
        out = {
            "initial_lr": initial,
            "max_lr": schedule.max_lr,
            "min_lr": initial / schedule.final_div_factor,
        }
        if schedule.cycle_momentum:
            out["max_momentum"] = schedule.max_momentum
            out["base_momentum"] = schedule.base_momentum
        return out
    if isinstance(schedule, CyclicLR):
        return {"initial_lr": schedule.base_lr}
    if isinstance(slot, ScheduleState):
        return {"initial_lr": float(slot.base_lr), **_swa_rates(schedule)}
    return {}


def _swa_rates(schedule: object) -> dict[str, float]:
    """The `swa_lr` torch's `SWALR` (alone or composed) writes into each group."""
    if isinstance(schedule, SWALR):
        return {"swa_lr": schedule.swa_lr}
    for kid in getattr(schedule, "_schedulers", ()):
        if found := _swa_rates(kid):
            return found
    return {}


_SCHEDULER_ENTRIES = frozenset(  # what torch's schedulers add to a group
    {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum", "swa_lr"}
)


def _same(saved: Any, mine: Any) -> bool:
    """Return whether a saved group setting equals ours (numbers by value)."""
    if isinstance(saved, (tuple, list)) and isinstance(mine, (tuple, list)):
        a, b = cast("Sequence[Any]", saved), cast("Sequence[Any]", mine)
        return len(a) == len(b) and all(map(_same, a, b))
    numbers = (int, float, Tensor)
    if isinstance(saved, numbers) and isinstance(mine, numbers):
        if isinstance(saved, bool) or isinstance(mine, bool):
            return saved is mine
        return float(saved) == float(mine)
    return bool(saved == mine)


def _check_group(
    opt: TorchOptimizer[Any], index: int, group: Mapping[str, Any], template: Any
) -> None:
    """Raise unless torch's group `index` holds `opt`'s settings."""
    cls = _torch_class(opt)
    defaults = _defaults(cls)
    unknown = sorted(
        set(group) - set(defaults) - {"params", "param_names"} - _SCHEDULER_ENTRIES
    )
    if unknown:
        msg = (
            f"Group {index} has settings {unknown} that {cls.__name__} does not "
            "take; the state dict is another optimizer's. Use that optimizer."
        )
        raise ValueError(msg)
    mine = _hyperparameters(opt, template)
    lacking = sorted(
        name
        for name, value in mine.items()
        if name not in group
        and name in defaults
        and isinstance(value, int | float)
        and not isinstance(value, bool)  # flags: torch's `__setstate__` sets them
        and name not in FLAGS
    )
    if lacking:  # torch's step would raise a KeyError on each
        msg = (
            f"Group {index} of the state dict has no settings {lacking}; "
            f"{cls.__name__} reads them at every step. Save the state dict again "
            "with `state_dict()`."
        )
        raise KeyError(msg)
    swa = _swa_rates(opt.lr)
    if "swa_lr" in group and swa and not _same(group["swa_lr"], swa["swa_lr"]):
        msg = (
            f"Group {index}'s `swa_lr` {group['swa_lr']!r} (saved) differs from the "
            f"SWALR's {swa['swa_lr']!r} (ours). Build the schedule with the saved "
            "settings."
        )
        raise ValueError(msg)
    differ = sorted(
        f"{name!r} {group[name]!r} (saved) and {mine[name]!r} (ours)"
        for name in mine
        if name in group
        and name not in FLAGS
        and not (name == "lr" and _scheduled(opt))
        and not _cycled(opt, name)
        and not _same(group[name], mine[name])
    )
    if differ:
        msg = (
            f"Group {index}'s settings differ from the {type(opt).__name__}'s: "
            f"{', '.join(differ)}. Build the optimizer with the saved settings."
        )
        raise ValueError(msg)


def _buffer_fields(state: Any) -> list[str]:
    """Return the fields of a state NamedTuple that hold tensors or ParamDicts."""
    return [
        f
        for f in state._fields
        if f != "schedule" and isinstance(getattr(state, f), (Tensor, ParamDict))
    ]


def _check_state(opt: TorchOptimizer[Any], template: Any) -> None:
    if not isinstance(getattr(template, "_fields", None), tuple):
        msg = (
            f"{type(opt).__name__} keeps no per-parameter state of torch.optim's "
            "kind; only the optimizers with a state NamedTuple convert."
        )
        raise TypeError(msg)


def _members(
    opt: Optimizer[Any], params: ParamDict, groups: list[list[str]]
) -> list[TorchOptimizer[Any]]:
    """Return the optimizer of each of torch's groups, checking the split."""
    if not _is_groups(opt):
        _torch_class(opt)
        if len(groups) != 1:
            msg = (
                f"The state dict has {len(groups)} parameter groups and "
                f"{type(opt).__name__} one; give `optim.ParamGroups` one optimizer "
                "per torch group, in torch's order."
            )
            raise ValueError(msg)
        return [cast("TorchOptimizer[Any]", opt)]
    members = opt._members()
    for member in members:
        _torch_class(member)
    routes = opt._routes_for(params)
    if len(routes) != len(groups):
        msg = (
            f"The state dict has {len(groups)} parameter groups and the ParamGroups "
            f"{len(routes)} (its groups, then its default); give torch one group "
            "per paramdict group, in that order."
        )
        raise ValueError(msg)
    for i, (route, names) in enumerate(zip(routes, groups, strict=True)):
        if set(route) != set(names):
            msg = (
                f"Group {i} of the state dict holds {sorted(names)} and group {i} of "
                f"the ParamGroups {sorted(route)}; give torch's groups in the "
                "ParamGroups' order (its groups, then its default)."
            )
            raise ValueError(msg)
    return cast("list[TorchOptimizer[Any]]", members)


def _is_groups(opt: object) -> TypeGuard[ParamGroups[Any]]:
    """Return whether `opt` is a `ParamGroups` (one torch group per member)."""
    return isinstance(opt, ParamGroups)


def load_torch_state_dict(
    opt: Optimizer[S],
    state_dict: Mapping[str, Any],
    params: ParamDict,
    names: Names | None = None,
    *,
    scheduler: Mapping[str, Any] | None = None,
    step: int | None = None,
) -> S:
    """Return the state of `opt` that continues a torch.optim run.

    `names` names torch's indices: a module (its `named_parameters` order) or
    the ordered names of each group; leave it out for a dict keyed by name
    (`torch.distributed.checkpoint`'s, FSDP2's sharded buffers included). For
    `ParamGroups`, torch's groups are its groups, then its default. Buffers
    are copied to the dtype and device of `opt.init(params)`; a group with no
    state yet starts from `init`'s. Nothing is changed.

    torch keeps a step count (and NAdam's `mu_product`, ASGD's `eta` and `mu`)
    per parameter, paramdict one per group: a group whose parameters' counts
    differ, or only some of which have state, is refused. torch's SGD and Muon
    keep no count: it is `step` if given, else 1 once a momentum buffer
    exists. A dict whose settings and buffers `opt` has is taken, as torch
    takes it (RAdam's into Adam).

    Args:
        opt: The paramdict optimizer, configured as the torch one was.
        state_dict: The torch.optim state dict.
        params: The parameters the state is for.
        names: A module, or the ordered parameter names of each group; `None`
            for a state dict keyed by name.
        scheduler: The `state_dict()` of torch's scheduler, when `opt`'s `lr` is
            a schedule (see `load_torch_scheduler_state_dict`).
        step: The step count for SGD and Muon, whose torch state has none.

    Returns:
        The state, as `opt.init(params)` returns it, at torch's step.

    Raises:
        KeyError: If `state_dict` has no `state` or `param_groups` (as torch),
            a group has no `params` or lacks a setting, or a parameter's state
            lacks an entry that torch's step reads (torch's step raises
            `KeyError` there); the message names it.
        TypeError: If `opt` has no torch.optim counterpart (in the installed
            torch), `params` is not a ParamDict, `names` is malformed, or an
            entry of `state_dict` is of the wrong kind (a string step, `state`
            as a list, a `None` buffer); the message names it.
        ValueError: If the groups, settings, parameters or buffers do not fit
            `opt` and `params`, a step count is not a whole number at least 0
            or differs between a group's parameters, a buffer is on the meta
            device, a scheduled `lr` has no `scheduler`, or `opt` uses a
            setting the installed torch's class lacks; the message names them.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> model = torch.nn.Linear(2, 1)
        >>> theirs = torch.optim.Adam(model.parameters(), lr=0.1)
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> theirs.step()
        >>> params = ParamDict.from_module(model)
        >>> state = optim.load_torch_state_dict(
        ...     optim.Adam(lr=0.1), theirs.state_dict(), params, model
        ... )
        >>> int(state.step), sorted(state.exp_avg)
        (1, ['bias', 'weight'])
    """
    check_step_argument(step)
    given: object = params
    if not isinstance(given, ParamDict):
        msg = (
            "`params` must be the ParamDict of the parameters the state is for, "
            f"got {type(given).__name__}."
        )
        raise TypeError(msg)
    saved_groups = param_groups(state_dict)
    saved_state_ = saved_state(state_dict)
    if names is not None:
        groups = _group_names(names)
    elif all(isinstance(p, str) for g in saved_groups for p in g["params"]):
        groups = [list(g["params"]) for g in saved_groups]
    else:
        msg = (
            "The state dict numbers its parameters; give their names as "
            "`names` (the module, or the names of each group in torch's order)."
        )
        raise TypeError(msg)
    if len(saved_groups) != len(groups):
        msg = (
            f"The state dict has {len(saved_groups)} parameter group(s) and `names` "
            f"{len(groups)}; give the names of each group in torch's order."
        )
        raise ValueError(msg)
    index: dict[Any, str] = {}
    for i, (group, group_names) in enumerate(zip(saved_groups, groups, strict=True)):
        ids = list(group["params"])
        if len(ids) != len(group_names):
            msg = (
                f"Group {i} of the state dict holds {len(ids)} parameters and "
                f"`names` gives {len(group_names)}; give one name per parameter."
            )
            raise ValueError(msg)
        if ids and all(isinstance(p, str) for p in ids) and ids != group_names:
            msg = (
                f"Group {i} of the state dict is keyed by the names {ids} and "
                f"`names` gives {group_names}; leave `names` out for a state "
                "dict keyed by name."
            )
            raise ValueError(msg)
        index.update(zip(ids, group_names, strict=True))
    named = set(index.values())
    missing = sorted(set(params) - named)
    extra = sorted(named - set(params))
    if missing or extra:
        msg = (
            f"Parameters differ: missing {missing}, unexpected {extra}. Give the "
            "names torch's optimizer saw, for the same parameters."
        )
        raise ValueError(msg)
    stray = sorted(str(i) for i in saved_state_ if i not in index)
    if stray:
        msg = (
            f"The state dict holds state for indices {stray} that no group lists; "
            "it is damaged. Save it again with `state_dict()`."
        )
        raise ValueError(msg)
    saved = {index[i]: s for i, s in saved_state_.items()}
    members = _members(opt, params, groups)
    if scheduler is not None and not all(_scheduled(m) for m in members):
        msg = (
            "`scheduler` is given but a group's `lr` is a rate; a torch scheduler "
            "drives every group. Give each group a schedule as `lr`."
        )
        raise ValueError(msg)
    states = [
        _load_group(m, i, saved_groups[i], saved, subset(params, g), scheduler, step)
        for i, (m, g) in enumerate(zip(members, groups, strict=True))
    ]
    if not _is_groups(opt):
        return cast("S", states[0])
    # Groups sharing a schedule loaded one position: torch's scheduler keeps one,
    # and `_check_group` refused groups whose base rates differ from it.
    return cast("S", opt._stored(tuple(states)))


def _load_group(
    opt: TorchOptimizer[Any],
    index: int,
    group: Mapping[str, Any],
    saved: Mapping[str, Mapping[str, Any]],
    params: ParamDict,
    scheduler: Mapping[str, Any] | None,
    step: int | None,
) -> Any:
    """Return `opt`'s state for torch's group `index` (all checks first)."""
    template: Any = opt.init(params)
    _check_state(opt, template)
    _check_group(opt, index, group, template)
    saved = {k: v for k, v in saved.items() if k in params}
    fields = _buffer_fields(template)
    per_key = {f for f in fields if isinstance(getattr(template, f), ParamDict)}
    for name in sorted(saved):
        kept = {f for f in fields if f not in per_key or name in getattr(template, f)}
        unknown = sorted(set(saved[name]) - kept)
        if unknown:
            msg = (
                f"The state of {name!r} holds buffers {unknown} that "
                f"{type(opt).__name__} does not keep; the state dict is another "
                "optimizer's or another configuration's."
            )
            raise ValueError(msg)
    check_entries(opt, saved, template, fields, per_key)
    values: dict[str, Any] = {}
    for f in fields:
        value = getattr(template, f)
        if f in per_key:
            values[f] = _filled(value, saved, f, f"`{f}`")
        elif (shared := one_per_group(f, saved, list(params))) is not None:
            values[f] = _fit(shared, value, f"`{f}`")
        elif f == "step" and type(opt).__name__ in NO_STEP:
            check_first_buffers(opt, saved, list(params))
            count = step if step is not None else int(any(saved.values()))
            values[f] = torch.full_like(value, count)
    if _scheduled(opt):
        if scheduler is None:
            msg = (
                f"{type(opt).__name__}'s `lr` is a schedule; give torch's scheduler "
                "state dict as `scheduler=` (`scheduler.state_dict()`)."
            )
            raise ValueError(msg)
        position = load_torch_scheduler_state_dict(
            cast("Any", opt.lr), scheduler, group=index
        )
        device = template.schedule.lr.device

        def moved(x: object) -> object:
            return x.to(device) if isinstance(x, Tensor) else x

        values["schedule"] = pytree.tree_map(moved, position)
    loaded = template._replace(**values)
    opt.check_state(params, loaded)  # what the dict's values make of the state
    return loaded


def _filled(
    buffer: ParamDict, saved: Mapping[str, Mapping[str, Any]], field: str, what: str
) -> ParamDict:
    """Return `buffer` with each parameter's saved `field`, where there is one."""
    out: dict[str, Tensor] = {}
    for key, like in buffer.items():
        got = saved.get(key, {}).get(field)
        out[key] = like if got is None else _fit(got, like, f"{what} of {key!r}")
    return ParamDict(out)


def _fit(got: Any, like: Tensor, what: str) -> Tensor:
    """Return `got` as a copy with `like`'s dtype and device, checking its shape."""
    tensor = tensor_of(got, what)
    if tensor.shape != like.shape:
        msg = (
            f"The buffer {what} has shape {tuple(tensor.shape)} and paramdict's "
            f"{tuple(like.shape)}; the state dict is for other parameters."
        )
        raise ValueError(msg)
    if tensor.is_floating_point() != like.is_floating_point() or (
        tensor.is_complex() != like.is_complex()
    ):
        msg = (
            f"The buffer {what} has dtype {tensor.dtype} and paramdict's {like.dtype}; "
            "the state dict is for other parameters. Give buffers of the "
            "parameters' kind."
        )
        raise ValueError(msg)
    return tensor.detach().to(dtype=like.dtype, device=like.device, copy=True)
