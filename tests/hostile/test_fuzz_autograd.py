"""Fuzzing differentiation: `grad`, `backward`, the products, `cg` and the implicit.

The entry points are `grad`, `backward`, `hvp`, `vjp`, `jvp`, `cg`,
`implicit_proximal` and `implicit_root` (the last two with the meta-gradient
taken through them).

Each meets hostile arguments (see `fuzz.py`) and must give what
`torch.autograd.grad` / `torch.autograd.functional` give, or a clear error naming
the argument or key, with nothing changed (no `.grad` accumulated on an error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from fuzz import (
    FUZZ,
    KEYS,
    OMIT,
    Arg,
    Built,
    Entry,
    Value,
    base,
    check_entry,
    entry_values,
    flag_values,
    not_callables,
    number_values,
    paramdict_values,
    params,
    positive,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict, cg, hvp, implicit_proximal, implicit_root, jvp, vjp

KEYED = tuple(repr(k) for k in KEYS)

# torch leaves `torch.autograd.functional` untyped.
_FUNCTIONAL: Any = torch.autograd.functional


def _loss_of(p: Mapping[str, Tensor]) -> Tensor:
    """A scalar loss of every entry: the sum of their squares (cubes for curvature)."""
    return sum(((v.abs() ** 3).sum() for v in p.values()), torch.zeros(()))


def _leaves() -> ParamDict:
    return base(requires_grad=True)


_SELF = Arg(
    "self",
    (
        Value("leaves", lambda b: _leaves()),
        Value("non-leaves", lambda b: _leaves() * 2),
    ),
    (
        *entry_values(
            lambda b: _leaves(),
            kinds=(
                "0-dim",
                "zero-size",
                "meta",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
                "non-contiguous",
                "float16",
            ),
        ),
        Value("frozen 'b'", lambda b: _leaves() | {"b": torch.ones(3)}, ("'b'",)),
        Value("empty", lambda b: ParamDict(), ("empty", "entry")),
    ),
)

_LOSS = Arg(
    "loss",
    (
        Value("sum of cubes", lambda b: _loss_of(b["self"])),
        Value("a list of two", lambda b: [b["self"]["w"].sum(), b["self"]["b"].sum()]),
    ),
    (
        Value("None", lambda b: None, ("loss",)),
        Value("'loss'", lambda b: "loss", ("loss",)),
        Value("1.0", lambda b: 1.0, ("loss",)),
        Value("[]", lambda b: [], ("loss",)),
        Value("[None]", lambda b: [None], ("loss", "0")),
        Value("constant", lambda b: torch.tensor(1.0), ("loss", "require grad")),
        Value(
            "detached", lambda b: _loss_of(b["self"]).detach(), ("loss", "require grad")
        ),
        Value("of 'w' only", lambda b: b["self"]["w"].sum(), ("'b'",)),
        Value("a vector", lambda b: b["self"]["w"] * 2, ("grad_outputs", "loss")),
        Value(
            "complex",
            lambda b: (b["self"]["w"] * 1j).sum(),
            ("loss", "complex", "real"),
        ),
        Value(
            "of a freed graph", lambda b: _freed(b["self"]), ("retain_graph", "freed")
        ),
    ),
)


def _freed(p: ParamDict) -> Tensor:
    loss = _loss_of(p)
    torch.autograd.grad(loss, list(p.values()), allow_unused=True)  # frees the graph
    return loss


_GRAD_OUTPUTS = Arg(
    "grad_outputs",
    (Value("left out", lambda b: OMIT), Value("None", lambda b: None)),
    (
        Value("ones(2)", lambda b: torch.ones(2), ("grad_outputs",)),
        Value("'x'", lambda b: "x", ("grad_outputs",)),
        Value(
            "[one, one]", lambda b: [torch.ones(()), torch.ones(())], ("grad_outputs",)
        ),
        Value("meta", lambda b: torch.ones((), device="meta"), ("grad_outputs",)),
        Value(
            "complex",
            lambda b: torch.ones((), dtype=torch.complex64),
            ("grad_outputs",),
        ),
    ),
    keyword=True,
)


def _grad_reference(p: ParamDict, loss: Any, **kw: Any) -> dict[str, Tensor]:
    """`torch.autograd.grad` on the entries, with `allow_unused`'s documented zeros."""
    allow_unused = kw.pop("allow_unused", False)
    create_graph = kw.get("create_graph", False)
    needs = {k: v for k, v in p.items() if v.requires_grad or not allow_unused}
    losses = [loss] if isinstance(loss, Tensor) else loss
    got: dict[str, Tensor] = {}
    if needs and (any(t.requires_grad for t in losses) or not allow_unused):
        found = torch.autograd.grad(
            loss,
            list(needs.values()),
            allow_unused=allow_unused,
            materialize_grads=allow_unused,
            **kw,
        )
        got = dict(zip(needs, found))
    # Documented: zeros for what `loss` does not reach (requiring grad under
    # `create_graph`, as `materialize_grads` makes them).
    return {
        k: got[k]
        if k in got
        else torch.zeros_like(
            v, requires_grad=create_graph and (v.is_floating_point() or v.is_complex())
        )
        for k, v in p.items()
    }


def _backward(p: ParamDict, loss: Any, **kw: Any) -> dict[str, Any]:
    grads = p.backward(loss, **kw)
    return {k: (grads[k], v.grad) for k, v in p.items()}


def _backward_reference(p: ParamDict, loss: Any, **kw: Any) -> dict[str, Any]:
    torch.autograd.backward(
        loss, grad_tensors=kw.pop("grad_outputs", None), inputs=list(p.values()), **kw
    )
    return {k: (v.grad, v.grad) for k, v in p.items()}


# ---------------------------------------------------------------- products


def _params() -> ParamDict:
    return positive()


_PARAMS = Arg(
    "params",
    (
        Value("params", lambda b: _params()),
        Value("requiring grad", lambda b: positive(requires_grad=True)),
    ),
    (
        *entry_values(
            lambda b: _params(),
            kinds=(
                "0-dim",
                "zero-size",
                "meta",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
                "non-contiguous",
                "non-leaf",
            ),
        ),
        Value("params=dict", lambda b: dict(_params()), ("params",)),
        Value("params=None", lambda b: None, ("params",)),
        Value("params=empty", lambda b: ParamDict(), ("params", "'w'")),
    ),
)


def _tangents(name: str) -> Arg:
    valid, hostile = paramdict_values(name, lambda b: base(shift=0.25))
    return Arg(
        name,
        (
            *valid,
            Value(f"{name}=alias of params", lambda b: b["params"], alias_of="params"),
        ),
        hostile,
    )


_FUNCS = (Value("sum of cubes", lambda b: _loss_of),)
_BAD_FUNCS = (
    *not_callables("func"),
    Value("of 'w' only", lambda b: lambda q: (q["w"] ** 3).sum(), ("'b'",)),
    Value("func gives None", lambda b: lambda q: None, ("function",)),
    Value(
        "func gives a vector", lambda b: lambda q: q["w"] * 2, ("function", "scalar")
    ),
    Value("func gives a float", lambda b: lambda q: 1.0, ("function",)),
    Value(
        "func gives a constant",
        lambda b: lambda q: torch.tensor(1.0),
        ("'w'", "'b'", "depend"),
    ),
)


def _over_tuple(func: Callable[..., Any], keys: list[str]) -> Callable[..., Any]:
    return lambda *xs: func(ParamDict(zip(keys, xs)))


def _hvp_reference(func: Any, p: Any, t: Any, **kw: Any) -> dict[str, Tensor]:
    keys = list(p)
    _, out = _FUNCTIONAL.hvp(
        _over_tuple(func, keys),
        tuple(v.detach() for v in p.values()),
        tuple(t[k] for k in keys),
        create_graph=kw.get("create_graph", False),
    )
    return dict(zip(keys, out))


_VJP_FUNCS = (
    Value("squares of 'w'", lambda b: lambda q: q["w"] ** 2 + q["b"].sum()),
    Value("a ParamDict", lambda b: lambda q: q * q),
)


def _cotangents(b: Built) -> Any:
    out = b["func"](b["params"].detach())
    return torch.ones_like(out) if isinstance(out, Tensor) else out.ones_like()


_COTANGENTS = Arg(
    "cotangents",
    (Value("ones like the output", _cotangents),),
    (
        Value("None", lambda b: None, ("cotangents",)),
        Value(
            "meta", lambda b: _meta_like(_cotangents(b)), ("cotangents", "'w'", "'b'")
        ),
        Value(
            "sparse",
            lambda b: _map_any(_cotangents(b), Tensor.to_sparse),
            ("cotangents", "'w'", "'b'"),
        ),
        Value(
            "complex",
            lambda b: _map_any(_cotangents(b), lambda v: v.to(torch.complex64)),
            ("cotangents", "'w'", "'b'"),
        ),
        Value(
            "float64",
            lambda b: _map_any(_cotangents(b), Tensor.double),
            ("cotangents", "'w'", "'b'"),
        ),
        Value(
            "bool",
            lambda b: _map_any(_cotangents(b), Tensor.bool),
            ("cotangents", "'w'", "'b'"),
        ),
        Value("wrong shape", lambda b: torch.ones(7), ("cotangents", "shape")),
        Value("a dict", lambda b: {"w": torch.ones(2, 3)}, ("cotangents", "'b'")),
    ),
)


def _map_any(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    return (
        fn(value)
        if isinstance(value, Tensor)
        else ParamDict({k: fn(v) for k, v in value.items()})
    )


def _meta_like(value: Any) -> Any:
    return _map_any(value, lambda v: torch.empty_like(v, device="meta"))


def _vjp_reference(func: Any, p: Any, u: Any, **kw: Any) -> dict[str, Tensor]:
    keys = list(p)
    if isinstance(u, Mapping):
        outs = func(p.detach())
        v = tuple(u[k] for k in outs)
        f = lambda *xs: tuple(func(ParamDict(zip(keys, xs))).values())  # noqa: E731
    else:
        v, f = u, _over_tuple(func, keys)
    _, grads = _FUNCTIONAL.vjp(
        f,
        tuple(x.detach() for x in p.values()),
        v,
        create_graph=kw.get("create_graph", False),
    )
    return dict(zip(keys, grads))


def _jvp_reference(func: Any, p: Any, t: Any, **kw: Any) -> Any:
    keys = list(p)
    outs = func(p.detach())
    f = _over_tuple(func, keys)
    if isinstance(outs, Mapping):
        f = lambda *xs: tuple(func(ParamDict(zip(keys, xs))).values())  # noqa: E731
    _, out = _FUNCTIONAL.jvp(
        f,
        tuple(x.detach() for x in p.values()),
        tuple(t[k] for k in keys),
        create_graph=kw.get("create_graph", False),
    )
    return dict(zip(outs, out)) if isinstance(outs, Mapping) else out


_OPTIONS = (
    Arg("create_graph", *flag_values("create_graph"), keyword=True),
    Arg("allow_unused", *flag_values("allow_unused"), keyword=True),
)


# ---------------------------------------------------------------- solving


def _b() -> ParamDict:
    return base(shift=0.5)


_MATVECS = (
    Value("2 v", lambda b: lambda v: 2 * v),
    Value("v + diag v", lambda b: lambda v: v + v * positive()),
)
_BAD_MATVECS = (
    *not_callables("matvec"),
    Value("matvec gives None", lambda b: lambda v: None, ("matvec",)),
    Value("matvec gives a tensor", lambda b: lambda v: torch.ones(3), ("matvec",)),
    Value("matvec drops 'b'", lambda b: lambda v: v.exclude("b"), ("'b'",)),
    Value(
        "matvec gives meta", lambda b: lambda v: v.to("meta"), ("matvec", "'w'", "'b'")
    ),
    Value(
        "matvec gives sparse",
        lambda b: lambda v: v.map(Tensor.to_sparse),
        ("matvec", "'w'", "'b'"),
    ),
    Value(
        "matvec gives float64",
        lambda b: lambda v: v.to(torch.float64),
        ("matvec", "'w'", "'b'"),
    ),
)
_B = Arg(
    "b",
    (Value("b", lambda b: _b()),),
    (
        *entry_values(
            lambda b: _b(),
            kinds=(
                "0-dim",
                "zero-size",
                "meta",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
                "nan",
                "inf",
            ),
        ),
        Value("b=dict", lambda b: dict(_b()), ("b",)),
        Value("b=None", lambda b: None, ("b",)),
    ),
)


def _tolerances(*, keyword: bool = True) -> tuple[Arg, ...]:
    return (
        Arg("rtol", *number_values("rtol", (1e-5,), tensors_ok=False), keyword=keyword),
        Arg("atol", *number_values("atol", (0.0,), tensors_ok=False), keyword=keyword),
        Arg(
            "maxiter",
            (Value("maxiter=3", lambda b: 3), Value("maxiter=None", lambda b: None)),
            number_values("maxiter")[1],
            keyword=keyword,
        ),
    )


def _adapted(b: Built) -> ParamDict:
    theta: ParamDict = b["params"]
    return (theta / 2).detach()


def _theta() -> ParamDict:
    return positive(requires_grad=True)


_THETA = Arg(
    "params",
    (Value("theta", lambda b: _theta()),),
    (
        *entry_values(
            lambda b: _theta(),
            kinds=(
                "0-dim",
                "zero-size",
                "meta",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
            ),
        ),
        Value("params=dict", lambda b: dict(_theta()), ("params",)),
        Value("params=None", lambda b: None, ("params",)),
    ),
)
_ADAPTED = Arg(
    "adapted",
    (
        Value("theta / 2", _adapted),
        Value("theta itself", lambda b: b["params"], alias_of="params"),
    ),
    (
        *entry_values(
            _adapted,
            kinds=(
                "0-dim",
                "zero-size",
                "wrong shape",
                "meta",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
                "nan",
            ),
        ),
        Value("adapted=dict", lambda b: dict(_adapted(b)), ("adapted",)),
        Value("adapted=None", lambda b: None, ("adapted",)),
        Value("missing 'b'", lambda b: _adapted(b).exclude("b"), ("'b'",)),
    ),
)


def _with_meta_gradient(fn: Callable[..., ParamDict]) -> Callable[..., Any]:
    """Run the implicit function, then take the meta-gradient through it."""

    def run(params: Any, adapted: Any, **kw: Any) -> Any:
        out = fn(adapted, params, **kw)
        loss = sum((v.abs().sum() for v in out.values()), torch.zeros(()))
        leaves = [v for v in params.values() if v.requires_grad]
        if not leaves or not loss.requires_grad:
            return None
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    return run


_OPTIMALITY = (Value("2 phi - theta", lambda b: lambda phi, theta: 2 * phi - theta),)
_BAD_OPTIMALITY = (
    *not_callables("optimality"),
    Value("gives None", lambda b: lambda phi, theta: None, ("optimality",)),
    Value(
        "gives a tensor", lambda b: lambda phi, theta: torch.ones(3), ("optimality",)
    ),
    Value(
        "drops 'b'",
        lambda b: lambda phi, theta: (2 * phi - theta).exclude("b"),
        ("'b'",),
    ),
    Value("ignores phi", lambda b: lambda phi, theta: -theta, ("phi", "optimality")),
)
_LOSSES = (Value("half squares", lambda b: lambda q: q.dot(q) / 2),)
_BAD_LOSSES = (
    *not_callables("loss"),
    Value("gives None", lambda b: lambda q: None, ("loss", "function")),
    Value("gives a vector", lambda b: lambda q: q["w"], ("loss", "function", "scalar")),
)


# What the function given raises on hostile params (a `KeyError` for a key it
# reads, torch's `RuntimeError` for mixed devices) is passed on, with a note.
_BY_FUNC = (RuntimeError, KeyError)

ENTRIES = [
    Entry(
        "p.grad",
        ParamDict.grad,
        (
            _SELF,
            _LOSS,
            _GRAD_OUTPUTS,
            Arg("retain_graph", *flag_values("retain_graph"), keyword=True),
            Arg("create_graph", *flag_values("create_graph"), keyword=True),
            Arg("allow_unused", *flag_values("allow_unused"), keyword=True),
        ),
        reference=_grad_reference,
    ),
    Entry(
        "p.backward",
        _backward,
        (
            _SELF,
            _LOSS,
            _GRAD_OUTPUTS,
            Arg("retain_graph", *flag_values("retain_graph"), keyword=True),
        ),
        reference=_backward_reference,
        pure=False,
    ),
    Entry(
        "hvp",
        hvp,
        (Arg("func", _FUNCS, _BAD_FUNCS), _PARAMS, _tangents("tangents"), *_OPTIONS),
        reference=_hvp_reference,
        passed_on=_BY_FUNC,
    ),
    Entry(
        "vjp",
        vjp,
        (Arg("func", _VJP_FUNCS, _BAD_FUNCS[:5]), _PARAMS, _COTANGENTS, *_OPTIONS),
        reference=_vjp_reference,
        passed_on=_BY_FUNC,
    ),
    Entry(
        "jvp",
        jvp,
        (
            Arg("func", _VJP_FUNCS, _BAD_FUNCS[:5]),
            _PARAMS,
            _tangents("tangents"),
            *_OPTIONS,
        ),
        reference=_jvp_reference,
        passed_on=_BY_FUNC,
    ),
    Entry(
        "cg",
        cg,
        (
            Arg("matvec", _MATVECS, _BAD_MATVECS),
            _B,
            Arg(
                "x0",
                (
                    Value("x0 left out", lambda b: OMIT),
                    Value("x0=zeros", lambda b: _b().zeros_like()),
                ),
                paramdict_values(
                    "x0",
                    lambda b: _b(),
                    kinds=("meta", "sparse", "0-dim", "float64", "None"),
                )[1],
                keyword=True,
            ),
            *_tolerances(),
        ),
        passed_on=_BY_FUNC,
    ),
    Entry(
        "implicit_proximal",
        _with_meta_gradient(implicit_proximal),
        (
            _THETA,
            _ADAPTED,
            Arg("loss", _LOSSES, _BAD_LOSSES, keyword=True),
            Arg("lam", *number_values("lam", (1.0,), tensors_ok=False), keyword=True),
            *_tolerances(),
        ),
        passed_on=_BY_FUNC,
    ),
    Entry(
        "implicit_root",
        _with_meta_gradient(implicit_root),
        (
            _THETA,
            _ADAPTED,
            Arg("optimality", _OPTIMALITY, _BAD_OPTIMALITY, keyword=True),
            *_tolerances(),
        ),
        passed_on=_BY_FUNC,
    ),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_autograd(entry: Entry, data: st.DataObject) -> None:
    """Hostile arguments give torch's answer or a clear error, and change nothing."""
    check_entry(entry, data)
