"""Fuzzing module in/out: `from_module`, `call`, `swapped_into` and `to_module`.

Each meets hostile modules and ParamDicts (see `fuzz.py`) and must give what
`torch.func.functional_call` / `load_state_dict` give, or a clear error naming the
argument or key, with the module exactly as it was (parameters, buffers, their
identities, hooks, flags and attributes).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from fuzz import (
    FUZZ,
    Arg,
    Built,
    Entry,
    Value,
    check_entry,
    entry_values,
    flag_values,
    params,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

from paramdict import ParamDict


class _Net(nn.Module):
    """A linear layer `w`, `b` and a buffer `scale`; keys 'w', 'b' and 'scale'."""

    scale: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.5, 6).reshape(2, 3))
        self.b = nn.Parameter(torch.tensor([0.5, -1.5, 2.0]))
        self.register_buffer("scale", torch.tensor(2.0))
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = (x @ self.w + self.b) * self.scale
        return out


def _net(b: Built) -> nn.Module:
    return _Net()


def _cyclic(b: Built) -> nn.Module:
    outer = nn.Sequential(_Net())
    outer[0].parent = outer  # a cycle on purpose
    return outer


def _tied(b: Built) -> nn.Module:
    net = _Net()
    net.b2 = net.b  # one tensor under two names
    return net


def _scripted(b: Built) -> nn.Module:
    return torch.jit.script(_Net())


_MODULE = Arg(
    "module",
    (Value("net", _net), Value("tied", _tied)),
    (
        Value("None", lambda b: None, ("module", "NoneType")),
        Value("a dict", lambda b: dict(_Net().state_dict()), ("module", "dict")),
        Value(
            "a ParamDict",
            lambda b: ParamDict.from_module(_Net()),
            ("module", "ParamDict"),
        ),
        Value("a scripted net", _scripted, ("TorchScript",)),
        Value("a Linear", lambda b: nn.Linear(3, 3), ("'w'", "'b'", "'scale'")),
        Value(
            "a net in a cycle",
            _cyclic,
            ("'w'", "'b'", "'scale'", "'0.w'", "'0.b'", "'0.scale'"),
        ),
    ),
)


def _values(b: Built) -> ParamDict:
    net = _Net()
    return ParamDict(w=net.w.detach() * 2, b=net.b.detach() + 1, scale=net.scale * 3)


def _some(b: Built) -> ParamDict:
    return _values(b).select("w")


_PARAMS = Arg(
    "self",
    (
        Value("all", _values),
        Value("some", _some),
        Value("requiring grad", lambda b: _values(b).requires_grad_()),
        Value("empty", lambda b: ParamDict()),
    ),
    (
        # Not meta: torch's own CPU matmul with a meta operand returns uninitialized
        # memory (torch 2.13), so no answer can be compared.
        *entry_values(
            _values,
            kinds=(
                "0-dim",
                "one more dim",
                "zero-size",
                "sparse",
                "complex64",
                "float64",
                "int64",
                "bool",
                "nan",
                "non-contiguous",
                "non-leaf",
            ),
            keys=("w", "scale"),
        ),
        Value("an extra key", lambda b: _values(b) | {"x": torch.ones(1)}, ("'x'",)),
        Value(
            "a key through the cycle",
            lambda b: ParamDict({"0.parent.0.w": torch.ones(2, 3)}),
            ("'0.parent.0.w'", "missing"),
        ),
        Value(
            "tied names differ",
            lambda b: _values(b) | {"b2": torch.zeros(3)},
            ("'b2'", "'b'"),
        ),
    ),
)

_WHOLE = Arg(
    "self",
    (_PARAMS.valid[0], _PARAMS.valid[2]),
    (
        *_PARAMS.hostile,
        *entry_values(_values, kinds=("meta",), keys=("w", "scale")),
        Value("some", _some, ("missing", "strict")),
        Value("empty", lambda b: ParamDict(), ("missing", "strict")),
    ),
)

_X = Arg(
    "x",
    (Value("x (4, 2)", lambda b: torch.ones(4, 2)),),
    (),
)


def _call_reference(p: Any, module: Any, x: Any) -> Any:
    try:
        return torch.func.functional_call(module, dict(p), (x,))
    except RecursionError:  # torch's tying walk never ends on a cycle; its way out:
        return torch.func.functional_call(module, dict(p), (x,), tie_weights=False)


def _swapped(p: ParamDict, module: nn.Module, x: Tensor) -> Any:
    with p.swapped_into(module) as m:
        try:
            return m(x)
        except RuntimeError as err:  # the caller's own code, in the block
            if sys.version_info >= (3, 11):
                err.add_note("(raised in the `with` block)")
            raise


def _state(module: nn.Module) -> dict[str, Tensor]:
    """The module's tensors, copied (read without `state_dict`, safe on a cycle)."""
    return dict(ParamDict.from_module(module, buffers=True).detach().clone())


def _to_module(p: ParamDict, module: nn.Module, **kw: Any) -> dict[str, Tensor]:
    p.to_module(module, **kw)
    return _state(module)


def _to_module_reference(
    p: Mapping[str, Tensor], module: nn.Module, strict: bool = True
) -> dict[str, Tensor]:
    """Copy each value into the tensor its name reaches, attribute by attribute.

    As `functional_call` resolves names (cycles included); with `strict`, every
    tensor of the module must be reached (tied ones count once).
    """
    targets: dict[str, Tensor] = {}
    for key in p:
        *path, name = key.split(".")
        owner = module
        for part in path:
            owner = getattr(owner, part)
        targets[key] = getattr(owner, name)
    if strict:
        reached = {id(t) for t in targets.values()}
        own = ParamDict.from_module(module, buffers=True)
        missing = sorted(k for k, t in own.items() if id(t) not in reached)
        if missing:
            msg = f"missing {missing}"
            raise RuntimeError(msg)
    with torch.no_grad():
        for key, value in p.items():
            if targets[key].shape != value.shape or targets[key].dtype != value.dtype:
                msg = f"{key}: {value.shape} {value.dtype}"
                raise RuntimeError(msg)
            targets[key].copy_(value)
    return _state(module)


def _from_module_reference(module: nn.Module, **kw: Any) -> dict[str, Tensor]:
    out: dict[str, Tensor] = dict(module.named_parameters())
    if kw.get("buffers"):
        out.update(module.named_buffers())
    return out


ENTRIES = [
    Entry(
        "ParamDict.from_module",
        ParamDict.from_module,
        (_MODULE, Arg("buffers", *flag_values("buffers"), keyword=True)),
        reference=_from_module_reference,
    ),
    # A forward that fails with nothing unlike the module's own swapped in raises
    # the module's own error, as it is (documented).
    Entry(
        "p.call",
        ParamDict.call,
        (_PARAMS, _MODULE, _X),
        reference=_call_reference,
        passed_on=(RuntimeError,),
    ),
    # The block is the caller's code: what the module raises in it is passed on.
    Entry(
        "p.swapped_into",
        _swapped,
        (_PARAMS, _MODULE, _X),
        reference=_call_reference,
        passed_on=(RuntimeError,),
    ),
    Entry(
        "p.to_module",
        _to_module,
        (_WHOLE, _MODULE, Arg("strict", *flag_values("strict"), keyword=True)),
        reference=_to_module_reference,
        pure=False,
    ),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_module(entry: Entry, data: st.DataObject) -> None:
    """Hostile modules and values give torch's answer or a clear error, unchanged."""
    check_entry(entry, data)
