"""Keyed second-order products: `hvp`, `jvp` and `vjp` of functions of a ParamDict.

Every product is computed with reverse mode only, so it works wherever
`ParamDict.grad` works, including through `params.call(model, ...)`:

- `hvp`: double backward, the gradient of `<grad f(p), v>`;
- `vjp`: one backward with `grad_outputs`;
- `jvp`: the double-vjp trick: `u -> J^T u` is linear in a dummy `u`, and its own
  vector-Jacobian product with `v` is `J v`.

Forward mode (`torch.func.jvp`, `torch.autograd.forward_ad`) is not used: over a
gradient it fails for common losses such as `F.mse_loss` ("ZeroTensors are
immutable", pytorch#112013), which is exactly the Hessian-vector case.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import torch
from torch import Tensor

from ._checks import describe_kind
from ._paramdict import ParamDict
from ._product_checks import (
    aligned,
    check_callable,
    check_devices,
    check_entries,
    check_floating,
    check_options,
    check_paramdict,
    evaluate,
    filled,
    grad_or_none,
    leaves,
)

__all__ = ["hvp", "jvp", "vjp"]

P = TypeVar("P", bound=ParamDict)
Q = TypeVar("Q", bound=ParamDict)
T = TypeVar("T")


# ------------------------------------------------------------------ HVP


def _scalar_loss(out: object, what: str) -> Tensor:
    if not isinstance(out, Tensor):
        msg = (
            f"`{what}`: the function must return a scalar tensor (the loss), got "
            f"{type(out).__name__}."
        )
        raise TypeError(msg)
    if out.is_complex():
        msg = (
            f"`{what}`: the function must return a real scalar loss, got a "
            f"{out.dtype} one, which has no gradient of its own. Reduce it to a "
            "real number first, e.g. with `.real` or `.abs()`."
        )
        raise TypeError(msg)
    if out.numel() != 1:
        msg = (
            f"`{what}`: the function must return a scalar loss, got shape "
            f"{tuple(out.shape)}. Reduce it, e.g. with `.sum()` or `.mean()`."
        )
        raise ValueError(msg)
    return out


class HessianOperator:
    """`v -> H v` for the Hessian of `func` at `params`, reusing one gradient graph.

    The gradient is computed once with `create_graph=True`; every product is one
    backward pass over its graph (`retain_graph=True`), which is what a Krylov
    solver calling it many times wants. `loss` is the (detached) value of `func`.
    """

    loss: Tensor

    def __init__(
        self,
        func: Callable[[P], Tensor],
        params: P,
        /,
        *,
        create_graph: bool,
        allow_unused: bool,
        what: str,
    ) -> None:
        self._what = what
        self._params = params
        self._create_graph = create_graph
        with torch.enable_grad():
            self._leaves = leaves(params, create_graph=create_graph)
            loss = _scalar_loss(evaluate(func, "func", what, self._leaves), what)
            self.loss = loss.detach()
            values = list(self._leaves.values())
            if not loss.requires_grad:
                found: Sequence[Tensor | None] = [None] * len(values)
            else:
                found = torch.autograd.grad(
                    loss, values, create_graph=True, allow_unused=True
                )
        self._grads = filled(params, found, what, allow_unused=allow_unused)

    def __call__(self, tangents: Mapping[str, Tensor], /) -> Any:
        """Return `H v`, keyed like the params."""
        params = self._params
        v = aligned(params, tangents, "tangents", self._what)
        with torch.enable_grad():
            found = grad_or_none(
                self._grads,
                list(self._leaves.values()),
                v,
                create_graph=self._create_graph,
                retain_graph=True,
            )
        return params._derive(filled(params, found, self._what, allow_unused=True))


def hvp(
    func: Callable[[P], Tensor],
    params: P,
    tangents: Mapping[str, Tensor],
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> P:
    """Return the Hessian-vector product `H v` of a scalar loss of keyed params.

    `H` is the Hessian of `func` at `params`, `v` is `tangents`; the result is keyed
    like `params`, which are unchanged. Computed by double backward (the gradient
    of `<grad func(p), v>`), so `func` may run a module with `p.call(model, x)`,
    where `torch.func.jvp(torch.func.grad(f))` fails for losses such as
    `F.mse_loss`. Costs one forward and two backward passes.

    Args:
        func: The loss: a function from a ParamDict like `params` to a scalar.
        params: The point at which the Hessian is taken.
        tangents: The vector `v`, a mapping with the same keys and shapes.
        create_graph: Record the computation, so the product can be
            differentiated again (with respect to `params`, where they require
            grad, and `tangents`).
        allow_unused: Treat entries that `func` does not depend on as constants
            (zero rows of `H`) instead of raising.

    Returns:
        A new ParamDict `H v`, keyed like `params`.

    Raises:
        TypeError: If `func` is not callable, `params` is not a ParamDict,
            `tangents` is not a mapping of dense tensors (complex exactly where
            `params` are), an entry is not a dense floating point tensor, a flag
            is not a bool, or `func` does not return a tensor.
        ValueError: If `params` is empty or mixes meta and other entries, the
            keys, shapes or devices of `tangents` differ from `params`' (the
            message names them), `func` returns a non-scalar, or `func` does not
            depend on some entries and `allow_unused` is false.

    Example:
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> v = ParamDict(w=torch.tensor([1.0, 0.0]))
        >>> hvp(lambda q: (q["w"] ** 3).sum(), p, v)["w"]  # H = diag(6 w)
        tensor([6., 0.])

    See Also:
        `jvp`, `vjp`, and `cg` to solve `H x = b`.
    """
    what = "hvp"
    check_callable(func, "func", what)
    check_paramdict(params, "params", what)
    check_entries(params, "params", what)
    check_floating(params, "params", what)
    check_devices(params, "params", what)
    check_options(what, create_graph=create_graph, allow_unused=allow_unused)
    aligned(params, tangents, "tangents", what)
    operator = HessianOperator(
        func, params, create_graph=create_graph, allow_unused=allow_unused, what=what
    )
    result: P = operator(tangents)
    return result


# ------------------------------------------------------------------ VJP, JVP


def _outputs(out: object, what: str) -> tuple[list[Tensor], ParamDict | None]:
    """Split `func`'s output into tensors, and the ParamDict it was (if it was)."""
    if isinstance(out, ParamDict):
        return list(out.values()), out
    if isinstance(out, Tensor):
        return [out], None
    msg = (
        f"`{what}`: the function must return a tensor or a ParamDict, got "
        f"{type(out).__name__}."
    )
    raise TypeError(msg)


def _matching(
    out: ParamDict | None, first: Tensor, given: object, name: str, what: str
) -> list[Tensor]:
    """Return `given` as tensors shaped like `func`'s output, or raise."""
    if out is not None:
        return aligned(out, given, name, what, against="function's output")
    if not isinstance(given, Tensor):
        msg = (
            f"`{what}`: the function returns a tensor, so `{name}` must be a "
            f"tensor, got {type(given).__name__}."
        )
        raise TypeError(msg)
    if given.shape != first.shape:
        msg = (
            f"`{what}`: `{name}` has shape {tuple(given.shape)}, the function's "
            f"output {tuple(first.shape)}; they must match."
        )
        raise ValueError(msg)
    if given.layout != torch.strided:
        msg = (
            f"`{what}`: `{name}` is a sparse tensor; it takes a dense one. Convert "
            "it with `.to_dense()` first."
        )
        raise TypeError(msg)
    if given.device != first.device or given.is_complex() != first.is_complex():
        msg = (
            f"`{what}`: `{name}` ({describe_kind(given)}) does not fit the "
            f"function's output ({describe_kind(first)}): it must be on the same "
            "device, and complex exactly where the output is."
        )
        raise ValueError(msg)
    return [given]


@overload
def vjp(
    func: Callable[[P], Tensor],
    params: P,
    cotangents: Tensor,
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> P: ...
@overload
def vjp(
    func: Callable[[P], ParamDict],
    params: P,
    cotangents: Mapping[str, Tensor],
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> P: ...
def vjp(
    func: Callable[[P], Any],
    params: P,
    cotangents: Any,
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> P:
    """Return the vector-Jacobian product `u^T J` of a function of keyed params.

    `J` is the Jacobian of `func` at `params`; `func` returns a tensor or a
    ParamDict, and `cotangents` (`u`) has its shape or its keys and shapes. The
    result is keyed like `params`, which are unchanged: the keyed form of
    `torch.autograd.grad(func(p), p, grad_outputs=u)`.

    Args:
        func: A function from a ParamDict like `params` to a tensor or ParamDict.
        params: The point at which the Jacobian is taken.
        cotangents: The vector `u`, shaped (keyed) like `func`'s output.
        create_graph: Record the computation, so the product can be
            differentiated again.
        allow_unused: Give zeros for entries that `func` does not depend on
            instead of raising.

    Returns:
        A new ParamDict `J^T u`, keyed like `params`.

    Raises:
        TypeError: If `func` is not callable, `params` is not a ParamDict, an
            entry is not a dense floating point tensor, a flag is not a bool,
            `func` returns neither a tensor nor a ParamDict, or `cotangents` is
            not of the output's kind (dense, complex exactly where it is).
        ValueError: If `params` is empty or mixes meta and other entries,
            `cotangents`' keys, shapes or devices differ from the output's, or
            `func` does not depend on some entries and `allow_unused` is false.

    Example:
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> vjp(lambda q: q["w"] ** 2, p, torch.tensor([1.0, 1.0]))["w"]
        tensor([2., 4.])

    See Also:
        `jvp` (the transpose), `hvp`.
    """
    what = "vjp"
    check_callable(func, "func", what)
    check_paramdict(params, "params", what)
    check_entries(params, "params", what)
    check_floating(params, "params", what)
    check_devices(params, "params", what)
    check_options(what, create_graph=create_graph, allow_unused=allow_unused)
    with torch.enable_grad():
        inputs = leaves(params, create_graph=create_graph)
        outs, out_dict = _outputs(evaluate(func, "func", what, inputs), what)
        cot = _matching(out_dict, outs[0], cotangents, "cotangents", what)
        found = grad_or_none(
            outs, list(inputs.values()), cot, create_graph=create_graph
        )
    return params._derive(filled(params, found, what, allow_unused=allow_unused))


@overload
def jvp(
    func: Callable[[P], Tensor],
    params: P,
    tangents: Mapping[str, Tensor],
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> Tensor: ...
@overload
def jvp(
    func: Callable[[P], Q],
    params: P,
    tangents: Mapping[str, Tensor],
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> Q: ...
def jvp(
    func: Callable[[P], Any],
    params: P,
    tangents: Mapping[str, Tensor],
    /,
    *,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> Any:
    """Return the Jacobian-vector product `J v` of a function of keyed params.

    `J` is the Jacobian of `func` at `params` and `v` is `tangents` (keyed like
    `params`); the result has the kind of `func`'s output: a tensor of its shape,
    or a ParamDict with its keys. `params` are unchanged. Computed in reverse mode
    by the double-vjp trick (`J v` is the vector-Jacobian product of the linear map
    `u -> J^T u`), so `func` may itself take gradients, as an optimality condition
    `F(phi) = grad L(phi)` does, and run a module with `p.call(model, x)`. Costs
    one forward and two backward passes.

    Args:
        func: A function from a ParamDict like `params` to a tensor or ParamDict.
        params: The point at which the Jacobian is taken.
        tangents: The vector `v`, a mapping with `params`' keys and shapes.
        create_graph: Record the computation, so the product can be
            differentiated again.
        allow_unused: Treat entries that `func` does not depend on as constants
            instead of raising.

    Returns:
        `J v`: a tensor, or a ParamDict keyed like `func`'s output.

    Raises:
        TypeError: If `func` is not callable, `params` is not a ParamDict,
            `tangents` is not a mapping of dense tensors (complex exactly where
            `params` are), an entry is not a dense floating point tensor, a flag
            is not a bool, or `func` returns neither a tensor nor a ParamDict.
        ValueError: If `params` is empty or mixes meta and other entries,
            `tangents`' keys, shapes or devices differ from `params`', or `func`
            does not depend on some entries and `allow_unused` is false.

    Example:
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> v = ParamDict(w=torch.tensor([1.0, 1.0]))
        >>> jvp(lambda q: q["w"] ** 2, p, v)
        tensor([2., 4.])

    See Also:
        `vjp` (the transpose), `hvp`.
    """
    what = "jvp"
    check_callable(func, "func", what)
    check_paramdict(params, "params", what)
    check_entries(params, "params", what)
    check_floating(params, "params", what)
    check_devices(params, "params", what)
    check_options(what, create_graph=create_graph, allow_unused=allow_unused)
    v = aligned(params, tangents, "tangents", what)
    with torch.enable_grad():
        inputs = leaves(params, create_graph=create_graph)
        values = list(inputs.values())
        outs, out_dict = _outputs(evaluate(func, "func", what, inputs), what)
        dummies = [torch.zeros_like(o).requires_grad_() for o in outs]
        # J^T u, linear in the dummy u; kept in the graph to differentiate again.
        transposed = grad_or_none(outs, values, dummies, create_graph=True)
        filled(params, transposed, what, allow_unused=allow_unused)
        pairs = [(t, g) for t, g in zip(transposed, v) if t is not None]
        found: Sequence[Tensor | None] = [None] * len(outs)
        if pairs:
            found = grad_or_none(
                [t for t, _ in pairs],
                dummies,
                [g for _, g in pairs],
                create_graph=create_graph,
            )
    products = [torch.zeros_like(o) if g is None else g for o, g in zip(outs, found)]
    if out_dict is None:
        return products[0]
    return out_dict._derive(products)
