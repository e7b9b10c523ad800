"""Modules in and out: read a module's tensors, run it with others, write them back."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Generator
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Self

from ._checks import check_flag, describe_kind, first_sentence
from ._container import _Container

__all__: list[str] = []


# Where a tensor lives: the owning module's `_parameters` or `_buffers` dict, and
# the attribute name. Writing that dict directly puts any tensor in the slot:
# `setattr` would refuse a non-Parameter in a parameter slot, and wrapping in
# `nn.Parameter` would cut the graph.
_Slot = tuple[dict[str, Any], str]


def _slots(module: nn.Module) -> dict[str, _Slot]:
    """Map every parameter and buffer name (tied aliases included) to its slot.

    The names are those of `named_parameters(remove_duplicate=False)` and
    `named_buffers(remove_duplicate=False)`.
    """
    return _walk(module)[0]


def _walk(module: nn.Module) -> tuple[dict[str, _Slot], bool]:
    """`_slots(module)`, and whether any tensor sits in two slots (is tied).

    `call` walks the module on every call, so this reads the modules' dicts
    directly rather than through `named_modules`.
    """
    slots: dict[str, _Slot] = {}
    seen: set[int] = set()
    _collect(module, "", slots, seen, {id(module)})
    return slots, len(seen) < len(slots)


def _collect(
    module: nn.Module,
    dot: str,
    slots: dict[str, _Slot],
    seen: set[int],
    above: set[int],
) -> None:
    for held in (module._parameters, module._buffers):
        for name, tensor in held.items():
            if tensor is not None:
                slots[dot + name] = (held, name)
                seen.add(id(tensor))
    for name, sub in module._modules.items():
        # A submodule that is one of its own ancestors (`m.l1.parent = m`) is a
        # cycle, not more tensors: `named_parameters()` lists its tensors once.
        if sub is not None and id(sub) not in above:
            above.add(id(sub))
            _collect(sub, f"{dot}{name}.", slots, seen, above)
            above.discard(id(sub))


def _through(module: nn.Module, key: str) -> _Slot | None:
    """The slot a dotted name reaches through submodules, cycles included.

    `torch.func.functional_call` resolves names attribute by attribute, so with a
    cycle (`m.l1.parent = m`) a name such as `l1.parent.l1.weight` reaches the
    tensor that `named_parameters()` lists once as `l1.weight`; `_walk` stops at
    the cycle and does not list it.
    """
    *path, name = key.split(".")
    held = module
    for part in path:
        sub = held._modules.get(part)
        if sub is None:
            return None
        held = sub
    for table in (held._parameters, held._buffers):
        if table.get(name) is not None:
            return (table, name)
    return None


def _resolved(
    module: nn.Module, keys: tuple[str, ...], slots: dict[str, _Slot]
) -> tuple[dict[str, _Slot], list[str]]:
    """The slot of every key (through cycles too), and the keys that have none."""
    found: dict[str, _Slot] = {}
    unknown: list[str] = []
    for key in keys:
        slot = slots.get(key) or _through(module, key)
        if slot is None:
            unknown.append(key)
        else:
            found[key] = slot
    return found, unknown


_SCRIPTED = torch.jit.ScriptModule


def _check_module(module: object, what: str, *, swaps: bool) -> nn.Module:
    """Return `module` if it is an `nn.Module` this operation can use, else raise."""
    if not isinstance(module, nn.Module):
        msg = (
            f"{what} takes a torch.nn.Module, got {type(module).__name__}. Pass the "
            "model itself (for a state dict, use `ParamDict(state_dict)`)."
        )
        raise TypeError(msg)
    if swaps and isinstance(module, _SCRIPTED):
        msg = (
            f"{what} cannot run a TorchScript module: its parameters live in the "
            "compiled module and cannot be swapped for other tensors (nothing was "
            "run). Call it on the original `nn.Module` before `torch.jit.script`, "
            "or write the values in with `to_module`."
        )
        raise TypeError(msg)
    return module


def _tensor_at(slot: _Slot) -> Tensor:
    found: Tensor = slot[0][slot[1]]
    return found


_Plan = list[tuple[str, dict[str, Any], str, Tensor]]
"""Which tensor goes where: `(name, slot dict, attribute, tensor)` per slot."""


def _put(plan: _Plan) -> list[tuple[dict[str, Any], str, Tensor]]:
    """Write the plan's tensors into their slots; return what they held."""
    originals = [(held, name, held[name]) for _, held, name, _ in plan]
    for _, held, name, value in plan:
        held[name] = value
    return originals


def _restore(originals: list[tuple[dict[str, Any], str, Tensor]]) -> None:
    for held, name, original in originals:
        held[name] = original


def _unexpected_message(module: nn.Module, unexpected: list[str], what: str) -> str:
    return (
        f"{what}: {type(module).__name__} has no parameter or buffer named "
        f"{sorted(unexpected)!r}. Check the names against `module.named_parameters()`"
        " and `module.named_buffers()`, or drop the entries with `.exclude(...)`."
    )


def _cannot_copy(value: Tensor, target: Tensor) -> tuple[str, str] | None:
    """Why `target.copy_(value)` must not run, as `(problem, detail)`, or `None`."""
    if value.layout != torch.strided:
        return "not a dense tensor", str(value.layout).removeprefix("torch.")
    if value.is_meta and not target.is_meta:
        return "a meta tensor holds no values", "meta"
    if target.shape != value.shape:
        return "shape differs", f"{tuple(value.shape)} vs {tuple(target.shape)}"
    if target.dtype != value.dtype:
        return "dtype differs", f"{value.dtype} vs {target.dtype}"
    return None


def _same_values(a: Tensor, b: Tensor) -> bool:
    return (
        a.layout == b.layout == torch.strided
        and not a.is_meta
        and not b.is_meta
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.device == b.device
        and torch.equal(a, b)
    )


_FULLY_SHARD = "torch.distributed.fsdp._fully_shard._fully_shard"

_FSDP2_SWAP = (
    "{what}: {name} is sharded by FSDP2 (`fully_shard`), which puts its own "
    "all-gathered parameters into the module at every forward, and on the first "
    "forward adopts whatever tensors the module holds as its parameters; it cannot "
    "run with other tensors. Write the values into the module with "
    "`p.to_module(model)` and call `model(...)`, or run an unsharded copy of the "
    "module."
)


def _sharded_by_fsdp2(module: nn.Module, plan: _Plan, what: str) -> bool:
    """Whether `module` is sharded by FSDP2 and `plan` swaps nothing; raise if it swaps.

    FSDP2 manages the module's slots itself, so a plan that puts the slots' own
    tensors back is run as a plain `module(...)`, and any other plan is refused.
    Nothing to check where FSDP2 was never imported (a `sys.modules` look-up).

    Raises:
        TypeError: If the module is sharded by FSDP2 and `plan` swaps other
            tensors in; the message names FSDP2 and the way out, and the module
            is not touched.
    """
    fully_shard = sys.modules.get(_FULLY_SHARD)
    if fully_shard is None:
        return False
    fsdp_module: type = fully_shard.FSDPModule
    if not any(isinstance(m, fsdp_module) for m in module.modules()):
        return False
    if all(held[name] is value for _, held, name, value in plan):
        return True
    msg = _FSDP2_SWAP.format(what=what, name=type(module).__name__)
    raise TypeError(msg)


def _misfit(
    module: nn.Module,
    plan: _Plan,
    originals: list[tuple[dict[str, Any], str, Tensor]],
    err: RuntimeError,
) -> ValueError | None:
    """The error naming the given entries unlike the module's own, if any.

    When the forward fails with tensors of another shape, dtype, device or layout
    in its slots, those are the likely cause; without any, the error is the
    module's own and is raised as it is.
    """
    unlike = sorted(
        f"{key!r} ({describe_kind(value)} vs {describe_kind(original)})"
        for (key, _, _, value), (_, _, original) in zip(plan, originals)
        if value is not original
        and (
            value.shape != original.shape
            or value.dtype != original.dtype
            or value.device != original.device
            or value.layout != original.layout
        )
    )
    if not unlike:
        return None
    msg = (
        f"`call`: {type(module).__name__}'s forward failed ({first_sentence(err)}) "
        f"with entries unlike the module's own tensors: {', '.join(unlike)}. Give "
        "tensors of the module's shapes, dtypes and devices, or leave these out."
    )
    return ValueError(msg)


class _ModuleIO(_Container):
    """`from_module`, `call`, `swapped_into` and `to_module` (see `ParamDict`)."""

    __slots__ = ()

    @classmethod
    def from_module(cls, module: nn.Module, /, *, buffers: bool = False) -> Self:
        """Return the module's own tensors, keyed as `named_parameters()` keys them.

        The values are the live `nn.Parameter` objects (same identity, no copy), so
        gradients of a loss computed with them reach the module's parameters.
        Tied parameters appear once, under their first name.

        Args:
            module: The module to read.
            buffers: Also include `named_buffers()` (BatchNorm running statistics).

        Returns:
            A new ParamDict; the module is unchanged.

        Raises:
            TypeError: If `module` is not an `nn.Module`.

        Example:
            >>> model = torch.nn.Linear(3, 2)
            >>> p = ParamDict.from_module(model)
            >>> list(p), p["weight"] is model.weight
            (['weight', 'bias'], True)
        """
        _check_module(module, "`from_module`", swaps=False)
        items: dict[str, Tensor] = dict(module.named_parameters())
        if buffers:
            items.update(module.named_buffers())
        return cls._from_parts(tuple(items), items.values())

    def call(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        """Run `module(*args, **kwargs)` with these tensors in place of its own.

        The same as `torch.func.functional_call(module, self, args, kwargs)`: the
        module is left as it was and the output is differentiable with respect to
        these values. Entries may cover a subset of the module's tensors; the rest
        are the module's own. In a module that holds one of its ancestors, a name
        through the cycle (`l1.parent.l1.weight` for `l1.weight`) reaches the same
        tensor, as with `functional_call`.

        Eagerly the tensors are swapped into the module's slots for the duration of
        the call (as `swapped_into` does), which costs a small fraction of
        `functional_call`'s reparametrization; under `torch.compile` it is
        `functional_call`, which traces without a graph break.

        Args:
            module: The module to run.
            *args: Positional arguments of the module's forward.
            **kwargs: Keyword arguments of the module's forward.

        Returns:
            Whatever the module's forward returns.

        Raises:
            ValueError: If a key names no parameter or buffer of the module, or
                tied names (one tensor under several names) are given different
                tensors; the module is not touched. Under `torch.func.vmap`,
                for running statistics a BatchNorm would update in place (see
                "BatchNorm in inner loops" in the MAML tutorial); and when a
                gradient taken under vmap through BatchNorm in training mode,
                LayerNorm or affine InstanceNorm is differentiated again (a
                second-order step, which torch gets silently wrong: run the
                tasks in a loop), raised by that backward. First-order use
                (per-sample gradients) is not affected. If the forward fails (a
                `RuntimeError`) while entries of another shape, dtype, device or
                layout than the module's own are swapped in, the message names
                them (otherwise the module's own error is raised as it is).
            TypeError: If `module` is not an `nn.Module` or is a TorchScript module
                (refused before anything runs), if the module is sharded by FSDP2
                (`fully_shard`) and the tensors are not its own (the module is not
                touched), or if the module replaced one of the given tensors while
                running (e.g. assigned a new buffer); the module gets its own
                tensors back, and `functional_call` with a plain `dict` receives
                the replacements.

        Example:
            >>> model = torch.nn.Linear(2, 1).requires_grad_(False)
            >>> p = ParamDict.from_module(model).zeros_like()
            >>> p.call(model, torch.ones(1, 2))
            tensor([[0.]])
        """
        _check_module(module, "`call`", swaps=True)
        if torch.compiler.is_compiling():
            # dynamo traces `functional_call` without a graph break.
            try:
                return torch.func.functional_call(module, self, args, kwargs)
            except (AttributeError, RuntimeError, KeyError) as err:
                unexpected = self._unexpected_in(_slots(module), module, "`call`")
                if unexpected is not None:
                    raise unexpected from err
                raise
        # Eagerly, swap the tensors in directly: the same result as
        # `functional_call`, without its per-call reparametrization machinery.
        plan = self._swap_plan(module, "`call`", ties_agree=True)
        if _sharded_by_fsdp2(module, plan, "`call`"):
            return module(*args, **kwargs)
        from . import _norms  # loaded on the first call: imports stay light

        forward = _norms.watched(module, self)  # `module` itself outside vmap
        originals = _put(plan)
        try:
            out = forward(*args, **kwargs)
            replaced = [
                key
                for key, held, name, value in plan
                if held.get(name) is not value and key in self
            ]
        except RuntimeError as err:
            misfit = _misfit(module, plan, originals, err)
            if misfit is None:
                if sys.version_info >= (3, 11):
                    err.add_note(
                        f"(raised by the forward of {type(module).__name__}, run by "
                        "`call`)"
                    )
                raise
            raise misfit from err
        finally:
            _restore(originals)
        if replaced:
            msg = (
                f"`call`: {type(module).__name__} replaced {sorted(replaced)!r} "
                "while running, and a ParamDict is immutable, so the new tensors "
                "cannot be handed back. Call "
                "`torch.func.functional_call(module, d, args)` with `d = dict(p)` "
                "to receive the replacements in `d`."
            )
            raise TypeError(msg)
        return out

    def _swap_plan(
        self, module: nn.Module, what: str, *, ties_agree: bool = False
    ) -> _Plan:
        """Which tensor goes into which slot.

        Tied aliases of a given name (one tensor under several names) follow it
        unless they are given too; with `ties_agree`, given aliases must hold the
        same tensor (as for `functional_call`).

        Raises:
            ValueError: For a key the module lacks, or disagreeing tied entries.
        """
        slots, tied = _walk(module)
        resolved, unknown = _resolved(module, self._keys, slots)
        if unknown:
            raise ValueError(_unexpected_message(module, unknown, what))
        cyclic = len(resolved) != 0 and any(k not in slots for k in resolved)
        if not tied and not cyclic:
            return [(key, *resolved[key], value) for key, value in self.items()]
        by_tensor: dict[int, list[str]] = {}
        for name, slot in slots.items():
            by_tensor.setdefault(id(_tensor_at(slot)), []).append(name)
        plan: _Plan = []
        claimed: dict[tuple[int, str], tuple[str, Tensor]] = {}
        disagree: set[str] = set()
        for key, value in self.items():
            own = resolved[key]
            for alias in by_tensor[id(_tensor_at(own))]:
                if alias != key and alias in self:  # given itself: its entry puts it
                    theirs: Tensor = dict.__getitem__(self, alias)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                    if ties_agree and theirs is not value:
                        disagree.update((key, alias))
                    continue
                held, name = slots[alias]
                where = (id(held), name)
                if where in claimed:  # two names through a cycle, one slot
                    first, theirs = claimed[where]
                    if ties_agree and theirs is not value:
                        disagree.update((first, key))
                    continue
                claimed[where] = (key, value)
                # A name through a cycle answers for its slot's own name.
                mine = held is own[0] and name == own[1] and alias not in self
                plan.append((key if mine else alias, held, name, value))
        if disagree:
            msg = (
                f"{what}: {sorted(disagree)!r} are tied in {type(module).__name__} "
                "(one tensor under several names), but the entries hold different "
                "tensors. Give one of the names, or the same tensor under each."
            )
            raise ValueError(msg)
        return plan

    def _tied_disagree(self, resolved: dict[str, _Slot]) -> list[str]:
        """The given names that are tied in the module but hold different values."""
        first: dict[int, tuple[str, Tensor]] = {}
        disagree: set[str] = set()
        for key, value in self.items():
            if key not in resolved:
                continue
            tensor_id = id(_tensor_at(resolved[key]))
            seen = first.setdefault(tensor_id, (key, value))
            other = seen[1]
            if seen[0] != key and other is not value and not _same_values(other, value):
                disagree.update((seen[0], key))
        return sorted(disagree)

    def _unexpected_in(
        self, slots: dict[str, _Slot], module: nn.Module, what: str
    ) -> ValueError | None:
        """The error naming the keys that are not among `slots`, if any."""
        unexpected = [k for k in self._keys if k not in slots]
        if not unexpected:
            return None
        return ValueError(_unexpected_message(module, unexpected, what))

    @contextlib.contextmanager
    def swapped_into(self, module: nn.Module, /) -> Generator[nn.Module, None, None]:
        """Make `module` use these very tensors inside the `with` block.

        The tensors are put into the module's parameter and buffer slots as they
        are (non-leaf tensors included, never re-wrapped in `nn.Parameter`), so
        gradients flow back through them to whatever produced them. Tied aliases
        of a swapped parameter are swapped too. On exit, also when the block
        raises, the module gets back exactly its original objects.

        Args:
            module: The module to swap the tensors into.

        Yields:
            The module itself.

        Raises:
            ValueError: If a key names no parameter or buffer of the module, or
                tied names (one tensor under several names) are given different
                tensors; the module is not touched.
            TypeError: If `module` is not an `nn.Module` or is a TorchScript module,
                or if the module is sharded by FSDP2 (`fully_shard`) and the
                tensors are not its own; the module is not touched.

        Example:
            >>> model = torch.nn.Linear(2, 1).requires_grad_(False)
            >>> p = ParamDict.from_module(model).zeros_like()
            >>> with p.swapped_into(model):
            ...     model(torch.ones(1, 2))
            tensor([[0.]])
            >>> model.weight is ParamDict.from_module(model)["weight"]
            True
        """
        _check_module(module, "`swapped_into`", swaps=True)
        plan = self._swap_plan(module, "`swapped_into`", ties_agree=True)
        if _sharded_by_fsdp2(module, plan, "`swapped_into`"):
            plan = []  # its own tensors: FSDP2 keeps managing them
        originals = _put(plan)
        try:
            yield module
        finally:
            _restore(originals)

    def to_module(self, module: nn.Module, /, *, strict: bool = True) -> None:
        """Copy the values into the module's existing tensors, in place.

        The copy runs under `torch.no_grad()` and keeps the module's own
        `nn.Parameter` objects, so a `torch.optim` optimizer and hooks that hold
        them stay valid. Everything is checked before anything is copied.

        Args:
            module: The module to write into.
            strict: Require an entry for every parameter and buffer of the module
                that `from_module(module, buffers=True)` would list (tied aliases
                count once). With `strict=False` a subset is fine.

        Raises:
            ValueError: If a key names nothing in the module, a module tensor has no
                entry (with `strict=True`), a shape or dtype differs, an entry is
                sparse or on the meta device, or tied names (one tensor under several
                names) are given different values; the message names the keys, and
                the module is left unchanged.
            TypeError: If `module` is not an `nn.Module`, or `strict` is not a
                bool.

        Example:
            >>> model = torch.nn.Linear(2, 1)
            >>> p = ParamDict.from_module(model)
            >>> (p * 0).to_module(model)
            >>> model.weight.abs().sum().item()
            0.0
        """
        _check_module(module, "`to_module`", swaps=False)
        check_flag(strict, "strict", "to_module")
        slots = _slots(module)
        resolved, unexpected = _resolved(module, self._keys, slots)
        problems: list[str] = []
        if unexpected:
            problems.append(f"unexpected {sorted(unexpected)!r}")
        if strict:
            covered = {id(_tensor_at(slot)) for slot in resolved.values()}
            missing = sorted(
                {
                    name
                    for name in dict(module.named_parameters()).keys()
                    | dict(module.named_buffers()).keys()
                    if id(_tensor_at(slots[name])) not in covered
                }
            )
            if missing:
                problems.append(f"missing {missing!r}")
        bad: dict[str, list[str]] = {}
        for key, value in self.items():
            if key not in resolved:
                continue
            target = _tensor_at(resolved[key])
            reason = _cannot_copy(value, target)
            if reason is not None:
                bad.setdefault(reason[0], []).append(f"{key!r} ({reason[1]})")
        for what, entries in sorted(bad.items()):
            problems.append(f"{what} for " + ", ".join(sorted(entries)))
        disagree = self._tied_disagree(resolved)
        if disagree:
            problems.append(
                f"{disagree!r} are tied (one tensor under several names) but hold "
                "different values; give one of the names"
            )
        if problems:
            fix = (
                " Pass `strict=False` to write a subset."
                if strict and not unexpected and not bad and not disagree
                else ""
            )
            msg = (
                f"`to_module` copied nothing into {type(module).__name__}: "
                + "; ".join(problems)
                + "."
                + fix
            )
            raise ValueError(msg)
        with torch.no_grad():
            for key, value in self.items():
                _tensor_at(resolved[key]).copy_(value)
