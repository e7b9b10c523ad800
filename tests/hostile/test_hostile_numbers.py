"""Numbers torch cannot read, options of the wrong kind, and arguments named.

An int beyond 64 bits, a float the entries' dtype cannot hold where torch converts
it, a flag given as a string: each is refused by name before anything runs (never
torch's bare `OverflowError` or parser message), or, where torch answers (`p *
1e308` is infinite), answered alike. Errors about one argument of several name it.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(w=torch.tensor([[0.5, -1.0], [2.0, 3.0]]), b=torch.tensor([1.5]))


def _c(name: str, build: Any, call: Any, error: Any, match: str) -> Case:
    return Case(name, build, call, error, match)


_BIG = 10**40


CASES = unique_ids(
    [
        # ints beyond 64 bits
        _c(
            "p + big int",
            lambda: (_p(),),
            lambda p: p + _BIG,
            ValueError,
            r"`\+` got the int 1000+, which is beyond 64 bits(?s:.*)float",
        ),
        _c(
            "add alpha big int",
            lambda: (_p(),),
            lambda p: p.add(p, alpha=_BIG),
            ValueError,
            r"`add`'s `alpha` got the int 1000+, which is beyond 64 bits",
        ),
        _c(
            "clip_norm big int",
            lambda: (_p(),),
            lambda p: p.clip_norm(_BIG),
            ValueError,
            r"`clip_norm`'s `max_norm` got the int 1000+",
        ),
        _c(
            "full_like big int",
            lambda: (_p(),),
            lambda p: p.full_like(_BIG),
            ValueError,
            r"`full_like`'s `fill_value` got the int 1000+",
        ),
        _c(
            "norm big int",
            lambda: (_p(),),
            lambda p: p.norm(_BIG),
            ValueError,
            r"`norm`'s `p` got the int 1000+",
        ),
        # floats the entries' dtype cannot hold, where torch converts them
        _c(
            "add alpha 1e308",
            lambda: (_p(),),
            lambda p: p.add(0.5, alpha=1e308),
            ValueError,
            r"`add`'s `alpha` got 1e\+308, which float32 cannot hold",
        ),
        _c(
            "lerp weight 1e308",
            lambda: (_p(),),
            lambda p: p.lerp(p, 1e308),
            ValueError,
            r"`lerp`'s `weight` got 1e\+308, which float32 cannot hold",
        ),
        _c(
            "clamp max 1e308",
            lambda: (_p(),),
            lambda p: p.clamp(max=-1e308),
            ValueError,
            r"`clamp`'s `max` got -1e\+308, which float32",
        ),
        _c(
            "addcmul value 1e308",
            lambda: (_p(),),
            lambda p: p.addcmul(p, p, value=1e308),
            ValueError,
            r"`addcmul`'s `value` got 1e\+308, which float32 cannot hold",
        ),
        _c(
            "maximum 1e308",
            lambda: (_p(),),
            lambda p: p.maximum(1e308),
            ValueError,
            r"`maximum` got 1e\+308, which float32 cannot hold",
        ),
        # arguments named among several
        _c(
            "lerp weight None",
            lambda: (_p(),),
            lambda p: p.lerp(p, None),
            TypeError,
            r"`lerp`'s `weight` takes a number",
        ),
        _c(
            "lerp end None",
            lambda: (_p(),),
            lambda p: p.lerp(None, 0.5),
            TypeError,
            r"`lerp`'s `end` takes a mapping",
        ),
        _c(
            "addcdiv tensor2 missing a key",
            lambda: (_p(),),
            lambda p: p.addcdiv(p, p.exclude("b")),
            ValueError,
            r"Keys differ in `addcdiv`'s `tensor2`: missing \['b'\]",
        ),
        _c(
            "clamp min a list",
            lambda: (_p(),),
            lambda p: p.clamp(min=[0.0]),
            TypeError,
            r"`clamp`'s `min` takes a number",
        ),
        _c(
            "where condition None",
            lambda: (_p(),),
            lambda p: p.where(None, 0.0),
            TypeError,
            r"`where`'s `condition` takes a mapping",
        ),
        _c(
            "allclose rtol -1",
            lambda: (_p(),),
            lambda p: p.allclose(p, rtol=-1.0),
            ValueError,
            r"`allclose` takes `rtol` >= 0, got -1\.0",
        ),
        _c(
            "allclose atol nan",
            lambda: (_p(),),
            lambda p: p.allclose(p, atol=math.nan),
            ValueError,
            r"`allclose` takes `atol` >= 0, got nan",
        ),
        _c(
            "allclose atol str",
            lambda: (_p(),),
            lambda p: p.allclose(p, atol="0"),
            TypeError,
            r"`allclose` takes a number as `atol`, got str",
        ),
        # flags and options of the wrong kind
        _c(
            "allclose equal_nan str",
            lambda: (_p(),),
            lambda p: p.allclose(p, equal_nan="yes"),
            TypeError,
            r"`allclose` takes True or False as `equal_nan`, got 'yes'",
        ),
        _c(
            "requires_grad_ str",
            lambda: (_p(),),
            lambda p: p.requires_grad_("no"),
            TypeError,
            r"`requires_grad_` takes True or False as `requires_grad`",
        ),
        _c(
            "zeros_like dtype str",
            lambda: (_p(),),
            lambda p: p.zeros_like(dtype="float64"),
            TypeError,
            r"`zeros_like` takes a torch\.dtype(?s:.*)as `dtype`, got 'float64'",
        ),
        _c(
            "ones_like device nowhere",
            lambda: (_p(),),
            lambda p: p.ones_like(device="nowhere"),
            ValueError,
            r"`ones_like`: `device` 'nowhere' is not a device",
        ),
        _c(
            "randn_like int dtype",
            lambda: (_p(),),
            lambda p: p.randn_like(dtype=torch.int32),
            ValueError,
            r"`randn_like` draws normal samples, which a torch\.int32 tensor cannot",
        ),
        _c(
            "empty_like int requiring grad",
            lambda: (_p(),),
            lambda p: p.empty_like(dtype=torch.int32, requires_grad=True),
            ValueError,
            r"`empty_like` cannot make torch\.int32 tensors that require grad",
        ),
        # the containers' own arguments
        _c(
            "fromkeys None",
            lambda: (None,),
            lambda keys: ParamDict.fromkeys(keys, torch.ones(1)),
            TypeError,
            r"`fromkeys` takes an iterable of str keys, got NoneType",
        ),
        _c(
            "stack one mapping",
            lambda: (_p(),),
            ParamDict.stack,
            TypeError,
            r"`stack` takes an iterable of mappings as `paramdicts`, got one mapping",
        ),
        _c(
            "map fn None",
            lambda: (_p(),),
            lambda p: p.map(None),
            TypeError,
            r"`map` takes a function as `fn`, got NoneType",
        ),
        _c(
            "map_to_dict fn str",
            lambda: (_p(),),
            lambda p: p.map_to_dict("f"),
            TypeError,
            r"`map_to_dict` takes a function as `fn`, got str",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_bad_numbers_flags_and_arguments_are_named(case: Case) -> None:
    """Each is refused naming the argument, before anything runs; nothing changes."""
    check(case)


def test_a_product_by_a_huge_number_is_torch_s() -> None:
    """`p * 1e308` is infinite in float32, as `torch.mul` gives it (not an error)."""
    p = _p()
    for op in ("__mul__", "__truediv__"):
        got = getattr(p, op)(1e308)
        for key, value in p.items():
            torch.testing.assert_close(got[key], getattr(value, op)(1e308))
