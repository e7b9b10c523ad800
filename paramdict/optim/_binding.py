"""`Bound`: an optimizer bound to its parameters and state, decided once.

`bind` checks everything a step depends on and chooses its path (`opt._plan`);
each step then compares a signature of the facts those decisions read (`Facts`)
and binds again only where it changed. `step` and `step_` keep the last binding.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import torch
from torch import Tensor

from .._foreach import holds_dtensors
from .._fresh import mixed
from .._paramdict import ParamDict
from ._copies import copied, lazily_copied
from ._validate import (
    aligned_grads,
    check_keyed,
    check_writable,
    entries_agree,
    refuse_shared_grads,
    state_tensors,
    storage_keys,
)

if TYPE_CHECKING:
    from ._optimizer import Optimizer

__all__ = [
    "Bound",
    "Composed",
    "Facts",
    "Plan",
    "flag_like",
    "on_copies",
    "relaid",
    "relaid_as",
]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)

_stride = Tensor.stride
Strides = tuple[int, ...]
_requires_grad = cast("Callable[[Tensor], bool]", operator.attrgetter("requires_grad"))
_PLAIN = {Tensor, torch.nn.Parameter}


class Plan(Protocol[S]):
    """One step's work (`Optimizer._plan`): prepare what can fail, return the commit.

    The commit, a function of the gradients, writes the step and returns the
    state; nothing is written before it.
    """

    def __call__(self, params: ParamDict, state: S, /) -> Callable[[ParamDict], S]:
        """Prepare one step; return the function that writes it."""
        ...


class Composed(Generic[S]):
    """A plan run on gradients first transformed (clipping); `transform_` in place."""

    __slots__ = ("_transform", "grad_strides", "inner", "transform_")

    def __init__(
        self,
        inner: Plan[S],
        transform: Callable[[ParamDict], ParamDict],
        transform_: Callable[[ParamDict], ParamDict] | None = None,
    ):
        self.inner = inner
        self._transform = transform
        self.transform_ = transform_
        self.grad_strides: list[Strides | None] | None = getattr(
            inner, "grad_strides", None
        )

    def __call__(self, params: ParamDict, state: S) -> Callable[[ParamDict], S]:
        commit = self.inner(params, state)
        transform = self._transform
        return lambda grads: commit(transform(grads))


class _Check(Protocol):
    def check(self, *tensors: Tensor) -> bool: ...


class _Listed:
    """Tensor facts read by `map`s (tensors torch's C++ check cannot read)."""

    __slots__ = ("facts",)

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        self.facts = _listed(tensors)

    def check(self, *tensors: Tensor) -> bool:
        try:
            return _listed(tensors) == self.facts
        except (RuntimeError, NotImplementedError):  # a tensor without strides
            return False


def _strides(t: Tensor) -> tuple[int, ...] | None:
    try:
        return _stride(t)
    except (RuntimeError, NotImplementedError):  # sparse, nested
        return None


def _listed(tensors: Sequence[Tensor]) -> tuple[list[Any], ...]:
    """The facts of `tensors` as lists."""
    layouts = list(map(_layout, tensors))
    dense = layouts.count(torch.strided) == len(tensors) and not any(
        map(_is_nested, tensors)
    )
    return (
        list(map(type, tensors)),
        list(map(Tensor.size, tensors)),
        list(map(Tensor.stride if dense else _strides, tensors)),
        list(map(_dtype, tensors)),
        list(map(_device, tensors)),
        list(map(_requires_grad, tensors)),
        list(map(Tensor.is_inference, tensors)),
        list(map(Tensor.is_neg, tensors)),
        layouts,
    )


_layout = cast("Callable[[Tensor], torch.layout]", operator.attrgetter("layout"))
_dtype = cast("Callable[[Tensor], torch.dtype]", operator.attrgetter("dtype"))
_device = cast("Callable[[Tensor], torch.device]", operator.attrgetter("device"))
_is_nested = cast("Callable[[Tensor], bool]", operator.attrgetter("is_nested"))
_is_meta = cast("Callable[[Tensor], bool]", operator.attrgetter("is_meta"))
_grad_fn = cast("Callable[[Tensor], object]", operator.attrgetter("grad_fn"))
_untyped_storage = Tensor.untyped_storage
_storage_address = torch.UntypedStorage.data_ptr


def _readable(tensors: Sequence[Tensor]) -> bool:
    """Whether torch's C++ check can read `tensors` (plain, dense; it aborts else)."""
    return (
        set(map(type, tensors)) <= _PLAIN
        and list(map(_layout, tensors)).count(torch.strided) == len(tensors)
        and not any(map(_is_nested, tensors))
    )


def addresses(tensors: Sequence[Tensor]) -> list[int] | None:
    """The data address of each tensor's memory; None for meta and DTensor entries."""
    if any(map(_is_meta, tensors)) or holds_dtensors(tensors):
        return None
    return list(map(_storage_address, map(_untyped_storage, tensors)))


def _torch_check() -> Callable[..., _Check] | None:
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover - a torch without it
        return None
    return cast("Callable[..., _Check]", TensorGuards)


_TORCH_CHECK = _torch_check()


class Facts:
    """A signature of tensors' facts (`memory`: and their addresses), compared later."""

    __slots__ = ("_check", "_count", "_leaves", "_listed", "_memory", "_mode")

    def __init__(self, tensors: list[Tensor], *, memory: bool) -> None:
        self._count = len(tensors)
        self._mode = torch.is_inference_mode_enabled()
        # Tensor subclasses (fake tensors while tracing) have no addresses to
        # compare; their memory was compared when bound (`storage_keys`).
        plain = set(map(type, tensors)) <= _PLAIN
        self._memory = addresses(tensors) if memory and plain else None
        check: _Check | None = None
        if _TORCH_CHECK is not None and _readable(tensors):
            try:
                check = _TORCH_CHECK(
                    *tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None
                )
            except (TypeError, RuntimeError):
                check = None
        self._listed = _Listed(tensors)
        # A tensor that requires grad can gain a `grad_fn` in place and keep its
        # facts (`requires_grad_(False)`, an operation, `requires_grad` again).
        self._leaves = any(map(_requires_grad, tensors))
        self._check: _Check = check if check is not None else self._listed

    def holds(self, tensors: list[Tensor], *, same: bool = False) -> bool:
        """Whether `tensors` (`same`: the very ones read) have these facts."""
        if len(tensors) != self._count:
            return False
        if torch.is_inference_mode_enabled() != self._mode:
            return False
        check = self._check
        if torch._C._len_torch_dispatch_stack():
            # torch's check reads the dispatch keys with those of an active
            # mode (a profiler, an operation counter): compare the lists.
            check = self._listed
        elif not same and not isinstance(check, _Listed) and not _readable(tensors):
            return False
        if not check.check(*tensors):
            return False
        if self._leaves and any(map(_grad_fn, tensors)):
            return False
        return self._memory is None or addresses(tensors) == self._memory


class Bound(Generic[S]):
    """An optimizer bound to parameters and a state: checked once, stepped often.

    Made by `Optimizer.bind`: the parameters, the state, what was decided about
    them and a signature of the facts the decisions read. `step_` writes into
    them; `step` replaces them. A change to the tensors' facts is found on the
    next step, which then checks and decides again.

    Attributes:
        optimizer: The optimizer.
        params: The parameters, after the last step.
        state: The state, after the last step.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> opt = optim.SGD(lr=0.5)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> bound = opt.bind(params, opt.init(params))
        >>> for _ in range(2):
        ...     state = bound.step_({"w": torch.ones(2)})
        >>> params["w"], int(state.step)
        (tensor([0., 1.]), 2)
    """

    __slots__ = (
        "_facts",
        "_grad_facts",
        "_in_place",
        "_lazy",
        "_mixed",
        "_owned",
        "_plain_grads",
        "_plan",
        "_relayout",
        "_tensors",
        "optimizer",
        "params",
        "state",
    )

    def __init__(
        self, optimizer: Optimizer[S], params: ParamDict, state: S, *, in_place: bool
    ) -> None:
        if in_place:
            check_writable(optimizer.differentiable, params, state)
        self._plan: Plan[S] = optimizer._plan(params, state, in_place=in_place)
        self.optimizer: Optimizer[S] = optimizer
        self.params: ParamDict = params
        self.state: S = state
        self._in_place = in_place
        tensors = [*params._vals, *state_tensors(state)]
        self._tensors = tensors
        self._facts = Facts(tensors, memory=in_place)
        self._owned = set(storage_keys(tensors)) if in_place else set[int]()
        self._grad_facts: Facts | None = None
        self._plain_grads = True
        self._relayout = False
        # `step`'s copies made by the first write (`_copies`): where the rule
        # writes only through ParamDict's methods and no write changes a dtype.
        self._lazy = (
            not in_place and optimizer._lazy_rule() and entries_agree(params, state)
        )
        self._mixed = self._lazy and mixed(params)

    def holds(self, params: ParamDict, state: object) -> bool:
        """Whether these are the bound parameters and state, with the same facts.

        Args:
            params: The parameters a step is handed.
            state: The state it is handed.

        Returns:
            Whether a step on them may use this binding.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.ones(2))
            >>> opt = optim.SGD(lr=0.1)
            >>> bound = opt.bind(params, opt.init(params))
            >>> bound.holds(bound.params, bound.state)
            True
            >>> _ = params["w"].resize_(3)  # another size: bind again
            >>> bound.holds(bound.params, bound.state)
            False
        """
        return (
            params is self.params
            and state is self.state
            and self._facts.holds(self._tensors, same=True)
        )

    def grads(self, grads: Mapping[str, Tensor]) -> ParamDict:
        """Return `grads` aligned to the parameters, after the checks they need.

        Checked in full when their facts change; in place, also for memory
        shared with what the step writes.

        Args:
            grads: A mapping with the parameters' keys.

        Returns:
            A ParamDict in the parameters' key order (gradients of a layout a
            fused kernel cannot walk are copied into one it can).

        Raises:
            ValueError: If a key, shape, dtype or device differs, or (in place) a
                gradient shares memory with a tensor the step writes.
            TypeError: If `grads` is not a mapping of tensors.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.ones(2))
            >>> bound = optim.SGD().bind(params, optim.SGD().init(params))
            >>> bound.grads({"w": torch.ones(3)})
            Traceback (most recent call last):
            ...
            ValueError: The gradients must match the parameters entry by entry ...
        """
        params = self.params
        aligned = aligned_grads(params, grads)
        values = aligned._vals
        known = self._grad_facts
        if known is None or not known.holds(values):
            check_keyed(params, aligned._vals, what="The gradients")
            self._grad_facts = Facts(values, memory=False)
            # Tensor subclasses (fake tensors) have no addresses to compare.
            self._plain_grads = set(map(type, values)) <= _PLAIN
            targets: list[Strides | None] | None = getattr(
                self._plan, "grad_strides", None
            )
            self._relayout = targets is not None and any(
                t is not None and _strides(g) != t for g, t in zip(values, targets)
            )
        if any(map(Tensor.is_neg, values)):
            # A view of negated memory: torch's writing foreach kernels refuse it.
            aligned = aligned._derive([g.resolve_neg() for g in values])
        if self._in_place:
            vals = aligned._vals
            keys = addresses(vals) if self._plain_grads else storage_keys(vals)
            refuse_shared_grads(params, self.state, aligned, self._owned, keys)
        if self._relayout:
            aligned = relaid(aligned, getattr(self._plan, "grad_strides"))  # noqa: B009
        return aligned

    def step_(self, grads: Mapping[str, Tensor], /) -> S:
        """Write one update into the bound parameters and state; return the state.

        Args:
            grads: The gradients: a mapping with the parameters' keys.

        Returns:
            The state: the bound one, its tensors written (a `ParamGroups`
            state saved in an older form comes back in the current one,
            holding the same tensors).

        Raises:
            ValueError: As `Optimizer.step_`; nothing is written then.
            TypeError: As `Optimizer.step_`.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.tensor([1.0]))
            >>> bound = optim.SGD(lr=0.5).bind(params, optim.SGD().init(params))
            >>> state = bound.step_({"w": torch.tensor([1.0])})
            >>> params["w"], int(state.step)
            (tensor([0.5000]), 1)
        """
        if not self._in_place:
            msg = "This binding was made for `step`; bind with `in_place=True`."
            raise ValueError(msg)
        aligned = self.grads(grads)  # checked even with no parameters
        if not self.params:
            return self.state
        with torch.no_grad():
            commit = self._plan(self.params, self.state)
            return commit(aligned)

    def step(self, grads: Mapping[str, Tensor], /) -> tuple[ParamDict, S]:
        """Return new parameters and state after one update; hold them from now on.

        Args:
            grads: The gradients: a mapping with the parameters' keys.

        Returns:
            `(params, state)`: new tensors; the old ones are unchanged.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.SGD(lr=0.5)
            >>> bound = opt.bind(params, opt.init(params), in_place=False)
            >>> new, state = bound.step({"w": torch.tensor([1.0])})
            >>> new["w"], params["w"], bound.params is new
            (tensor([0.5000]), tensor([1.]), True)
        """
        if self._in_place:
            msg = "This binding was made for `step_`; bind with `in_place=False`."
            raise ValueError(msg)
        params, state = self.params, self.state
        aligned = self.grads(grads)  # checked even with no parameters
        if not params:
            return params, state
        new_params, new_state = on_copies(
            self._plan,
            params,
            state,
            aligned,
            recorded=self.optimizer.differentiable,
            lazy=self._lazy,
            exact=self._mixed,
        )
        self.hold(new_params, new_state)
        return new_params, new_state

    def hold(self, params: ParamDict, state: S) -> None:
        """Hold `params` and `state`, made by a step of this binding, from now on.

        For a wrapper's own `step` shortcut; their facts are read anew.

        Args:
            params: New parameters of the bound structure.
            state: Their state.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.SGD()
            >>> bound = opt.bind(params, opt.init(params), in_place=False)
            >>> copies = params.clone()
            >>> bound.hold(copies, bound.state)
            >>> bound.params is copies
            True
        """
        self.params, self.state = params, state
        self._tensors = [*params._vals, *state_tensors(state)]
        self._facts = Facts(self._tensors, memory=False)


def on_copies(
    plan: Plan[S],
    params: P,
    state: S,
    grads: ParamDict,
    *,
    recorded: bool,
    lazy: bool,
    exact: bool,
) -> tuple[P, S]:
    """Run `plan` on copies of `params` and `state`; new leaves unless `recorded`."""
    with torch.set_grad_enabled(recorded and torch.is_grad_enabled()):
        if lazy:
            copies, copied_state, finish = lazily_copied(
                params, state, recorded=recorded, exact=exact
            )
            new_state = plan(copies, copied_state)(grads)
            finish()
        else:
            copies, copied_state = copied(params, state, recorded=recorded)
            new_state = plan(copies, copied_state)(grads)
    if not recorded:
        flag_like(copies, params)
    return copies, new_state


def flag_like(new: ParamDict, old: ParamDict) -> None:
    """Make each entry of `new` require grad where its entry of `old` does."""
    for value, given in zip(new._vals, old._vals):
        if given.requires_grad:
            value.requires_grad_()


def relaid_as(plan: object, grads: ParamDict) -> ParamDict:
    """`grads` in the strides `plan` takes its gradients in (`grad_strides`)."""
    targets: list[Strides | None] | None = getattr(plan, "grad_strides", None)
    return grads if targets is None else relaid(grads, targets)


def relaid(grads: ParamDict, targets: list[Strides | None]) -> ParamDict:
    """`grads` with each entry in the strides `targets` (itself where all have them)."""
    out: list[Tensor] = []
    for g, target in zip(grads._vals, targets):
        if target is None or _strides(g) == target:
            out.append(g)
        else:
            made = torch.empty_strided(g.shape, target, dtype=g.dtype, device=g.device)
            out.append(made.copy_(g))
    if all(map(operator.is_, out, grads._vals)):
        return grads
    return grads._derive(out)
