"""Gradient accumulation: apply an optimizer once every `every_k` calls."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Literal, NamedTuple, TypeVar, cast

import attrs
import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from typing_extensions import override

from .._container import key_mismatch_message
from .._paramdict import ParamDict
from ._clip import ClipGradNorm
from ._hyper import check_count, check_counter, is_traced, new_counter
from ._keyed import check_keyed, requires_grad_like
from ._protocol import Optimizer, recall, register_state, remember
from ._repeat import kept
from ._strategy import one_graph, traced
from ._vocabulary import Kernels

__all__ = ["MultiSteps", "MultiStepsState"]

P = TypeVar("P", bound=ParamDict)


@register_state
class MultiStepsState(NamedTuple):
    """The state of `MultiSteps`.

    Attributes:
        mini_step: Calls since the inner optimizer last stepped, a 0-dim tensor
            in `[0, every_k)`.
        acc_grads: The gradients accumulated (summed) since then, keyed like the
            parameters. At `mini_step` 0 nothing is accumulated and the values
            are left over (the next call writes over them, without a pass to
            clear them first).
        inner_state: The wrapped optimizer's state.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=2)
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> _, state = opt.step(params, {"w": torch.tensor([3.0])}, opt.init(params))
        >>> state.mini_step, state.acc_grads["w"]
        (tensor(1., dtype=torch.float64), tensor([3.]))
    """

    mini_step: Tensor
    acc_grads: ParamDict
    inner_state: Any


def _check_reduction(instance: object, attribute: Any, value: Any) -> None:
    if value not in ("mean", "sum"):
        msg = f"`{attribute.name}` must be 'mean' or 'sum', got {value!r}."
        raise ValueError(msg)


def _check_optimizer(instance: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, Optimizer):
        msg = (
            f"`{attribute.name}` must be a paramdict optimizer, got "
            f"{type(value).__name__}."
        )
        raise TypeError(msg)


_MEAN: Literal["mean", "sum"] = (
    "mean"  # typed: `attrs.field` widens a bare "mean" to str
)


def _check_sum(params: ParamDict, acc_grads: object) -> None:
    """Raise unless `acc_grads` is a ParamDict keyed like `params`, in its order.

    The sum is added to entry by entry in the gradients' order, so it must
    hold the parameters' keys in their order, each of its parameter's shape,
    dtype and device.
    """
    what = "The state's `acc_grads`"
    if not isinstance(acc_grads, ParamDict):
        msg = (
            f"{what} must be a ParamDict keyed like the parameters, got "
            f"{type(acc_grads).__name__}. Use the state from this optimizer's `init`."
        )
        raise TypeError(msg)
    fix = "Use the state from this optimizer's `init` on these parameters."
    if acc_grads.keys() != params.keys():
        msg = key_mismatch_message(
            tuple(params), acc_grads.keys(), what=f"{what} and the params", fix=fix
        )
        raise ValueError(msg)
    if tuple(acc_grads) != tuple(params):
        msg = (
            f"{what} holds the parameters' keys in another order, and the "
            f"gradients are summed into it entry by entry in theirs. {fix}"
        )
        raise ValueError(msg)
    check_keyed(params, acc_grads, what=what)


@attrs.frozen(eq=False)
class MultiSteps(Optimizer[MultiStepsState]):
    """Accumulate gradients over `every_k` calls, then step `optimizer` once.

    The functional form of gradient accumulation over micro-batches (optax's
    `MultiSteps`). Each call adds `grads` to the accumulated gradients; on every
    `every_k`-th call the wrapped optimizer steps with their mean (or sum, with
    `reduction="sum"`) and the next call starts a new sum. The first
    call of each round writes its gradients into the accumulator (as backward
    writes `.grad` before it adds to it): a gradient of `-0.0` stays one, as
    in torch. On the other
    calls the parameters and the wrapped optimizer's state come back unchanged.

    Any optimizer works, and `differentiable` is the wrapped one's. What a call
    costs depends on where the count of calls can be read:

    - Eager (the usual loop): the count is read on the host (on an accelerator,
      one device sync per call), and it decides. A call that only accumulates
      adds `grads` into the accumulator (`step_`: in place; `step`: into a new
      one, returning the parameters' values as they are) and the wrapped
      optimizer does not run, nor its schedule; the `every_k`-th call runs the
      wrapped optimizer's own `step_` or `step` once on the mean, on its best
      path (torch's fused kernel where it has one). Behind a `ClipGradNorm`,
      `step_` clips the mean in place.
      A differentiable step decides the same way and runs the wrapped rule.
    - Traced (`torch.compile`, `torch.func` transforms such as `vmap`): the
      count stays a tensor and the choice is a `torch.where` on it, so nothing
      is read back and a compiled step is one graph without a guard on the
      count, at the price of computing the wrapped rule, and discarding its
      result, on every call that only accumulates.

    Eager, the parameters and state are bitwise those of the wrapped
    optimizer's `step_` (or `step`) on the mean gradient; the traced form is
    bitwise the wrapped rule (`update`) on it.

    Attributes:
        optimizer: The optimizer to step every `every_k` calls.
        every_k: The number of calls (micro-batches) per optimizer step.
        reduction: `"mean"` (the default: the mean of the micro-batch gradients,
            which equals the full-batch gradient of a mean loss) or `"sum"`.

    Raises:
        TypeError: If `optimizer` is not an `Optimizer` or `every_k` not an int.
        ValueError: If `every_k < 1` or `reduction` is unknown.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=2)
        >>> params = ParamDict(w=torch.tensor([0.0]))
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([1.0])}, state)
        >>> params["w"]  # accumulated, not applied
        tensor([0.])
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0])}, state)
        >>> params["w"]  # one SGD step with the mean gradient 2.0
        tensor([-2.])
    """

    optimizer: Optimizer[Any] = attrs.field(validator=_check_optimizer)
    every_k: int = attrs.field(kw_only=True, validator=check_count)
    # pyright solves `attrs.field`'s type from the default and widens it to str.
    reduction: Literal["mean", "sum"] = attrs.field(  # pyright: ignore[reportAssignmentType]
        default="mean", kw_only=True, validator=_check_reduction
    )

    differentiable: bool = attrs.field(init=False, repr=False)
    """Whether `step` keeps the graph: the same as the wrapped optimizer's."""

    def __attrs_post_init__(self) -> None:
        """Take `differentiable` from the wrapped optimizer."""
        object.__setattr__(self, "differentiable", self.optimizer.differentiable)

    def init(self, params: ParamDict, /) -> MultiStepsState:
        """Return the first state: no gradient accumulated, the inner first state.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            A `MultiStepsState`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.MultiSteps(optim.Adam(), every_k=4)
            >>> type(opt.init(ParamDict(w=torch.ones(2))).inner_state).__name__
            'AdamState'
        """
        inner = self.optimizer.init(params)
        return MultiStepsState(new_counter(params), params.zeros_like(), inner)

    @override
    def check_state(self, params: ParamDict, state: MultiStepsState, /) -> None:
        given = cast(object, state)  # checked here: annotations are promises
        if not isinstance(given, MultiStepsState):
            msg = (
                "`MultiSteps` needs a `MultiStepsState` as its state, got "
                f"{type(state).__name__}. Use the state from this optimizer's `init`."
            )
            raise TypeError(msg)
        check_counter(state.mini_step, params, "mini_step")
        check = partial(_check_sum, params, state.acc_grads)
        kept(params, given, "acc_grads", check)  # once while unchanged (`_repeat`)
        self.optimizer.check_state(params, state.inner_state)

    @property
    @override
    def takes_metric(self) -> bool:
        return self.optimizer.takes_metric

    @override
    def step_schedule(
        self, state: MultiStepsState, metrics: float | Tensor, /
    ) -> MultiStepsState:
        inner = self.optimizer.step_schedule(state.inner_state, metrics)
        return state._replace(inner_state=inner)

    @override
    def last_lr(self, state: MultiStepsState, /) -> list[float]:
        return self.optimizer.last_lr(state.inner_state)

    @override
    def step_count(self, state: MultiStepsState, /) -> int:
        return self.optimizer.step_count(state.inner_state)

    def _calls(self, state: MultiStepsState) -> int | None:
        """Return the count of calls with this one, read on the host; None if traced."""
        counter = state.mini_step
        if is_traced(counter) or traced():
            return None
        return int(counter.item()) + 1

    @override
    def _prepare(
        self, params: ParamDict, grads: ParamDict, state: MultiStepsState
    ) -> None:
        calls = self._calls(state)
        remember(state, calls)
        if calls is None or calls >= self.every_k:  # the wrapped optimizer steps
            self.optimizer._prepare(params, grads, state.inner_state)

    @override
    def _step_in_place(
        self, params: ParamDict, grads: ParamDict, state: MultiStepsState
    ) -> MultiStepsState:
        known, prepared = recall(state)
        calls = cast("int | None", prepared) if known else self._calls(state)
        if calls is None:  # traced: the `where` form of `update`, in place
            return super()._step_in_place(params, grads, state)
        acc = list(state.acc_grads.values())
        if calls == 1:  # the first micro-batch: written, as backward writes `.grad`
            torch._foreach_copy_(acc, list(grads.values()))
        else:
            torch._foreach_add_(acc, list(grads.values()))
        if calls < self.every_k:  # accumulate only
            state.mini_step.add_(1)
            return state
        divisor = self.every_k if self.reduction == "mean" else 1
        inner_opt = self.optimizer
        if isinstance(inner_opt, ClipGradNorm):
            # The sum is this step's own scratch (written over next round): a
            # clip in front of the wrapped optimizer scales it in place.
            inner = inner_opt._step_in_place_clipping(
                params, state.acc_grads, state.inner_state, divisor
            )
        else:
            if divisor != 1:
                torch._foreach_div_(acc, divisor)
            inner = inner_opt._step_in_place(params, state.acc_grads, state.inner_state)
        state.mini_step.zero_()
        if inner is state.inner_state:
            return state
        return state._replace(inner_state=inner)

    @override
    def step(
        self, params: P, grads: Mapping[str, Tensor], state: MultiStepsState, /
    ) -> tuple[P, MultiStepsState]:
        """Return the parameters after one call, and the next state.

        As `Optimizer.step`. Eager and not differentiable, a call that only
        accumulates returns the parameters' values as they are (new tensors
        sharing their memory) and the new sum; the `every_k`-th hands the mean
        to the wrapped optimizer's own `step`, so it steps on its best path
        (torch's fused kernel on copies where it has one). Traced or
        differentiable, `update` runs (see the class).

        Args:
            params: The parameters.
            grads: Their gradients (a mapping with the same keys).
            state: The state from `init` or a previous call.

        Returns:
            `(new_params, new_state)`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=2)
            >>> params = ParamDict(w=torch.zeros(1))
            >>> state = opt.init(params)
            >>> for g in (1.0, 3.0):
            ...     params, state = opt.step(params, {"w": torch.tensor([g])}, state)
            >>> params["w"], state.mini_step
            (tensor([-2.]), tensor(0., dtype=torch.float64))
        """
        if one_graph(self) is not None:  # `update`, one graph
            return super().step(params, grads, state)
        with self._facts_kept(params, state):
            aligned = self._checked(params, grads, state)
        calls = self._calls(state)
        if not params or calls is None:
            return super().step(params, grads, state)
        with torch.no_grad():
            acc = aligned.clone() if calls == 1 else state.acc_grads.add(aligned)
            if calls < self.every_k:  # accumulate only
                kept = requires_grad_like(params.detach(), params)
                return kept, state._replace(
                    mini_step=state.mini_step + 1, acc_grads=acc
                )
            if self.reduction == "mean":  # `acc` is this call's own: divided in place
                torch._foreach_div_(list(acc.values()), self.every_k)
            restart = torch.zeros_like(state.mini_step)
        new_params, inner = self.optimizer.step(params, acc, state.inner_state)
        # The next call writes over the accumulator. Behind a clip the wrapped
        # step saw a clipped copy, so this call's sum is free to keep; else the
        # wrapped state may hold the gradients it was given: keep the old one.
        held = acc if isinstance(self.optimizer, ClipGradNorm) else state.acc_grads
        return new_params, MultiStepsState(restart, held, inner)

    @override
    def update(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: MultiStepsState,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, MultiStepsState]:
        calls = self._calls(state)
        if calls is None:
            return self._selected(params, grads, state, ops)
        acc = grads.clone() if calls == 1 else state.acc_grads.add(grads)
        if calls < self.every_k:  # accumulate only
            kept = MultiStepsState(state.mini_step + 1, acc, state.inner_state)
            return params.clone(), kept
        update = acc.div(self.every_k) if self.reduction == "mean" else acc
        stepped, inner = self.optimizer.update(params, update, state.inner_state, ops)
        restart = torch.zeros_like(state.mini_step)
        # The next call writes over the accumulator: the sum stays (as in the
        # `where` form), with no pass to clear it.
        return stepped, MultiStepsState(restart, acc, inner)

    def _selected(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: MultiStepsState,
        ops: Kernels,
    ) -> tuple[ParamDict, MultiStepsState]:
        """The traced form: both outcomes computed, one chosen by `torch.where`."""
        first = ParamDict.fromkeys(grads, state.mini_step == 0)
        acc = grads.where(first, state.acc_grads.add(grads))
        mini_step = state.mini_step + 1
        # At least, not equal: a state saved with a larger `every_k` steps on its
        # next call instead of never.
        apply = mini_step >= self.every_k
        update = acc.div(self.every_k) if self.reduction == "mean" else acc
        # Borrowed: the inner rule must not write into the parameters, which are
        # kept as they are on the calls that only accumulate.
        stepped, inner = self.optimizer.update(
            ops.borrowed(params), update, state.inner_state, ops
        )
        new_params = ops.where(apply, stepped, params)

        def chosen(new: object, old: object) -> object:
            if isinstance(new, Tensor):
                return torch.where(apply, new, cast(Tensor, old))
            return new

        new_inner = pytree.tree_map(
            chosen,
            inner,
            state.inner_state,
        )
        mini_step = torch.where(apply, torch.zeros_like(mini_step), mini_step)
        return new_params, MultiStepsState(mini_step, acc, new_inner)
