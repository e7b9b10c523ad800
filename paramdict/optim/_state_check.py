"""The buffers of a state against its parameters: kinds, keys, shapes, presence.

What each field must hold is read from the optimizer's `init_state` on meta
copies of the parameters (nothing is allocated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import check_rate_keys
from ._validate import check_keyed

if TYPE_CHECKING:
    from ._torch_optimizer import TorchOptimizer

__all__ = ["check_buffers", "check_scalar"]


def check_buffers(opt: TorchOptimizer[Any], params: ParamDict, state: Any) -> None:
    """Raise unless each buffer field of `state` fits `params` and `opt`'s options."""
    kinds = _kinds(opt, params)
    for field, buffer in zip(state._fields, state):
        if field in ("step", "schedule") or field in opt.own_fields:
            continue
        kind = kinds.get(field)
        what = f"The state's `{field}`"
        if kind == "other":  # the optimizer's own kind of field: its own check
            continue
        if kind is None and isinstance(buffer, Tensor) and buffer.dim() == 0:
            continue  # a scalar, where the first state could not be probed
        if kind == "scalar":
            check_scalar(params, field, buffer)
            continue
        if isinstance(buffer, ParamDict) and not buffer:
            if params and kind == "buffer":
                option = opt.buffer_options.get(field)
                why = (
                    f"`{option}` needs it"
                    if option is not None
                    else "its options need it"
                )
                msg = (
                    f"{what} is empty, but `{type(opt).__name__}` keeps that buffer: "
                    f"{why}, and the state comes from an optimizer without it. Start "
                    f"a new state with `init`, or add the buffer: "
                    f"`state._replace({field}=params.zeros_like())`."
                )
                raise ValueError(msg)
            continue
        if not isinstance(buffer, ParamDict):
            msg = (
                f"{what} must be a ParamDict keyed like the parameters, got "
                f"{_describe(buffer)}. Use the state from this optimizer's `init` "
                "(or a checkpoint of it)."
            )
            raise TypeError(msg)
        check_rate_keys(params, field, buffer)
        if buffer._keys != params._keys:
            msg = (
                f"{what} must match the parameters entry by entry, in their order; "
                "it holds their keys in another order (a state made for other "
                "parameters). Build the state with `init` on these parameters."
            )
            raise ValueError(msg)
        check_keyed(params, buffer._vals, what=what)


def check_scalar(params: ParamDict, field: str, value: object) -> None:
    """Raise unless `value` is a 0-dim float tensor on the CPU or the params' device."""
    what = f"The state's `{field}`"
    fix = "Use the state from this optimizer's `init` (or a checkpoint of it)."
    if not (
        isinstance(value, Tensor) and value.dim() == 0 and value.is_floating_point()
    ):
        got = _describe(value)
        msg = f"{what} must be a 0-dim floating-point tensor, got {got}. {fix}"
        raise TypeError(msg)
    first = next(iter(params.values()), None)
    device = value.device if first is None else first.device
    if value.device.type != "cpu" and value.device != device:
        msg = (
            f"{what} is on {value.device}, the parameters on {device}. Keep it "
            f"on the CPU or the parameters' device. {fix}"
        )
        raise ValueError(msg)


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _kinds(opt: TorchOptimizer[Any], params: ParamDict) -> dict[str, str]:
    """Each field's kind in `opt.init_state`: buffer, empty, scalar or other.

    Empty where the probe on meta copies cannot run.
    """
    if not params or torch.compiler.is_compiling():
        return {}
    probe = ParamDict(
        {k: torch.empty_like(v, device="meta") for k, v in params.items()}
    )
    try:
        first: Any = opt.init_state(probe)
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return {}
    kinds: dict[str, str] = {}
    shapes = [v.shape for v in probe.values()]
    for field, value in zip(first._fields, first):
        if isinstance(value, ParamDict) and value.keys() == probe.keys():
            same = [value[k].shape for k in probe] == shapes
            kinds[field] = "buffer" if same else "other"
        elif isinstance(value, ParamDict):
            kinds[field] = "empty" if not value else "other"
        elif isinstance(value, Tensor) and value.dim() == 0:
            kinds[field] = "scalar"
        else:
            kinds[field] = "other"
    return kinds
