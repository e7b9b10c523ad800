"""The optimizer protocol: `init`, `step` and its two modes, and `step_module`.

Every optimizer is an immutable configuration with two pure methods:

    state = opt.init(params)
    params, state = opt.step(params, grads, state)

Three separate things make an optimizer: its configuration (the attrs fields of
the class), its update rule (`update`, the public hook an author overrides,
written against the kernel vocabulary of `_vocabulary.py`), and the driver here
(`step`, `step_module`), which checks the inputs and picks the kernels for the
mode, chosen once by the configuration's `differentiable` flag:

- default: the rule runs under `torch.no_grad()`, so new parameters and state are
  fresh tensors with no autograd history; each new parameter is then marked as
  requiring grad where the old one did. A training loop of any length keeps no
  graph and its memory stays flat.
- `differentiable=True`: the rule runs with autograd on, so the new parameters and
  state depend differentiably on the old ones, on the gradients and on tensor
  hyperparameters: a meta-loss can be differentiated through inner steps.

The path a step takes (recorded, traced, torch's fused kernel on copies or in
place, the rule on the in-place kernels) is chosen in one place, `_strategy.py`,
whose table writes each path's preconditions beside it.

`step_` checks, then commits: `_prepare` chooses the path and advances every
schedule (running its callbacks) before anything is written, and the step then
`recall`s what was prepared, so an error at any point leaves every tensor and
counter as it was.

States are `typing.NamedTuple`s: immutable, typed, registered pytrees (so
`torch.func` and `torch.compile` see their tensors), constructible inside a
compiled function without a graph break (a frozen attrs class is not), and
registered as safe globals so `torch.load(weights_only=True)` accepts them.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamDict's and torch's package-internal helpers)
import abc
import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .._paramdict import ParamDict
from ._ahead import planned, recall, remember
from ._hooks import OptionalHooks
from ._keyed import aligned_grads, check_grads, finished, requires_grad_like
from ._layout import fused_copies, in_place_grads
from ._registry import register_state
from ._repeat import repeating
from ._strategy import Choice, Path, choose, traced, transformed
from ._vocabulary import Kernels
from ._vocabulary_inplace import InPlaceKernels
from ._vocabulary_recorded import RecordedKernels
from ._writable import check_writable, twinned, write_back, written_state

if TYPE_CHECKING:
    from ._fused import KernelRates

__all__ = ["Optimizer", "recall", "register_state", "remember"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)
T = TypeVar("T", bound=type[Any])
F = TypeVar("F", bound=Callable[..., Any])


_EAGER_CHECKS = (
    "`step_` checks what it may write (shared memory, inference tensors) eagerly, "
    "then compiles the update as one graph: compile it without `fullgraph=True`, "
    "or compile `step`, which is one graph"
)


def _eagerly(fn: F) -> F:
    """`fn`, run eagerly even inside `torch.compile` (`torch.compiler.disable`)."""
    disable = cast("Callable[..., F]", torch.compiler.disable)  # pyright: ignore[reportUnknownMemberType]  # untyped in torch
    return disable(fn, reason=_EAGER_CHECKS)


class Optimizer(OptionalHooks[S], abc.ABC):
    """The base of every optimizer: `init`, the `update` hook, `step`, `step_module`.

    A subclass is an immutable configuration that defines `init` (the first
    state) and `update` (the update rule, written against the kernel vocabulary
    it is given, never mutating its inputs) and has a `differentiable` flag.
    `step` checks the inputs and runs `update` in the mode `differentiable`
    selects; see the `paramdict.optim` module documentation. Optimizers in the
    style of `torch.optim` (learning rate, weight decay, `maximize`) extend
    `TorchOptimizer` instead, which implements `init` and the shared checks.

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

    __slots__ = ()

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

    @abc.abstractmethod
    def update(
        self, params: ParamDict, grads: ParamDict, state: S, ops: Kernels, /
    ) -> tuple[ParamDict, S]:
        """Return the updated parameters and state: the update rule (the hook).

        Override this to write an optimizer. Do the work on ParamDicts through
        `ops`, the kernel vocabulary of the mode `step` runs in (`ops.lerp`,
        `ops.mul`, `ops.addcdiv`, ... ; see `Kernels`); rates in any form (number,
        0-dim tensor, per-key ParamDict) go to it as they are. The inputs are
        already checked: `grads` has the keys, order, shapes and dtypes of
        `params`, and `state` came from `init`. `step` turns the result back
        into `params`' type.

        Args:
            params: The current parameters.
            grads: Their gradients.
            state: The current state.
            ops: The kernels to compute with.

        Returns:
            `(new_params, new_state)`.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> opt = optim.SGD(lr=0.5)
            >>> ops = optim.Kernels.for_params(p)
            >>> new, state = opt.update(p, p.ones_like(), opt.init(p), ops)
            >>> new["w"], state.step
            (tensor([0.5000, 1.5000]), tensor(1., dtype=torch.float64))
        """

    def check_state(self, params: ParamDict, state: S, /) -> None:  # an optional hook
        """Raise if `state` cannot be the state of this optimizer for `params`.

        The default accepts anything; `TorchOptimizer` checks the state's type,
        keys, shapes and dtypes, and `ParamGroups` and `ClipGradNorm` ask their
        members.

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

    def _checked(
        self, params: ParamDict, grads: Mapping[str, Tensor], state: S
    ) -> ParamDict:
        aligned = self._aligned(params, grads)
        return self._check_aligned(params, aligned, state)

    def _aligned(self, params: ParamDict, grads: Mapping[str, Tensor]) -> ParamDict:
        """Return `grads` in `params`' key order, after checking what both are."""
        given = cast(object, params)  # checked here: annotations are promises
        if not isinstance(given, ParamDict):
            msg = (
                "`step` takes the parameters as a ParamDict, got "
                f"{type(params).__name__}. Wrap them: `ParamDict(params)`."
            )
            raise TypeError(msg)
        given_grads = cast(object, grads)
        if not isinstance(given_grads, Mapping):
            msg = (
                "`grads` must be a mapping from each parameter's key to its "
                f"gradient (a ParamDict or dict), got {type(grads).__name__}."
            )
            raise TypeError(msg)
        return aligned_grads(params, grads)

    def _facts_kept(
        self, params: ParamDict, state: S
    ) -> contextlib.AbstractContextManager[None]:
        """`step`'s checks keep their verdicts on tensors of these facts (`_repeat`)."""
        if transformed():
            return contextlib.nullcontext()
        return repeating(self, params, state, addressed=False)

    def _check_aligned(
        self, params: ParamDict, grads: ParamDict, state: S
    ) -> ParamDict:
        """Raise unless `grads` (aligned) and `state` fit `params`; the grads to use."""
        grads = check_grads(params, grads)
        self.check_state(params, state)
        return grads

    def step(self, params: P, grads: Mapping[str, Tensor], state: S, /) -> tuple[P, S]:
        """Return the parameters after one update, and the next state.

        Pure: `params`, `grads` and `state` are unchanged and new ParamDicts are
        returned. By default the new parameters are fresh leaves without history,
        requiring grad wherever the old ones did, and the new state has no history
        either; with `differentiable=True` both stay in the autograd graph. Every
        entry keeps its shape and dtype.

        `Adam`, `AdamW` and `Adagrad` (and `SGD` with `fused=True`) run torch's
        fused kernel on fresh copies of the parameters and state when their
        `fused` flag and the step allow it: one pass over memory instead of the
        rule's several, bitwise `torch.optim` with `fused=True` (which rounds
        slightly differently from its foreach path; `fused=False` gives that).

        Under `torch.compile(fullgraph=True)`, the default mode compiles when the
        parameters do not require grad (gradients from `torch.func.grad`), and the
        differentiable mode always compiles: a compiled function cannot return new
        leaves that require grad, so marking them is the one step left to eager
        code (compile without `fullgraph` and it runs after the compiled update).

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
        with self._facts_kept(params, state):
            aligned = self._checked(params, grads, state)
            if not params:  # nothing to update: torch's foreach calls refuse []
                return params, state
            path, rates = choose(self, params, state, in_place=False)
        if path is Path.RECORDED:
            ops: Kernels = RecordedKernels.for_params(params)
            new_params, new_state = self.update(params, aligned, state, ops)
            return finished(new_params, params, ops.dtype), new_state
        if rates is not None:  # FUSED_COPIES
            # torch's fused kernel on fresh copies: one pass over memory instead
            # of the rule's several (what torch.optim's `fused=True` computes;
            # the copies are the new parameters and state).
            with torch.no_grad():
                copies, kernel_grads, copied_state = fused_copies(
                    params, aligned, state
                )
                copied_state = self._fused_step(
                    copies, kernel_grads, copied_state, rates
                )
            return requires_grad_like(copies, params), copied_state
        # The in-place kernels owning nothing yet: each first operation on the
        # inputs runs out of place, and everything after it writes into the
        # tensors the step itself just made. Only the new parameters and state
        # (and a rule's scratch) are allocated, bitwise the functional results.
        # Traced, the step stays functional: torch.func's transforms have no rule
        # for the in-place foreach kernels, and the compiler plans the memory of
        # the whole graph itself (the ownership checks would guard on identities).
        kernels = Kernels if path is Path.TRACED else InPlaceKernels
        ops = kernels.for_params(params)
        with torch.no_grad():
            new_params, new_state = self.update(params, aligned, state, ops)
            new_params = finished(new_params, params, ops.dtype)
        return requires_grad_like(new_params, params), new_state

    def step_(self, params: P, grads: Mapping[str, Tensor], state: S, /) -> tuple[P, S]:
        """Write one update into the tensors of `params` and `state`; return them.

        The in-place counterpart of `step`, for callers who own their parameters
        and state: no new parameters or buffers are allocated. It writes into
        every tensor of `params` and every tensor of `state` (the buffers and the
        step counter), and into nothing else: `grads` is only read, and no
        ParamDict or state object is changed (they are immutable; their tensors
        are). The returned `params` and state are the ones given, holding the
        same, updated tensors; keep using them (or the returned ones) from then
        on. The values equal `step`'s, bitwise where the kernels are the same.

        `Adam`, `AdamW`, `SGD` without dampening and `Adagrad` (CPU) use torch's
        fused kernels when their `fused` flag allows (not `False`), every entry
        shares float32 or float64 and one device, and `weight_decay` is a
        number and `lr` a number or a 0-dim tensor (`_strategy`'s table):
        bitwise `torch.optim` with `fused=True` and `step`. Every other optimizer
        and case runs its rule on `InPlaceKernels`, bitwise `step`.

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
        if self.differentiable:
            check_writable(True, params, ParamDict(), state)
        if traced():  # eager checks, then one traced graph (no plan)
            aligned = self._checked_to_write(params, grads, state)
            if not params:
                return params, state
            # Through twins (new containers of the same tensors): the compiled
            # frame guards fewer of its inputs' containers; a call at 150 x 16
            # takes 4% to 9% less than through `params` and `state` themselves.
            twin = twinned(state)
            written = self._write_traced(params._twin(), aligned, twin)
            # A state of another structure cannot be written back: it is new.
            return params, state if written is twin else written
        # Check, then commit: everything that can fail runs before the first
        # write, so an error leaves every tensor and counter as it was. The
        # tensors of the last call come back: what they passed is not checked
        # again while nothing about them changed (`_repeat`, which reads them
        # after a mapping of gradients ran its own code).
        aligned = self._aligned(params, grads)
        with repeating(self, params, state):
            aligned = self._check_step_(params, aligned, state)
            if not params:
                return params, state
            with planned():
                self._prepare(params, aligned, state)
                with torch.no_grad():
                    new_state = self._step_in_place(params, aligned, state)
        return params, new_state

    @_eagerly
    def _checked_to_write(
        self, params: ParamDict, grads: Mapping[str, Tensor], state: S
    ) -> ParamDict:
        """Return the aligned gradients of a traced `step_`, after all its checks.

        Eager even inside `torch.compile`: what `step_` may write is a question
        about memory (addresses, inference tensors) that a trace cannot ask, and
        traced piecemeal it broke the compiled step into a graph per check. So
        the compiled step is one eager call here, kept cheap on a repeat by
        `_repeat`'s record, then one graph of the update.
        """
        aligned = self._aligned(params, grads)
        with repeating(self, params, state):
            return self._check_step_(params, aligned, state)

    def _check_step_(self, params: ParamDict, grads: ParamDict, state: S) -> ParamDict:
        """Raise, before `step_` writes, on anything it refuses; the grads to use."""
        grads = self._check_aligned(params, grads, state)
        check_writable(False, params, grads, state)
        return grads

    def _write_traced(self, params: ParamDict, grads: ParamDict, state: S) -> S:
        """Write one step into the tensors of checked `params` and `state`.

        Traced as one graph: the rule on the functional kernels, each result
        written into its input's memory. Returns `state`, or a new state where
        the rule's is of another structure (`written_state`).
        """
        with torch.no_grad():
            return self._step_in_place(params, grads, state)

    def _step_in_place(self, params: ParamDict, grads: ParamDict, state: S) -> S:
        """Write one step into checked `params` and `state`; return `state`.

        The path `_strategy.choose` gives (kept by `_prepare`): torch's fused
        kernel, or the rule on `InPlaceKernels` (functional `Kernels` when
        traced), then whatever it made out of place copied into the tensors it
        replaces. Runs under `torch.no_grad()`.
        """
        known, planned = recall(state)
        if known:
            path, rates = cast(Choice, planned)
        else:
            path, rates = choose(self, params, state, in_place=True)
        if path is Path.TRACED:
            # The rule on the functional kernels, then copied into the tensors
            # it replaces. The compiler writes each result straight into its
            # input's memory; the in-place kernels' ownership and torch's fused
            # kernels are eager plans it cannot follow.
            ops = Kernels.for_params(params)
            new_params, new_state = self.update(params, grads, state, ops)
            write_back(params, finished(new_params, params, ops.dtype))
            return written_state(state, new_state)
        if rates is not None:  # FUSED
            kernel_grads = in_place_grads(params, grads)
            return self._fused_step(params, kernel_grads, state, rates)
        new_params, new_state = self._run_in_place(params, grads, state)
        write_back(params, new_params)
        return written_state(state, new_state)

    def _prepare(self, params: ParamDict, grads: ParamDict, state: S) -> None:
        """Run, before `step_` writes anything, every part of it that can fail.

        Here: the choice of path (`_strategy.choose`), with its refusals,
        `remember`ed for `_step_in_place`. `TorchOptimizer` also advances its
        schedule (whose callbacks may raise); the wrappers prepare the
        optimizers they hold. An override calls this one.
        """
        remember(state, choose(self, params, state, in_place=True))

    _copies_pay: ClassVar[bool] = True
    """Whether the default `step` runs a fused kernel on copies when it can.

    True where one fused pass over the copies costs less than the rule's passes
    (Adam's family, Adagrad); SGD's rule makes its two new tensors in as few
    passes as the copies alone, so it only does with `fused=True`.
    """

    def _fused_rates(self, params: ParamDict, state: S) -> KernelRates | None:
        """Return the rates of a step by torch's fused kernel, or None (the rule).

        The optimizers that have a fused kernel (`Adam`, `AdamW`, `SGD`,
        `Adagrad`) return their rates as the kernel takes them when their
        `fused` flag and the step (dtypes, device, a number `weight_decay`, a
        number or 0-dim tensor `lr`) allow it (`_fused.fused_rates`); here there
        is none.
        """
        return None

    def _fused_step(
        self, params: ParamDict, grads: ParamDict, state: S, rates: KernelRates
    ) -> S:
        """`_step_fused`, then the schedule of the state advanced, in place.

        The next schedule is computed first (in `step_` it was, by `_prepare`),
        and written last, into the tensors of the state's `schedule` field.
        """
        advance = getattr(self, "next_schedule", None)
        slot: object = getattr(state, "schedule", ())
        new_slot = advance(state) if advance is not None and slot != () else slot
        new_state = self._step_fused(params, grads, state, rates)
        if new_slot is not slot:
            for old, value in zip(
                pytree.tree_leaves(slot), pytree.tree_leaves(new_slot), strict=True
            ):
                if isinstance(old, Tensor) and old is not value:
                    old.copy_(value)
        return new_state

    def _step_fused(
        self, params: ParamDict, grads: ParamDict, state: S, rates: KernelRates
    ) -> S:
        """Write one step by torch's fused kernel into `params` and `state`."""
        raise NotImplementedError  # only called where `_fused_rates` gave rates

    def _run_in_place(
        self, params: ParamDict, grads: ParamDict, state: S
    ) -> tuple[ParamDict, S]:
        ops = InPlaceKernels.for_params(params)
        assert isinstance(ops, InPlaceKernels)  # for the type checkers
        given = cast(object, state)
        fields = cast("tuple[object, ...]", given) if isinstance(given, tuple) else ()
        ops.own(params, *fields)
        new_params, new_state = self.update(params, grads, state, ops)
        return finished(new_params, params, ops.dtype), new_state

    def _update_in_place(
        self, params: P, grads: Mapping[str, Tensor], state: S, /
    ) -> tuple[P, S]:
        """Run `update` with `InPlaceKernels`, writing into `params` and `state`.

        The rule alone, as the kernels leave it (what `step_` builds on): the
        parameters' and the state's tensors are overwritten; the returned
        ParamDicts hold them.
        """
        aligned = self._checked(params, grads, state)
        if not params:
            return params, state
        with torch.no_grad():
            new_params, new_state = self._run_in_place(params, aligned, state)
        return cast(P, new_params), new_state

    def step_module(
        self, module: nn.Module, loss_fn: Callable[[], Tensor], state: S, /
    ) -> tuple[Tensor, S]:
        """Take one training step on `module`, updating its parameters in place.

        Computes `loss = loss_fn()` (which should call `module`), its gradients
        with respect to the module's parameters that require grad, and one
        `step_`, which writes the update into the module's own `nn.Parameter`
        objects and into the tensors of `state` (so hooks and references to them
        stay valid, and no second copy of the parameters or the state is made).
        The parameters' `.grad` fields are not touched. The returned state is
        `state` itself, updated.

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
        given = cast(object, module)  # checked here: annotations are promises
        if not isinstance(given, nn.Module):
            msg = f"`step_module` takes an nn.Module, got {type(module).__name__}."
            raise TypeError(msg)
        given_fn = cast(object, loss_fn)
        if not callable(given_fn):
            msg = (
                "`step_module` takes `loss_fn`, a function of no arguments that "
                f"returns the loss, got {type(loss_fn).__name__}."
            )
            raise TypeError(msg)
        params = ParamDict.from_module(module).trainable()
        with repeating(self, params, state):  # refused before the loss is computed
            self.check_state(params, state)
            check_writable(False, params, ParamDict(), state)
        loss = loss_fn()
        grads = params.grad(loss)
        _, new_state = self.step_(params, grads, state)
        return loss.detach(), new_state
