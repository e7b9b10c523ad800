"""The buffers of a state against its parameters: keys, shapes, dtypes, presence.

`TorchOptimizer.check_state` checks the state's type, counter and schedule
itself and hands the buffers here (unless `_repeat.py` kept that these very
tensors passed before, unchanged). A buffer keyed like the parameters must match each
entry; an empty one is refused where the optimizer's options keep that buffer
(a state from `Adam(amsgrad=False)` given to `Adam(amsgrad=True)`), naming the
option and the fix.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import check_rate_keys
from ._keyed import check_keyed

if TYPE_CHECKING:
    from ._base import TorchOptimizer

__all__ = ["check_buffers"]

_NEEDED: weakref.WeakKeyDictionary[TorchOptimizer[Any], frozenset[str]] = (
    weakref.WeakKeyDictionary()
)


def check_buffers(opt: TorchOptimizer[Any], params: ParamDict, state: Any) -> None:
    """Raise unless each buffer field of `state` fits `params` and `opt`'s options.

    Raises:
        TypeError: If a buffer field is not a ParamDict.
        ValueError: If a buffer's keys, shapes, dtypes or devices are not
            `params`', or a buffer `opt`'s options keep is empty.
    """
    for field, buffer in zip(state._fields, state):
        if field in ("step", "schedule"):
            continue
        if isinstance(buffer, ParamDict) and not buffer:
            # Eager only: a cache filled while tracing would recompile.
            if (
                params
                and not torch.compiler.is_compiling()
                and field in _needed_buffers(opt, params)
            ):
                _refuse_missing(opt, field)
            continue
        if isinstance(buffer, Tensor) and buffer.dim() == 0:
            continue  # a scalar of the state, such as NAdam's `mu_product`
        what = f"The state's `{field}`"
        if not isinstance(buffer, ParamDict):
            msg = f"{what} must be a ParamDict, got {type(buffer).__name__}."
            raise TypeError(msg)
        if buffer.keys() != params.keys():
            check_rate_keys(params, field, buffer)
        check_keyed(params, buffer, what=what)


def _needed_buffers(opt: TorchOptimizer[Any], params: ParamDict) -> frozenset[str]:
    """Return the fields that `opt.init_state` fills for non-empty `params`.

    Which buffers a state keeps depends on the options alone (`amsgrad`,
    `centered`, `momentum`), so the verdict is computed once per optimizer,
    from `init_state` on meta copies of `params` (nothing is allocated).
    """
    cached = _NEEDED.get(opt)
    if cached is not None:
        return cached
    probe = ParamDict(
        {k: torch.empty_like(v, device="meta") for k, v in params.items()}
    )
    first: Any = opt.init_state(probe)
    needed = frozenset(
        field
        for field, buffer in zip(first._fields, first)
        if isinstance(buffer, ParamDict) and buffer
    )
    _NEEDED[opt] = needed
    return needed


def _refuse_missing(opt: TorchOptimizer[Any], field: str) -> None:
    name = type(opt).__name__
    option = opt.buffer_options.get(field)
    why = f"`{option}` needs it" if option is not None else "its options need it"
    msg = (
        f"The state's `{field}` is empty, but `{name}` keeps that buffer: "
        f"{why}, and the state comes from an optimizer without it. Start a new "
        f"state with `init`, or add the buffer: "
        f"`state._replace({field}=params.zeros_like())`."
    )
    raise ValueError(msg)
