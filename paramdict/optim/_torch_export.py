"""Optimizer states to `torch.optim` state dicts: the inverse of `_torch_state.py`."""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (the shared mapping of `_torch_state.py`, of this package)
from typing import Any, TypeVar, cast

import torch
from torch import Tensor, nn

from .._paramdict import ParamDict
from ._optimizer import Optimizer
from ._torch_dict import NO_STEP
from ._torch_optimizer import TorchOptimizer
from ._torch_state import (
    Names,
    _buffer_fields,
    _check_state,
    _group_names,
    _hyperparameters,
    _is_groups,
    _torch_class,
)

S = TypeVar("S")

__all__ = ["to_torch_state_dict"]


def to_torch_state_dict(
    opt: Optimizer[S], state: S, names: Names, *, by_name: bool = False
) -> dict[str, Any]:
    """Return the torch.optim state dict of `opt`'s `state`.

    `torch.optim.<Same>(params).load_state_dict` accepts it when `params` are
    the parameters `names` names, in order (for `ParamGroups` its groups, then
    its default). `param_groups` carry `opt`'s settings (a scheduled `lr` at
    its current value, with `initial_lr`), and the flags that choose torch's
    kernels name those `opt.step` runs (`fused=True`, or the `foreach` that
    rounds as the rule), so torch continues bit for bit
    (`docs/coming-from-torch-optim.md`). `by_name=True` keys the parameters by
    name, as `torch.distributed.checkpoint` takes them. `state` is checked as
    `step` checks it: against the module's parameters when `names` is one,
    else only against its own buffers (so give the module where you have it).
    Every buffer is a copy; `state` is unchanged.

    Args:
        opt: The paramdict optimizer.
        state: Its state.
        names: A module, or the ordered parameter names of each group.
        by_name: Key the parameters by name (torch.distributed.checkpoint's
            format), not by number.

    Returns:
        A dict with `state` (by integer index, or by name) and `param_groups`.

    Raises:
        TypeError: If `opt` has no torch.optim counterpart (in the installed
            torch), a setting is not one number per group, or a field of
            `state` holds another kind of value than `init` puts there.
        ValueError: If `names` and the state's keys or groups differ (a name
            the state does not hold, or a key `names` does not give), a buffer
            or the counter is not what `step` accepts, or `opt` uses a setting
            the installed torch's class lacks; the message names them.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = optim.SGD(lr=0.1, momentum=0.9)
        >>> params = ParamDict.from_module(model)
        >>> state = opt.init(params)
        >>> theirs = torch.optim.SGD(model.parameters(), lr=0.5)
        >>> theirs.load_state_dict(optim.to_torch_state_dict(opt, state, model))
        >>> theirs.param_groups[0]["lr"], sorted(theirs.state_dict()["state"])
        (0.1, [0, 1])
    """
    groups = _group_names(names)
    given: Any = state
    members: list[Optimizer[Any]]
    if _is_groups(opt):
        members, substates = list(opt._members()), list(opt._full(given))
    else:
        members, substates = [opt], [given]
    if len(members) != len(groups):
        msg = (
            f"`names` gives {len(groups)} groups and the {type(opt).__name__} has "
            f"{len(members)}; give the names of each group in its order (for "
            "ParamGroups its groups, then its default)."
        )
        raise ValueError(msg)
    out_state: dict[Any, dict[str, Any]] = {}
    param_groups: list[dict[str, Any]] = []
    module: dict[str, Tensor] | None = None
    if isinstance(names, nn.Module):
        module = {k: v.detach() for k, v in names.named_parameters()}
    offset = 0
    for member, substate, group in zip(members, substates, groups, strict=True):
        part, settings = _export_group(member, substate, group, module)
        ids = list(group) if by_name else list(range(offset, offset + len(group)))
        out_state.update((ids[i], entry) for i, entry in part.items())
        param_groups.append({**settings, "params": ids})
        offset += len(group)
    return {"state": out_state, "param_groups": param_groups}


def _export_group(
    opt: Optimizer[Any],
    state: Any,
    group: list[str],
    module: dict[str, Tensor] | None,
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """Return torch's entries (by place in `group`) and settings of one group."""
    _torch_class(opt)
    member = cast("TorchOptimizer[Any]", opt)
    _check_state(member, state)
    if module is not None:
        member.check_state(ParamDict({k: module[k] for k in group}), state)
    fields = _buffer_fields(state)
    per_key = [f for f in fields if isinstance(getattr(state, f), ParamDict)]
    keys = {k for f in per_key for k in cast("ParamDict", getattr(state, f))}
    extra = sorted(keys - set(group))
    if extra:
        msg = (
            f"The state holds parameters {extra} that `names` does not give; give "
            "the names of every parameter the state is for."
        )
        raise ValueError(msg)
    missing = sorted(set(group) - keys)
    if keys and missing:
        msg = (
            f"`names` gives parameters {missing} that the state does not hold; "
            "give the names of the parameters the state is for (or build the "
            "state with `init` on all of them)."
        )
        raise ValueError(msg)
    if module is None:
        member.check_state(member._stand_ins(state), state)
    settings = _hyperparameters(member, state)
    scalar = torch.promote_types(torch.get_default_dtype(), torch.float32)
    out: dict[int, dict[str, Any]] = {}
    for i, name in enumerate(group):
        entry: dict[str, Any] = {}
        for f in fields:
            value = getattr(state, f)
            if f in per_key:
                if name in value:
                    entry[f] = cast("Tensor", value[name]).detach().clone()
            elif f == "step":
                if type(member).__name__ not in NO_STEP:
                    entry[f] = value.detach().to(scalar, copy=True)
            else:
                entry[f] = cast("Tensor", value).detach().clone()
        if any(f in entry for f in per_key):
            out[i] = entry
    return out, {
        k: v.detach().clone() if isinstance(v, Tensor) else v
        for k, v in settings.items()
    }
