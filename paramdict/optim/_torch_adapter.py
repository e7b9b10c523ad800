"""`as_torch_optimizer`: any paramdict optimizer as a real `torch.optim.Optimizer`.

`TorchAdapter` answers what training code calls (`step`, `zero_grad`,
`param_groups`, `state_dict`, `load_state_dict`, the hooks) with a paramdict
optimizer's in-place step, bound once. The groups live in `_adapter_groups.py`,
the state dict's conversions in `_adapter_state.py`.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamGroups' routing and members, of this package)
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias, cast, overload

import attrs
import torch
from torch import Tensor, nn
from typing_extensions import override

from .._paramdict import ParamDict
from ._adapter_groups import Group, checked, defaults_of
from ._adapter_state import exported, loaded
from ._optimizer import Optimizer
from ._torch_optimizer import TorchOptimizer
from ._torch_state import _is_groups

__all__ = ["TorchAdapter", "as_torch_optimizer"]

Params: TypeAlias = (
    nn.Module
    | Iterable[Tensor]
    | Iterable[tuple[str, Tensor]]
    | Iterable[dict[str, Any]]
)
"""What the adapter takes: a module, or what `torch.optim` optimizers take."""

_NOT_PICKLED = (
    "A TorchAdapter is not pickled or copied: its groups hold bound steps. Save "
    "`adapter.state_dict()` and load it into a new adapter (`load_state_dict`)."
)


def _named(items: list[Any], where: str) -> dict[str, Tensor]:
    """`(name, tensor)` pairs as a dict, refusing anything else and repeats."""
    if not all(
        isinstance(item, tuple)
        and len(cast("tuple[object, ...]", item)) == 2
        and isinstance(item[0], str)
        for item in items
    ):
        msg = (
            f"{where}: `optim.ParamGroups` chooses its groups by name; pass the "
            "module or its `named_parameters()`, not tensors or groups."
        )
        raise TypeError(msg)
    pairs = cast("list[tuple[str, Tensor]]", items)
    named = dict(pairs)
    if len(named) != len(pairs):
        repeated = sorted({k for k, _ in pairs if [n for n, _ in pairs].count(k) > 1})
        msg = f"{where}: the names {repeated} are given twice; give each one once."
        raise ValueError(msg)
    return named


def _split(
    optimizer: object, params: Params, where: str
) -> tuple[TorchOptimizer[Any], list[TorchOptimizer[Any]], list[Any]]:
    """The base optimizer, each given group's optimizer, and torch's groups."""
    if isinstance(params, Tensor):
        msg = (
            "params argument given to the optimizer should be an iterable of "
            f"Tensors or dicts, but got {torch.typename(params)}"
        )
        raise TypeError(msg)
    items: list[Any] = (
        list(params.named_parameters())
        if isinstance(params, nn.Module)
        else list(cast("Iterable[Any]", params))
    )
    if not items:
        msg = "optimizer got an empty parameter list"
        raise ValueError(msg)
    if not _is_groups(optimizer):
        return attrs.evolve(checked(optimizer, where)), [], items
    named = _named(items, where)
    routes = optimizer._routes_for(ParamDict(named))
    members = [
        attrs.evolve(checked(member, f"{where}, group {i}"))
        for i, member in enumerate(optimizer._members())
    ]
    given: list[dict[str, Any]] = [
        {"params": [(k, named[k]) for k in route], **defaults_of(member, None)}
        for member, route in zip(members, routes, strict=True)
    ]
    for group in given:
        if not group["params"]:  # a default that holds nothing: named, as the rest
            group["param_names"] = []
    return members[-1], members, given


class TorchAdapter(torch.optim.Optimizer):
    """A paramdict optimizer as a `torch.optim.Optimizer` (see `as_torch_optimizer`).

    `step`, `add_param_group`, `state_dict` and `load_state_dict` are torch's
    methods, answered with the paramdict optimizer; `zero_grad` and the hooks
    are torch's own.

    Attributes:
        param_groups: One dict per group, its `params` and every setting under
            torch's name; schedulers and the user may write them.
        state: Each parameter's buffers under torch's names, the optimizer's
            own tensors (read them; write through `load_state_dict`).
        defaults: The settings a group added without them takes.

    Example:
        >>> import torch
        >>> from paramdict import optim
        >>> opt = optim.as_torch_optimizer(optim.SGD(lr=0.5), torch.nn.Linear(2, 1))
        >>> isinstance(opt, optim.TorchAdapter), opt.param_groups[0]["lr"]
        (True, 0.5)
    """

    def __init__(self, optimizer: Optimizer[Any], params: Params, /) -> None:
        self._base, self._next, given = _split(optimizer, params, "as_torch_optimizer")
        self._groups: list[Group] = []
        super().__init__(given, defaults_of(self._base, None))

    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group, as torch does; its settings default to `defaults`.

        Its optimizer is the adapter's with the group's settings, its state `init`'s.

        Args:
            param_group: `params` (tensors, or `(name, tensor)` pairs) and any
                settings.

        Raises:
            ValueError: As torch (a non-leaf tensor, a parameter already in a
                group), or if a setting is refused or a name repeats.
            TypeError: As torch, or if a setting is of the wrong kind.

        Example:
            >>> import torch
            >>> from paramdict import optim
            >>> first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
            >>> opt = optim.as_torch_optimizer(
            ...     optim.AdamW(lr=0.1), first.named_parameters()
            ... )
            >>> opt.add_param_group({"params": second.named_parameters(), "lr": 0.01})
            >>> [(g["lr"], g["weight_decay"]) for g in opt.param_groups]
            [(0.1, 0.01), (0.01, 0.01)]
        """
        member = self._next.pop(0) if self._next else self._base
        index = len(self.param_groups)
        offset = sum(len(g.params) for g in self._groups)
        super().add_param_group(param_group)
        group_dict = self.param_groups[-1]
        try:
            tensors: list[Tensor] = group_dict["params"]
            names: list[str] = group_dict.get(
                "param_names", [str(offset + i) for i in range(len(tensors))]
            )
            if len(set(names)) != len(names):
                repeated = sorted({n for n in names if names.count(n) > 1})
                msg = (
                    f"param_groups[{index}] names {repeated} more than once; give "
                    "each parameter its own name."
                )
                raise ValueError(msg)
            group = Group.made(index, member, group_dict, names)
        except BaseException:
            self.param_groups.pop()
            raise
        self._groups.append(group)
        self.state.update(group.view())

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @override
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Take one step on every group's `.grad`s; return the closure's loss.

        The closure runs first, with gradients enabled. Nothing is written until
        every group is configured as its dict says and its gradients are checked.
        A parameter whose `.grad` is None is skipped, as torch skips it (its
        group's step count still advances: paramdict keeps one per group).

        Args:
            closure: A function that recomputes the loss and its gradients.

        Returns:
            The closure's loss, or None.

        Raises:
            ValueError: If a setting written into a group is refused, or a
                gradient does not fit its parameter; nothing is written.

        Example:
            >>> import torch
            >>> from paramdict import optim
            >>> w = torch.nn.Parameter(torch.tensor([1.0]))
            >>> opt = optim.as_torch_optimizer(optim.SGD(lr=0.25), [w])
            >>> w.grad = torch.tensor([2.0])
            >>> opt.step()
            >>> w.data
            tensor([0.5000])
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        commits: list[Callable[[], object]] = []
        for group, settings in zip(self._groups, self.param_groups, strict=True):
            group.sync(settings)
            if (commit := group.prepare()) is not None:
                commits.append(commit)
        with torch.no_grad():
            for commit in commits:
                commit()
        return loss

    @override
    def state_dict(self) -> dict[str, Any]:
        """Return the state in torch's format, with torch's hooks.

        Parameters are numbered across the groups, their buffers copied under
        torch's names; it loads into torch's class of the same name.

        Returns:
            `{"state": ..., "param_groups": ...}`.

        Example:
            >>> import torch
            >>> from paramdict import optim
            >>> w = torch.nn.Parameter(torch.ones(2))
            >>> opt = optim.as_torch_optimizer(optim.Adam(lr=0.1), [w])
            >>> w.grad = torch.ones(2)
            >>> opt.step()
            >>> saved = opt.state_dict()
            >>> sorted(saved["state"][0]), saved["param_groups"][0]["params"]
            (['exp_avg', 'exp_avg_sq', 'step'], [0])
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = exported(self._groups, self.param_groups)
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            if (result := post_hook(self, state_dict)) is not None:
                state_dict = result
        return state_dict

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this adapter or of torch's class of the same name.

        The groups take the saved settings, as torch's do; buffers are copied to
        the optimizer's dtypes and devices. Nothing changes on an error.

        Args:
            state_dict: What `state_dict()` returned, here or in torch.

        Raises:
            ValueError: If the groups differ in number or size, the dict is
                another optimizer's, or a buffer does not fit.

        Example:
            >>> import torch
            >>> from paramdict import optim
            >>> w = torch.nn.Parameter(torch.ones(2))
            >>> theirs = torch.optim.Adam([w], lr=0.1)
            >>> w.grad = torch.ones(2)
            >>> theirs.step()
            >>> opt = optim.as_torch_optimizer(optim.Adam(), [w])
            >>> opt.load_state_dict(theirs.state_dict())
            >>> opt.param_groups[0]["lr"], int(opt.state[w]["step"])
            (0.1, 1)
        """
        state_dict = dict(state_dict)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            if (result := pre_hook(self, state_dict)) is not None:
                state_dict = result
        results = loaded(self._groups, self.param_groups, state_dict)
        bounds = [
            member.bind(group.params, state)
            for group, (member, state, _) in zip(self._groups, results, strict=True)
        ]
        for group, (member, state, settings), bound in zip(
            self._groups, results, bounds, strict=True
        ):
            group.replace(member, state, bound, settings)
        self.param_groups: list[dict[str, Any]] = [s for _, _, s in results]
        self.state.clear()
        for group in self._groups:
            self.state.update(group.view())
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    @override
    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(_NOT_PICKLED)


def as_torch_optimizer(optimizer: Optimizer[Any], params: Params, /) -> TorchAdapter:
    """Return `optimizer` as a `torch.optim.Optimizer` stepping `params` in place.

    For code that takes a `torch.optim.Optimizer`: a plain loop, torch's LR
    schedulers, `torch.amp.GradScaler`, Lightning's `configure_optimizers`.
    `step` writes the update of each parameter's `.grad` into the parameter
    in place; the numbers are torch.optim's, bit for bit, for the optimizers
    torch has (its fused kernel where `fused` shows True, else foreach).

    `param_groups` holds one dict per group (of `optim.ParamGroups`, or of
    torch's list of dicts, whose settings override the optimizer's), every
    setting under torch's name. A written `lr` is used as is; another change
    rebuilds the group's optimizer and binds it again. `state_dict()` loads
    into torch's class of the same name, and torch's loads here. `optimizer`
    is not changed.

    Args:
        optimizer: A paramdict optimizer in the style of torch.optim (number
            rates, not differentiable), or `optim.ParamGroups` of them.
        params: A module (its `named_parameters()`), or what torch.optim takes:
            tensors, `(name, tensor)` pairs, or a list of group dicts.

    Returns:
        The adapter, a `torch.optim.Optimizer`.

    Raises:
        TypeError: If `optimizer` is not in the style of torch.optim (or has a
            schedule or per-key rate), or `params` is not as described.
        ValueError: As torch's optimizers (no parameters, a non-leaf tensor,
            a parameter in two groups), and as `Optimizer.bind`.

    Example:
        >>> import torch
        >>> from paramdict import optim
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = optim.as_torch_optimizer(optim.AdamW(lr=0.1), model)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        >>> weight = model.weight.detach().clone()
        >>> model(torch.ones(4, 2)).sum().backward()
        >>> opt.step()
        >>> sched.step()
        >>> bool((model.weight != weight).all()), opt.param_groups[0]["lr"]
        (True, 0.05)
        >>> isinstance(opt, torch.optim.Optimizer), sorted(opt.state_dict()["state"])
        (True, [0, 1])
    """
    return TorchAdapter(optimizer, params)
