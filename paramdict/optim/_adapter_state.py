"""The state dict of `TorchAdapter`, in torch's own format, out and back in.

Buffers go under torch's names through `to_torch_state_dict` for the optimizers
torch has, under the state's field names for the others; the groups are the
adapter's dicts as they are. `loaded` checks every group before the adapter
holds any.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (the shared conversions of `_torch_state.py`, of this package)
import copy
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._adapter_groups import Group, buffers, configured, unchanged
from ._torch_export import to_torch_state_dict
from ._torch_optimizer import TorchOptimizer
from ._torch_paths import FLAGS, torch_flags
from ._torch_state import _filled, _fit, counterpart, load_torch_state_dict

__all__ = ["exported", "loaded"]

_OPTIONAL = FLAGS | {"maximize", "decoupled_weight_decay"}
"""Settings a saved group may lack (torch fills them in for older checkpoints)."""


def _own_state(group: Group, keys: list[str]) -> dict[int, dict[str, Tensor]]:
    """The buffers of an optimizer torch does not have, under its state's names."""
    state, per_key = group.state, buffers(group.state).items()
    scalar = torch.promote_types(torch.get_default_dtype(), torch.float32)
    out: dict[int, dict[str, Tensor]] = {}
    for i, key in enumerate(keys):
        if entry := {f: v[key].detach().clone() for f, v in per_key if key in v}:
            out[i] = {**entry, "step": state.step.detach().to(scalar, copy=True)}
    return out


def exported(
    groups: Sequence[Group], settings: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Return the state dict of the adapter's `groups` and their dicts."""
    state: dict[int, dict[str, Tensor]] = {}
    packed: list[dict[str, Any]] = []
    offset = 0
    for group, group_dict in zip(groups, settings, strict=True):
        keys = list(group.params)
        if counterpart(group.member):
            part = to_torch_state_dict(group.member, group.state, [keys])["state"]
        else:
            part = _own_state(group, keys)
        state.update((offset + i, entry) for i, entry in part.items())
        saved = {k: v for k, v in group_dict.items() if k != "params"}
        if counterpart(group.member) and saved.get("foreach", False) is None:
            # the `foreach` that makes torch run its kernels (None beside fused ones)
            flags = torch_flags(group.member, group.state, {"foreach": None})
            saved["foreach"] = None if group.runs_fused() else flags["foreach"]
        packed.append({**saved, "params": list(range(offset, offset + len(keys)))})
        offset += len(keys)
    return {"state": state, "param_groups": packed}


def _own_loaded(
    member: TorchOptimizer[Any],
    entries: Mapping[int, Mapping[str, Any]],
    params: ParamDict,
    where: str,
) -> Any:
    """The state of an optimizer torch does not have, from its saved buffers."""
    template: Any = member.init(params)
    keys = list(params)
    per_key = buffers(template)
    for i in sorted(entries):
        kept = {f for f, v in per_key.items() if keys[i] in v} | {"step"}
        unknown = sorted(set(entries[i]) - kept)
        if unknown:
            msg = (
                f"{where}: the state of {keys[i]!r} holds buffers {unknown} that "
                f"{type(member).__name__} does not keep; the state dict is another "
                "optimizer's or another configuration's."
            )
            raise ValueError(msg)
    by_name = {keys[i]: entry for i, entry in entries.items()}
    values: dict[str, Any] = {f: _filled(v, by_name, f, f) for f, v in per_key.items()}
    steps = [e["step"] for _, e in sorted(entries.items()) if "step" in e]
    if steps:
        values["step"] = _fit(steps[0], template.step, "'step'")
    return template._replace(**values)


def loaded(
    groups: Sequence[Group],
    settings: Sequence[Mapping[str, Any]],
    state_dict: Mapping[str, Any],
) -> list[tuple[TorchOptimizer[Any], Any, dict[str, Any]]]:
    """Return, for each group, its optimizer, state and dict after `state_dict`."""
    given: object = state_dict.get("param_groups")
    if not isinstance(given, Sequence):
        msg = (
            "The state dict has no `param_groups`; give what `state_dict()` "
            "returned (the adapter's, or torch.optim's)."
        )
        raise TypeError(msg)
    saved_groups: list[dict[str, Any]] = copy.deepcopy(
        list(cast("Sequence[dict[str, Any]]", given))
    )
    if len(saved_groups) != len(groups):
        msg = "loaded state dict has a different number of parameter groups"
        raise ValueError(msg)
    if any(len(s["params"]) != len(g.params) for s, g in zip(saved_groups, groups)):
        msg = (
            "loaded state dict contains a parameter group that doesn't match the "
            "size of optimizer's group"
        )
        raise ValueError(msg)
    saved_state: Mapping[Any, Mapping[str, Any]] = state_dict.get("state", {})
    out: list[tuple[TorchOptimizer[Any], Any, dict[str, Any]]] = []
    for i, (group, current, saved) in enumerate(
        zip(groups, settings, saved_groups, strict=True)
    ):
        where = f"Group {i} of the state dict"
        shown = group.shown
        name = type(group.member).__name__
        lacking = sorted(k for k in shown if k not in saved and k not in _OPTIONAL)
        if lacking:
            msg = (
                f"{where} lacks the settings {lacking} of {name}: the state dict is "
                "another optimizer's. Load it into an adapter of that optimizer."
            )
            raise ValueError(msg)
        changes = {
            k: saved[k]
            for k in shown
            if k in saved and not unchanged(saved[k], shown[k])
        }
        member = configured(group.member, shown, changes, where)
        entries = {
            j: saved_state[pid]
            for j, pid in enumerate(saved["params"])
            if pid in saved_state
        }
        keys = list(group.params)
        if counterpart(member):
            ours = {k: saved[k] for k in shown if k in saved}
            ours["params"] = list(range(len(keys)))
            torch_dict = {"state": entries, "param_groups": [ours]}
            state = load_torch_state_dict(member, torch_dict, group.params, [keys])
        else:
            state = _own_loaded(member, entries, group.params, where)
        saved["params"] = current["params"]
        if "param_names" in current and "param_names" not in saved:
            saved["param_names"] = current["param_names"]
        out.append((member, state, saved))
    return out
