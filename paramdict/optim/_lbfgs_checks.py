"""What `LBFGS` refuses: a per-key `lr`, a foreign state, a closure of the wrong kind.

The state records the keys and shapes it was built for (`layout`): a state for
other parameters of the same size would otherwise be used silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NoReturn, cast

from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import check_rate
from ._schedules.slot import is_schedule

__all__ = ["Layout", "check_lr", "check_state", "closure_result", "layout_of"]

Layout = tuple[tuple[str, tuple[int, ...]], ...]
"""Each entry's key and shape, in order: what the flat vectors of a state stand for."""

_FIX = "Use the state from this optimizer's `init` for these parameters."


def check_lr(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless `value` is a number or a 0-dim tensor (no per-key rates)."""
    if isinstance(value, ParamDict):
        msg = (
            "`lr` of `LBFGS` must be a number: L-BFGS steps all entries as one flat "
            "vector, so per-key learning rates (a ParamDict) do not apply. Pass one "
            "number, or optimize the groups with separate `LBFGS` instances."
        )
        raise TypeError(msg)
    if is_schedule(value):
        msg = (
            f"`lr` of `LBFGS` must be a number, got a {type(value).__name__}: "
            "`LBFGS` takes no schedule (its step runs a line search at a fixed "
            "rate). Step the schedule yourself and give each step its rate: "
            "`attrs.evolve(opt, lr=float(schedule_state.lr))` keeps the state valid."
        )
        raise TypeError(msg)
    check_rate(instance, attribute, value)


def layout_of(params: ParamDict) -> Layout:
    """Return the keys and shapes of `params`, for the state to record."""
    return tuple((k, tuple(v.shape)) for k, v in params.items())


def _refuse(field: str, problem: str, error: type[Exception] = ValueError) -> NoReturn:
    msg = f"The `LBFGS` state's `{field}` {problem}. {_FIX}"
    raise error(msg)


def _check_layout(params: ParamDict, recorded: object) -> None:
    if recorded == ():
        return  # a state saved before layouts were recorded: counts are checked
    if not isinstance(recorded, tuple):
        _refuse("layout", f"must be a tuple, got {type(recorded).__name__}", TypeError)
    given = dict(layout_of(params))
    pairs = cast("tuple[tuple[object, Iterable[object]], ...]", recorded)
    kept: dict[str, tuple[int, ...]] | None
    try:
        kept = {str(k): tuple(int(cast(Any, n)) for n in s) for k, s in pairs}
    except (TypeError, ValueError):
        kept = None  # refused outside the handler: no chained exception
    if kept is None:
        _refuse("layout", "must hold (key, shape) pairs", TypeError)
    if list(kept) == list(given) and kept == given:
        return
    missing = sorted(set(given) - set(kept))
    unexpected = sorted(set(kept) - set(given))
    reshaped = sorted(k for k in set(given) & set(kept) if given[k] != kept[k])
    parts = [
        f"{label} {keys!r}"
        for label, keys in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("with other shapes", reshaped),
        )
        if keys
    ] or ["in another order"]
    msg = (
        "The `LBFGS` state was built for other parameters: its history is of "
        f"flat vectors over other entries ({', '.join(parts)}), so using it would "
        f"mix another model's curvature into this one. {_FIX}"
    )
    raise ValueError(msg)


def _check_vector(name: str, value: object, numel: int, like: Tensor) -> None:
    if not isinstance(value, Tensor) or value.dim() != 1:
        kind = type(value).__name__
        _refuse(name, f"must be a 1-dim tensor, got {kind}", TypeError)
    if value.numel() != numel:
        _refuse(
            name,
            f"has {value.numel()} elements, the parameters {numel} together "
            "(a state from other parameters)",
        )
    if value.dtype != like.dtype or value.device != like.device:
        _refuse(
            name,
            f"is {value.dtype} on {value.device}, the parameters {like.dtype} on "
            f"{like.device}",
        )


def _check_scalar(name: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, Tensor) and value.dim() == 0 and value.is_floating_point():
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return
    expected = "a number, a 0-dim tensor" + (" or None" if optional else "")
    _refuse(name, f"must be {expected}, got {type(value).__name__}", TypeError)


def check_state(params: ParamDict, state: Any) -> None:
    """Raise unless `state` is an `LBFGSState` for `params`."""
    for name in ("func_evals", "n_iter"):
        count = getattr(state, name)
        if not isinstance(count, int) or isinstance(count, bool):
            _refuse(name, f"must be an int, got {type(count).__name__}", TypeError)
        if count < 0:
            _refuse(name, f"must be >= 0, got {count}")
    _check_layout(params, getattr(state, "layout", ()))
    like = next(iter(params.values()))
    numel = sum(v.numel() for v in params.values())
    for name in ("d", "prev_flat_grad"):
        value = getattr(state, name)
        if value is None:
            if state.n_iter > 0:
                _refuse(name, f"is None after {state.n_iter} iterations")
            continue
        _check_vector(name, value, numel, like)
    _check_scalar("t", state.t, optional=state.n_iter == 0)
    _check_scalar("H_diag", state.H_diag, optional=False)
    prev_loss = state.prev_loss
    if not (prev_loss is None or isinstance(prev_loss, (int, float, Tensor))):
        kind = type(prev_loss).__name__
        _refuse("prev_loss", f"must be a number or None, got {kind}", TypeError)
    history = {name: getattr(state, name) for name in ("old_dirs", "old_stps", "ro")}
    for name, kept in history.items():
        if not isinstance(kept, (tuple, list)):
            _refuse(name, f"must be a tuple, got {type(kept).__name__}", TypeError)
    lengths = {name: len(kept) for name, kept in history.items()}
    if len(set(lengths.values())) > 1:
        _refuse("old_dirs", f"`old_stps` and `ro` differ in length ({lengths})")
    for name in ("old_dirs", "old_stps"):
        for i, vector in enumerate(history[name]):
            _check_vector(f"{name}[{i}]", vector, numel, like)
    for i, value in enumerate(history["ro"]):
        _check_scalar(f"ro[{i}]", value, optional=False)


def closure_result(result: object) -> tuple[Tensor, Mapping[str, Tensor] | None]:
    """Return the loss a closure returned, and its gradients if it gave them."""
    how = (
        "The closure must return the loss, a real scalar tensor computed from the "
        "parameters it is given (differentiated here), or `(loss, grads)` with the "
        "gradients keyed like the parameters"
    )
    grads: Mapping[str, Tensor] | None = None
    loss: object = result
    if isinstance(result, tuple):
        items = cast("tuple[object, ...]", result)
        if len(items) != 2 or not isinstance(items[1], Mapping):
            kinds = ", ".join(type(v).__name__ for v in items)
            msg = f"{how}; got a tuple of {len(items)} ({kinds})."
            raise TypeError(msg)
        loss, grads = items[0], cast("Mapping[str, Tensor]", items[1])
    if (
        not isinstance(loss, Tensor)
        or loss.is_complex()
        or not loss.is_floating_point()
    ):
        kind = loss.dtype if isinstance(loss, Tensor) else type(loss).__name__
        msg = f"{how}; got {kind} as the loss."
        raise TypeError(msg)
    if loss.numel() != 1:
        msg = (
            f"{how}; got a loss of shape {tuple(loss.shape)}. Reduce it first, "
            "e.g. with `.sum()` or `.mean()`."
        )
        raise ValueError(msg)
    if grads is None and not loss.requires_grad:
        msg = (
            f"{how}; the loss returned does not depend on the parameters (it does "
            "not require grad). Compute it from the ParamDict passed to the "
            "closure, or return `(loss, grads)`."
        )
        raise ValueError(msg)
    return loss, grads
