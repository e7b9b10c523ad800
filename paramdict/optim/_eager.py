"""The eager checks of a compiled `step_`, hidden from the compiler on first use.

`torch.compiler.disable` imports `torch._dynamo`, so the wrapped function is made
when first looked up (`__getattr__`), which only a compiled step does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

__all__: list[str] = []  # `checked`, made on first look-up (`__getattr__`)

REASON = (
    "`step_` checks what it may write (shared memory, inference tensors) eagerly, "
    "then compiles the update as one graph: compile it without `fullgraph=True`, "
    "or compile `step`, which is one graph"
)


def _checked(opt: Any, params: Any, grads: Any, state: Any) -> Any:
    return opt._bound(params, state, in_place=True).grads(grads)


def __getattr__(name: str) -> Any:
    if name != "checked":
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    disable = cast("Callable[..., Any]", torch.compiler.disable)  # pyright: ignore[reportUnknownMemberType]  # untyped in torch
    try:
        made = disable(_checked, reason=REASON)
    except TypeError:  # torch before 2.7: `disable` takes no reason
        made = disable(_checked)
    globals()["checked"] = made
    return made
