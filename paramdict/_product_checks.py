"""The checks and helpers the keyed products share (hvp, vjp, jvp, cg, implicit).

Each check raises before anything is computed, naming the argument, the keys
and the fix.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from ._checks import check_flag, describe_kind
from ._container import key_mismatch_message
from ._paramdict import ParamDict

__all__ = [
    "aligned",
    "check_callable",
    "check_devices",
    "check_entries",
    "check_floating",
    "check_kinds",
    "check_options",
    "check_paramdict",
    "evaluate",
    "filled",
    "grad_or_none",
    "leaves",
    "unused_error",
]

P = TypeVar("P", bound=ParamDict)
T = TypeVar("T")


def evaluate(fn: Callable[..., T], name: str, what: str, *args: Any) -> T:
    """Return `fn(*args)`; an error it raises is the caller's, passed on as it is.

    On Python 3.11+ the error gets a note saying it came from `name`, so that it
    is not taken for one of `what`'s own refusals.
    """
    try:
        return fn(*args)
    except Exception as err:
        if sys.version_info >= (3, 11):
            err.add_note(f"(raised by `{name}`, the function given to `{what}`)")
        raise


def check_callable(fn: object, name: str, what: str) -> None:
    """Raise a TypeError naming `name` unless `fn` is callable."""
    if not callable(fn):
        msg = (
            f"`{what}`: `{name}` must be a callable, got {type(fn).__name__}. Pass "
            f"a function, e.g. `lambda p: loss(p.call(model, x), y)`."
        )
        raise TypeError(msg)


def check_paramdict(value: object, name: str, what: str) -> None:
    """Raise a TypeError naming `name` unless `value` is a ParamDict."""
    if not isinstance(value, ParamDict):
        msg = (
            f"`{what}`: `{name}` must be a ParamDict, got {type(value).__name__}. "
            f"Wrap it: `ParamDict({name})`."
        )
        raise TypeError(msg)


def check_entries(params: ParamDict, name: str, what: str) -> None:
    """Raise a ValueError if `params` is empty: there is nothing to differentiate.

    As `torch.autograd.grad` refuses empty `inputs`, and before `func` runs on a
    ParamDict without the keys it reads.
    """
    if not params:
        msg = (
            f"`{what}` needs at least one entry in `{name}` to differentiate with "
            "respect to, but it is empty. Check the selection that built it."
        )
        raise ValueError(msg)


def check_floating(params: ParamDict, name: str, what: str) -> None:
    """Raise a TypeError naming the entries of `params` that cannot be differentiated.

    They must be dense, floating point (or complex) tensors: not integer or
    boolean, not sparse. (Meta tensors are fine here: the products of meta
    tensors are meta tensors of the right shapes, as with `torch.autograd`.)
    """
    bad = sorted(
        k for k, v in params.items() if not (v.is_floating_point() or v.is_complex())
    )
    if bad:
        msg = (
            f"`{what}`: entries {bad!r} of `{name}` are not floating point, so they "
            "cannot be differentiated. Leave them out with `.exclude(...)`."
        )
        raise TypeError(msg)
    sparse = sorted(k for k, v in params.items() if v.layout != torch.strided)
    if sparse:
        msg = (
            f"`{what}`: entries {sparse!r} of `{name}` are sparse; `{what}` takes "
            "dense tensors. Convert them with `.to_dense()` first."
        )
        raise TypeError(msg)


def check_devices(params: ParamDict, name: str, what: str) -> None:
    """Raise a ValueError if some entries are meta tensors and others are not.

    Products of meta tensors are meta tensors of the right shapes (as with
    `torch.autograd`); a function of meta and real entries together has no
    backward torch can run.
    """
    meta = sorted(k for k, v in params.items() if v.is_meta)
    if meta and len(meta) != len(params):
        msg = (
            f"`{what}`: entries {meta!r} of `{name}` are meta tensors and the others "
            "are not; torch cannot differentiate through both. Move them to one "
            "kind of device first (`.to(device)`), all meta for shapes only."
        )
        raise ValueError(msg)


def check_kinds(
    keys: Sequence[str],
    ours: Sequence[Tensor],
    given: Sequence[Tensor],
    name: str,
    what: str,
    against: str,
) -> None:
    """Raise naming the keys where `given` cannot pair with `ours` in autograd.

    Each must be dense (`TypeError`), on its partner's device, and complex exactly
    where its partner is (`ValueError`): what torch's backward refuses, with a
    message that names neither the key nor the argument.
    """
    pairs = list(zip(keys, ours, given))
    sparse = sorted(k for k, _, g in pairs if g.layout != torch.strided)
    if sparse:
        msg = (
            f"`{what}`: `{name}` has sparse tensors at {sparse!r}; it takes dense "
            "ones. Convert them with `.to_dense()` first."
        )
        raise TypeError(msg)
    wrong = sorted(
        k
        for k, o, g in pairs
        if g.device != o.device or g.is_complex() != o.is_complex()
    )
    if wrong:
        by_key = {k: (o, g) for k, o, g in pairs}
        detail = ", ".join(
            f"{k!r}: {describe_kind(by_key[k][1])} vs {describe_kind(by_key[k][0])}"
            for k in wrong
        )
        msg = (
            f"`{what}`: `{name}` does not fit {against} at {wrong!r} ({detail}): "
            "each must be on its entry's device, and complex exactly where the "
            "entry is. Convert with `.to(...)` first."
        )
        raise ValueError(msg)


def check_options(what: str, **flags: object) -> None:
    """Raise a TypeError naming the first flag that is not a bool."""
    for name, value in flags.items():
        check_flag(value, name, what)


def aligned(
    params: ParamDict,
    other: object,
    name: str,
    what: str,
    *,
    shapes: bool = True,
    against: str = "params",
) -> list[Tensor]:
    """Return `other`'s tensors in `params`' key order, checking keys and shapes."""
    if not isinstance(other, Mapping):
        msg = (
            f"`{what}`: `{name}` must be a mapping of tensors keyed like the "
            f"params (a ParamDict), got {type(other).__name__}."
        )
        raise TypeError(msg)
    given = cast("Mapping[str, object]", other)
    if set(given) != set(params):
        msg = key_mismatch_message(
            list(params),
            given,
            what=f"`{what}` ({name} vs {against})",
            fix=f"Give `{name}` exactly the keys of {against}.",
        )
        raise ValueError(msg)
    not_tensors = sorted(k for k in params if not isinstance(given[k], Tensor))
    if not_tensors:
        msg = f"`{what}`: `{name}` holds non-tensors at {not_tensors!r}."
        raise TypeError(msg)
    values = [cast("Tensor", given[k]) for k in params]
    check_kinds(list(params), list(params.values()), values, name, what, against)
    if shapes:
        wrong = sorted(k for k, v in zip(params, values) if v.shape != params[k].shape)
        if wrong:
            by_key = dict(zip(params, values))
            detail = ", ".join(
                f"{k!r}: {tuple(by_key[k].shape)} vs {tuple(params[k].shape)}"
                for k in wrong
            )
            msg = (
                f"`{what}`: `{name}` has the wrong shapes at {wrong!r} ({detail}); "
                f"each must have the shape of its entry in {against}."
            )
            raise ValueError(msg)
    return values


def leaves(params: P, *, create_graph: bool) -> P:
    """Return `params` as tensors that require grad, for differentiating a function.

    With `create_graph`, values that already require grad stay connected to their
    graph (a view), so the product can be differentiated with respect to them;
    otherwise they are detached.
    """
    if create_graph:
        return params.map(
            lambda v: v.view_as(v) if v.requires_grad else v.detach().requires_grad_()
        )
    return params.detach().requires_grad_()


def unused_error(keys: Sequence[str], what: str) -> ValueError:
    """The error for entries the function does not depend on."""
    msg = (
        f"`{what}`: the function does not depend on {sorted(keys)!r}. Pass "
        "`allow_unused=True` to treat them as constants (zeros in the product), "
        "or leave them out with `.exclude(...)`."
    )
    return ValueError(msg)


def filled(
    params: ParamDict,
    found: Sequence[Tensor | None],
    what: str,
    *,
    allow_unused: bool,
) -> list[Tensor]:
    """Return `found` with zeros for `None`, or raise naming the unused entries."""
    missing = [k for k, g in zip(params, found) if g is None]
    if missing and not allow_unused:
        raise unused_error(missing, what)
    return [
        torch.zeros_like(v) if g is None else g for v, g in zip(params.values(), found)
    ]


def grad_or_none(
    outputs: Sequence[Tensor],
    inputs: Sequence[Tensor],
    grad_outputs: Sequence[Tensor],
    *,
    create_graph: bool,
    retain_graph: bool | None = None,
) -> Sequence[Tensor | None]:
    """`torch.autograd.grad` that gives `None` where nothing connects.

    Outputs that do not require grad contribute nothing and are left out.
    """
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    outs, gos = [o for o, _ in pairs], [g for _, g in pairs]
    if not outs:
        return [None] * len(inputs)
    return torch.autograd.grad(
        outs,
        list(inputs),
        grad_outputs=gos,
        create_graph=create_graph,
        retain_graph=retain_graph,
        allow_unused=True,
    )
