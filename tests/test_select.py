import fnmatch
from typing import Any

import pytest
import torch
from _helpers import MyParams
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from paramdict import ParamDict

KEYS = [
    "encoder.0.weight",
    "encoder.0.bias",
    "encoder.norm.weight",
    "head.weight",
    "head.bias",
    "Head.scale",
    "temperature",
]


def _params(cls: type[ParamDict] = ParamDict) -> Any:
    return cls({k: torch.full((i + 1,), float(i)) for i, k in enumerate(KEYS)})


def _same_objects(out: ParamDict, p: ParamDict) -> bool:
    return all(out[k] is p[k] for k in out)


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (("*.bias",), ["encoder.0.bias", "head.bias"]),
        (("encoder.*",), ["encoder.0.weight", "encoder.0.bias", "encoder.norm.weight"]),
        (("head.*",), ["head.weight", "head.bias"]),  # case-sensitive
        (("temperature",), ["temperature"]),
        (("encoder.?.*",), ["encoder.0.weight", "encoder.0.bias"]),
        (
            ("[Hh]ead.*", "temperature"),
            ["head.weight", "head.bias", "Head.scale", "temperature"],
        ),
        (("*.bias", "head.*"), ["encoder.0.bias", "head.weight", "head.bias"]),
        ((), []),
    ],
)
def test_select_keeps_matching_keys_in_order(
    patterns: tuple[str, ...], expected: list[str]
) -> None:
    """`select` keeps the keys any pattern matches, in the ParamDict's order."""
    p = _params()
    out = p.select(*patterns)
    assert type(out) is ParamDict
    assert list(out) == expected
    assert list(out) == [
        k for k in KEYS if any(fnmatch.fnmatchcase(k, pat) for pat in patterns)
    ]
    assert _same_objects(out, p)


def test_exclude_is_the_complement_of_select() -> None:
    """`exclude` keeps exactly what `select` drops, in order, same tensor objects."""
    p = _params()
    out = p.exclude("*.bias", "temperature")
    assert list(out) == [
        "encoder.0.weight",
        "encoder.norm.weight",
        "head.weight",
        "Head.scale",
    ]
    assert _same_objects(out, p)
    assert list(p.exclude()) == KEYS


@pytest.mark.parametrize("method", ["select", "exclude"])
def test_pattern_matching_nothing_is_named(method: str) -> None:
    """Patterns that match no key raise a ValueError naming them, sorted."""
    p = _params()
    with pytest.raises(
        ValueError, match=r"the patterns \['decoder\.\*', 'tmp'\] match no"
    ):
        getattr(p, method)("*.bias", "tmp", "decoder.*")
    out = getattr(p, method)("*.bias", "tmp", missing_ok=True)
    assert list(out) == list(getattr(p, method)("*.bias"))


@pytest.mark.parametrize("method", ["select", "exclude"])
def test_patterns_must_be_strings(method: str) -> None:
    """A list passed instead of unpacked patterns is a TypeError with the fix."""
    with pytest.raises(TypeError, match=r"got list\. Unpack a list"):
        getattr(_params(), method)(["*.bias"])


def test_filter_by_key_and_value() -> None:
    """`filter` keeps the entries its predicate accepts, any truth value."""
    p = _params()
    out = p.filter(lambda k, v: k.startswith("head") and v.numel() > 4)
    assert list(out) == ["head.bias"]
    assert list(p.filter(lambda k, v: v.numel() % 2)) == KEYS[::2]
    assert _same_objects(out, p)


def test_filter_refuses_tensor_verdicts() -> None:
    """A predicate returning a tensor is a TypeError naming the key (no hidden sync)."""
    with pytest.raises(TypeError, match=r"returned a tensor for 'encoder\.0\.weight'"):
        _params().filter(lambda k, v: v.sum() > 0)


def test_trainable_keeps_values_that_require_grad() -> None:
    """`trainable` keeps the entries whose value requires grad."""
    model = nn.BatchNorm1d(3)
    model.bias.requires_grad_(False)
    p = ParamDict.from_module(model, buffers=True)
    assert list(p.trainable()) == ["weight"]
    assert p.trainable()["weight"] is model.weight


def test_prefixed_and_scoped_are_inverse() -> None:
    """`scoped` strips what `prefixed` adds; unrelated keys are left out."""
    p = _params()
    enc = p.scoped("encoder")
    assert list(enc) == ["0.weight", "0.bias", "norm.weight"]
    assert _same_objects(enc.prefixed("encoder"), p)
    assert list(enc.prefixed("encoder")) == KEYS[:3]
    assert list(p.scoped("encoder.0")) == ["weight", "bias"]
    assert list(p.scoped("")) == KEYS
    assert list(p.prefixed("")) == KEYS


def test_scoped_needs_a_dot_boundary() -> None:
    """`scoped("enc")` does not match `encoder.*`, and a key equal to it is left out."""
    p = ParamDict(
        {"enc": torch.ones(1), "encoder.w": torch.ones(1), "enc.w": torch.ones(1)}
    )
    assert list(p.scoped("enc")) == ["w"]
    with pytest.raises(ValueError, match=r"no key starts with 'decoder\.'"):
        p.scoped("decoder")
    assert list(p.scoped("decoder", missing_ok=True)) == []


@pytest.mark.parametrize("method", ["scoped", "prefixed"])
def test_prefix_errors(method: str) -> None:
    """A trailing dot is a ValueError with the fix; a non-str a TypeError."""
    p = _params()
    with pytest.raises(ValueError, match=r"pass 'encoder'"):
        getattr(p, method)("encoder.")
    with pytest.raises(TypeError, match="takes a str prefix, got int"):
        getattr(p, method)(0)


def test_scoped_runs_a_submodule() -> None:
    """`scoped` gives a submodule's parameters, ready for `call` on it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    p = ParamDict.from_module(model) * 2
    x = torch.randn(5, 3)
    out = p.scoped("2").call(model[2], p.scoped("0").call(model[0], x).tanh())
    torch.testing.assert_close(out, p.call(model, x))


def test_selections_keep_the_subclass() -> None:
    """Every selection returns the subclass it was called on."""
    p = _params(MyParams)
    for out in (
        p.select("*.bias"),
        p.exclude("*.bias"),
        p.filter(lambda k, v: True),
        p.trainable(),
        p.prefixed("model"),
        p.scoped("encoder"),
        p.select(),
    ):
        assert type(out) is MyParams


_key = st.text("ab.", min_size=1, max_size=4)
_pattern = st.text("ab.*?", min_size=1, max_size=4)


@given(st.lists(_key, max_size=6, unique=True), st.lists(_pattern, max_size=3))
def test_select_and_exclude_partition_the_keys(
    keys: list[str], patterns: list[str]
) -> None:
    """`select` and `exclude` split the keys into two ordered, disjoint parts."""
    p = ParamDict({k: torch.tensor(float(i)) for i, k in enumerate(keys)})
    inside = p.select(*patterns, missing_ok=True)
    outside = p.exclude(*patterns, missing_ok=True)
    assert set(inside).isdisjoint(outside)
    assert sorted([*inside, *outside], key=keys.index) == keys
    assert list(inside) == [k for k in keys if k in inside]
    assert (inside | outside) == p


@given(
    st.lists(_key, max_size=6, unique=True), _key.filter(lambda s: not s.endswith("."))
)
def test_prefixed_then_scoped_round_trips(keys: list[str], prefix: str) -> None:
    """`p.prefixed(x).scoped(x)` is `p`, for any keys and prefix."""
    p = ParamDict({k: torch.tensor(float(i)) for i, k in enumerate(keys)})
    back = p.prefixed(prefix).scoped(prefix, missing_ok=True)
    assert list(back) == keys
    assert _same_objects(back, p)
