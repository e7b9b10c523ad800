"""Fuzzing the checkpoint functions: `load_torch_state_dict`, `to_torch_state_dict`.

`load_torch_state_dict` meets torch.optim's own state dicts (two steps in) with one
entry made hostile (`_BAD`: wrong kinds, NaN, negative, fractional or string
steps, meta and sparse buffers, missing keys, lists where dicts are, another
optimizer's dict), and hostile names and parameters; what it loads steps on as
torch's optimizer does after its own `load_state_dict` and one step, and what it
refuses is refused with a `TypeError`, `ValueError` or (where torch raises one)
`KeyError` naming the entry, with the dict and everything else as it was.
`to_torch_state_dict` meets hostile names, and (for a module's parameters)
hostile states, each field bad as the optimizer fuzzer draws them: what it
exports, torch's optimizer loads and steps on as paramdict's `step` does from
the state, and what it refuses, `step` refuses.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _optim_fuzz import OPTIMIZERS, Spec, check_readable, state_arg
from fuzz import FUZZ, Arg, Built, Entry, Value, check_entry, check_picks
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from paramdict import ParamDict, optim

F64 = torch.float64
SPECS = [s for s in OPTIMIZERS if s.theirs is not None]


def _options(spec: Spec) -> dict[str, Any]:
    return {k: v for k, v in spec.options.items() if k != "fused"}


def _torch_run(
    spec: Spec, params: ParamDict, steps: int
) -> tuple[torch.optim.Optimizer, dict[str, Tensor]]:
    """Torch's optimizer on copies of `params`, after `steps` steps."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
    theirs = spec.theirs(list(leaves.values()), **_options(spec))  # type: ignore[misc]  # checked: not None
    grads = spec.like(shift=0.25)
    for _ in range(steps):
        for k, leaf in leaves.items():
            leaf.grad = grads[k].clone()
        theirs.step()
    return theirs, leaves


def _saved(spec: Spec) -> dict[str, Any]:
    """Torch's state dict two steps in (fresh tensors each time)."""
    theirs, _ = _torch_run(spec, spec.like(), 2)
    return copy.deepcopy(theirs.state_dict())


def _first_buffer(spec: Spec) -> str:
    entries: dict[str, Any] = _saved(spec)["state"][0]
    return next(str(k) for k in entries if k != "step")


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


_DELETE: Any = _Delete()


def _bad(
    spec: Spec,
) -> list[tuple[str, tuple[str, ...], Callable[[dict[str, Any]], Any]]]:
    """(label, what an error must name, how the saved dict is made hostile)."""
    buf = _first_buffer(spec)
    buffer_names = (f"`{buf}`", f"'{buf}'", buf)
    step_names = ("`step`", "'step'", "step")

    def at(*path: Any, value: Any) -> Callable[[dict[str, Any]], Any]:
        def change(sd: dict[str, Any]) -> Any:
            held: Any = sd
            for key in path[:-1]:
                held = held[key]
            if value is _DELETE:
                del held[path[-1]]
            else:
                held[path[-1]] = value() if callable(value) else value
            return sd

        return change

    def whole(make: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        return make

    out: list[tuple[str, tuple[str, ...], Callable[[dict[str, Any]], Any]]] = [
        ("no 'state'", ("'state'", "state"), at("state", value=_DELETE)),
        (
            "no 'param_groups'",
            ("'param_groups'", "param_groups"),
            at("param_groups", value=_DELETE),
        ),
        (
            "state=list",
            ("`state`", "state"),
            lambda sd: sd | {"state": [sd["state"][0]]},
        ),
        ("state=None", ("`state`", "state"), at("state", value=lambda: None)),
        ("state[0]=list", ("`state[0]`", "state"), at("state", 0, value=lambda: [1.0])),
        ("state[0]=None", ("`state[0]`", "state"), at("state", 0, value=lambda: None)),
        (
            "param_groups='groups'",
            ("`param_groups`", "param_groups"),
            at("param_groups", value="groups"),
        ),
        (
            "param_groups=dict",
            ("`param_groups`", "param_groups"),
            lambda sd: sd | {"param_groups": sd["param_groups"][0]},
        ),
        (
            "param_groups[0]=str",
            ("`param_groups[0]`", "param_groups"),
            at("param_groups", 0, value="lr"),
        ),
        (
            "param_groups[0] without params",
            ("params", "'params'"),
            at("param_groups", 0, "params", value=_DELETE),
        ),
        (
            "param_groups[0].params=[0]",
            ("params", "parameters", "1"),
            at("param_groups", 0, "params", value=lambda: [0]),
        ),
        ("lr='x'", ("`lr`", "'lr'", "lr"), at("param_groups", 0, "lr", value="x")),
        ("lr=nan", ("`lr`", "'lr'", "lr"), at("param_groups", 0, "lr", value=math.nan)),
        ("lr=-1", ("`lr`", "'lr'", "lr"), at("param_groups", 0, "lr", value=-1.0)),
        (
            "lr missing",
            ("`lr`", "'lr'", "lr"),
            at("param_groups", 0, "lr", value=_DELETE),
        ),
        (
            "a stray index",
            ("5", "indices"),
            lambda sd: sd | {"state": {**sd["state"], 5: dict(sd["state"][0])}},
        ),
        (
            "state[1] deleted",
            ("'b'", "'w'"),
            lambda sd: sd | {"state": {0: sd["state"][0]}},
        ),
        (
            f"{buf}: meta",
            (*buffer_names, "meta"),
            _buffer(buf, lambda t: torch.empty_like(t, device="meta")),
        ),
        (f"{buf}: sparse", buffer_names, _buffer(buf, lambda t: t.to_sparse())),
        (f"{buf}: 0-dim", buffer_names, _buffer(buf, lambda t: torch.tensor(0.5))),
        (f"{buf}: zero-size", buffer_names, _buffer(buf, lambda t: t.new_zeros((0,)))),
        (f"{buf}: wrong shape", buffer_names, _buffer(buf, lambda t: torch.ones(7))),
        (
            f"{buf}: complex",
            buffer_names,
            _buffer(buf, lambda t: t.to(torch.complex64)),
        ),
        (f"{buf}: int64", buffer_names, _buffer(buf, lambda t: t.long())),
        (f"{buf}: None", buffer_names, _buffer(buf, lambda t: None)),
        (f"{buf}: 'x'", buffer_names, _buffer(buf, lambda t: "x")),
        (f"{buf}: a list", buffer_names, _buffer(buf, lambda t: t.tolist())),
        (f"{buf} missing", buffer_names, _buffer(buf, lambda t: _DELETE)),
        (
            "an extra buffer",
            ("'surprise'", "surprise"),
            at("state", 0, "surprise", value=lambda: torch.zeros(2, 3)),
        ),
    ]
    if "step" in _saved(spec)["state"][0]:
        for label, value in (
            ("'three'", "three"),
            ("nan", math.nan),
            ("-1", -1.0),
            ("1.5", 1.5),
            ("tensor nan", lambda: torch.tensor(math.nan)),
            ("tensor -2", lambda: torch.tensor(-2.0)),
            ("meta", lambda: torch.tensor(2.0, device="meta")),
            ("a vector", lambda: torch.ones(2)),
            ("None", None),
            ("True", True),
        ):
            out.append(
                (f"step={label}", step_names, at("state", 0, "step", value=value))
            )
        out.append(
            (
                "steps differ",
                ("'w'", "'b'", *step_names),
                at("state", 0, "step", value=lambda: torch.tensor(7.0)),
            )
        )
    other = (
        torch.optim.RAdam if spec.theirs is not torch.optim.RAdam else torch.optim.Adam
    )
    out.append(
        (
            f"{other.__name__}'s dict",
            ("another", "buffers", "settings", "state"),
            lambda sd: _other_dict(other, spec),
        )
    )
    out.append(
        (
            "SGD's dict",
            ("another", "buffers", "settings", "state", "momentum"),
            lambda sd: _other_dict(torch.optim.SGD, spec, momentum=0.9),
        )
    )
    return [(label, names, make) for label, names, make in out]


def _buffer(buf: str, make: Callable[[Tensor], Any]) -> Callable[[dict[str, Any]], Any]:
    def change(sd: dict[str, Any]) -> Any:
        value = make(sd["state"][0][buf])
        if value is _DELETE:
            del sd["state"][0][buf]
        else:
            sd["state"][0][buf] = value
        return sd

    return change


def _other_dict(cls: Any, spec: Spec, **options: Any) -> dict[str, Any]:
    leaves = [v.detach().clone().requires_grad_() for v in spec.like().values()]
    theirs = cls(leaves, lr=0.1, **options)
    for leaf in leaves:
        leaf.grad = torch.ones_like(leaf)
    theirs.step()
    return copy.deepcopy(theirs.state_dict())


def _flat(names: Any) -> Any:
    """The names of all groups, in order (as given where not a list of lists)."""
    if isinstance(names, nn.Module):
        return [n for n, _ in names.named_parameters()]
    if names and isinstance(names, list) and isinstance(names[0], list):
        return [n for group in names for n in group]
    return names


def _names_arg(spec: Spec) -> Arg:
    keys = list(spec.like())
    names = ("names", "`names`", "group", "parameter")
    return Arg(
        "names",
        (Value("names", lambda b: [list(keys)]),),
        (
            Value("names=flat", lambda b: list(keys), names),
            Value("names=None", lambda b: None, (*names, "numbers")),
            Value("names='w'", lambda b: "w", names),
            Value("names=one", lambda b: [keys[:1]], names),
            Value("names=three", lambda b: [[*keys, "x"]], (*names, "'x'")),
            Value("names=two groups", lambda b: [keys[:1], keys[1:]], names),
            Value("names=[[1, 2]]", lambda b: [[1, 2]], names),
            Value("names=other", lambda b: [["p", "q"]], (*names, "'p'")),
        ),
    )


def _params_arg(spec: Spec) -> Arg:
    return Arg(
        "params",
        (Value("params", lambda b: spec.like()),),
        (
            Value("params missing 'b'", lambda b: spec.like().exclude("b"), ("'b'",)),
            Value(
                "params extra 'x'",
                lambda b: spec.like() | {"x": torch.ones(3)},
                ("'x'",),
            ),
            Value("params=None", lambda b: None, ("params", "ParamDict")),
            Value(
                "params float64",
                lambda b: spec.like().to(F64),
                ("params", "dtype", "float64"),
            ),
        ),
    )


def _made(spec: Spec, make: Callable[[dict[str, Any]], Any]) -> Callable[[Built], Any]:
    return lambda b: make(_saved(spec))


def _load_entry(spec: Spec) -> Entry:
    """Load torch's dict, then step: torch's step after its own load, or refused."""
    hostile = tuple(
        Value(label, _made(spec, make), names) for label, names, make in _bad(spec)
    )
    state_dict = Arg(
        "state_dict", (Value("torch's dict", lambda b: _saved(spec)),), hostile
    )

    def call(opt: Any, sd: Any, params: Any, names: Any) -> dict[str, Tensor]:
        state = optim.load_torch_state_dict(opt, sd, params, names)
        new, _ = opt.step(params, spec.like(shift=0.25), state)
        return dict(new)

    def reference(opt: Any, sd: Any, params: Any, names: Any) -> dict[str, Tensor]:
        del opt
        keys = list(spec.like())
        flat = _flat(names)
        if list(params) != keys or flat != keys:
            msg = "torch's optimizer takes the parameters it was saved with"
            raise ValueError(msg)
        theirs, leaves = _torch_run(spec, params, 0)
        theirs.load_state_dict(copy.deepcopy(sd))
        saved = theirs.state_dict()
        check_readable(saved, list(leaves.values()))
        grads = spec.like(shift=0.25)
        for k, leaf in leaves.items():
            leaf.grad = grads[k].clone().to(leaf.dtype)
        theirs.step()
        return {k: v.detach() for k, v in leaves.items()}

    return Entry(
        f"load_torch_state_dict[{spec.name}]",
        call,
        (
            Arg("opt", (Value(spec.name, lambda b: spec.make()),)),
            state_dict,
            _params_arg(spec),
            _names_arg(spec),
        ),
        errors=(TypeError, ValueError, KeyError),
        reference=reference,
    )


def _export_entry(spec: Spec) -> Entry:
    """Export a state, load it into torch, step: paramdict's step, or refused."""

    def call(opt: Any, state: Any, names: Any) -> dict[str, Tensor]:
        sd = optim.to_torch_state_dict(opt, state, names)
        theirs, leaves = _torch_run(spec, spec.like(), 0)
        try:
            check_readable(sd, list(leaves.values()))
        except ValueError as err:  # torch would crash: fail, visibly
            raise RuntimeError(str(err)) from err
        theirs.load_state_dict(sd)
        grads = spec.like(shift=0.25)
        for k, leaf in leaves.items():
            leaf.grad = grads[k].clone()
        theirs.step()
        return {k: v.detach() for k, v in leaves.items()}

    def reference(opt: Any, state: Any, names: Any) -> dict[str, Tensor]:
        flat = _flat(names)
        if flat != list(spec.like()):
            msg = "the state is exported for these parameters only"
            raise ValueError(msg)
        new, _ = opt.step(spec.like(), spec.like(shift=0.25), state)
        return {k: v.detach() for k, v in new.items()}

    names = _names_arg(spec)
    return Entry(
        f"to_torch_state_dict[{spec.name}]",
        call,
        (
            Arg("opt", (Value(spec.name, lambda b: spec.make()),)),
            _export_state(spec),
            names,
        ),
        reference=reference,
    )


def _export_state(spec: Spec) -> Arg:
    """The state from `init`, and after a step (hostile states: see the module)."""

    def init(b: Built) -> Any:
        return b["opt"].init(spec.like())

    def stepped(b: Built) -> Any:
        return b["opt"].step(spec.like(), spec.like(shift=0.5), init(b))[1]

    return Arg("state", (Value("state=init", init), Value("after a step", stepped)))


def _module_of(params: ParamDict) -> nn.Module:
    """A module whose parameters are copies of `params`, under the same names."""
    module = nn.Module()
    for k, v in params.items():
        module.register_parameter(k, nn.Parameter(v.detach().clone()))
    return module


def _export_checked_entry(spec: Spec) -> Entry:
    """Export a hostile state for a module: refused as `step` refuses it."""
    entry = _export_entry(spec)
    state = state_arg(spec, alias_ok=True)
    hostile = tuple(v for v in state.hostile if not v.label.endswith("the parameters"))
    names = Value("names=the module", lambda b: _module_of(spec.like()))
    return Entry(
        f"to_torch_state_dict[{spec.name}, states]",
        entry.call,
        (
            entry.args[0],
            Arg("state", state.valid[:1], hostile),
            Arg("names", (names,)),
        ),
        reference=entry.reference,
    )


ENTRIES = {
    "load_torch_state_dict": [_load_entry(s) for s in SPECS],
    "to_torch_state_dict": [_export_entry(s) for s in SPECS],
    "to_torch_state_dict states": [_export_checked_entry(s) for s in SPECS],
}

CHECKPOINT_FUZZ = settings(FUZZ, max_examples=3 * FUZZ.max_examples)


@pytest.mark.parametrize("kind", list(ENTRIES))
@CHECKPOINT_FUZZ
@given(data=st.data())
def test_fuzz_checkpoints(kind: str, data: st.DataObject) -> None:
    """Hostile saved dicts, states and names: torch's step or a clear error."""
    entry = data.draw(st.sampled_from(ENTRIES[kind]), label="optimizer")
    check_entry(entry, data)


@pytest.mark.parametrize(
    "entry", [e for entries in ENTRIES.values() for e in entries], ids=repr
)
def test_torch_dicts_load_as_torch_continues(entry: Entry) -> None:
    """Every optimizer's dict, untouched: loaded and stepped as torch steps it."""
    check_picks(entry, {a.name: a.valid[0] for a in entry.args}, set())
