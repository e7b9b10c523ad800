"""A fuzzer for the public entry points: torch's answer or a clear error, always.

An entry point is described once, as an `Entry`: the call, one `Arg` per argument
(with the values it is valid with and the hostile ones to try), the error types its
docstring promises, and, where torch has one, the torch equivalent. `check_entry`
then draws, with hypothesis, a valid or a hostile value for each argument (at most
two hostile at a time), builds them fresh, snapshots everything given
(`_unchanged.state`), makes the call, and asserts:

- if it returns: the arguments are unchanged (unless the entry is `pure=False`),
  and, where the entry has a `reference`, the torch equivalent run on a fresh build
  of the same arguments accepts them too and gives the same result (values, dtype,
  shape, device, `requires_grad`);
- if it raises: the error is one of the entry's documented types (never a raw
  `RuntimeError`, `IndexError`, `AttributeError` or a warning), it is a sentence
  that names one of the hostile values drawn (the argument, or the key of the bad
  entry: each hostile `Value` says what an error about it must name), valid values
  alone are never refused, and every tensor, counter and module given is exactly as
  it was (values, dtypes, shapes, strides, `requires_grad`, `.grad`, version
  counters, module parameters, buffers and attributes).

The value catalogues (`entry_values`, `paramdict_values`, `self_values`,
`number_values`, `operand_values`, `flag_values`, `not_callables`) hold the hostile
kinds: `None`, strings, bools, NaN, infinities
and negative numbers, 0-dim tensors where n-dim ones are expected and back,
zero-size, meta, sparse and complex tensors, other dtypes, another device (the meta
device stands in for one on CPU-only machines), aliases of another argument, plain
dicts where ParamDicts or NamedTuples are expected, and ParamDicts with missing or
extra keys or one bad entry.

Adding entry points (the optimizers, for instance) takes a table in a
`tests/hostile/test_fuzz_*.py` file and one parametrized test, e.g.::

    def _init(b: Built) -> Any:
        return b["opt"].init(b["params"])

    ENTRIES = [
        Entry(
            "Adam.step",
            lambda opt, p, g, s: opt.step(p, g, s),
            (
                Arg("opt", (Value("Adam", lambda b: optim.Adam(lr=0.1)),)),
                Arg("params", *self_values()),
                Arg("grads", *paramdict_values("grads", lambda b: positive())),
                Arg(
                    "state",
                    (Value("init", _init),),
                    (  # one hostile value per state field, each naming it
                        Value("step=-1", lambda b: _init(b)._replace(step=-1),
                              ("step",)),
                        Value("a dict", lambda b: _init(b)._asdict(), ("state",)),
                    ),
                ),
            ),
            reference=...,  # the same steps with torch.optim, where it has them
        ),
    ]

    @pytest.mark.parametrize("entry", params(ENTRIES))
    @FUZZ
    @given(data=st.data())
    def test_fuzz_optim(entry: Entry, data: st.DataObject) -> None:
        \"\"\"Hostile arguments: torch.optim's answer or a clear error.\"\"\"
        check_entry(entry, data)

A `Value`'s builder receives the arguments built so far (by name), so a later
argument can alias or mirror an earlier one (`lambda b: b["params"]`, marked
`alias_of="params"`). An in-place entry (`step_`, `to_module`) is `pure=False`:
only its error path must leave everything as it was; its `call` (and `reference`)
return what is to be compared, e.g. the parameters after the step.

Profiles: the tests use `FUZZ`, which runs `FUZZ_EXAMPLES` examples per entry point
in CI (the whole fuzz suite in under a minute on two cores). For a longer local run,
load the `fuzz-long` profile registered in `tests/conftest.py`:

    HYPOTHESIS_PROFILE=fuzz-long python -m pytest tests/hostile/test_fuzz_*.py

A failure prints the drawn values (`note`) and the seed to reproduce it.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _unchanged import difference, state
from hypothesis import HealthCheck, assume, note, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from torch import Tensor

from paramdict import ParamDict

__all__ = [
    "ENTRY_KINDS",
    "FUZZ",
    "FUZZ_EXAMPLES",
    "KEYS",
    "OMIT",
    "TENSOR_KINDS",
    "Arg",
    "Built",
    "Entry",
    "Value",
    "base",
    "check_entry",
    "check_picks",
    "constant",
    "entry_values",
    "flag_values",
    "not_callables",
    "number_values",
    "operand_values",
    "paramdict_values",
    "params",
    "per_entry",
    "positive",
    "same",
    "self_values",
]

Built = dict[str, Any]
"""The arguments built so far, by name."""

FUZZ_EXAMPLES = 25
"""Examples per entry point in CI; `fuzz-long` runs the profile's count instead."""

if os.environ.get("HYPOTHESIS_PROFILE") == "fuzz-long":
    FUZZ = settings()  # the loaded profile's own count
else:
    FUZZ = settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


class _Omitted:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omitted()
"""An argument left out, so its default applies."""


@dataclass(frozen=True)
class Value:
    """One value an argument can take: how to build it, and what an error must name.

    `blame` is empty for a valid value; for a hostile one it holds the strings an
    error caused by it may name (the argument's name, the bad entry's key as
    `'w'`): the error message must contain one of them. `alias_of` names the
    earlier argument a value is (the same object): when that one is hostile, an
    error may name either.
    """

    label: str
    build: Callable[[Built], Any]
    blame: tuple[str, ...] = ()
    alias_of: str = ""

    def __repr__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Arg:
    """An argument: its name, valid values and hostile values, and how it is passed."""

    name: str
    valid: tuple[Value, ...]
    hostile: tuple[Value, ...] = ()
    keyword: bool = False


@dataclass(frozen=True)
class Entry:
    """A public entry point, its arguments, its documented errors and torch's twin.

    `passed_on` lists the errors a function the user gave may raise and the entry
    point lets through unchanged, with a note (`add_note`) saying where it came
    from: `map` names the entry, the products name the function, `call` the
    module's forward.
    """

    name: str
    call: Callable[..., Any]
    args: tuple[Arg, ...]
    errors: tuple[type[Exception], ...] = (TypeError, ValueError)
    reference: Callable[..., Any] | None = None
    pure: bool = True
    passed_on: tuple[type[Exception], ...] = ()

    def __repr__(self) -> str:
        return self.name


def params(entries: Sequence[Entry]) -> list[Any]:
    """Return `entries` as pytest params with their names as ids (checked unique)."""
    names = [e.name for e in entries]
    assert len(set(names)) == len(names), sorted(
        {n for n in names if names.count(n) > 1}
    )
    return [pytest.param(e, id=e.name) for e in entries]


# ---------------------------------------------------------------- running one example


def _note(text: str) -> None:
    """Print `text` with a failing example (outside hypothesis: nowhere)."""
    if currently_in_test_context():
        note(text)


def _build(entry: Entry, picks: Mapping[str, Value]) -> Built:
    """Build every argument fresh, in order; reject the example if one cannot be."""
    built: Built = {}
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for arg in entry.args:
            try:
                built[arg.name] = picks[arg.name].build(built)
            except Exception:  # a value that cannot be built with the others
                assume(False)
    return built


def _invoke(entry: Entry, built: Built, call: Callable[..., Any]) -> Any:
    positional = [
        built[a.name] for a in entry.args if not a.keyword and built[a.name] is not OMIT
    ]
    keywords = {
        a.name: built[a.name]
        for a in entry.args
        if a.keyword and built[a.name] is not OMIT
    }
    return call(*positional, **keywords)


# Python's own refusal of an operand (an operator method returned `NotImplemented`):
# it names both operands' types.
_OPERATOR_PROTOCOL = re.compile(
    r"^unsupported operand type\(s\) for .+: '\w+' and '\w+'$"
)


def _is_sentence(text: str) -> bool:
    text = text.strip()
    return len(text) > 10 and text.endswith((".", ".)", ".`", "?"))


def check_entry(entry: Entry, data: st.DataObject) -> None:
    """Draw arguments for `entry`, call it, and check the outcome (see the module)."""
    fuzzable = [a.name for a in entry.args if a.hostile]
    chosen: set[str] = set()
    if fuzzable:
        chosen = data.draw(
            st.sets(st.sampled_from(fuzzable), max_size=2), label="hostile"
        )
    picks = {
        a.name: data.draw(
            st.sampled_from(a.hostile if a.name in chosen else a.valid), label=a.name
        )
        for a in entry.args
    }
    check_picks(entry, picks, chosen)


def check_picks(entry: Entry, picks: Mapping[str, Value], chosen: set[str]) -> None:
    """Build the values `picks`, call `entry`, and check the outcome (see the module).

    `chosen` names the arguments given hostile values.
    """
    _note(f"{entry.name}: {', '.join(f'{k}={v!r}' for k, v in picks.items())}")
    # torch's answer first, on a build of its own: torch warns some things once
    # per process, and it must be torch that sees them first.
    expected = _reference(entry, picks) if entry.reference is not None else None
    built = _build(entry, picks)
    given = list(built.values())
    before = state(given)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            result = _invoke(entry, built, entry.call)
        except Exception as err:
            _check_refusal(entry, picks, chosen, err)
            changed = difference(before, state(given))
            assert changed is None, (
                f"{entry.name} raised but changed its arguments at {changed}"
            )
            return
    if entry.pure:
        changed = difference(before, state(given))
        assert changed is None, f"{entry.name} changed its arguments at {changed}"
    ours = {(w.category, str(w.message)) for w in warned}
    if expected is None:
        assert not ours, f"{entry.name} warned: {sorted(m for _, m in ours)}"
        return
    answer, theirs = expected
    if isinstance(answer, Exception):
        msg = (
            f"{entry.name} accepted what torch refuses "
            f"({type(answer).__name__}: {answer})"
        )
        raise AssertionError(msg) from answer
    same(result, answer, entry.name)
    extra = sorted(m for c, m in ours - theirs)
    assert not extra, f"{entry.name} warned where torch does not: {extra}"


def _check_refusal(
    entry: Entry, picks: Mapping[str, Value], chosen: set[str], err: Exception
) -> None:
    # A note (`add_note`) is part of the message: `map` names the entry in one.
    text = "\n".join([str(err), *getattr(err, "__notes__", ())])
    _note(f"{entry.name} raised {type(err).__name__}: {text}")
    kind = type(err).__name__
    if not isinstance(err, (*entry.errors, *entry.passed_on)):
        msg = (
            f"{entry.name} raised {kind}, not one of "
            f"{[e.__name__ for e in entry.errors]}: {text}"
        )
        raise AssertionError(msg) from err
    names = sorted(
        {n for name in chosen for n in picks[name].blame}
        | {
            n
            for name, value in picks.items()
            if value.alias_of in chosen
            for n in (name, *picks[value.alias_of].blame)
        }
    )
    if names and isinstance(err, TypeError) and _OPERATOR_PROTOCOL.match(text):
        return
    if isinstance(err, entry.passed_on) and names:
        # Raised by a function the user gave, passed on as it is: a note says so
        # (from Python 3.11 on). Only that nothing changed is checked.
        noted = sys.version_info < (3, 11) or getattr(err, "__notes__", None)
        assert noted, f"{entry.name} passed on {kind} without a note: {text}"
        return
    if not names:
        msg = f"{entry.name} refused valid arguments: {kind}: {text}"
        raise AssertionError(msg) from err
    if not any(n in text for n in names):
        msg = f"{entry.name}'s {kind} names none of {names}: {text}"
        raise AssertionError(msg) from err
    # `KeyError` (a mapping's protocol) and what a user's function raised (passed
    # on unchanged, named in a note) are not ours to word.
    sentence = not isinstance(err, (KeyError, *entry.passed_on))
    if sentence and not _is_sentence(str(err)):
        msg = f"{entry.name}'s {kind} is not a sentence: {text!r}"
        raise AssertionError(msg) from err


def _reference(
    entry: Entry, picks: Mapping[str, Value]
) -> tuple[Any, set[tuple[type[Warning], str]]]:
    """Return torch's answer (or error) on a fresh build of `picks`, and warnings."""
    assert entry.reference is not None
    fresh = _build(entry, picks)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            answer = _invoke(entry, fresh, entry.reference)
        except Exception as err:
            answer = err
    return answer, {(w.category, str(w.message)) for w in warned}


def same(got: Any, expected: Any, path: str) -> None:
    """Assert that `got` is `expected`: keys, order, tensors' values and metadata."""
    if isinstance(expected, Mapping):
        assert isinstance(got, Mapping), f"{path}: {type(got).__name__}, not a mapping"
        assert list(got) == list(expected), (
            f"{path}: keys {list(got)} vs {list(expected)}"
        )
        for key in expected:
            same(got[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, Tensor):
        assert isinstance(got, Tensor), f"{path}: {type(got).__name__}, not a tensor"
        _same_tensor(got, expected, path)
    elif isinstance(expected, list | tuple):
        assert isinstance(got, list | tuple), f"{path}: {type(got).__name__}"
        assert len(got) == len(expected), f"{path}: {len(got)} vs {len(expected)} items"
        for i, (a, b) in enumerate(zip(got, expected)):
            same(a, b, f"{path}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert isinstance(got, float), f"{path}: {got!r} vs nan"
        assert math.isnan(got), f"{path}: {got!r} vs nan"
    else:
        assert got == expected, f"{path}: {got!r} vs {expected!r}"


def _same_tensor(got: Tensor, expected: Tensor, path: str) -> None:
    mine = (got.dtype, tuple(got.shape), got.device, got.requires_grad)
    theirs = (
        expected.dtype,
        tuple(expected.shape),
        expected.device,
        expected.requires_grad,
    )
    assert mine == theirs, (
        f"{path}: (dtype, shape, device, requires_grad) {mine} vs {theirs}"
    )
    if got.is_meta:
        return
    a = got.detach().to_dense() if got.layout != torch.strided else got.detach()
    b = expected.detach()
    b = b.to_dense() if b.layout != torch.strided else b
    torch.testing.assert_close(a, b, equal_nan=True, msg=lambda m: f"{path}: {m}")


# ---------------------------------------------------------------- the base values

KEYS = ("w", "b")
"""The keys of every base ParamDict: an error about an entry names `'w'` or `'b'`."""


def _w() -> Tensor:
    return torch.linspace(-1.0, 1.5, 6).reshape(2, 3)


def _b() -> Tensor:
    return torch.tensor([0.5, -1.5, 2.0])


def base(*, requires_grad: bool = False, shift: float = 0.0) -> ParamDict:
    """A float32 ParamDict `{'w': (2, 3), 'b': (3,)}`; `shift` gives other values."""
    return ParamDict(
        w=(_w() + shift).requires_grad_(requires_grad),
        b=(_b() * (1 + shift)).requires_grad_(requires_grad),
    )


def positive(*, requires_grad: bool = False) -> ParamDict:
    """A float32 ParamDict with base's keys and shapes and values in [0.5, 2]."""
    return ParamDict(
        w=torch.linspace(0.5, 2.0, 6).reshape(2, 3).requires_grad_(requires_grad),
        b=torch.tensor([0.75, 1.25, 2.0]).requires_grad_(requires_grad),
    )


# Each takes the good tensor of an entry and returns a hostile stand-in.
_ENTRY_VARIANTS: dict[str, Callable[[Tensor], Any]] = {
    "0-dim": lambda t: torch.tensor(0.25),
    "one more dim": lambda t: torch.stack([t.detach(), t.detach()]),
    "zero-size": lambda t: t.detach().new_zeros((0, *t.shape[1:])),
    "wrong shape": lambda t: torch.ones(5),
    "broadcastable (1,)": lambda t: torch.ones(1),
    "meta": lambda t: torch.empty_like(t, device="meta"),
    "sparse": lambda t: t.detach().to_sparse(),
    "complex64": lambda t: t.detach().to(torch.complex64),
    "float64": lambda t: t.detach().double(),
    "float16": lambda t: t.detach().half(),
    "int64": lambda t: t.detach().round().long(),
    "bool": lambda t: t.detach() > 0,
    "nan": lambda t: torch.full_like(t.detach(), math.nan),
    "inf": lambda t: torch.full_like(t.detach(), -math.inf),
    "non-contiguous": lambda t: torch.stack([t.detach(), t.detach()], -1)[..., 0],
    "requires grad": lambda t: t.detach().clone().requires_grad_(),
    "non-leaf": lambda t: t.detach().clone().requires_grad_() * 1,
    "None": lambda t: None,
    "float": lambda t: 1.5,
    "str": lambda t: "w",
    "list": lambda t: t.tolist(),
    "numpy": lambda t: t.detach().numpy().copy(),
}

ENTRY_KINDS = tuple(_ENTRY_VARIANTS)
"""The names of the hostile kinds of entry, for the tables."""

TENSOR_KINDS = ENTRY_KINDS[: ENTRY_KINDS.index("None")]
"""The kinds that are tensors (what a ParamDict can hold)."""


def entry_values(
    like: Callable[[Built], Mapping[str, Tensor]],
    *,
    kinds: Sequence[str] = ENTRY_KINDS,
    make: Callable[[dict[str, Any]], Any] = ParamDict,
    keys: Sequence[str] = KEYS,
) -> tuple[Value, ...]:
    """Mappings like `like(built)`, with one entry replaced by each hostile kind.

    `make` builds the mapping from a dict (a ParamDict, or `dict` for plain ones);
    an error about one of them must name its key.
    """
    out: list[Value] = []
    for key in keys:
        for kind in kinds:

            def build(b: Built, key: str = key, kind: str = kind) -> Any:
                good = dict(like(b))
                good[key] = _ENTRY_VARIANTS[kind](good[key])
                return make(good)

            out.append(Value(f"{kind} at {key!r}", build, (repr(key),)))
    return tuple(out)


def paramdict_values(
    name: str,
    like: Callable[[Built], Mapping[str, Tensor]],
    *,
    mapping_ok: bool = True,
    kinds: Sequence[str] = ENTRY_KINDS,
    also: Sequence[str] = (),
) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The valid and hostile values of an argument that takes a ParamDict like `like`.

    Valid: `like(built)` itself (and as a plain dict where `mapping_ok`). Hostile:
    not a mapping at all, keys missing or extra, an empty one, one bad entry, and a
    plain dict where only a ParamDict will do. `also` names more strings an error
    about the whole argument may use (an operator's symbol).
    """
    names = (name, *also)
    keyed = tuple(repr(k) for k in KEYS)
    valid = [Value(f"{name}", lambda b: ParamDict(like(b)))]
    hostile = [
        Value(f"{name}=None", lambda b: None, names),
        Value(f"{name}='w'", lambda b: "w", names),
        Value(f"{name}=tensor", lambda b: torch.ones(3), names),
        Value(f"{name}=pairs", lambda b: list(like(b).items()), names),
        Value(
            f"{name}=missing 'b'", lambda b: ParamDict(like(b)).exclude("b"), ("'b'",)
        ),
        Value(
            f"{name}=extra 'x'",
            lambda b: ParamDict(like(b)) | {"x": torch.ones(3)},
            ("'x'",),
        ),
        Value(f"{name}=empty", lambda b: ParamDict(), (*names, *keyed)),
        *entry_values(like, kinds=kinds),
    ]
    if mapping_ok:
        valid.append(Value(f"{name}=dict", lambda b: dict(like(b))))
        hostile.append(
            Value(
                f"{name}=dict with 1-dim 'w'",
                lambda b: dict(like(b)) | {"w": torch.ones(3)},
                ("'w'",),
            )
        )
    else:
        hostile.append(Value(f"{name}=dict", lambda b: dict(like(b)), names))
    return tuple(valid), tuple(hostile)


def number_values(
    name: str,
    valid: Sequence[float] = (0.5, 2),
    *,
    also: Sequence[str] = (),
    tensors_ok: bool = True,
) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The valid and hostile values of a number argument (valid: `valid`)."""
    names = (name, *also)
    good = [Value(f"{name}={v!r}", constant(v)) for v in valid]
    if tensors_ok:
        good.append(
            Value(f"{name}=0-dim tensor", lambda b: torch.tensor(float(valid[0])))
        )
    bad: list[tuple[str, Callable[[Built], Any]]] = [
        ("None", lambda b: None),
        ("'0.5'", lambda b: "0.5"),
        ("True", lambda b: True),
        ("nan", lambda b: math.nan),
        ("inf", lambda b: math.inf),
        ("-inf", lambda b: -math.inf),
        ("-1.0", lambda b: -1.0),
        ("0", lambda b: 0),
        ("1e308", lambda b: 1e308),
        ("10**40", lambda b: 10**40),
        ("numpy 0.5", lambda b: np.float64(0.5)),
        ("1j", lambda b: 1j),
        ("[0.5]", lambda b: [0.5]),
        ("tensor (2,)", lambda b: torch.ones(2)),
        ("nan tensor", lambda b: torch.tensor(math.nan)),
        ("int tensor", lambda b: torch.tensor(2)),
        ("meta tensor", lambda b: torch.tensor(0.5, device="meta")),
        ("tensor requiring grad", lambda b: torch.tensor(0.5, requires_grad=True)),
        ("ParamDict", lambda b: base()),
    ]
    # An error about a 0-dim tensor operand may name it by what it is.
    hostile = tuple(
        Value(
            f"{name}={label}", build, (*names, "0-dim") if "tensor" in label else names
        )
        for label, build in bad
    )
    return tuple(good), hostile


def constant(value: Any) -> Callable[[Built], Any]:
    """A builder that gives `value` itself (a number, a name: nothing to copy)."""
    return lambda b: value


def flag_values(name: str) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The valid (`True`, `False`, left out) and hostile values of a flag."""
    valid = (
        Value(f"{name}=True", lambda b: True),
        Value(f"{name}=False", lambda b: False),
        Value(f"{name} left out", lambda b: OMIT),
    )
    hostile = tuple(
        Value(f"{name}={label}", build, (name,))
        for label, build in (
            ("None", lambda b: None),
            ("'yes'", lambda b: "yes"),
            ("1", lambda b: 1),
            ("nan", lambda b: math.nan),
            ("tensor", lambda b: torch.tensor(True)),
        )
    )
    return valid, hostile


def not_callables(name: str) -> tuple[Value, ...]:
    """Hostile values for an argument that takes a function."""
    return tuple(
        Value(f"{name}={label}", build, (name,))
        for label, build in (
            ("None", lambda b: None),
            ("'f'", lambda b: "f"),
            ("tensor", lambda b: torch.ones(2)),
            ("ParamDict", lambda b: base()),
        )
    )


def per_entry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The torch reference of a per-entry method: `fn` on each entry, keyed alike.

    Arguments that are mappings give their entry for the key; anything else is
    passed as it is.
    """

    def reference(p: Mapping[str, Tensor], *args: Any, **kwargs: Any) -> dict[str, Any]:
        def pick(value: Any, key: str) -> Any:
            return value[key] if isinstance(value, Mapping) else value

        return {
            k: fn(
                v,
                *(pick(a, k) for a in args),
                **{n: pick(x, k) for n, x in kwargs.items()},
            )
            for k, v in p.items()
        }

    return reference


def self_values(
    like: Callable[[], ParamDict] = base,
    *,
    grad: Callable[[], ParamDict] | None = None,
    kinds: Sequence[str] = TENSOR_KINDS,
) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """The ParamDict a method runs on: `like()` (and `grad()`), or one bad entry."""
    valid = [Value("self", lambda b: like())]
    if grad is not None:
        valid.append(Value("self requiring grad", lambda b: grad()))
    keyed = tuple(repr(k) for k in KEYS)
    hostile = (
        *entry_values(lambda b: like(), kinds=kinds),
        Value("self=empty", lambda b: ParamDict(), (*keyed, "no key", "empty")),
    )
    return tuple(valid), hostile


def operand_values(
    name: str, *, also: Sequence[str] = ()
) -> tuple[tuple[Value, ...], tuple[Value, ...]]:
    """An operand: a number, a 0-dim tensor, or a mapping keyed like `self`."""
    numbers, bad_numbers = number_values(name, also=also)
    mappings, bad_mappings = paramdict_values(name, lambda b: positive(), also=also)
    valid = (
        *numbers,
        *mappings,
        Value(f"{name}=numbers per key", lambda b: {"w": 0.5, "b": 2.0}),
        Value(f"{name}=alias of self", lambda b: b["self"], alias_of="self"),
    )
    hostile = (
        *bad_numbers,
        *bad_mappings,
        Value(
            f"{name}=a number and a tensor",
            lambda b: {"w": 0.5, "b": torch.ones(3)},
            ("'w'", "'b'", name),
        ),
    )
    return valid, hostile
