"""Tampered pickles never load as a ParamDict that disagrees with itself.

A ParamDict pickles as `rebuild(name, dict(p))`: no state, and the class itself is not
a safe global, so `torch.load(weights_only=True)` refuses any file that names it (extra
slot state, `__new__` without `__init__`). Forgeries through `rebuild` (bad keys, bad
values, unknown classes) are refused by both `torch.load` and `pickle`; whatever does
load is a consistent ParamDict (its kept keys and values are exactly its entries).
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from paramdict import ParamDict
from paramdict._pytree import rebuild


@contextlib.contextmanager
def _forged(reduced: tuple[Any, ...]) -> Iterator[ParamDict]:
    """A ParamDict that pickles as `reduced` while the block runs."""
    original = ParamDict.__reduce__
    ParamDict.__reduce__ = lambda self: reduced  # type: ignore[method-assign]  # forging a file on purpose
    try:
        yield ParamDict()
    finally:
        ParamDict.__reduce__ = original  # type: ignore[method-assign]  # restored


_NEWOBJ: Any = vars(copyreg)["__newobj__"]  # what pickle calls for `cls.__new__`


def _torch_load(reduced: tuple[Any, ...]) -> Any:
    buf = io.BytesIO()
    with _forged(reduced) as p:
        torch.save(p, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _pickle_load(reduced: tuple[Any, ...]) -> Any:
    with _forged(reduced) as p:
        data = pickle.dumps(p)
    return pickle.loads(data)


LOADERS = pytest.mark.parametrize(
    "load", [_torch_load, _pickle_load], ids=["torch.load", "pickle"]
)


def consistent(q: object) -> None:
    """A loaded ParamDict's kept keys and values are exactly its entries."""
    assert isinstance(q, ParamDict)
    assert list(q._keys) == list(dict.keys(q))
    assert len(q._vals) == len(q)
    assert all(a is b for a, b in zip(q._vals, dict.values(q)))
    assert all(isinstance(k, str) for k in q)
    assert all(isinstance(v, torch.Tensor) for v in q.values())
    for key, value in q.items():  # what arithmetic computes is what indexing shows
        torch.testing.assert_close((q * 1)[key], value * 1, equal_nan=True)


def _ones() -> dict[str, torch.Tensor]:
    return {"w": torch.ones(2)}


_HIDDEN = torch.full((2,), 666.0)
_NAME = "paramdict._paramdict.ParamDict"
_NAMED_CLASS = "Unsupported global: GLOBAL paramdict._paramdict.ParamDict"

# Forgeries that name the class itself: `torch.load(weights_only=True)` refuses the
# class as a global before anything runs; `pickle` reaches our checks.
_WITH_CLASS: dict[str, tuple[Callable[[], tuple[Any, ...]], str]] = {
    "slot state _vals": (
        lambda: (ParamDict, (_ones(),), (None, {"_vals": [_HIDDEN]})),
        "extra state",
    ),
    "slot state _keys": (
        lambda: (ParamDict, (_ones(),), (None, {"_keys": ("x",)})),
        "extra state",
    ),
    "slot state both": (
        lambda: (
            ParamDict,
            (_ones(),),
            (None, {"_keys": ("x",), "_vals": [_HIDDEN]}),
        ),
        "extra state",
    ),
    "dict state": (
        lambda: (ParamDict, (_ones(),), {"_vals": [_HIDDEN]}),
        "extra state",
    ),
    "state with entries": (
        lambda: (ParamDict, (_ones(),), ({"w": _HIDDEN}, None)),
        "extra state",
    ),
    "newobj with state": (
        lambda: (_NEWOBJ, (ParamDict,), (None, {"_vals": [_HIDDEN]})),
        "extra state",
    ),
    "newobj with items": (
        lambda: (_NEWOBJ, (ParamDict,), None, None, iter(_ones().items())),
        "immutable",
    ),
    "class with int key": (lambda: (ParamDict, ({1: torch.ones(2)},)), "must be str"),
    "class with None value": (lambda: (ParamDict, ({"w": None},)), "'w': NoneType"),
    "class with two dicts": (
        lambda: (ParamDict, (_ones(), _ones())),
        "positional argument",
    ),
}

# Forgeries through `rebuild`, the one loading entry point: both loaders reach it.
_THROUGH_REBUILD: dict[str, tuple[Callable[[], tuple[Any, ...]], str]] = {
    "int key": (lambda: (rebuild, (_NAME, {1: torch.ones(2)})), "not str: 1"),
    "None key": (lambda: (rebuild, (_NAME, {None: torch.ones(2)})), "not str: None"),
    "None value": (lambda: (rebuild, (_NAME, {"w": None})), "'w': NoneType"),
    "int value": (lambda: (rebuild, (_NAME, {"w": 3})), "'w': int"),
    "str value": (lambda: (rebuild, (_NAME, {"w": "x"})), "'w': str"),
    "list value": (lambda: (rebuild, (_NAME, {"w": [1.0]})), "'w': list"),
    "pairs instead of a dict": (
        lambda: (rebuild, (_NAME, [("w", torch.ones(2))])),
        "plain dict of its entries, got list",
    ),
    "an int instead of a dict": (lambda: (rebuild, (_NAME, 5)), "got int"),
    "an unknown class": (
        lambda: (rebuild, ("os.system", _ones())),
        "class 'os.system'",
    ),
    "a class name that is not a str": (lambda: (rebuild, (1, _ones())), "class 1"),
    "a plain dict class name": (
        lambda: (rebuild, ("builtins.dict", _ones())),
        "class 'builtins.dict'",
    ),
    "state after rebuild": (
        lambda: (rebuild, (_NAME, _ones()), (None, {"_vals": [_HIDDEN]})),
        "extra state|Can only build",
    ),
    "too many arguments": (
        lambda: (rebuild, (_NAME, _ones(), _ones())),
        r"`rebuild\(name, entries\)`, two arguments; this file gives 3",
    ),
}


@pytest.mark.parametrize("name", list(_WITH_CLASS))
def test_torch_load_refuses_files_that_name_the_class(name: str) -> None:
    """With `weights_only=True`, a file cannot name the class, so none of these load."""
    build, _ = _WITH_CLASS[name]
    with pytest.raises(pickle.UnpicklingError, match=_NAMED_CLASS):
        _torch_load(build())


@pytest.mark.parametrize("name", list(_WITH_CLASS))
def test_pickle_refuses_forged_state_and_entries(name: str) -> None:
    """Through `pickle`, forged state and bad entries are refused by the class."""
    build, match = _WITH_CLASS[name]
    with pytest.raises(TypeError, match=match):
        _pickle_load(build())


@LOADERS
@pytest.mark.parametrize("name", list(_THROUGH_REBUILD))
def test_forgeries_through_rebuild_are_refused(
    load: Callable[..., Any], name: str
) -> None:
    """Each forged call of `rebuild` raises, naming what is wrong."""
    build, match = _THROUGH_REBUILD[name]
    with pytest.raises(Exception, match=match) as info:
        load(build())
    assert isinstance(info.value, TypeError | ValueError | pickle.UnpicklingError)


def test_torch_load_cannot_make_an_instance_without_init() -> None:
    """`cls.__new__(cls)` alone is refused: the class is not a safe global."""
    with pytest.raises(pickle.UnpicklingError, match=_NAMED_CLASS):
        _torch_load((_NEWOBJ, (ParamDict,)))


@LOADERS
def test_a_genuine_file_round_trips(load: Callable[..., Any]) -> None:
    """The reduce tuple a ParamDict writes itself loads back equal and consistent."""
    p = ParamDict(w=torch.ones(2), b=torch.zeros(()))
    q = load(p.__reduce__())
    consistent(q)
    assert q == p
    assert list(q) == list(p)


def test_a_serialized_treespec_with_bad_keys_is_refused() -> None:
    """Tree specs read back from JSON must hold str keys, once each."""
    from torch.utils import _pytree as pytree

    p = ParamDict(w=torch.ones(1), b=torch.ones(1))
    spec = pytree.tree_structure(p)
    text = pytree.treespec_dumps(spec)
    assert pytree.treespec_loads(text) == spec
    for bad, error in (('["w", 1]', TypeError), ('["w", "w"]', ValueError)):
        forged = text.replace('["w", "b"]', bad)
        assert forged != text
        with pytest.raises(error, match="ParamDict treespec"):
            pytree.treespec_loads(forged)


_keys = st.one_of(st.text(max_size=3), st.integers(-2, 2), st.none())
_values = st.one_of(
    st.builds(torch.full, st.just((2,)), st.floats(-1e3, 1e3) | st.just(math.nan)),
    st.none(),
    st.integers(),
    st.lists(st.floats(allow_nan=False), max_size=2),
)
_slot_states = st.dictionaries(
    st.sampled_from(["_keys", "_vals", "other"]),
    st.one_of(
        st.lists(_values, max_size=3),
        st.tuples(st.text(max_size=2)),
        st.none(),
    ),
    max_size=3,
)


@given(
    entries=st.dictionaries(_keys, _values, max_size=3),
    slots=st.one_of(st.none(), _slot_states),
    via_rebuild=st.booleans(),
    loader=st.sampled_from([_torch_load, _pickle_load]),
)
def test_whatever_loads_never_disagrees_with_itself(
    entries: dict[Any, Any],
    slots: dict[str, Any] | None,
    via_rebuild: bool,
    loader: Callable[..., Any],
) -> None:
    """Random forged reduce tuples either raise or load consistently."""
    if via_rebuild:
        reduced: tuple[Any, ...] = (rebuild, (_NAME, entries))
    else:
        reduced = (ParamDict, (entries,))
    if slots is not None:
        reduced = (*reduced, (None, slots))
    try:
        q = loader(reduced)
    except (TypeError, ValueError, pickle.UnpicklingError):
        return
    consistent(q)
    assert slots is None  # any state at all is refused
    assert list(q) == list(entries)
