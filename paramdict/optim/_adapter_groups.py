"""One parameter group of `TorchAdapter`: its optimizer, state and binding.

Each of the adapter's `param_groups` dicts is paired with a `Group`, which holds
a private copy of the optimizer configured as the dict says and its binding.
Before each step `Group.sync` compares the dict with the copy's settings (torch's
names and order): a new rate is set on the copy, whose plan reads it at the step;
any other change makes a new copy (`attrs.evolve`) and binds it again. `fused`
shows what runs and a written one has torch's meaning; `foreach` is kept as
written (the export names the path that rounds as the rule).
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (the binding's plan and the shared conversions of this package)
import operator
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, TypeGuard, cast

import attrs
import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._binding import Bound
from ._fused import FusedPlan
from ._groups import subset
from ._hyper import check_rate, is_int_or_float
from ._schedules.slot import is_schedule
from ._torch_dict import NO_STEP
from ._torch_optimizer import TorchOptimizer
from ._torch_state import _defaults, _hyperparameters, _torch_class, counterpart

__all__ = [
    "MISSING",
    "Group",
    "buffers",
    "checked",
    "configured",
    "defaults_of",
    "unchanged",
]

MISSING: Any = object()
_FREE = frozenset({"foreach"})
"""Settings kept as written, with no effect: the rule's kernels are foreach."""
_RATES = frozenset({"lr", "weight_decay"})
_LIVE = _RATES | {"momentum", "betas"}
"""Settings the step reads each time (`rate`, `cycled`): set without a new binding."""


def _torch_style(opt: object) -> TypeGuard[TorchOptimizer[Any]]:
    return isinstance(opt, TorchOptimizer)


def checked(opt: object, where: str) -> TorchOptimizer[Any]:
    """Return `opt` if the adapter can step it (torch's style, not differentiable)."""
    if not _torch_style(opt):
        msg = (
            f"{where} needs an optimizer in the style of torch.optim (a "
            f"`TorchOptimizer` such as `optim.AdamW(...)`), got "
            f"{type(opt).__name__}. Clip with `torch.nn.utils.clip_grad_norm_` and "
            "accumulate gradients in the loop, as with torch.optim; give groups as "
            "`optim.ParamGroups` or as torch's list of dicts."
        )
        raise TypeError(msg)
    name = type(opt).__name__
    if is_schedule(opt.lr):
        msg = (
            f"{where}: the {name}'s `lr` is a paramdict schedule; as a torch.optim "
            "optimizer its rate is `param_groups[i]['lr']`, which torch's "
            "schedulers set. Give a number as `lr` and attach a "
            "`torch.optim.lr_scheduler` to the adapter."
        )
        raise TypeError(msg)
    per_key = sorted(
        f.name
        for f in attrs.fields(type(opt))
        if isinstance(getattr(opt, f.name), ParamDict)
    )
    if per_key:
        msg = (
            f"{where}: the {name}'s {per_key} are per-key ParamDicts; torch.optim's "
            "param_groups take one number per group. Give each set of values its "
            "own group (a list of dicts, or `optim.ParamGroups`)."
        )
        raise TypeError(msg)
    if opt.differentiable:
        msg = (
            f"{where}: the {name} is differentiable; the adapter writes its steps "
            "into the parameters, outside autograd. Build it with "
            "`differentiable=False`."
        )
        raise ValueError(msg)
    return opt


def _init_fields(member: TorchOptimizer[Any]) -> frozenset[str]:
    return frozenset(f.name for f in attrs.fields(type(member)) if f.init)


def defaults_of(member: TorchOptimizer[Any], state: object) -> dict[str, Any]:
    """The settings of `member` under torch's names; `foreach` as torch's default."""
    if counterpart(member):
        settings = _hyperparameters(member, state)
        if "foreach" in settings:
            settings["foreach"] = _defaults(_torch_class(member))["foreach"]
        return settings
    return {name: getattr(member, name) for name in sorted(_init_fields(member))}


def _numbers(value: object) -> list[object]:
    """A setting's numbers: its members if it is a pair (`betas`), else itself."""
    if isinstance(value, (tuple, list)):
        return list(cast("Sequence[object]", value))
    return [value]


def unchanged(now: object, before: object) -> bool:
    """Whether a written setting equals the applied one (tensors by identity)."""
    if now is before:
        return True
    if is_int_or_float(now) and is_int_or_float(before):
        return bool(now == before)
    if isinstance(now, (tuple, list)) and isinstance(before, (tuple, list)):
        a, b = cast("Sequence[object]", now), cast("Sequence[object]", before)
        return len(a) == len(b) and all(map(unchanged, a, b))
    if isinstance(now, (str, type(None))) and isinstance(before, (str, type(None))):
        return now == before
    return False


def configured(
    member: TorchOptimizer[Any],
    shown: Mapping[str, Any],
    changes: Mapping[str, Any],
    where: str,
    *,
    keep_fused: bool = False,
) -> TorchOptimizer[Any]:
    """Return a checked copy of `member` with the written `changes` (or `member`).

    `keep_fused`: a `fused` of None keeps the optimizer's own choice (a group
    being added) instead of torch's meaning, not fused.
    """
    fields = _init_fields(member)
    name = type(member).__name__
    options: dict[str, Any] = {}
    for key, value in changes.items():
        if value is MISSING:
            msg = f"{where} has no {key!r}; put it back (it was {shown[key]!r})."
            raise ValueError(msg)
        if key == "fused" and key in fields:
            if value is not None and not isinstance(value, bool):
                msg = f"{where}: `fused` must be None, True or False, got {value!r}."
                raise TypeError(msg)
            if not (keep_fused and value is None):
                options[key] = value is True
        elif key in fields:
            if isinstance(shown[key], tuple) and isinstance(value, list):
                value = tuple(cast("list[object]", value))
            options[key] = value
        elif key not in _FREE:
            msg = (
                f"{where} sets {key!r} to {value!r}; paramdict's {name} keeps it at "
                f"{shown[key]!r} (it has no such option). Leave it at that value."
            )
            raise ValueError(msg)
    if not options:
        return member
    try:
        made = attrs.evolve(member, **options)
    except (TypeError, ValueError) as error:
        msg = f"{where}: {error}"
        raise type(error)(msg) from error
    return checked(made, where)


def buffers(state: Any) -> dict[str, ParamDict]:
    """The fields of `state` that hold ParamDicts (buffers keyed like parameters)."""
    return {
        f: v for f in state._fields if isinstance(v := getattr(state, f), ParamDict)
    }


def _sub_state(state: Any, keys: Sequence[str]) -> Any:
    """The state of the entries `keys`: the same tensors, buffers subset."""
    values: dict[str, ParamDict] = {}
    for field in state._fields:
        value = getattr(state, field)
        if isinstance(value, ParamDict) and len(value):
            values[field] = subset(value, [k for k in keys if k in value])
    return state._replace(**values)


def _misfit(params: ParamDict, grads: list[Tensor], name: str) -> str | None:
    """Say which `.grad`s do not fit their parameters and why, or None."""
    sparse = sorted(k for k, g in zip(params._keys, grads) if g.layout != torch.strided)
    if sparse:
        return (
            f"the `.grad` of {sparse} is sparse; {name} takes dense gradients, as "
            "torch's does (torch's SparseAdam takes sparse ones). Build the "
            "embedding with `sparse=False`."
        )
    described = [
        f"{k!r}: {tuple(g.shape)} {g.dtype} on {g.device} for "
        f"{tuple(p.shape)} {p.dtype} on {p.device}"
        for k, p, g in zip(params._keys, params._vals, grads)
        if g.shape != p.shape or g.dtype != p.dtype or g.device != p.device
    ]
    if not described:
        return None
    return (
        f"a `.grad` does not fit its parameter ({', '.join(sorted(described))}). "
        "A gradient has its parameter's shape, dtype and device: set it with "
        "`p.grad = ...`, which torch checks, rather than through `.data`."
    )


_grad = cast("Callable[[Tensor], Tensor | None]", operator.attrgetter("grad"))


class Group:
    """One torch parameter group: its parameters, optimizer copy, state and binding.

    `params` are the module's own tensors, keyed by name (by number without one);
    `shown` are the settings the copy was configured with, as the dict shows them.
    """

    __slots__ = (
        "_bound",
        "_live",
        "_partial",
        "index",
        "member",
        "params",
        "shown",
        "state",
    )

    def __init__(
        self,
        index: int,
        params: ParamDict,
        member: TorchOptimizer[Any],
        state: Any,
        settings: Mapping[str, Any],
    ) -> None:
        self.index = index
        self.params = params
        self._partial: dict[tuple[str, ...], Bound[Any]] = {}
        self._hold(member, state, member.bind(params, state), settings)

    def _hold(
        self,
        member: TorchOptimizer[Any],
        state: Any,
        bound: Bound[Any],
        settings: Mapping[str, Any],
    ) -> None:
        """Hold `member`, `state` and their binding, as `settings` show them."""
        self.member, self.state, self._bound = member, state, bound
        self._partial.clear()
        self._live = _LIVE & _init_fields(member)
        self.shown = self._shown(settings)

    @classmethod
    def made(
        cls,
        index: int,
        base: TorchOptimizer[Any],
        group: dict[str, Any],
        keys: list[str],
    ) -> Group:
        """Return the group of torch's filled `group` dict, whose `fused` it sets."""
        where = f"param_groups[{index}]"
        params = ParamDict(dict(zip(keys, group["params"], strict=True)))
        shown = defaults_of(base, None)
        changes = {
            k: group.get(k, MISSING)
            for k, v in shown.items()
            if not unchanged(group.get(k, MISSING), v)
        }
        member = configured(base, shown, changes, where, keep_fused=True)
        if member is base:  # each group sets its own copy's rates
            member = attrs.evolve(base)
        made = cls(index, params, member, member.init(params), group)
        group.update(made.shown)
        return made

    def _shown(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The settings as shown: `fused` as what runs, the free ones as written."""
        shown = defaults_of(self.member, self.state)
        if "fused" in shown and "fused" in _init_fields(self.member):
            shown["fused"] = True if self.runs_fused() else None
        for key in (_FREE & shown.keys()) - _init_fields(self.member):
            shown[key] = settings.get(key, shown[key])
        for key, value in shown.items():  # the dict's own objects: `is` next time
            if key in settings and unchanged(settings[key], value):
                shown[key] = settings[key]
        return shown

    def sync(self, group: Mapping[str, Any]) -> None:
        """Configure the optimizer as `group` says now (see the module)."""
        if len(group.get("params", ())) != len(self.params):
            msg = (
                f"param_groups[{self.index}]['params'] was changed in place; add "
                "parameters with `add_param_group`, as a new group."
            )
            raise ValueError(msg)
        shown = self.shown
        changes: dict[str, Any] = {}
        for key, before in shown.items():
            now = group.get(key, MISSING)
            if now is before or unchanged(now, before):
                continue
            if key in self._live and self._set_live(key, now):
                shown[key] = now
            else:
                changes[key] = now
        if changes:
            where = f"param_groups[{self.index}]"
            member = configured(self.member, shown, changes, where)
            self._hold(member, self.state, member.bind(self.params, self.state), group)

    def _set_live(self, key: str, value: object) -> bool:
        """Set a number read at each step on the copy, unless the binding depends on it.

        A momentum that starts or stops being zero changes the buffers and the plan.
        """
        member = self.member
        before: object = getattr(member, key)
        numbers, olds = _numbers(value), _numbers(before)
        if len(numbers) != len(olds) or not all(
            map(is_int_or_float, [*numbers, *olds])
        ):
            return False
        if isinstance(before, tuple):
            value = tuple(numbers)  # `betas` written as a list
        if key == "momentum" and (value == 0) != (before == 0):
            return False
        attribute = attrs.fields_dict(type(member))[key]
        check = check_rate if key in _RATES else attribute.validator
        try:
            if check is not None:
                check(member, attribute, value)
        except (TypeError, ValueError) as error:
            msg = f"param_groups[{self.index}]: {error}"
            raise type(error)(msg) from error
        object.__setattr__(member, key, value)  # the adapter's private copy
        return True

    def replace(
        self,
        member: TorchOptimizer[Any],
        state: Any,
        bound: Bound[Any],
        settings: dict[str, Any],
    ) -> None:
        """Hold a loaded `member`, `state` and binding; set `settings` to what runs."""
        self._hold(member, state, bound, settings)
        settings.update(self.shown)

    def prepare(self) -> Callable[[], object] | None:
        """Check this step's gradients and prepare it; return its commit.

        None when no parameter has a gradient; as torch, those without are skipped.
        """
        params = self.params
        grads = list(map(_grad, params._vals))
        missing = list(map(operator.is_, grads, repeat(None)))
        if all(missing):
            return None
        bound = self._bound
        if any(missing):
            keys = tuple(k for k, g in zip(params._keys, grads) if g is not None)
            bound = self._subset(keys)
            given = bound.params._derive([g for g in grads if g is not None])
        else:
            given = params._derive(cast("list[Tensor]", grads))
            if not bound.holds(params, self.state):
                bound = self._bound = self.member.bind(params, self.state)
        try:
            aligned = bound.grads(given)
        except ValueError as error:
            misfit = _misfit(bound.params, given._vals, type(self.member).__name__)
            if misfit is None:
                raise
            msg = f"param_groups[{self.index}]: {misfit}"
            raise ValueError(msg) from error
        with torch.no_grad():
            commit = bound._plan(bound.params, bound.state)
        return lambda: commit(aligned)

    def _subset(self, keys: tuple[str, ...]) -> Bound[Any]:
        """The binding of the entries `keys` (made once per set of keys)."""
        bound = self._partial.get(keys)
        if bound is None or not bound.holds(bound.params, bound.state):
            params = subset(self.params, keys)
            bound = self.member.bind(params, _sub_state(self.state, keys))
            self._partial[keys] = bound
        return bound

    def runs_fused(self) -> bool:
        """Whether the bound step runs torch's fused kernel."""
        return isinstance(self._bound._plan, FusedPlan)

    def view(self) -> dict[Tensor, dict[str, Tensor]]:
        """Each parameter's buffers under torch's names (the state's own tensors)."""
        state = self.state
        per_key = buffers(state).items()
        counted = type(self.member).__name__ not in NO_STEP
        out: dict[Tensor, dict[str, Tensor]] = {}
        for key, param in self.params.items():
            entry = {f: v[key] for f, v in per_key if key in v}
            if counted:
                entry["step"] = state.step
            out[param] = entry
        return out
