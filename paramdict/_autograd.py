"""Autograd on ParamDicts: `grad` and `backward` return keyed gradients."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeAlias, cast

import torch
from torch import Tensor
from typing_extensions import Self

from ._checks import check_flag, first_sentence
from ._container import _Container
from ._foreach import holds_dtensors as _holds_dtensors

__all__ = ["Outputs"]

Outputs: TypeAlias = Tensor | Sequence[Tensor]
"""What to differentiate: a tensor (usually a scalar loss) or a sequence of them."""


def _empty_error(what: str) -> ValueError:
    # torch refuses empty `inputs` too; say which call and what to do.
    msg = (
        f"`{what}` needs at least one entry to differentiate with respect to, but the "
        "ParamDict is empty. Check the selection that built it (e.g. `.trainable()` "
        "of a frozen model)."
    )
    return ValueError(msg)


def _constant_error(what: str, fix: str) -> ValueError:
    msg = (
        f"`{what}`: `loss` does not require grad, so it depends on no entry. Was it "
        f"computed under `torch.no_grad()` or from detached values? {fix}"
    )
    return ValueError(msg)


def _reaches_graph(loss: object, what: str) -> bool:
    """Check `loss` is a tensor or a non-empty sequence of them; return if recorded."""
    kind = type(loss).__name__
    if isinstance(loss, Tensor):
        return loss.requires_grad
    if isinstance(loss, Sequence) and not isinstance(loss, str):
        items = cast("Sequence[object]", loss)
    else:
        items = ()
    if items:
        bad = [i for i, t in enumerate(items) if not isinstance(t, Tensor)]
        if not bad:
            return any(cast("Tensor", t).requires_grad for t in items)
        msg = (
            f"`{what}` takes a tensor or a sequence of tensors as `loss`; the items at "
            f"positions {bad!r} are not tensors."
        )
        raise TypeError(msg)
    empty = " (empty)" if isinstance(loss, Sequence) else ""
    msg = (
        f"`{what}` takes a tensor or a non-empty sequence of tensors as `loss`, got "
        f"{kind}{empty}."
    )
    raise TypeError(msg)


def _check_grad_outputs(loss: object, grad_outputs: object, what: str) -> None:
    """Refuse a number of `grad_outputs` that differs from the number of losses."""
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        return
    if not isinstance(grad_outputs, Sequence):
        msg = (
            f"`{what}` takes a tensor, a sequence of tensors or `None` as "
            f"`grad_outputs`, got {type(grad_outputs).__name__}."
        )
        raise TypeError(msg)
    count = 1 if isinstance(loss, Tensor) else len(cast("Sequence[Tensor]", loss))
    items = cast("Sequence[object]", grad_outputs)
    bad = [i for i, g in enumerate(items) if not (g is None or isinstance(g, Tensor))]
    if isinstance(grad_outputs, str) or bad:
        kinds = (
            ", ".join(f"{type(items[i]).__name__} at position {i}" for i in bad)
            or "a str"
        )
        msg = (
            f"`{what}` takes tensors (or `None`) in `grad_outputs`, one per output "
            f"of `loss`; got {kinds}."
        )
        raise TypeError(msg)
    given = len(items)
    if given != count:
        msg = (
            f"`{what}`: `grad_outputs` does not fit `loss`: {given} "
            f"given for {count} output(s). Pass one per output of `loss`."
        )
        raise ValueError(msg)


def _explained(err: RuntimeError, what: str) -> Exception:
    """Turn torch's refusal of `loss` or `grad_outputs` into a ValueError saying so."""
    text = str(err)
    if (
        "Mismatch in shape" in text
        or "Mismatch in dtype" in text
        or "invalid gradient at index" in text
        or "Cannot copy out of meta tensor" in text
        or "grad can be implicitly created" in text
        or re.search(r"got \d+ tensors and \d+ gradients", text) is not None
        or "grad_tensors" in text
        or "grad_outputs" in text
    ):
        msg = (
            f"`{what}`: `grad_outputs` does not fit `loss`: {first_sentence(err)} "
            "Pass one tensor of `loss`'s shape, dtype and device per output, or "
            "`None` for a real scalar `loss`."
        )
        return ValueError(msg)
    if "backward through the graph a second time" in text:
        msg = (
            f"`{what}`: the graph of `loss` was already freed by an earlier "
            f"backward pass ({text.split('.')[0]}). Pass `retain_graph=True` to the "
            "earlier call."
        )
        return ValueError(msg)
    return err


def _reached(loss: Outputs, values: Sequence[Tensor]) -> list[bool]:
    """Whether the graph of `loss` reaches each of `values` (a walk, no backward)."""
    losses = [loss] if isinstance(loss, Tensor) else list(loss)
    stack = [t.grad_fn for t in losses if t.grad_fn is not None]
    seen: set[object] = set()
    leaves: set[int] = {id(t) for t in losses if t.grad_fn is None}
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node
        if variable is not None:
            leaves.add(id(variable))
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return [
        v.grad_fn in seen if v.grad_fn is not None else id(v) in leaves for v in values
    ]


_FSDP2_GRAD = (
    "`loss` does not depend on {unused!r} directly. They are DTensors: if they are "
    "the parameters of a model sharded by FSDP2 (`fully_shard`), its forward ran "
    "through unsharded copies of them, and FSDP2 turns those gradients into "
    "sharded ones only during `backward`. Use `.backward(loss)`, which returns "
    "the sharded gradients keyed like the parameters."
)


class _Autograd(_Container):
    """Keyed `torch.autograd.grad` and `torch.autograd.backward` (see `ParamDict`)."""

    __slots__ = ()

    def _frozen_error(self, what: str, fix: str) -> ValueError | None:
        """The error naming the entries that do not require grad, if any."""
        frozen = sorted(k for k, v in self.items() if not v.requires_grad)
        if not frozen:
            return None
        return ValueError(
            f"Cannot take `{what}` with respect to {frozen!r}: they do not require "
            f"grad. {fix}"
        )

    def grad(
        self,
        loss: Outputs,
        /,
        *,
        grad_outputs: Outputs | None = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
        allow_unused: bool = False,
        is_grads_batched: bool = False,
    ) -> Self:
        """Return the gradients of `loss` with respect to every value, keyed the same.

        The keyed form of `torch.autograd.grad(loss, tuple(p.values()))`; the result
        has the same type, keys and order as `self`, which is unchanged. The options
        mean what they mean for `torch.autograd.grad`.

        Args:
            loss: The tensor (or tensors) to differentiate, usually a scalar loss.
            grad_outputs: The vector(s) in the vector-Jacobian product; `None` for a
                scalar `loss`.
            retain_graph: Keep the graph for another backward pass. Defaults to
                `create_graph`.
            create_graph: Record the gradient computation, for higher-order gradients
                (the MAML inner step).
            allow_unused: Give zeros for entries that `loss` does not depend on or
                that do not require grad, instead of raising.
            is_grads_batched: Treat the first dimension of `grad_outputs` as a batch
                (vmapped vector-Jacobian products).

        Returns:
            A new ParamDict of gradients, each the shape of its value.

        Raises:
            ValueError: If `allow_unused` is false and some entries do not require
                grad (checked before any work) or are not reached by `loss`; the
                message names them (and, for DTensors, points to `backward`: the
                graph of an FSDP2 model never reaches its sharded parameters). If
                `grad_outputs` does not fit `loss` (shape, dtype, device), or the
                graph was freed.
            TypeError: If `loss` or `grad_outputs` holds something other than
                tensors, or a flag is not a bool.

        Example:
            >>> w = torch.tensor([1.0, 2.0], requires_grad=True)
            >>> p = ParamDict(w=w)
            >>> p.grad((p["w"] ** 2).sum())["w"]
            tensor([2., 4.])
        """
        check_flag(retain_graph, "retain_graph", "grad", none_ok=True)
        check_flag(create_graph, "create_graph", "grad")
        check_flag(allow_unused, "allow_unused", "grad")
        check_flag(is_grads_batched, "is_grads_batched", "grad")
        values = self._vals
        if not values:
            empty = _empty_error("grad")
            raise empty
        inputs = values
        needs: list[bool] = []
        if allow_unused:
            needs = [v.requires_grad for v in values]
            if not all(needs):
                inputs = [v for v, n in zip(values, needs) if n]
        found: Sequence[Tensor | None] = [None] * len(inputs)
        reaches = _reaches_graph(loss, "grad")
        if grad_outputs is not None:
            _check_grad_outputs(loss, grad_outputs, "grad")
        if inputs and reaches:
            try:
                found = torch.autograd.grad(
                    loss,
                    inputs,
                    grad_outputs=grad_outputs,
                    retain_graph=retain_graph,
                    create_graph=create_graph,
                    allow_unused=True,
                    is_grads_batched=is_grads_batched,
                )
            except RuntimeError as err:
                # torch checks that every input requires grad before running the
                # graph (which stays intact); name the entries that do not.
                frozen = self._frozen_error(
                    "grad",
                    "Call `.requires_grad_()` on them, drop them with `.trainable()`, "
                    "or pass `allow_unused=True` to get zeros.",
                )
                if frozen is not None:
                    raise frozen from None
                raise _explained(err, "grad") from err
        elif not allow_unused:
            frozen = self._frozen_error(
                "grad",
                "Call `.requires_grad_()` on them, drop them with `.trainable()`, "
                "or pass `allow_unused=True` to get zeros.",
            )
            if frozen is not None:
                raise frozen
            if inputs:
                constant = _constant_error(
                    "grad", "Pass `allow_unused=True` for zeros."
                )
                raise constant
        if len(inputs) != len(values):
            it = iter(found)
            found = [next(it) if n else None for n in needs]
        for g in found:
            if g is None:
                found = self._fill_unused(
                    found, values, allow_unused=allow_unused, create_graph=create_graph
                )
                break
        # Every entry is a tensor by now (`_fill_unused` replaced the `None`s).
        return self._derive(cast("Sequence[Tensor]", found))

    def _fill_unused(
        self,
        found: Sequence[Tensor | None],
        values: list[Tensor],
        *,
        allow_unused: bool,
        create_graph: bool,
    ) -> list[Tensor]:
        """Return `found` with zeros for the unused entries, or raise naming them."""
        if not allow_unused:
            unused = sorted(k for k, g in zip(self._keys, found) if g is None)
            if _holds_dtensors([v for v, g in zip(values, found) if g is None]):
                msg = _FSDP2_GRAD.format(unused=unused)
                raise ValueError(msg)
            msg = (
                f"`loss` does not depend on {unused!r}. Pass `allow_unused=True` "
                "to get zeros for them, or leave them out with `.exclude(...)`."
            )
            raise ValueError(msg)
        # As `torch.autograd.grad(..., materialize_grads=True)` fills them: zeros
        # that require grad under `create_graph`, so higher derivatives are zeros.
        return [
            g
            if g is not None
            else torch.zeros_like(
                v,
                requires_grad=create_graph
                and (v.is_floating_point() or v.is_complex()),
            )
            for v, g in zip(values, found)
        ]

    def backward(
        self,
        loss: Outputs,
        /,
        *,
        grad_outputs: Outputs | None = None,
        retain_graph: bool | None = None,
        create_graph: bool = False,
    ) -> Self:
        """Accumulate gradients of `loss` into each value's `.grad`, and return them.

        Runs `torch.autograd.backward(loss, grad_outputs, inputs=values)`: only these
        tensors receive gradients (hooks and accumulation behave exactly as there),
        then returns their accumulated `.grad` as a ParamDict keyed like `self`.
        Non-leaf values receive a `.grad` too, as with `inputs=`.

        When any value is a DTensor, it runs as `loss.backward()` (without
        `inputs=`): a model sharded by FSDP2 (`fully_shard`) computes through
        unsharded copies of its parameters and writes the sharded `.grad`s from
        its hooks, so the graph never reaches the DTensors themselves. Every leaf
        the loss reaches then receives a gradient, as with `loss.backward()`.

        Args:
            loss: The tensor (or tensors) to differentiate, usually a scalar loss.
            grad_outputs: The vector(s) in the vector-Jacobian product (torch's
                `grad_tensors`); `None` for a scalar `loss`.
            retain_graph: Keep the graph for another backward pass. Defaults to
                `create_graph`.
            create_graph: Record the gradient computation, for higher-order gradients.

        Returns:
            A new ParamDict of the accumulated `.grad` tensors (the very objects).

        Raises:
            ValueError: If some entries do not require grad, or `loss` does not
                reach some entries (the message names them), or `grad_outputs`
                does not fit `loss`; every `.grad` is then left as it was (torch
                would have accumulated into the entries it reached).
            TypeError: If `loss` or `grad_outputs` holds something other than
                tensors, or a flag is not a bool.

        Example:
            >>> w = torch.tensor([1.0, 2.0], requires_grad=True)
            >>> p = ParamDict(w=w)
            >>> p.backward((w * 3).sum())["w"]
            tensor([3., 3.])
            >>> w.grad
            tensor([3., 3.])
        """
        check_flag(retain_graph, "retain_graph", "backward", none_ok=True)
        check_flag(create_graph, "create_graph", "backward")
        values = self._vals
        if not values:
            empty = _empty_error("backward")
            raise empty
        frozen = self._frozen_error(
            "backward",
            "Call `.requires_grad_()` on them or drop them with `.trainable()`.",
        )
        if frozen is not None:
            raise frozen
        reaches = _reaches_graph(loss, "backward")
        if grad_outputs is not None:
            _check_grad_outputs(loss, grad_outputs, "backward")
        if not reaches:
            constant = _constant_error("backward", "Nothing was accumulated.")
            raise constant
        sharded = _holds_dtensors(values)
        # A non-leaf that does not retain its grad has none (reading it warns).
        before = [v.grad if v.is_leaf or v.retains_grad else None for v in values]
        if not sharded and any(g is not None for g in before):
            # Gradients would accumulate into existing ones, which cannot be undone
            # exactly: find unreached entries first (a walk over `loss`'s graph).
            reached = _reached(loss, values)
            if not all(reached):
                raise self._unreached_error(
                    [k for k, r in zip(self._keys, reached) if not r]
                )
        try:
            torch.autograd.backward(
                loss,
                grad_tensors=grad_outputs,
                retain_graph=retain_graph,
                create_graph=create_graph,
                # FSDP2 runs the forward through unsharded copies of its DTensor
                # parameters and writes their sharded `.grad`s from hooks, so the
                # graph never reaches the DTensors themselves: run as
                # `loss.backward()`.
                inputs=None if sharded else values,
            )
        except RuntimeError as err:
            raise _explained(err, "backward") from err
        grads = [v.grad for v in values]
        if any(g is None for g in grads):
            unused = [k for k, g in zip(self._keys, grads) if g is None]
            if not sharded:
                # No entry had a `.grad` before (else the walk above refused): take
                # back what this call gave the reached ones.
                for value, old in zip(values, before):
                    value.grad = old
            raise self._unreached_error(unused)
        return self._from_parts(self._keys, grads)

    def _unreached_error(self, unused: list[str]) -> ValueError:
        msg = (
            f"`loss` does not reach {sorted(unused)!r}, so they have no `.grad`; "
            "nothing was accumulated. Leave them out with `.exclude(...)`, or use "
            "`.grad(loss, allow_unused=True)` for zeros."
        )
        return ValueError(msg)
