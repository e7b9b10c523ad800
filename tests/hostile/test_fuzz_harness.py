"""The fuzzer itself: each of its checks fails on the defect it is there to catch.

Toy entry points with a known defect (a raw `RuntimeError`, an error that names
nothing, a write before refusing, an answer unlike torch's, a valid input refused)
are run through `check_picks`, which must fail on each; and the snapshots of
`_unchanged` must see every kind of change the fuzzer promises to catch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import attrs
import pytest
import torch
from _unchanged import difference, state
from fuzz import Arg, Entry, Value, check_picks
from torch import Tensor, nn

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(w=torch.ones(2))


_GOOD = Value("good", lambda b: _p())
_BAD = Value("bad", lambda b: _p(), ("'w'",))


def _run(call: Any, *, bad: bool = True, reference: Any = None) -> None:
    entry = Entry("toy", call, (Arg("p", (_GOOD,), (_BAD,)),), reference=reference)
    check_picks(entry, {"p": _BAD if bad else _GOOD}, {"p"} if bad else set())


def _raw(p: ParamDict) -> None:
    msg = "a raw kernel error"
    raise RuntimeError(msg)


def _unnamed(p: ParamDict) -> None:
    msg = "Something is wrong somewhere."
    raise ValueError(msg)


def _named(p: ParamDict) -> None:
    msg = "The entry 'w' is wrong."
    raise ValueError(msg)


def _writes_then_refuses(p: ParamDict) -> None:
    p["w"].add_(1)
    _named(p)


def _half(p: ParamDict) -> ParamDict:
    return p / 2


def test_a_clear_error_naming_the_key_passes() -> None:
    """The control: a named `ValueError` that changes nothing is accepted."""
    _run(_named)


def test_a_raw_error_fails() -> None:
    """A `RuntimeError` is not a documented error type."""
    with pytest.raises(AssertionError, match="raised RuntimeError, not one of"):
        _run(_raw)


def test_an_error_naming_nothing_fails() -> None:
    """The error must name the hostile argument or key."""
    with pytest.raises(AssertionError, match=r"names none of \[\"'w'\"\]"):
        _run(_unnamed)


def test_a_write_before_refusing_fails() -> None:
    """An argument changed on the error path is caught."""
    with pytest.raises(AssertionError, match="raised but changed its arguments"):
        _run(_writes_then_refuses)


def test_a_refused_valid_input_fails() -> None:
    """Valid values alone must not be refused."""
    with pytest.raises(AssertionError, match="refused valid arguments"):
        _run(_named, bad=False)


def test_an_answer_unlike_torch_s_fails() -> None:
    """A result that differs from the reference is caught."""
    with pytest.raises(AssertionError, match=r"toy\['w'\]: Tensor-likes are not close"):
        _run(_half, bad=False, reference=lambda p: {"w": p["w"] / 3})


def test_accepting_what_torch_refuses_fails() -> None:
    """Succeeding where the reference raises is caught."""
    with pytest.raises(AssertionError, match="accepted what torch refuses"):
        _run(_half, bad=False, reference=_raw)


@attrs.define
class _Counter:
    step: int
    cache: dict[str, int] = attrs.field(init=False, factory=dict)


@dataclass
class _Moments:
    count: int
    buffer: Tensor = field(default_factory=lambda: torch.zeros(2))


def test_snapshots_see_counters_fields_strides_and_module_attributes() -> None:
    """Every kind of change the fuzzer promises to catch changes the snapshot."""
    counter, moments = _Counter(3), _Moments(1)
    module = nn.Linear(2, 2)
    setattr(module, "scale", 1.0)  # noqa: B010  # a plain attribute, not a tensor
    tensor = torch.ones(2, 2)
    given = [counter, moments, module, tensor]
    before = state(given)
    counter.cache["k"] = 1  # a cache the object sets for itself: not observable
    assert difference(before, state(given)) is None
    changes: list[Callable[[], object]] = [
        lambda: setattr(counter, "step", 4),
        lambda: setattr(moments, "count", 2),
        lambda: moments.buffer.add_(1),
        lambda: setattr(module, "scale", 2.0),
        lambda: module.register_forward_hook(lambda *a: None),
        lambda: module.weight.grad,  # reading changes nothing
        lambda: tensor.t_(),  # the strides
    ]
    seen = []
    for change in changes:
        before = state(given)
        change()
        seen.append(difference(before, state(given)) is not None)
    assert seen == [True, True, True, True, True, False, True]
