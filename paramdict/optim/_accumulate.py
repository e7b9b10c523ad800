"""Gradient accumulation: apply an optimizer once every `every_k` calls."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast

import attrs
import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from typing_extensions import override

from .._container import key_mismatch_message
from .._paramdict import ParamDict
from ._binding import Composed, Plan, flag_like, relaid_as
from ._copies import copied
from ._hyper import check_count, check_counter, host_numbers, new_counter
from ._optimizer import Optimizer
from ._states import MultiStepsState
from ._validate import check_keyed, transformed

__all__ = ["MultiSteps", "MultiStepsState"]

P = TypeVar("P", bound=ParamDict)


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


def _check_sum(params: ParamDict, acc_grads: object) -> None:
    """Raise unless `acc_grads` is a ParamDict keyed like `params`, in its order."""
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
    check_keyed(params, acc_grads._vals, what=what)


@attrs.frozen(eq=False)
class MultiSteps(Optimizer[MultiStepsState]):
    """Accumulate gradients over `every_k` calls, then step `optimizer` once.

    Gradient accumulation over micro-batches (optax's `MultiSteps`): each call
    adds `grads` to the sum (the first of a round writes them, as backward
    writes `.grad`); every `every_k`-th call steps the wrapped optimizer with
    their mean (or sum) and starts a new sum. The other calls leave the
    parameters and the wrapped state unchanged. `differentiable` is the
    wrapped optimizer's.

    Eager, the count is read on the host and decides: the wrapped optimizer
    runs only on the `every_k`-th call, on its best path. Traced
    (`torch.compile`, `torch.func`), the choice is a `torch.where` on the count,
    so the wrapped rule is computed on every call. Either way the result is
    bitwise the wrapped optimizer's on the mean gradient.

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

        Example:
            >>> from paramdict import optim
            >>> opt = optim.MultiSteps(optim.Adam(), every_k=4)
            >>> type(opt.init(ParamDict(w=torch.ones(2))).inner_state).__name__
            'AdamState'
        """
        inner = self.optimizer.init(params)
        return MultiStepsState(new_counter(), params.zeros_like(), inner)

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
        _check_sum(params, state.acc_grads)
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

    @override
    def eval_params(self, params: P, state: MultiStepsState, /) -> P:
        return self.optimizer.eval_params(params, state.inner_state)

    @override
    def step(
        self, params: P, grads: Mapping[str, Tensor], state: MultiStepsState, /
    ) -> tuple[P, MultiStepsState]:
        """Return the parameters after one call, and the next state.

        As `Optimizer.step`. Eager, a call that only accumulates returns the
        parameters' values as they are and the wrapped state uncopied.

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
        if self.differentiable or torch.compiler.is_compiling() or transformed():
            return super().step(params, grads, state)
        bound = self._bound(params, state, in_place=False)
        held = bound.state
        counter = host_numbers(False, held.mini_step)
        if counter is None or counter[0] + 1 >= self.every_k:
            new_params, new_state = bound.step(grads)
            return cast(P, new_params), new_state
        aligned = bound.grads(grads)
        with torch.no_grad():
            # In the sum's own layout (the parameters'), whatever the gradients'.
            first = counter[0] == 0  # written, as backward writes `.grad`
            acc = (
                held.acc_grads.empty_like().copy_(aligned)
                if first
                else held.acc_grads.clone().add_(aligned)
            )
            kept = bound.params.detach()
        flag_like(kept, bound.params)
        new_state = held._replace(mini_step=held.mini_step + 1, acc_grads=acc)
        bound.hold(kept, new_state)
        return cast(P, kept), new_state

    @override
    def _lazy_rule(self) -> bool:
        return self.optimizer._lazy_rule()

    @override
    def _plan(
        self, params: ParamDict, state: MultiStepsState, *, in_place: bool
    ) -> Plan[MultiStepsState]:
        self.check_state(params, state)
        inner = self.optimizer._plan(params, state.inner_state, in_place=in_place)
        # A clipping wrapper's transform runs in place on the accumulator, the
        # state's own (the mean is left clipped there): one pass over it less.
        whole, transform_ = inner, _in_place_transform(inner)
        if transform_ is not None:
            inner = cast("Composed[Any]", inner).inner
        every_k, mean = self.every_k, self.reduction == "mean"
        # The accumulator is handed to the inner plan as its gradients: in the
        # strides it takes them in, decided for the bound buffers.
        relay = relaid_as(inner, state.acc_grads) is not state.acc_grads

        def prepare(
            params: ParamDict, state: MultiStepsState
        ) -> Callable[[ParamDict], MultiStepsState]:
            counter = state.mini_step
            host = host_numbers(False, counter)  # eager on the host: read, it decides
            if host is None:  # traced: both outcomes, one chosen by `where`
                return lambda grads: _selected(
                    whole, every_k, mean, params, grads, state
                )
            calls = int(host[0]) + 1
            acc = state.acc_grads
            # At least, not equal: a state saved with a larger `every_k` steps on
            # its next call instead of never.
            stepping = calls >= every_k
            inner_commit = inner(params, state.inner_state) if stepping else None

            def commit(grads: ParamDict) -> MultiStepsState:
                if calls == 1:  # written, as backward writes `.grad`
                    acc.copy_(grads)
                else:
                    acc.add_(grads)
                if inner_commit is None:
                    counter.add_(1)
                    return state
                if mean:
                    acc.div_(every_k)
                if transform_ is not None:
                    transform_(acc)
                inner_commit(relaid_as(inner, acc) if relay else acc)
                counter.zero_()
                return state

            return commit

        return prepare


def _in_place_transform(plan: Plan[Any]) -> Callable[[ParamDict], ParamDict] | None:
    """A clipping wrapper's in-place transform of the gradients, or None."""
    return plan.transform_ if isinstance(plan, Composed) else None


def _selected(
    inner: Plan[Any],
    every_k: int,
    mean: bool,
    params: ParamDict,
    grads: ParamDict,
    state: MultiStepsState,
) -> MultiStepsState:
    """The traced form: the inner step computed always, kept where it is due."""
    first = ParamDict.fromkeys(grads, state.mini_step == 0)
    acc = state.acc_grads
    total = grads.where(first, acc.add(grads))
    apply = state.mini_step + 1 >= every_k
    update = total.div(every_k) if mean else total
    transform_ = _in_place_transform(inner)
    if transform_ is not None:  # clipped as the eager step clips it
        inner = cast("Composed[Any]", inner).inner
        update = transform_(update.clone() if update is total else update)
    # The sum, or on a step the mean it was divided into (clipped where a
    # ClipGradNorm is wrapped), as the eager step keeps it.
    acc.copy_(update.where(ParamDict.fromkeys(update, apply), total))
    stepped, inner_state = copied(params, state.inner_state, recorded=False)
    inner(stepped, inner_state)(relaid_as(inner, update))
    params.copy_(stepped.where(ParamDict.fromkeys(params, apply), params))
    for old, new in zip(
        pytree.tree_leaves(state.inner_state), pytree.tree_leaves(inner_state)
    ):
        if isinstance(old, Tensor):
            old.copy_(torch.where(apply, cast(Tensor, new), old))
    counter = state.mini_step
    counter.copy_(torch.where(apply, torch.zeros_like(counter), counter + 1))
    return state
