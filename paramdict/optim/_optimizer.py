"""The optimizer protocol: `init`, the in-place rule, and the three ways to step.

The rule (`update_`, or `TorchOptimizer.math`) writes in place; the mode decides
whose tensors: the caller's (`step_`), copies (`step`), or copies autograd records
(`differentiable=True`). What can be decided before a step is decided once, at
`bind` (`_binding.py`).
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Mapping
from typing import TypeVar, cast

import torch
from torch import Tensor, nn

from .._fresh import mixed
from .._paramdict import ParamDict
from . import _eager
from ._binding import Bound, Plan, on_copies
from ._hooks import OptionalHooks
from ._registry import register_state
from ._validate import (
    aligned_grads,
    check_keyed,
    check_params,
    entries_agree,
    transformed,
)

__all__ = ["Optimizer", "register_state"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


class Optimizer(OptionalHooks[S], abc.ABC):
    """The base of every optimizer: `init`, the rule `update_`, and the steps.

    A subclass is an immutable configuration that defines `init`, `update_`
    (write one update into the parameters and state, never into `grads`) and
    `differentiable`. Optimizers in the style of `torch.optim` extend
    `TorchOptimizer`, whose rule hook is `math`.

    Example:
        >>> from paramdict import optim
        >>> def train(opt: optim.Optimizer[optim.SGDState], params: ParamDict):
        ...     state = opt.init(params)
        ...     for _ in range(3):
        ...         params, state = opt.step(params, params, state)  # grad of |p|^2 / 2
        ...     return params
        >>> train(optim.SGD(lr=0.5), ParamDict(w=torch.tensor([8.0])))["w"]
        tensor([1.])
    """

    __slots__ = ("_last",)

    differentiable: bool
    """Whether `step` keeps the autograd graph through the update."""

    @abc.abstractmethod
    def init(self, params: ParamDict, /) -> S:
        """Return the state for the first step on `params`; `params` is unchanged.

        Args:
            params: The parameters to optimize.

        Returns:
            The optimizer's state: buffers keyed like `params`, not requiring grad.

        Example:
            >>> from paramdict import optim
            >>> state = optim.SGD(lr=0.1).init(ParamDict(w=torch.ones(2)))
            >>> state.step
            tensor(0., dtype=torch.float64)
        """

    def update_(self, params: ParamDict, grads: ParamDict, state: S, /) -> S:
        """Write one update into `params` and `state`; return `state` (the hook).

        Override this for an optimizer not in the style of `torch.optim`
        (those override `TorchOptimizer.math`): write with ParamDict's in-place
        arithmetic into `params` and `state`, read `grads` only. The inputs are
        checked, and the same rule serves every mode.

        Args:
            params: The parameters, to write into.
            grads: Their gradients, to read.
            state: The state, to write into.

        Returns:
            `state` itself.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> opt = optim.SGD(lr=0.5)
            >>> state = opt.update_(p, p.ones_like(), opt.init(p))
            >>> p["w"], state.step
            (tensor([0.5000, 1.5000]), tensor(1., dtype=torch.float64))
        """
        if type(self)._plan is not Optimizer._plan:  # pyright: ignore[reportUnknownMemberType]  # a method compared, not called
            # A wrapper (`ParamGroups`, `ClipGradNorm`, `MultiSteps`): its plan.
            return self._plan(params, state, in_place=True)(params, state)(grads)
        msg = (
            f"`{type(self).__name__}` defines no update rule: override `update_` "
            "(or `math`, for a `TorchOptimizer`)."
        )
        raise NotImplementedError(msg)

    def check_state(self, params: ParamDict, state: S, /) -> None:  # an optional hook
        """Raise if `state` cannot be the state of this optimizer for `params`.

        The default accepts anything; `TorchOptimizer` checks the state's type,
        keys, shapes and dtypes, and the wrappers ask their members. It runs
        at bind time, not on every step.

        Args:
            params: The parameters of the step.
            state: The state to check.

        Raises:
            TypeError: If `state` is of the wrong kind (another optimizer's).
            ValueError: If its buffers do not match `params`; the message names
                the keys.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.ones(2))
            >>> optim.SGD().check_state(p, optim.Adam().init(p))
            Traceback (most recent call last):
            ...
            TypeError: `SGD` needs a `SGDState` as its state, got AdamState. ...
        """

    def _plan(self, params: ParamDict, state: S, *, in_place: bool) -> Plan[S]:
        """Check `params` and `state` once per binding; return the step's work."""
        self.check_state(params, state)
        update = self.update_
        name = type(self).__name__

        def prepare(params: ParamDict, state: S) -> Callable[[ParamDict], S]:
            def commit(grads: ParamDict) -> S:
                written = update(params, grads, state)
                if in_place and written is not state:
                    msg = (
                        f"`{name}.update_` returned a new state object; an update "
                        "writes into the tensors of the state it is given and "
                        "returns that state."
                    )
                    raise TypeError(msg)
                return written

            return commit

        return prepare

    def _lazy_rule(self) -> bool:
        """Whether `update_` writes only through ParamDict's in-place methods."""
        return False

    # ------------------------------------------------------------ binding

    def bind(
        self, params: ParamDict, state: S, /, *, in_place: bool = True
    ) -> Bound[S]:
        """Check `params` and `state` once; return them bound, ready to step.

        `step_` and `step` bind on their own; this is for a loop that holds
        the binding itself.

        Args:
            params: The parameters.
            state: Their state, from `init` or a checkpoint.
            in_place: Bind for `Bound.step_` (writing into `params` and
                `state`), or for `Bound.step` (new tensors each step).

        Returns:
            The binding.

        Raises:
            TypeError: If `params` is not a ParamDict of real floating-point
                tensors, or `state` is not this optimizer's.
            ValueError: As `step_` (`in_place=True`) or `step`.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.SGD(lr=0.25)
            >>> bound = opt.bind(params, opt.init(params))
            >>> state = bound.step_({"w": torch.tensor([2.0])})
            >>> params["w"]
            tensor([0.5000])
        """
        bound = Bound(self, check_params(params, "bind"), state, in_place=in_place)
        object.__setattr__(self, "_last", bound)
        return bound

    def _bound(self, params: ParamDict, state: S, *, in_place: bool) -> Bound[S]:
        """The last binding if it holds `params` and `state`, else a new one."""
        if self.differentiable:
            # Recorded steps keep nothing between calls: a binding holding their
            # outputs would keep the autograd graph of the last step alive.
            return Bound(self, check_params(params, "step"), state, in_place=in_place)
        last = cast("Bound[S] | None", getattr(self, "_last", None))
        if last is not None and last._in_place is in_place:
            if last.holds(params, state):
                return last
            given: object = params
            if (
                isinstance(given, ParamDict)
                and state is last.state
                and params._keys == last.params._keys
                and all(map(operator.is_, params._vals, last.params._vals))
                and last.holds(last.params, state)
            ):
                return last  # the same tensors in a new ParamDict (`from_module`)
        return self.bind(params, state, in_place=in_place)

    # ------------------------------------------------------------ steps

    def step(self, params: P, grads: Mapping[str, Tensor], state: S, /) -> tuple[P, S]:
        """Return the parameters after one update, and the next state.

        Pure: the inputs are unchanged; the update is written into fresh copies.
        By default the new parameters are leaves requiring grad where the old
        ones did; with `differentiable=True` autograd records the update, so
        the results depend differentiably on the inputs and tensor
        hyperparameters. Under `torch.compile(fullgraph=True)` the default
        mode compiles when the parameters do not require grad, the
        differentiable mode always.

        Args:
            params: The current parameters.
            grads: Their gradients: a mapping with the same keys, in any order,
                and each gradient of its parameter's shape and dtype.
            state: The state from `init` or from the previous `step`.

        Returns:
            `(new_params, new_state)`; `new_params` has the type and key order of
            `params`. An empty `params` comes back as it is, with `state`.

        Raises:
            ValueError: If the keys of `grads` (or of a per-key hyperparameter)
                differ from those of `params`, or a gradient's shape or dtype
                differs from its parameter's; the message names them.
            TypeError: If an argument is not of the kind described here, or
                `state` is not this optimizer's.

        Example:
            >>> import torch
            >>> from paramdict import ParamDict, optim
            >>> params = ParamDict(w=torch.tensor([1.0], requires_grad=True))
            >>> opt = optim.SGD(lr=0.25)
            >>> grads = {"w": torch.tensor([2.0])}
            >>> new, state = opt.step(params, grads, opt.init(params))
            >>> new["w"], new["w"].is_leaf
            (tensor([0.5000], requires_grad=True), True)
            >>> params["w"]  # unchanged
            tensor([1.], requires_grad=True)
        """
        if not (torch.compiler.is_compiling() or transformed()):
            bound = self._bound(params, state, in_place=False)
            new_params, new_state = bound.step(grads)
            return cast(P, new_params), new_state
        # Traced: the checks at trace time, the plan on copies, as one graph.
        params = cast(P, check_params(params, "step"))
        aligned = aligned_grads(params, grads)
        check_keyed(params, aligned._vals, what="The gradients")
        if not params:
            return params, state
        plan = self._plan(params, state, in_place=False)
        lazy = self._lazy_rule() and entries_agree(params, state)
        recorded, exact = self.differentiable, lazy and mixed(params)
        return on_copies(
            plan, params, state, aligned, recorded=recorded, lazy=lazy, exact=exact
        )

    def step_(self, params: P, grads: Mapping[str, Tensor], state: S, /) -> tuple[P, S]:
        """Write one update into the tensors of `params` and `state`; return them.

        The in-place counterpart of `step`: it writes into every tensor of
        `params` and `state` and nothing else (`grads` is only read), bitwise
        as `step`. `Adam`, `AdamW`, `SGD` without dampening and `Adagrad` run
        torch's fused kernels where their `fused` flag and the entries allow.
        Everything is checked before anything is written, once per binding.

        Args:
            params: The parameters, written in place.
            grads: Their gradients (a mapping with the same keys); read only.
            state: The state from `init` or a previous step, written in place.

        Returns:
            `(params, state)`: the objects given, with the update written in.

        Raises:
            ValueError: If the optimizer is differentiable; if a tensor of
                `params` or `state` is recorded by autograd (has a `grad_fn`), is
                an inference tensor outside inference mode, has overlapping
                elements, or shares memory with another entry, buffer or
                gradient; and as for `step`. Nothing is written then.
            TypeError: As for `step`.

        Example:
            >>> import torch
            >>> from paramdict import ParamDict, optim
            >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> opt = optim.SGD(lr=0.5)
            >>> state = opt.init(params)
            >>> w, grads = params["w"], {"w": torch.tensor([1.0, 1.0])}
            >>> params, state = opt.step_(params, grads, state)
            >>> params["w"] is w, w
            (True, tensor([0.5000, 1.5000]))
        """
        if torch.compiler.is_compiling():
            aligned = _eager.checked(self, params, grads, state)
            if not params:
                return params, state
            with torch.no_grad():
                plan = self._plan(params, state, in_place=True)
                return params, plan(params, state)(aligned)
        given: object = params
        if isinstance(given, ParamDict) and isinstance(cast(object, grads), Mapping):
            # First: a mapping's own code runs here, before the facts are read.
            grads = aligned_grads(params, grads)
        bound = self._bound(params, state, in_place=True)
        return params, bound.step_(grads)

    def step_module(
        self, module: nn.Module, loss_fn: Callable[[], Tensor], state: S, /
    ) -> tuple[Tensor, S]:
        """Take one training step on `module`, updating its parameters in place.

        Computes `loss = loss_fn()`, its gradients with respect to the module's
        trainable parameters, and one `step_` into the module's own
        `nn.Parameter` objects and `state` (`.grad` fields are not touched).

        Args:
            module: The module to train.
            loss_fn: A function of no arguments returning the scalar loss.
            state: The state from `init(ParamDict.from_module(module))` (on the
                parameters that require grad) or from the previous call.

        Returns:
            `(loss, new_state)`, the loss detached from the graph.

        Raises:
            ValueError: If the optimizer is differentiable (writing into a module
                cuts the graph; use `step` on ParamDicts instead), or if the keys
                do not match the state's.

        Example:
            >>> import torch
            >>> from paramdict import ParamDict, optim
            >>> model = torch.nn.Linear(2, 1)
            >>> opt = optim.SGD(lr=0.1)
            >>> state = opt.init(ParamDict.from_module(model))
            >>> x, y = torch.ones(4, 2), torch.zeros(4, 1)
            >>> loss_fn = lambda: torch.nn.functional.mse_loss(model(x), y)
            >>> first, state = opt.step_module(model, loss_fn, state)
            >>> second, state = opt.step_module(model, loss_fn, state)
            >>> bool(second < first)
            True
        """
        if self.differentiable:
            msg = (
                "`step_module` writes the new values into the module, which cuts "
                "the autograd graph, so it needs `differentiable=False`. For "
                "differentiable steps call `step` on ParamDicts and run the module "
                "with `params.call(module, ...)`."
            )
            raise ValueError(msg)
        if not isinstance(cast(object, module), nn.Module):
            msg = f"`step_module` takes an nn.Module, got {type(module).__name__}."
            raise TypeError(msg)
        if not callable(cast(object, loss_fn)):
            msg = (
                "`step_module` takes `loss_fn`, a function of no arguments that "
                f"returns the loss, got {type(loss_fn).__name__}."
            )
            raise TypeError(msg)
        params = ParamDict.from_module(module).trainable()
        bound = self._bound(params, state, in_place=True)  # refused before the loss
        loss = loss_fn()
        grads = bound.params.grad(loss)
        bound.step_(grads)
        return loss.detach(), state
