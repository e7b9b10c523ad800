"""Modules in and out: read a module's tensors, run it with others, write them back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import Self

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
    _collect(module, "", slots, seen)
    return slots, len(seen) < len(slots)


def _collect(
    module: nn.Module, dot: str, slots: dict[str, _Slot], seen: set[int]
) -> None:
    for held in (module._parameters, module._buffers):
        for name, tensor in held.items():
            if tensor is not None:
                slots[dot + name] = (held, name)
                seen.add(id(tensor))
    for name, sub in module._modules.items():
        if sub is not None:
            _collect(sub, f"{dot}{name}.", slots, seen)


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

        Example:
            >>> model = torch.nn.Linear(3, 2)
            >>> p = ParamDict.from_module(model)
            >>> list(p), p["weight"] is model.weight
            (['weight', 'bias'], True)
        """
        items: dict[str, Tensor] = dict(module.named_parameters())
        if buffers:
            items.update(module.named_buffers())
        return cls._from_parts(tuple(items), items.values())

    def call(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        """Run `module(*args, **kwargs)` with these tensors in place of its own.

        The same as `torch.func.functional_call(module, self, args, kwargs)`: the
        module is left as it was and the output is differentiable with respect to
        these values. Entries may cover a subset of the module's tensors; the rest
        are the module's own.

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
                tensors; the module is not touched.
            TypeError: If the module replaced one of the given tensors while
                running (e.g. assigned a new buffer); the module gets its own
                tensors back, and `functional_call` with a plain `dict` receives
                the replacements.

        Example:
            >>> model = torch.nn.Linear(2, 1).requires_grad_(False)
            >>> p = ParamDict.from_module(model) * 0
            >>> p.call(model, torch.ones(1, 2))
            tensor([[0.]])
        """
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
        originals = _put(plan)
        try:
            out = module(*args, **kwargs)
            replaced = [
                key
                for key, held, name, value in plan
                if held.get(name) is not value and key in self
            ]
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
        try:
            plan = [(key, *slots[key], value) for key, value in self.items()]
        except KeyError:
            error = self._unexpected_in(slots, module, what)
            assert error is not None  # some key was not found
            raise error from None
        if not tied:
            return plan
        by_tensor: dict[int, list[str]] = {}
        for name, slot in slots.items():
            by_tensor.setdefault(id(_tensor_at(slot)), []).append(name)
        plan = []
        disagree: set[str] = set()
        for key, value in self.items():
            for alias in by_tensor[id(_tensor_at(slots[key]))]:
                if alias == key or alias not in self:
                    plan.append((alias, *slots[alias], value))
                elif ties_agree and dict.__getitem__(self, alias) is not value:
                    disagree.update((key, alias))
        if disagree:
            msg = (
                f"{what}: {sorted(disagree)!r} are tied in {type(module).__name__} "
                "(one tensor under several names), but the entries hold different "
                "tensors. Give one of the names, or the same tensor under each."
            )
            raise ValueError(msg)
        return plan

    def _unexpected_in(
        self, slots: dict[str, _Slot], module: nn.Module, what: str
    ) -> ValueError | None:
        """The error naming the keys that are not among `slots`, if any."""
        unexpected = [k for k in self._keys if k not in slots]
        if not unexpected:
            return None
        return ValueError(_unexpected_message(module, unexpected, what))

    @contextlib.contextmanager
    def swapped_into(self, module: nn.Module, /) -> Iterator[nn.Module]:
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
            ValueError: If a key names no parameter or buffer of the module; the
                module is not touched.

        Example:
            >>> model = torch.nn.Linear(2, 1).requires_grad_(False)
            >>> p = ParamDict.from_module(model).zeros_like()
            >>> with p.swapped_into(model):
            ...     model(torch.ones(1, 2))
            tensor([[0.]])
            >>> model.weight is ParamDict.from_module(model)["weight"]
            True
        """
        originals = _put(self._swap_plan(module, "`swapped_into`"))
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
                entry (with `strict=True`), or a shape or dtype differs; the message
                names the keys, and the module is left unchanged.

        Example:
            >>> model = torch.nn.Linear(2, 1)
            >>> p = ParamDict.from_module(model)
            >>> (p * 0).to_module(model)
            >>> model.weight.abs().sum().item()
            0.0
        """
        slots = _slots(module)
        unexpected = [k for k in self._keys if k not in slots]
        problems: list[str] = []
        if unexpected:
            problems.append(f"unexpected {sorted(unexpected)!r}")
        if strict:
            covered = {id(_tensor_at(slots[k])) for k in self._keys if k in slots}
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
        shape_bad = []
        dtype_bad = []
        for key, value in self.items():
            if key not in slots:
                continue
            target = _tensor_at(slots[key])
            if target.shape != value.shape:
                shape_bad.append(
                    f"{key!r} ({tuple(value.shape)} vs {tuple(target.shape)})"
                )
            elif target.dtype != value.dtype:
                dtype_bad.append(f"{key!r} ({value.dtype} vs {target.dtype})")
        if shape_bad:
            problems.append("shape differs for " + ", ".join(sorted(shape_bad)))
        if dtype_bad:
            problems.append("dtype differs for " + ", ".join(sorted(dtype_bad)))
        if problems:
            fix = (
                " Pass `strict=False` to write a subset."
                if strict and not unexpected and not shape_bad and not dtype_bad
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
                _tensor_at(slots[key]).copy_(value)
