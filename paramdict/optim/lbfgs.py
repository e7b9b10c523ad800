"""L-BFGS: a quasi-Newton method that re-evaluates the loss through a closure."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeAlias, TypeVar, cast

import attrs
import torch
from torch import Tensor
from torch._C._nn import flatten_dense_tensors, unflatten_dense_tensors

from .._paramdict import ParamDict
from ._hyper import check_count, check_flag, check_non_negative
from ._lbfgs_checks import check_lr, check_state, closure_result, layout_of
from ._line_search import strong_wolfe
from ._states import LBFGSState
from ._validate import aligned_grads, check_keyed, check_real

__all__ = ["LBFGS", "LBFGSState"]

P = TypeVar("P", bound=ParamDict)

Closure: TypeAlias = Callable[
    [ParamDict], "Tensor | tuple[Tensor, Mapping[str, Tensor]]"
]
"""A function of the parameters returning the loss, or `(loss, grads)`."""


def _check_line_search(instance: object, attribute: Any, value: Any) -> None:
    if value not in (None, "strong_wolfe"):
        msg = f"`{attribute.name}` must be None or 'strong_wolfe', got {value!r}."
        raise ValueError(msg)


@attrs.frozen(kw_only=True, eq=False)
class LBFGS:
    """L-BFGS, the functional `torch.optim.LBFGS`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.LBFGS`, so a
    run gives the same parameters. `step` takes a closure instead of gradients:
    `closure(params)` returns the loss (differentiated here) or `(loss, grads)`.
    As in torch, all entries are one flat vector (one dtype and device), with
    no groups or per-key rates; the loop reads losses on the host, so there is
    no differentiable or compiled mode.

    Attributes:
        lr: Learning rate (the first step along each direction): a number.
        max_iter: The most iterations per `step`.
        max_eval: The most closure evaluations per `step` (default
            `max_iter * 5 // 4`).
        tolerance_grad: Stop when the largest gradient entry is at most this.
        tolerance_change: Stop when the loss or the step changes less.
        history_size: The number of past updates kept.
        line_search_fn: `None` or `"strong_wolfe"`.
        maximize: Maximize the closure's value instead of minimizing it (as
            `torch.optim.LBFGS(maximize=True)`, torch 2.14 or newer).

    Raises:
        ValueError: If a hyperparameter is out of range; the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([3.0, -1.0], dtype=torch.float64))
        >>> opt = optim.LBFGS(line_search_fn="strong_wolfe")
        >>> loss = lambda p: ((p["w"] - 1) ** 2).sum()
        >>> params, state = opt.step(params, loss, opt.init(params))
        >>> params["w"]
        tensor([1., 1.], dtype=torch.float64)
    """

    lr: float = attrs.field(default=1, validator=check_lr)
    max_iter: int = attrs.field(default=20, validator=check_count)
    max_eval: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(check_count)
    )
    tolerance_grad: float = attrs.field(default=1e-7, validator=check_non_negative)
    tolerance_change: float = attrs.field(default=1e-9, validator=check_non_negative)
    history_size: int = attrs.field(default=100, validator=check_count)
    line_search_fn: str | None = attrs.field(default=None, validator=_check_line_search)
    maximize: bool = attrs.field(default=False, validator=check_flag)

    def init(self, params: ParamDict, /) -> LBFGSState:
        """Return the state before the first step (empty history).

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            An `LBFGSState`.

        Raises:
            TypeError: If `params` is not a ParamDict of real floating-point
                tensors.
            ValueError: If the entries differ in dtype or device.

        Example:
            >>> from paramdict import optim
            >>> optim.LBFGS().init(ParamDict(w=torch.ones(2))).n_iter
            0
        """
        _check_params(params)
        return LBFGSState(
            0, 0, None, None, (), (), (), 1, None, None, layout_of(params)
        )

    def step(
        self, params: P, closure: Closure, state: LBFGSState, /
    ) -> tuple[P, LBFGSState]:
        """Return the parameters after one L-BFGS step (up to `max_iter` iterations).

        Pure. The closure gets ParamDicts whose values require grad; the new
        parameters are leaves that require grad where `params`' did.

        Args:
            params: The current parameters.
            closure: `closure(params)` returns the loss (a scalar tensor), or
                `(loss, grads)` with the gradients keyed like `params`.
            state: The state from `init` or the previous `step`.

        Returns:
            `(new_params, new_state)`.

        Raises:
            TypeError: If an argument is of the wrong kind.
            ValueError: If the entries differ in dtype or device, or the
                closure's gradients do not match `params`; the message names them.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.tensor([2.0]))
            >>> opt = optim.LBFGS(max_iter=5)
            >>> loss = lambda p: (p["w"] ** 2).sum()
            >>> new, _ = opt.step(params, loss, opt.init(params))
            >>> new["w"].abs() < 1e-6
            tensor([True])
        """
        _check_params(params)
        if not callable(cast(object, closure)):
            msg = (
                "`LBFGS.step` takes a closure, a function of the parameters that "
                f"returns the loss, got {type(closure).__name__}."
            )
            raise TypeError(msg)
        if not isinstance(cast(object, state), LBFGSState):
            msg = (
                f"`LBFGS` needs an `LBFGSState` as its state, got "
                f"{type(state).__name__}. Use the state from this optimizer's `init`."
            )
            raise TypeError(msg)
        if not params:
            return params, state
        check_state(params, state)
        return _Run(self, params, closure).step(state)

    def step_(self, params: object, closure: object, state: object, /) -> NoReturn:
        """Refuse: L-BFGS has no in-place step; use `step`.

        A step evaluates the closure at several trial points, so it cannot
        write once after every check as `step_` promises; assign `step`'s
        result back.

        Raises:
            TypeError: Always; the message says what to use.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.ones(1))
            >>> opt = optim.LBFGS()
            >>> opt.step_(params, lambda p: p["w"].sum(), opt.init(params))
            Traceback (most recent call last):
            ...
            TypeError: `LBFGS` has no in-place `step_`: ...
        """
        msg = (
            "`LBFGS` has no in-place `step_`: each step evaluates the closure at "
            "several trial points before it knows the new parameters. Use "
            "`params, state = opt.step(params, closure, state)` and assign the "
            "result back (or copy it into your tensors with `copy_`)."
        )
        raise TypeError(msg)


def _check_params(params: ParamDict) -> None:
    if not isinstance(cast(object, params), ParamDict):
        msg = (
            "LBFGS takes the parameters as a ParamDict, got "
            f"{type(params).__name__}. Wrap them: `ParamDict(params)`."
        )
        raise TypeError(msg)
    check_real(params)
    kinds = {(v.dtype, v.device) for v in params.values()}
    if len(kinds) > 1:
        msg = (
            "LBFGS works on all entries as one flat vector, so they must share one "
            f"dtype and device; got {sorted(map(str, kinds))}. Convert them first, "
            "e.g. `params.to(torch.float64)`."
        )
        raise ValueError(msg)


def _flattened(values: list[Tensor]) -> Tensor:
    """A new vector holding `values` one after another (one C++ loop over them)."""
    if len(values) < 2:  # one entry would come back as a view of it, not a copy
        return torch.cat([v.reshape(-1) for v in values])
    return flatten_dense_tensors(values)


class _Run:
    """One `step`: the flat vector, the closure and its evaluations."""

    def __init__(self, opt: LBFGS, params: ParamDict, closure: Closure) -> None:
        self.opt = opt
        self.params = params
        self.closure = closure
        self.templates = list(params.values())
        with torch.no_grad():
            self.x = _flattened([v.detach() for v in self.templates])
        self.evals = 0

    def unflat(self, flat: Tensor) -> ParamDict:
        """Views of `flat` shaped as the parameters (one C++ loop over them)."""
        return self.params._derive(unflatten_dense_tensors(flat, self.templates))

    def evaluate(self, x: Tensor) -> tuple[float, Tensor]:
        """Return the loss (a float) and the flat gradient at the flat point `x`."""
        # Views of `x`, each a leaf of its own: `x` is never written in place.
        point = self.unflat(x.detach())
        for value in point.values():
            value.requires_grad_()
        with torch.enable_grad():
            loss, given = closure_result(self.closure(point))
            if given is not None:
                grads = aligned_grads(point, given)
                check_keyed(point, grads._vals, what="The gradients")
            else:
                values: tuple[Tensor | None, ...] = torch.autograd.grad(
                    loss, list(point.values()), allow_unused=True
                )  # None for an entry the loss does not use
                grads = point._derive(
                    [
                        torch.zeros_like(p) if g is None else g  # pyright: ignore[reportUnnecessaryComparison]  # torch annotates Tensor; allow_unused gives None
                        for p, g in zip(point.values(), values)
                    ]
                )
                # autograd gives each leaf a gradient of its shape and dtype;
                # only a sparse one (an embedding's) is left to refuse
                if any(g.layout != torch.strided for g in grads.values()):
                    check_keyed(point, grads._vals, what="The gradients")
        flat = _flattened([g.detach() for g in grads.values()])
        if self.opt.maximize:  # as torch: minimize the negated loss
            return -float(loss), flat.neg()
        return float(loss), flat

    def evaluate_along(self, x: Tensor, d: Tensor, t: Any) -> tuple[float, Tensor]:
        """Return the loss and flat gradient at `x + t * d`."""
        return self.evaluate(x.add(d, alpha=t))

    @torch.no_grad()
    def step(self, state: LBFGSState) -> tuple[Any, LBFGSState]:
        opt = self.opt
        lr = float(opt.lr)
        max_eval = opt.max_eval if opt.max_eval is not None else opt.max_iter * 5 // 4
        func_evals, n_total = state.func_evals, state.n_iter
        d, t = state.d, state.t
        old_dirs, old_stps = list(state.old_dirs), list(state.old_stps)
        ro, h_diag = list(state.ro), state.H_diag
        prev_flat_grad, prev_loss = state.prev_flat_grad, state.prev_loss
        x = self.x
        prev_owned = False
        loss, flat_grad = self.evaluate(x)
        current_evals = 1
        func_evals += 1
        done = bool(flat_grad.abs().max() <= opt.tolerance_grad)
        n_iter = 0
        while not done and n_iter < opt.max_iter:
            n_iter += 1
            n_total += 1
            if n_total == 1:
                d = flat_grad.neg()
                old_dirs, old_stps, ro, h_diag = [], [], [], 1
            else:
                assert d is not None  # set by the first iteration
                assert prev_flat_grad is not None
                assert t is not None
                y = flat_grad.sub(prev_flat_grad)
                s = d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    if len(old_dirs) == opt.history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)
                # The two-loop recursion: d = -H g.
                # `q` and `r` are this step's own vectors: updated in place.
                al: list[Any] = [None] * len(old_dirs)
                q = flat_grad.neg()
                for i in range(len(old_dirs) - 1, -1, -1):
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q.add_(old_dirs[i], alpha=-al[i])
                r = torch.mul(q, h_diag)
                for i in range(len(old_dirs)):
                    be_i = old_dirs[i].dot(r) * ro[i]
                    r.add_(old_stps[i], alpha=al[i] - be_i)
                d = r
            if prev_owned:  # made by an earlier iteration of this step: reused
                assert prev_flat_grad is not None
                prev_flat_grad.copy_(flat_grad)
            else:  # the given state's: never written
                prev_flat_grad = flat_grad.clone()
                prev_owned = True
            prev_loss = loss
            # The first step of all is scaled by the gradient's size.
            first: Any = min(1.0, 1.0 / flat_grad.abs().sum())
            t = first * lr if n_total == 1 else lr
            gtd = flat_grad.dot(d)
            if gtd > -opt.tolerance_change:
                break
            evals = 0
            if opt.line_search_fn is not None:
                loss, flat_grad, t, evals = strong_wolfe(
                    functools.partial(self.evaluate_along, x, d),
                    t,
                    d,
                    loss,
                    flat_grad,
                    gtd,
                    max_ls=max_eval - current_evals,
                )
                x = x.add(d, alpha=t)
                done = bool(flat_grad.abs().max() <= opt.tolerance_grad)
            else:
                x = x.add(d, alpha=t)
                if n_iter != opt.max_iter:
                    loss, flat_grad = self.evaluate(x)
                    done = bool(flat_grad.abs().max() <= opt.tolerance_grad)
                    evals = 1
            current_evals += evals
            func_evals += evals
            if n_iter == opt.max_iter or current_evals >= max_eval or done:
                break
            if d.mul(t).abs().max() <= opt.tolerance_change:
                break
            if abs(loss - prev_loss) < opt.tolerance_change:
                break

        new = self.unflat(x.clone())
        new = new._derive(
            [
                v.requires_grad_(p.requires_grad)
                for v, p in zip(new.values(), self.params.values())
            ]
        )
        return new, LBFGSState(
            func_evals,
            n_total,
            d,
            t,
            tuple(old_dirs),
            tuple(old_stps),
            tuple(ro),
            h_diag,
            prev_flat_grad,
            prev_loss,
            layout_of(self.params),
        )
