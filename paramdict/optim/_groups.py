"""Parameter groups: different optimizer settings for keys chosen by pattern or test."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeAlias, TypeVar, cast

import attrs
import torch
from torch import Tensor
from torch.utils import _pytree as pytree
from typing_extensions import override

from .._fresh import pending, rebind
from .._paramdict import ParamDict
from ._binding import Bound, Plan, Strides
from ._optimizer import Optimizer
from ._schedules.slot import is_schedule

P = TypeVar("P", bound=ParamDict)

__all__ = ["ParamGroups"]

S = TypeVar("S")

_Patterns = tuple[str, ...]
_Routes = tuple[tuple[str, ...], ...]
Predicate: TypeAlias = Callable[[str, Tensor], bool]
"""A group's test of one entry: its name and tensor in, whether it belongs out."""
_Selector = _Patterns | Predicate


def _as_selector(key: object) -> _Selector:
    if callable(key):
        return cast(Predicate, key)
    given: object = (key,) if isinstance(key, str) else key
    patterns: tuple[object, ...] = (
        cast("tuple[object, ...]", given) if isinstance(given, tuple) else ()
    )
    if not (patterns and all(isinstance(p, str) for p in patterns)):
        msg = (
            "Each group is keyed by a pattern or a non-empty tuple of patterns "
            f"(str), or a predicate on (name, tensor), got {key!r}."
        )
        raise TypeError(msg)
    return cast(_Patterns, patterns)


def _name(predicate: Predicate) -> str:
    return str(getattr(predicate, "__qualname__", repr(predicate)))


def _keepers(members: Sequence[object]) -> tuple[int, ...]:
    """Return, for each member, the first member whose `lr` is the same schedule."""
    lrs: list[object] = [getattr(opt, "lr", None) for opt in members]
    return tuple(
        next(j for j, other in enumerate(lrs) if other is lr) if is_schedule(lr) else i
        for i, lr in enumerate(lrs)
    )


def _slot(state: object) -> object:
    """Return a group state's `schedule` field (`()` where it keeps none)."""
    return getattr(state, "schedule", ())


def _with_slot(state: S, slot: object) -> S:
    """Return `state` holding `slot` as its `schedule`."""
    replaced: S = cast("Any", state)._replace(schedule=slot)
    return replaced


def _globs(selectors: Sequence[_Selector]) -> dict[str, re.Pattern[str]]:
    """Return each pattern's `fnmatchcase` regex, compiled now (not while traced)."""
    return {
        p: re.compile(fnmatch.translate(p))
        for selector in selectors
        if not callable(selector)
        for p in selector
    }


def _chosen(
    selector: _Selector, params: ParamDict, globs: Mapping[str, re.Pattern[str]]
) -> list[str]:
    """Return the keys `selector` chooses, in key order (a key itself is no pattern)."""
    if callable(selector):
        return [k for k, v in params.items() if selector(k, v)]
    exact = {p for p in selector if p in params}
    rest = [globs[p] for p in selector if p not in exact]
    return [k for k in params if k in exact or any(g.match(k) for g in rest)]


@attrs.frozen(eq=False, init=False)
class ParamGroups(Optimizer[tuple[S, ...]]):
    """Give different optimizer settings to the parameters chosen by pattern or test.

    The keyed `torch.optim` parameter groups: each group is a shell-style
    pattern as for `ParamDict.select` (`"*.bias"`), a tuple of them, or a
    predicate on each entry's name and tensor (`lambda name, t: t.dim() >= 2`),
    mapped to its own optimizer. A string equal to a parameter name chooses
    that entry only. Each key goes to the first group that chooses it, else to
    `default`. The state is the tuple of the groups' states (then the
    default's). Groups whose `lr` is one schedule object share its state,
    stored in the first of them (the others hold `()`).

    All the optimizers share one state type and one `differentiable` setting.
    The routing is computed once per key set, so a predicate must not depend on
    the tensors' values.

    Args:
        groups: An ordered mapping from a pattern, a tuple of patterns or a
            predicate on (name, tensor) to the optimizer for the keys it
            chooses.
        default: The optimizer for every key no group matches; without it every
            key must match a group.

    Raises:
        TypeError: If a group key is not a pattern, tuple of patterns or
            callable, or a value is not an `Optimizer`.
        ValueError: If the optimizers disagree on `differentiable`.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict.from_module(torch.nn.Linear(3, 2))
        >>> opt = optim.ParamGroups(
        ...     {"*bias": optim.AdamW(weight_decay=0.0)},
        ...     default=optim.AdamW(weight_decay=0.01),
        ... )
        >>> state = opt.init(params)
        >>> len(state), list(state[0].exp_avg), list(state[1].exp_avg)
        (2, ['bias'], ['weight'])
        >>> decay = optim.ParamGroups(
        ...     {lambda name, t: t.dim() >= 2: optim.AdamW(weight_decay=0.1)},
        ...     default=optim.AdamW(weight_decay=0.0),
        ... )
        >>> [list(s.exp_avg) for s in decay.init(params)]
        [['weight'], ['bias']]
    """

    groups: tuple[tuple[_Patterns | Predicate, Optimizer[S]], ...]
    default: Optimizer[S] | None
    differentiable: bool
    # For each member, the member whose state stores its schedule's state.
    _keepers: tuple[int, ...] = attrs.field(init=False, default=(), repr=False)
    # Each pattern's regular expression (`_globs`).
    _globs: dict[str, re.Pattern[str]] = attrs.field(
        init=False, factory=lambda: dict[str, re.Pattern[str]](), repr=False
    )

    def __init__(
        self,
        groups: Mapping[str | _Patterns | Predicate, Optimizer[S]],
        /,
        *,
        default: Optimizer[S] | None = None,
    ) -> None:
        given: object = groups
        if not isinstance(given, Mapping):
            msg = (
                "`groups` must be a mapping from a key pattern (or a tuple of "
                "patterns, or a test of the key) to its optimizer, got "
                f"{type(given).__name__}: write `optim.ParamGroups({{'*.bias': "
                "optim.SGD(...)}, default=...)` (a list of pairs becomes one with "
                "`dict(pairs)`)."
            )
            raise TypeError(msg)
        pairs = tuple((_as_selector(k), opt) for k, opt in groups.items())
        members: list[tuple[str, object]] = [
            (f"the group {_name(k) if callable(k) else repr(k)}", opt)
            for k, opt in groups.items()
        ]
        members += [("`default`", default)] if default is not None else []
        bad = [
            f"{w}: {type(m).__name__}"
            for w, m in members
            if not isinstance(m, Optimizer)
        ]
        if bad:
            msg = (
                "Every group needs a paramdict optimizer (an `Optimizer` such as "
                f"`optim.AdamW(...)`), got {'; '.join(bad)}."
            )
            raise TypeError(msg)
        flags = {cast(Optimizer[S], opt).differentiable for _, opt in members}
        if len(flags) > 1:
            msg = (
                "All groups must share one `differentiable` setting; they disagree "
                "here. Set the same value on every optimizer."
            )
            raise ValueError(msg)
        # Whether `step` keeps the graph, as every member optimizer agrees.
        self.__attrs_init__(  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # made by attrs
            pairs, default, bool(flags) and flags.pop()
        )
        object.__setattr__(self, "_keepers", _keepers(self._members()))
        object.__setattr__(self, "_globs", _globs([k for k, _ in pairs]))

    def _members(self) -> list[Optimizer[S]]:
        members = [opt for _, opt in self.groups]
        if self.default is not None:
            members.append(self.default)
        return members

    def _routes_for(self, params: ParamDict) -> _Routes:
        """Split the keys among the groups (then the default), first match wins."""
        patterns = sorted(
            pattern
            for selector, _ in self.groups
            if not callable(selector)
            for pattern in selector
            if not _chosen((pattern,), params, self._globs)
        )
        tests = sorted(
            _name(selector)
            for selector, _ in self.groups
            if callable(selector) and not _chosen(selector, params, self._globs)
        )
        if patterns or tests:
            what = " and ".join(
                [f"the group patterns {patterns!r}"] * bool(patterns)
                + [f"the group predicates {tests!r}"] * bool(tests)
            )
            msg = (
                f"{what[0].upper()}{what[1:]} match no key. Check them against "
                f"the parameter names, e.g. {list(params)[:4]!r}."
            )
            raise ValueError(msg)
        routes: list[tuple[str, ...]] = []
        taken: set[str] = set()
        for selector, _ in self.groups:
            route = tuple(
                k for k in _chosen(selector, params, self._globs) if k not in taken
            )
            routes.append(route)
            taken.update(route)
        rest = [k for k in params if k not in taken]
        if self.default is not None:
            routes.append(tuple(rest))
        elif rest:
            msg = (
                f"The keys {sorted(rest)!r} match no group. Add a group for them "
                "or pass `default=` an optimizer for the rest."
            )
            raise ValueError(msg)
        return tuple(routes)

    def init(self, params: ParamDict, /) -> tuple[S, ...]:
        """Return the tuple of each group's first state, then the default's.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            One state per group, in order, then one for `default` if given.

        Raises:
            ValueError: If a pattern matches no key, or a key matches no group and
                there is no `default`; the message names them.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict.from_module(torch.nn.Linear(3, 2))
            >>> opt = optim.ParamGroups(
            ...     {"bias": optim.Adam(lr=0.1)}, default=optim.Adam(lr=0.01)
            ... )
            >>> [list(s.exp_avg) for s in opt.init(params)]
            [['bias'], ['weight']]
        """
        routes = self._routes_for(params)
        return self._stored(
            tuple(
                opt.init(subset(params, keys))
                for opt, keys in zip(self._members(), routes)
            )
        )

    def _full(
        self, state: tuple[S, ...], routes: _Routes | None = None
    ) -> tuple[S, ...]:
        """Return each group's whole state: shared schedule states handed out.

        With `routes`, only the group that advances a shared state gets it; the
        others get copies, so each reads the rate before any write.
        """
        full = list(state)
        for i, keeper in enumerate(self._keepers):
            if keeper == i or i >= len(state) or keeper >= len(state):
                continue
            slot = _slot(state[keeper])
            if routes is not None and i != self._writer(keeper, routes):
                slot = pytree.tree_map_only(Tensor, Tensor.clone, slot)
            full[i] = _with_slot(state[i], slot)
        return tuple(full)

    def _writer(self, keeper: int, routes: _Routes) -> int:
        """Return the group whose step advances the schedule state `keeper` stores."""
        sharing = [i for i, k in enumerate(self._keepers) if k == keeper]
        return next((i for i in sharing if routes[i]), keeper)

    def _stored_once(self, state: tuple[S, ...]) -> bool:
        """Whether each shared schedule state of `state` is stored once already."""
        return all(
            keeper == i or i >= len(state) or _slot(state[i]) == ()
            for i, keeper in enumerate(self._keepers)
        )

    def _stored(
        self, states: tuple[S, ...], routes: _Routes | None = None
    ) -> tuple[S, ...]:
        """Return the state to keep: each shared schedule state stored once."""
        stored = list(states)
        for i, keeper in enumerate(self._keepers):
            if keeper == i:
                continue
            stored[i] = _with_slot(states[i], ())
            writer = keeper if routes is None else self._writer(keeper, routes)
            if writer != keeper:
                stored[keeper] = _with_slot(states[keeper], _slot(states[writer]))
        return tuple(stored)

    @override
    def check_state(self, params: ParamDict, state: tuple[S, ...], /) -> None:
        routes = self._routes_for(params)
        given = cast(object, state)  # checked here: annotations are promises
        if not isinstance(given, tuple) or hasattr(state, "_fields"):
            msg = (
                f"The state of these ParamGroups is a tuple of {len(routes)} group "
                f"states, got {type(state).__name__}. Use the state from this "
                "optimizer's `init`."
            )
            raise TypeError(msg)
        if len(state) != len(routes):
            msg = (
                f"The state has {len(state)} entries but these ParamGroups have "
                f"{len(routes)} groups. Use the state from this optimizer's `init`."
            )
            raise ValueError(msg)
        full = self._full(state)
        for opt, keys, given, sub_state in zip(self._members(), routes, state, full):
            # A group's own copy of a shared schedule state (as states made
            # before it was stored once held it) is checked as it is.
            own = _slot(given) != ()
            opt.check_state(subset(params, keys), given if own else sub_state)

    @property
    @override
    def takes_metric(self) -> bool:
        return any(opt.takes_metric for opt in self._members())

    @override
    def step_schedule(
        self, state: tuple[S, ...], metrics: float | Tensor, /
    ) -> tuple[S, ...]:
        """Return `state` after every group's `ReduceLROnPlateau` saw `metrics`.

        The other groups keep their state; `state` is unchanged. Raises
        `ValueError` if no group's `lr` is a `ReduceLROnPlateau`.

        Example:
            >>> from paramdict import optim
            >>> params = ParamDict.from_module(torch.nn.Linear(3, 2))
            >>> plateau = optim.ReduceLROnPlateau(base_lr=0.1, patience=0)
            >>> opt = optim.ParamGroups(
            ...     {"bias": optim.SGD(lr=plateau)}, default=optim.SGD(lr=0.1)
            ... )
            >>> state = opt.init(params)
            >>> for loss in (1.0, 1.0):
            ...     state = opt.step_schedule(state, loss)
            >>> state[0].schedule.lr, state[1].schedule
            (tensor(0.0100, dtype=torch.float64), ())
        """
        if not self.takes_metric:
            return super().step_schedule(state, metrics)
        return self._stored(
            tuple(
                opt.step_schedule(sub_state, metrics) if opt.takes_metric else sub_state
                for opt, sub_state in zip(
                    self._members(), self._full(state), strict=True
                )
            )
        )

    @override
    def last_lr(self, state: tuple[S, ...], /) -> list[float]:
        return [
            lr
            for opt, sub in zip(self._members(), self._full(state))
            for lr in opt.last_lr(sub)
        ]

    @override
    def step_count(self, state: tuple[S, ...], /) -> int:
        return max(opt.step_count(sub) for opt, sub in zip(self._members(), state))

    @override
    def eval_params(self, params: P, state: tuple[S, ...], /) -> P:
        """Return each group's point to evaluate at (`params` where all are theirs)."""
        routes = self._routes_for(params)
        found: dict[str, Tensor] = {}
        moved = False
        for opt, keys, sub in zip(self._members(), routes, self._full(state)):
            if not keys:
                continue
            part = subset(params, keys)
            point = opt.eval_params(part, sub)
            moved = moved or point is not part
            found.update(zip(keys, point.values()))
        if not moved:
            return params
        return params._derive([found[k] for k in params._keys])

    @override
    def step(
        self, params: P, grads: Mapping[str, Tensor], state: tuple[S, ...], /
    ) -> tuple[P, tuple[S, ...]]:
        """Return the parameters after one update, and the next state.

        As `Optimizer.step`; a group without keys passes its state along as it is.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ParamGroups(
            ...     {"b": optim.SGD(lr=1.0)}, default=optim.SGD(lr=0.5)
            ... )
            >>> params = ParamDict(w=torch.ones(1), b=torch.ones(1))
            >>> new, _ = opt.step(params, params, opt.init(params))
            >>> new["w"], new["b"]
            (tensor([0.5000]), tensor([0.]))
        """
        new_params, new_state = super().step(params, grads, state)
        if self.differentiable or torch.compiler.is_compiling() or not params:
            return new_params, new_state
        last: Bound[tuple[S, ...]] | None = getattr(self, "_last", None)
        if not isinstance(last, Bound) or last.state is not new_state:
            return new_params, new_state
        plan = last._plan
        if not isinstance(plan, _GroupsPlan):
            return new_params, new_state
        routes = plan._routes
        # A group without keys whose state holds no schedule another one steps.
        idle = {
            i
            for i, keys in enumerate(routes)
            if not keys and all(k != i or j == i for j, k in enumerate(self._keepers))
        }
        kept = tuple(state[i] if i in idle else new for i, new in enumerate(new_state))
        last.hold(new_params, kept)
        return new_params, kept

    @override
    def _lazy_rule(self) -> bool:
        return all(m._lazy_rule() for m in self._members())

    @override
    def _plan(
        self, params: ParamDict, state: tuple[S, ...], *, in_place: bool
    ) -> Plan[tuple[S, ...]]:
        self.check_state(params, state)
        routes = self._routes_for(params)
        return _GroupsPlan(self, params, state, routes, in_place=in_place)


def subset(params: P, keys: Sequence[str], /) -> P:
    """Return the entries of `params` under exactly `keys` (no patterns), in order."""
    return params._from_parts(tuple(keys), [params[k] for k in keys])


class _GroupsPlan(Generic[S]):
    """Each group's plan on its entries, prepared all before any writes."""

    __slots__ = ("_groups", "_indices", "_plans", "_routes", "grad_strides")

    def __init__(
        self,
        groups: ParamGroups[S],
        params: ParamDict,
        state: tuple[S, ...],
        routes: _Routes,
        *,
        in_place: bool,
    ) -> None:
        self._groups = groups
        self._routes = routes
        place = {k: i for i, k in enumerate(params._keys)}
        self._indices = [[place[k] for k in keys] for keys in routes]
        full = groups._full(state, routes)
        self._plans: list[Plan[S] | None] = [
            opt._plan(subset(params, keys), sub_state, in_place=in_place)
            if keys
            else None
            for opt, keys, sub_state in zip(groups._members(), routes, full)
        ]
        strides: list[Strides | None] = [None] * len(params._keys)
        found = False
        for plan, indices in zip(self._plans, self._indices):
            own: list[Strides | None] | None = getattr(plan, "grad_strides", None)
            if own is not None:
                found = True
                for i, target in zip(indices, own):
                    strides[i] = target
        self.grad_strides = strides if found else None

    def __call__(
        self, params: ParamDict, state: tuple[S, ...]
    ) -> Callable[[ParamDict], tuple[S, ...]]:
        full = self._groups._full(state, self._routes)
        pvals = params._vals
        lazy = pending(params)  # copied by the first write: each group's too
        commits: list[tuple[tuple[str, ...], list[int], Callable[[ParamDict], S]]] = []
        parts: list[tuple[list[int], ParamDict]] = []
        for plan, keys, indices, sub_state in zip(
            self._plans, self._routes, self._indices, full
        ):
            if plan is None:
                continue
            sub_params = params._from_parts(keys, [pvals[i] for i in indices])
            if lazy:
                sub_params._pending = params._pending
                parts.append((indices, sub_params))
            commits.append((keys, indices, plan(sub_params, sub_state)))

        groups, routes = self._groups, self._routes

        def commit(grads: ParamDict) -> tuple[S, ...]:
            gvals = grads._vals
            for keys, indices, each in commits:
                each(grads._from_parts(keys, [gvals[i] for i in indices]))
            if parts:  # the groups' new tensors, into the parameters
                merged = list(params._vals)
                for indices, sub_params in parts:
                    for i, value in zip(indices, sub_params._vals):
                        merged[i] = value
                rebind(params, merged)
            if groups._stored_once(state):
                return state
            # A state saved with a copy of a shared schedule state per group:
            # the same tensors, each shared schedule state stored once.
            return groups._stored(tuple(full), routes)

        return commit
