"""Optimizer states to and from `torch.optim` state dicts.

`load_torch_state_dict` builds the state of a paramdict optimizer from what
`torch.optim.Optimizer.state_dict()` returned (integer-indexed `state` and
`param_groups`) and the parameter names; `to_torch_state_dict` builds the dict
that `torch.optim.<Same>(...).load_state_dict` accepts. A run moves between the
two libraries and continues where it stopped.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import Tensor, nn

from paramdict import ParamDict

from ._base import TorchOptimizer

S = TypeVar("S")

Names = nn.Module | Sequence[Sequence[str]]


def _torch_class(opt: TorchOptimizer[Any]) -> type[torch.optim.Optimizer]:
    """Return torch.optim's class of the same name as `opt`'s."""
    name = type(opt).__name__
    cls = getattr(torch.optim, name, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        msg = f"torch.optim has no optimizer named {name!r}; convert its state by hand."
        raise TypeError(msg)
    return cls


def _group_names(names: Names) -> list[list[str]]:
    """Return the ordered names of each group (a module is one group)."""
    if isinstance(names, nn.Module):
        return [[name for name, _ in names.named_parameters()]]
    if isinstance(names, str) or not all(
        isinstance(group, Sequence) and not isinstance(group, str) for group in names
    ):
        msg = (
            "`names` must be a module or a sequence of groups, each a sequence of "
            "parameter names; wrap one group's names in a list: `[names]`."
        )
        raise TypeError(msg)
    return [list(group) for group in names]


def _hyperparameters(opt: TorchOptimizer[Any], cls: type[Any]) -> dict[str, Any]:
    """Return the group settings of torch's `cls` for `opt`'s configuration."""
    group: dict[str, Any] = {}
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name in ("self", "params") or parameter.default is inspect.Parameter.empty:
            continue
        value = getattr(opt, name, parameter.default)
        if isinstance(value, ParamDict) or not isinstance(
            value, (int, float, bool, str, tuple, Tensor, type(None))
        ):
            msg = (
                f"The setting {name!r} of {type(opt).__name__} is {type(value).__name__}"
                f"; torch.optim's param_groups take one number per group. Give a "
                "number or a 0-dim tensor."
            )
            raise TypeError(msg)
        group[name] = value
    return group


def _buffer_fields(state: Any) -> list[str]:
    """Return the fields of a state NamedTuple that hold tensors or ParamDicts."""
    return [
        f
        for f in state._fields
        if f != "schedule" and isinstance(getattr(state, f), (Tensor, ParamDict))
    ]


def _check_state(opt: TorchOptimizer[Any], template: Any, kind: str) -> None:
    if not (isinstance(template, tuple) and hasattr(template, "_fields")):
        msg = (
            f"{type(opt).__name__} keeps no per-parameter state of torch.optim's "
            f"kind; {kind} supports the optimizers with a state NamedTuple."
        )
        raise TypeError(msg)
    if getattr(template, "schedule", ()) != ():
        msg = (
            f"{type(opt).__name__} has a scheduled `lr`; {kind} converts states of "
            "optimizers with a fixed `lr`."
        )
        raise TypeError(msg)


def load_torch_state_dict(
    opt: TorchOptimizer[S],
    state_dict: Mapping[str, Any],
    params: ParamDict,
    names: Names,
) -> S:
    """Return the state of `opt` that continues a torch.optim run.

    `state_dict` is what `torch.optim.<Same>.state_dict()` returned; `names`
    gives the parameter name of each index: a module (its `named_parameters`
    order, as `torch.optim.<Same>(module.parameters())` saw them) or the ordered
    names of each parameter group. Every buffer is copied to the dtype and
    device of `opt.init(params)`; a parameter torch has no state for yet starts
    from `init`'s value, as torch would start it. Nothing is changed.

    Args:
        opt: The paramdict optimizer, configured as the torch one was.
        state_dict: The torch.optim state dict.
        params: The parameters the state is for.
        names: A module, or the ordered parameter names of each group.

    Returns:
        The state, as `opt.init(params)` returns it, at torch's step.

    Raises:
        TypeError: If `opt` has no torch.optim counterpart or `names` is malformed.
        ValueError: If the groups, parameters or buffers do not fit `opt` and
            `params`; the message names them.

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
    cls = _torch_class(opt)
    groups = _group_names(names)
    template: Any = opt.init(params)
    _check_state(opt, template, "load_torch_state_dict")
    saved_groups = list(state_dict.get("param_groups", ()))
    if len(saved_groups) != len(groups):
        msg = (
            f"The state dict has {len(saved_groups)} parameter group(s) and `names` "
            f"{len(groups)}; give the names of each group in torch's order."
        )
        raise ValueError(msg)
    expected = set(_hyperparameters(opt, cls))
    index: dict[int, str] = {}
    for i, (group, group_names) in enumerate(zip(saved_groups, groups, strict=True)):
        ids = list(group["params"])
        if len(ids) != len(group_names):
            msg = (
                f"Group {i} of the state dict holds {len(ids)} parameters and "
                f"`names` gives {len(group_names)}; give one name per parameter."
            )
            raise ValueError(msg)
        unknown = sorted(set(group) - expected - {"params", "param_names", "initial_lr"})
        if unknown:
            msg = (
                f"Group {i} has settings {unknown} that {cls.__name__} does not take; "
                f"the state dict is another optimizer's. Use that optimizer."
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
    saved: dict[str, Mapping[str, Any]] = {
        index[i]: s for i, s in state_dict.get("state", {}).items()
    }
    fields = _buffer_fields(template)
    per_key = {f for f in fields if isinstance(getattr(template, f), ParamDict)}
    allowed = set(fields) | {"momentum_buffer"}
    for name in sorted(saved):
        unknown = sorted(set(saved[name]) - allowed)
        if unknown:
            msg = (
                f"The state of {name!r} holds buffers {unknown} that "
                f"{type(opt).__name__} does not keep; the state dict is another "
                "optimizer's or another configuration's."
            )
            raise ValueError(msg)
    values: dict[str, Any] = {}
    for f in fields:
        value = getattr(template, f)
        if f in per_key:
            entries: dict[str, Tensor] = {}
            for key, init in cast("ParamDict", value).items():
                got = saved.get(key, {}).get(f)
                entries[key] = init if got is None else _fit(got, init, f"{f} of {key!r}")
            values[f] = ParamDict(entries)
        else:
            found = [saved[k][f] for k in sorted(saved) if saved[k].get(f) is not None]
            got_scalar = found[0] if found else None
            values[f] = (
                value if got_scalar is None else _fit(got_scalar, value, f"{f!r}")
            )
    return cast("S", template._replace(**values))


def _fit(got: Any, like: Tensor, what: str) -> Tensor:
    """Return `got` as a copy with `like`'s dtype and device, checking its shape."""
    if not isinstance(got, Tensor):
        got = torch.as_tensor(got)
    if got.shape != like.shape:
        msg = (
            f"The buffer {what} has shape {tuple(got.shape)} and paramdict's "
            f"{tuple(like.shape)}; the state dict is for other parameters."
        )
        raise ValueError(msg)
    if got.is_floating_point() != like.is_floating_point():
        msg = (
            f"The buffer {what} has dtype {got.dtype} and paramdict's {like.dtype}; "
            "give floating-point buffers."
        )
        raise ValueError(msg)
    return got.detach().to(dtype=like.dtype, device=like.device, copy=True)


def to_torch_state_dict(
    opt: TorchOptimizer[S], state: S, names: Names
) -> dict[str, Any]:
    """Return the torch.optim state dict of `opt`'s `state`.

    `torch.optim.<Same>(params).load_state_dict` accepts it when `params` are
    the parameters named by `names` in that order (a module's `parameters()`,
    or one group per sequence of names); `param_groups` carry `opt`'s settings
    and every buffer is a copy. `state` is unchanged.

    Args:
        opt: The paramdict optimizer.
        state: Its state.
        names: A module, or the ordered parameter names of each group.

    Returns:
        A dict with `state` (by integer index) and `param_groups`.

    Raises:
        TypeError: If `opt` has no torch.optim counterpart or a setting is not
            one number per group.
        ValueError: If `names` and the state's keys differ; the message names them.

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
    cls = _torch_class(opt)
    groups = _group_names(names)
    s: Any = state
    _check_state(opt, s, "to_torch_state_dict")
    fields = _buffer_fields(s)
    per_key = [f for f in fields if isinstance(getattr(s, f), ParamDict)]
    keys: set[str] = set()
    for f in per_key:
        keys |= set(cast("ParamDict", getattr(s, f)))
    named = [name for group in groups for name in group]
    extra = sorted(keys - set(named))
    if extra:
        msg = (
            f"The state holds parameters {extra} that `names` does not give; give "
            "the names of every parameter the state is for."
        )
        raise ValueError(msg)
    settings = _hyperparameters(opt, cls)
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    out_state: dict[int, dict[str, Any]] = {}
    param_groups: list[dict[str, Any]] = []
    i = 0
    for group in groups:
        ids: list[int] = []
        for name in group:
            entry: dict[str, Any] = {}
            for f in fields:
                value = getattr(s, f)
                if f in per_key:
                    if name in value:
                        entry[f] = cast("Tensor", value[name]).detach().clone()
                elif f == "step":
                    entry[f] = value.detach().to(scalar, copy=True)
                else:
                    entry[f] = cast("Tensor", value).detach().clone()
            if any(f in entry for f in per_key):
                out_state[i] = entry
            ids.append(i)
            i += 1
        param_groups.append({**_copy(settings), "params": ids})
    return {"state": out_state, "param_groups": param_groups}


def _copy(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Return the settings with tensors copied."""
    return {
        k: v.detach().clone() if isinstance(v, Tensor) else v
        for k, v in settings.items()
    }
