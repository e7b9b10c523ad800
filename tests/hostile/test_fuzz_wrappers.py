"""Fuzzing the wrappers: `MultiSteps`, `ClipGradNorm` and `ParamGroups`.

Each wrapper's constructor, `init`, `step` and `step_` meet hostile values for
every argument and every field of their state (see `fuzz.py` for what a refusal
must be: a `TypeError` or `ValueError` naming the value, everything given as it
was). What is accepted is compared with a plain reference: torch.optim's step of
the wrapped optimizer on the mean of the accumulated gradients (`MultiSteps`),
on the gradients clipped by `torch.nn.utils.clip_grad_norm_` (`ClipGradNorm`),
or one torch optimizer per group on its entries (`ParamGroups`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from _optim_fuzz import Spec, constructor_args, replaced, state_arg, torch_step
from fuzz import (
    FUZZ,
    OMIT,
    Arg,
    Built,
    Entry,
    Value,
    base,
    check_entry,
    check_picks,
    constant,
    entry_values,
    paramdict_values,
    self_values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict, optim

F64 = torch.float64

SGD = Spec("SGD", optim.SGD, {"lr": 0.1, "momentum": 0.9}, torch.optim.SGD)
ADAM = Spec("Adam", optim.Adam, {"lr": 0.1, "amsgrad": True}, torch.optim.Adam)
ADAM_W = Spec("Adam-w", optim.Adam, {"lr": 0.05}, torch.optim.Adam)


def _not_optimizers(name: str) -> tuple[Value, ...]:
    """Hostile values of an argument that takes a paramdict optimizer."""
    return tuple(
        Value(f"{name}={label}", constant(value), (f"`{name}`", name))
        for label, value in (
            ("None", None),
            ("'sgd'", "sgd"),
            ("torch's SGD class", torch.optim.SGD),
            ("a ParamDict", ParamDict(w=torch.ones(1))),
            ("the class", optim.SGD),
        )
    )


def _params() -> Arg:
    valid, hostile = self_values(base, grad=lambda: base(requires_grad=True))
    return Arg("params", valid, hostile)


def _grads(*, alias_ok: bool) -> Arg:
    valid, hostile = paramdict_values("grads", lambda b: base(shift=0.25))
    alias = Value("grads=params", lambda b: b["params"], alias_of="params")
    if alias_ok:
        valid = (*valid, alias)
    else:
        share = ("'w'", "'b'", "share", "memory")
        hostile = (*hostile, Value("grads=params", lambda b: b["params"], share))
    return Arg("grads", valid, hostile)


def _after_step(p: ParamDict) -> dict[str, Tensor]:
    """The parameters after `step_`, as a copy to compare."""
    return {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in p.items()}


def _step(opt: Any, p: ParamDict, g: Any, s: Any) -> dict[str, Tensor]:
    new, _ = opt.step(p, g, s)
    return dict(new)


def _step_(opt: Any, p: ParamDict, g: Any, s: Any) -> dict[str, Tensor]:
    opt.step_(p, g, s)
    return _after_step(p)


def _plain(p: Mapping[str, Tensor], given: Mapping[str, Any], what: str) -> None:
    """Raise unless `given` holds a dense tensor like each parameter.

    (torch's arithmetic on anything else may crash rather than raise, and has no
    plain answer: the step must refuse it.)
    """
    for k, v in p.items():
        t = given[k]
        fits = isinstance(t, Tensor) and t.layout == torch.strided
        if not (fits and (t.shape, t.dtype, t.device) == (v.shape, v.dtype, v.device)):
            msg = f"no plain answer with the {what} of {k!r}"
            raise ValueError(msg)


def _as_given(p: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The parameters' values, as a step that does not apply returns them."""
    return {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in p.items()}


def _step_entries(
    name: str,
    make: Callable[[Built], Any],
    state: Callable[[bool], Arg],
    reference: Callable[..., dict[str, Tensor]],
) -> list[Entry]:
    """`step` and `step_` of the optimizer `make` builds, checked by `reference`."""
    opt = Arg("opt", (Value(name, make),))
    return [
        Entry(
            f"{name}.step",
            _step,
            (opt, _params(), _grads(alias_ok=True), state(True)),
            reference=reference,
        ),
        Entry(
            f"{name}.step_",
            _step_,
            (opt, _params(), _grads(alias_ok=False), state(False)),
            reference=reference,
            pure=False,
        ),
    ]


def _init_entry(name: str, make: Callable[[Built], Any]) -> Entry:
    return Entry(
        f"{name}.init",
        lambda o, p: o.init(p) and None,
        (Arg("opt", (Value(name, make),)), _params()),
    )


_COUNTS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("-1", lambda: torch.tensor(-1.0, dtype=F64)),
    ("nan", lambda: torch.tensor(float("nan"), dtype=F64)),
    ("inf", lambda: torch.tensor(float("inf"), dtype=F64)),
    ("1.5", lambda: torch.tensor(1.5, dtype=F64)),
    ("float32", lambda: torch.tensor(1.0)),
    ("int64", lambda: torch.tensor(1)),
    ("meta", lambda: torch.zeros((), dtype=F64, device="meta")),
    ("a vector", lambda: torch.zeros(2, dtype=F64)),
    ("an int", lambda: 1),
    ("None", lambda: None),
    ("'1'", lambda: "1"),
)


def _called(make: Callable[[], Any]) -> Callable[[Built], Any]:
    return lambda b: make()


def _whole_states(init: Callable[[Built], Any], name: str) -> list[Value]:
    return [
        Value("state=None", lambda b: None, ("state",)),
        Value("state=dict", lambda b: init(b)._asdict(), ("state", "dict")),
        Value("state=tuple", lambda b: tuple(init(b)), ("state", "tuple")),
        Value(
            "state=the inner state",
            lambda b: init(b).inner_state,
            ("state", name),
        ),
    ]


# ---------------------------------------------------------------- MultiSteps

EVERY_K = 2


def _multi(b: Built) -> optim.MultiSteps:
    return optim.MultiSteps(ADAM.make(), every_k=EVERY_K)


def _multi_constructor() -> Entry:
    def build(optimizer: Any, **options: Any) -> None:
        optim.MultiSteps(optimizer, **options)

    inner = Arg(
        "optimizer",
        (Value("Adam", lambda b: ADAM.make()),),
        _not_optimizers("optimizer"),
    )
    options = constructor_args(optim.MultiSteps, {"optimizer": None, "every_k": 2})
    return Entry("MultiSteps(...)", build, (inner, *options[1:]))


def _multi_state(alias_ok: bool) -> Arg:
    def init(b: Built) -> Any:
        return b["opt"].init(base())

    def once(b: Built) -> Any:  # one call in: a sum held, `mini_step` 1
        return b["opt"].step(base(), base(shift=0.5), init(b))[1]

    inner_bad = [
        Value(
            f"inner_state: {v.label}",
            replaced(init, "inner_state", v.build),
            (*v.blame, "`inner_state`"),
        )
        for v in state_arg(ADAM, alias_ok=alias_ok).hostile
        if not v.label.startswith("state=")
    ][::3]  # a third of them: each field still meets several kinds
    _, acc_bad = paramdict_values(
        "acc_grads",
        lambda b: once(b).acc_grads,
        mapping_ok=False,
        kinds=("0-dim", "zero-size", "meta", "sparse", "complex64", "float64"),
    )
    hostile = [
        *(
            Value(
                f"mini_step={label}",
                replaced(once, "mini_step", _called(m)),
                ("`mini_step`",),
            )
            for label, m in _COUNTS
        ),
        *(
            Value(
                f"acc_grads: {v.label}",
                replaced(once, "acc_grads", v.build),
                (*v.blame, "`acc_grads`"),
            )
            for v in acc_bad
        ),
        *inner_bad,
        *_whole_states(init, "MultiStepsState"),
    ]
    if not alias_ok:
        hostile.append(
            Value(
                "acc_grads=the parameters",
                replaced(once, "acc_grads", lambda b: b["params"]),
                ("`acc_grads`", "'w'", "'b'", "share", "memory"),
            )
        )
    valid = (Value("init", init), Value("after one call", once))
    return Arg("state", valid, tuple(hostile))


def _multi_reference(
    opt: Any, p: ParamDict, g: Mapping[str, Tensor], s: Any
) -> dict[str, Tensor]:
    """Torch's Adam on the mean gradient on the `every_k`-th call, else nothing."""
    calls = int(s.mini_step) + 1
    grads = {k: g[k].detach().clone() for k in p}
    _plain(p, g, "grads")
    if calls > 1:
        _plain(p, s.acc_grads, "`acc_grads`")
    total = grads if calls == 1 else {k: s.acc_grads[k] + grads[k] for k in p}
    if calls < opt.every_k:
        return _as_given(p)
    mean = {k: v / opt.every_k for k, v in total.items()}
    return torch_step(ADAM, p, mean, s.inner_state)


def _multi_entries() -> list[Entry]:
    return [
        _multi_constructor(),
        _init_entry("MultiSteps", _multi),
        *_step_entries("MultiSteps", _multi, _multi_state, _multi_reference),
    ]


# ---------------------------------------------------------------- ClipGradNorm

MAX_NORM = 0.5


def _clip(b: Built) -> optim.ClipGradNorm[Any]:
    return optim.ClipGradNorm(ADAM.make(), max_norm=MAX_NORM)


def _clip_constructor() -> Entry:
    def build(optimizer: Any, **options: Any) -> None:
        optim.ClipGradNorm(optimizer, **options)

    inner = Arg(
        "optimizer",
        (Value("Adam", lambda b: ADAM.make()),),
        _not_optimizers("optimizer"),
    )
    options = constructor_args(
        optim.ClipGradNorm, {"optimizer": None, "max_norm": MAX_NORM}
    )
    return Entry("ClipGradNorm(...)", build, (inner, *options[1:]))


def _clip_reference(
    opt: Any, p: ParamDict, g: Mapping[str, Tensor], s: Any
) -> dict[str, Tensor]:
    """`torch.nn.utils.clip_grad_norm_` on copies, then torch's Adam."""
    _plain(p, g, "grads")
    grads = {k: g[k].detach().clone() for k in p}
    leaves = [torch.zeros_like(v, requires_grad=True) for v in grads.values()]
    for leaf, v in zip(leaves, grads.values()):
        leaf.grad = v
    torch.nn.utils.clip_grad_norm_(leaves, MAX_NORM, norm_type=opt.norm_type)
    clipped = {k: leaf.grad for k, leaf in zip(grads, leaves)}
    return torch_step(ADAM, p, clipped, s)


def _clip_entries() -> list[Entry]:
    return [
        _clip_constructor(),
        _init_entry("ClipGradNorm", _clip),
        *_step_entries(
            "ClipGradNorm",
            _clip,
            lambda alias_ok: state_arg(ADAM, alias_ok=alias_ok),
            _clip_reference,
        ),
    ]


# ---------------------------------------------------------------- ParamGroups

GROUPS = (("w", ADAM), ("b", ADAM_W))  # the group for 'w', the default for 'b'


def _groups(b: Built) -> optim.ParamGroups[Any]:
    return optim.ParamGroups({"w": ADAM.make()}, default=ADAM_W.make())


def _groups_constructor() -> Entry:
    def build(groups: Any, default: Any = OMIT) -> None:
        if default is OMIT:
            optim.ParamGroups(groups)
        else:
            optim.ParamGroups(groups, default=default)

    blame = ("group", "`groups`")
    groups = Arg(
        "groups",
        (
            Value("{'w': Adam}", lambda b: {"w": ADAM.make()}),
            Value("{('w', 'b'): Adam}", lambda b: {("w", "b"): ADAM.make()}),
            Value("{a predicate: Adam}", lambda b: {lambda n, t: True: ADAM.make()}),
        ),
        (
            Value("groups=None", lambda b: None, blame),
            Value("groups=pairs", lambda b: [("w", ADAM.make())], blame),
            Value("groups='w'", lambda b: "w", blame),
            Value("groups={'w': None}", lambda b: {"w": None}, blame),
            Value("groups={3: Adam}", lambda b: {3: ADAM.make()}, blame),
            Value("groups={(): Adam}", lambda b: {(): ADAM.make()}, blame),
            Value("groups={('w', 3): Adam}", lambda b: {("w", 3): ADAM.make()}, blame),
            Value(
                "groups={'w': torch's Adam class}",
                lambda b: {"w": torch.optim.Adam},
                blame,
            ),
            Value(
                "groups={'w': differentiable Adam}",
                lambda b: {"w": optim.Adam(differentiable=True)},
                ("`differentiable`",),
            ),
        ),
    )
    default = Arg(
        "default",
        (Value("default left out", lambda b: OMIT), Value("Adam", _adam_w)),
        _not_optimizers("default"),
        keyword=True,
    )
    return Entry("ParamGroups(...)", build, (groups, default))


def _adam_w(b: Built) -> Any:
    return ADAM_W.make()


def _minus_one() -> Tensor:
    return torch.tensor(-1.0, dtype=F64)


def _groups_state(alias_ok: bool) -> Arg:
    def init(b: Built) -> Any:
        return b["opt"].init(base())

    def own(i: int) -> Callable[[Built], Any]:
        return lambda b: init(b)[i]

    def group(i: int, make: Callable[[Built], Any]) -> Callable[[Built], Any]:
        def build(b: Built) -> Any:
            states = list(init(b))
            states[i] = make(b)
            return tuple(states)

        return build

    hostile = [
        Value("state=None", lambda b: None, ("state",)),
        Value("state=list", lambda b: list(init(b)), ("state", "list")),
        Value("state=one group's", lambda b: init(b)[:1], ("state", "1 entries")),
        Value("state=one more", lambda b: (*init(b), init(b)[0]), ("state", "3")),
        Value("state=an AdamState", lambda b: init(b)[0], ("state", "AdamState")),
        Value("state=groups swapped", lambda b: init(b)[::-1], ("'w'", "'b'", "state")),
        Value("state[0]=None", group(0, lambda b: None), ("state", "NoneType", "None")),
        Value(
            "state[1]=dict",
            group(1, lambda b: init(b)[1]._asdict()),
            ("state", "dict"),
        ),
    ]
    # One bad buffer entry in each group's state (the group's own key).
    for i, (key, spec) in enumerate(GROUPS):
        kinds = ("0-dim", "zero-size", "meta", "sparse", "complex64", "None")

        def like(b: Built, i: int = i) -> ParamDict:
            exp_avg: ParamDict = init(b)[i].exp_avg
            return exp_avg

        hostile += [
            Value(
                f"state[{i}].exp_avg: {v.label}",
                group(i, replaced(own(i), "exp_avg", v.build)),
                ("exp_avg", repr(key)),
            )
            for v in entry_values(like, kinds=kinds, keys=(key,))
        ]
        hostile.append(
            Value(
                f"state[{i}].step=-1",
                group(i, replaced(own(i), "step", _called(_minus_one))),
                ("`step`",),
            )
        )
        del spec
    valid: tuple[Value, ...] = (Value("init", init),)
    if alias_ok:
        valid += (
            Value(
                "exp_avg=the parameters",
                group(
                    0, lambda b: init(b)[0]._replace(exp_avg=b["params"].select("w"))
                ),
            ),
        )
    return Arg("state", valid, tuple(hostile))


def _groups_reference(
    opt: Any, p: ParamDict, g: Mapping[str, Tensor], s: Any
) -> dict[str, Tensor]:
    """One torch optimizer per group, each on its entries and its state."""
    out: dict[str, Tensor] = {}
    for (key, spec), sub in zip(GROUPS, s, strict=True):
        out.update(torch_step(spec, p.select(key), {key: g[key]}, sub))
    return {k: out[k] for k in p}


def _groups_entries() -> list[Entry]:
    return [
        _groups_constructor(),
        _init_entry("ParamGroups", _groups),
        *_step_entries("ParamGroups", _groups, _groups_state, _groups_reference),
    ]


ENTRIES = {
    "MultiSteps": _multi_entries(),
    "ClipGradNorm": _clip_entries(),
    "ParamGroups": _groups_entries(),
}

# Each wrapper's four entry points share a budget of twice the `FUZZ` count.
WRAPPER_FUZZ = settings(FUZZ, max_examples=2 * FUZZ.max_examples)


@pytest.mark.parametrize("wrapper", list(ENTRIES))
@WRAPPER_FUZZ
@given(data=st.data())
def test_fuzz_wrappers(wrapper: str, data: st.DataObject) -> None:
    """Hostile options, parameters and states: the plain reference or a clear error."""
    entry = data.draw(st.sampled_from(ENTRIES[wrapper]), label="entry")
    check_entry(entry, data)


@pytest.mark.parametrize(
    "entry", [e for entries in ENTRIES.values() for e in entries], ids=repr
)
def test_valid_values_give_the_reference(entry: Entry) -> None:
    """The last valid value of every argument: accepted, as the reference."""
    picks = {a.name: a.valid[-1] for a in entry.args}
    check_picks(entry, picks, set())
