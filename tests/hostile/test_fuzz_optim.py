"""Fuzzing the optimizers: constructors, `init`, `step`, `step_`, `bind`, `step_module`.

Every optimizer of `_optim_fuzz.OPTIMIZERS` meets hostile options (each argument
of its constructor), parameters, gradients and states (each field of its state;
see `fuzz.py` and `_optim_fuzz.py`). What is accepted gives torch.optim's answer:
its constructor accepts the options too, and a step equals torch's step from the
same state (exported with `to_torch_state_dict`); what is refused is refused with
a `TypeError` or `ValueError` naming the option, key or state field, and with
every tensor, counter and module exactly as it was.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from _optim_fuzz import (
    OPTIMIZERS,
    Spec,
    constructor_args,
    opt_arg,
    state_arg,
    torch_step,
)
from fuzz import (
    FUZZ,
    Arg,
    Entry,
    Value,
    check_entry,
    flag_values,
    not_callables,
    paramdict_values,
    self_values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from paramdict import ParamDict


def _constructor(spec: Spec) -> Entry:
    """`Cls(**options)`: accepted where torch's class accepts, or refused by name."""

    def build(**options: Any) -> None:
        spec.cls(**options)

    reference = None
    if spec.theirs is not None:
        theirs = spec.theirs
        takes = set(inspect.signature(theirs).parameters)

        def reference(**options: Any) -> None:
            # paramdict's own options (Muon's `differentiable`, ...) are left out.
            given = {k: v for k, v in options.items() if k in takes}
            theirs([torch.zeros(2, 2, requires_grad=True)], **given)

    return Entry(
        f"{spec.name}(...)", build, constructor_args(spec.cls), reference=reference
    )


def _params(spec: Spec) -> Arg:
    valid, hostile = self_values(spec.like, grad=lambda: spec.like(requires_grad=True))
    return Arg("params", valid, hostile)


def _grads(spec: Spec, *, alias_ok: bool) -> Arg:
    valid, hostile = paramdict_values("grads", lambda b: spec.like(shift=0.25))
    alias = Value("grads=params", lambda b: b["params"], alias_of="params")
    if alias_ok:
        valid = (*valid, alias)
    else:
        hostile = (
            *hostile,
            Value(
                "grads=params", lambda b: b["params"], ("'w'", "'b'", "share", "memory")
            ),
        )
    return Arg("grads", valid, hostile)


def _step_reference(spec: Spec) -> Any:
    if spec.theirs is None:
        return None

    def reference(opt: Any, p: Any, g: Any, s: Any) -> dict[str, Tensor]:
        del opt
        return torch_step(spec, p, g, s)

    return reference


def _step(opt: Any, p: ParamDict, g: Any, s: Any) -> dict[str, Tensor]:
    new, _ = opt.step(p, g, s)
    return dict(new)


def _step_(opt: Any, p: ParamDict, g: Any, s: Any) -> dict[str, Tensor]:
    opt.step_(p, g, s)
    return {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in p.items()}


def _bind(opt: Any, p: ParamDict, s: Any, in_place: Any = True) -> None:
    opt.bind(p, s, in_place=in_place)


class _Net(nn.Module):
    def __init__(self, values: ParamDict) -> None:
        super().__init__()
        self.w = nn.Parameter(values["w"].detach().clone())
        self.b = nn.Parameter(values["b"].detach().clone())

    def forward(self) -> Tensor:
        return (self.w**2).sum() + (self.b**3).sum()


def _step_module(opt: Any, module: Any, loss_fn: Any, state: Any) -> Any:
    loss, _ = opt.step_module(module, loss_fn, state)
    return loss


def _module_args(spec: Spec) -> tuple[Arg, ...]:
    module = Arg(
        "module",
        (Value("net", lambda b: _Net(spec.like())),),
        (
            Value("module=None", lambda b: None, ("nn.Module", "NoneType")),
            Value(
                "module=ParamDict",
                lambda b: spec.like(),
                ("nn.Module", "ParamDict"),
            ),
            Value(
                "module with other names",
                lambda b: nn.Linear(3, 2),
                ("'w'", "'b'", "'weight'", "'bias'"),
            ),
        ),
    )
    loss_fn = Arg(
        "loss_fn",
        (Value("loss_fn", lambda b: b["module"]),),
        not_callables("loss_fn"),
    )
    state = state_arg(spec, alias_ok=False)
    return (opt_arg(spec), module, loss_fn, state)


def _entries(spec: Spec) -> list[Entry]:
    reference = _step_reference(spec)
    return [
        _constructor(spec),
        Entry(
            f"{spec.name}.init",
            lambda o, p: o.init(p) and None,
            (opt_arg(spec), _params(spec)),
        ),
        Entry(
            f"{spec.name}.step",
            _step,
            (
                opt_arg(spec),
                _params(spec),
                _grads(spec, alias_ok=True),
                state_arg(spec, alias_ok=True),
            ),
            reference=reference,
        ),
        Entry(
            f"{spec.name}.step_",
            _step_,
            (
                opt_arg(spec),
                _params(spec),
                _grads(spec, alias_ok=False),
                state_arg(spec, alias_ok=False),
            ),
            reference=reference,
            pure=False,
        ),
        Entry(
            f"{spec.name}.bind",
            _bind,
            (
                opt_arg(spec),
                _params(spec),
                state_arg(spec, alias_ok=False),
                Arg("in_place", *flag_values("in_place"), keyword=True),
            ),
        ),
        Entry(
            f"{spec.name}.step_module",
            _step_module,
            _module_args(spec),
            pure=False,
        ),
    ]


KINDS = ("constructor", "init", "step", "step_", "bind", "step_module")
ENTRIES = {
    kind: [_entries(spec)[i] for spec in OPTIMIZERS] for i, kind in enumerate(KINDS)
}

# One test per kind of entry point, each example drawing the optimizer: the
# kinds share a budget three times the per-entry count of `FUZZ` (CI), or
# three times the `fuzz-long` profile's.
OPTIM_FUZZ = settings(FUZZ, max_examples=3 * FUZZ.max_examples)


@pytest.mark.parametrize("kind", KINDS)
@OPTIM_FUZZ
@given(data=st.data())
def test_fuzz_optim(kind: str, data: st.DataObject) -> None:
    """Hostile options, parameters and states: torch.optim's answer or a clear error."""
    entry = data.draw(st.sampled_from(ENTRIES[kind]), label="optimizer")
    check_entry(entry, data)
