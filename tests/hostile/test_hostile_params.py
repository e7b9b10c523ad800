"""Hostile parameters: meta, integer, bool and empty entries, refused by key.

Meta tensors have no memory for `step_` to write into; integer and bool entries
are not what an optimizer updates; Adafactor cannot scale an entry without
elements (torch.optim.Adafactor divides by zero on it). Every case checks the
error names the entries and the fix, and that nothing changed.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _unchanged import Case, check, unique_ids

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
from optim_cases import TABLE as ROWS  # the shared optimizer case table

from paramdict import ParamDict, optim


def _shapes(matrices_only: bool) -> dict[str, tuple[int, ...]]:
    return {"w": (3, 2), "b": (2, 2)} if matrices_only else {"w": (3,), "b": (2,)}


def _params(matrices_only: bool, **kwargs: Any) -> ParamDict:
    shapes = _shapes(matrices_only)
    return ParamDict(
        {
            k: torch.linspace(-1, 1, s.numel()).reshape(s).to(**kwargs)
            for k, s in ((k, torch.Size(v)) for k, v in shapes.items())
        }
    )


Make = Callable[[], optim.Optimizer[Any]]


def _rows() -> list[tuple[str, Make, bool]]:
    rows: list[tuple[str, Make, bool]] = []
    for case in ROWS:
        make: Make = case.make
        if case.matrices_only and case.classes is not None:  # the class itself
            cls: Callable[..., optim.Optimizer[Any]] = case.classes[0]
            make = functools.partial(cls, **case.rich)
        rows.append((case.name, make, case.matrices_only))
    return rows


@pytest.mark.parametrize(
    ("name", "make", "matrices"), _rows(), ids=[r[0] for r in _rows()]
)
def test_meta_params_step_in_place(name: str, make: Make, matrices: bool) -> None:
    """`step_` on meta tensors runs as on real ones (how shapes are traced).

    Meta tensors hold no memory: the step checks them, runs its kernels for
    their shapes and dtypes, and writes nothing; so does `step`.
    """
    del name
    params = _params(matrices, device="meta")
    opt = make()
    state = opt.init(params)
    new, new_state = opt.step_(params, params.full_like(0.5), state)
    assert new is params
    assert all(v.is_meta for v in new.values())
    stepped, _ = opt.step(params, params.full_like(0.5), new_state)
    assert all(v.is_meta and v.shape == params[k].shape for k, v in stepped.items())


def test_meta_params_with_real_state_refused() -> None:
    """Meta parameters with a state on the CPU are refused naming the meta ones."""
    opt = optim.SGD(lr=0.1, momentum=0.9)

    def build() -> Any:
        params = _params(False, device="meta")
        state = opt.init(_params(False))
        return params, params.full_like(0.5), state

    check(Case("mixed", build, opt.step_, (TypeError, ValueError), r"meta"))


_KINDS: list[tuple[str, torch.dtype]] = [
    ("int64", torch.int64),
    ("int32", torch.int32),
    ("bool", torch.bool),
    ("complex", torch.complex64),
]


def _integer_cases() -> list[Case]:
    cases: list[Case] = []
    for name, make, matrices in _rows():
        for kind, dtype in _KINDS:
            for method in ("init", "step", "step_"):

                def build(
                    make: Make = make, matrices: bool = matrices, dtype: Any = dtype
                ) -> Any:
                    real = _params(matrices)
                    opt = make()
                    state = opt.init(real)
                    params = real.to(dtype)
                    return opt, params, params.map(torch.ones_like), state

                def call(opt: Any, p: Any, g: Any, s: Any, m: str = method) -> Any:
                    return opt.init(p) if m == "init" else getattr(opt, m)(p, g, s)

                cases.append(
                    Case(
                        f"{name}-{kind}-{method}",
                        build,
                        call,
                        TypeError,
                        r"real floating-point tensors; \['b', 'w'\] are not"
                        r"(?s:.*)`\.to\(dtype\)`",
                    )
                )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _integer_cases()])
def test_integer_and_bool_params_refused_by_key(case: Case) -> None:
    """Integer, bool and complex parameters are refused by key; nothing changes."""
    check(case)


_EMPTY_SHAPES = [(0,), (3, 0), (0, 3), (0, 0), (2, 0, 3)]


@pytest.mark.parametrize("shape", _EMPTY_SHAPES, ids=str)
def test_torch_adafactor_fails_on_empty_entries(shape: tuple[int, ...]) -> None:
    """torch.optim.Adafactor cannot step an entry without elements (the reference)."""
    weight = torch.nn.Parameter(torch.ones(shape))
    weight.grad = torch.ones(shape)
    with pytest.raises(ZeroDivisionError):
        torch.optim.Adafactor([weight]).step()  # type: ignore[no-untyped-call]  # torch's annotation


@pytest.mark.parametrize("shape", _EMPTY_SHAPES, ids=str)
def test_adafactor_refuses_empty_entries_at_init(shape: tuple[int, ...]) -> None:
    """Adafactor's `init` refuses entries without elements by key; nothing changes."""
    params = ParamDict(w=torch.ones(2, 2), e=torch.ones(shape), f=torch.ones(shape))
    check(
        Case(
            str(shape),
            lambda: (params,),
            optim.Adafactor().init,
            ValueError,
            r"without elements; \['e', 'f'\] have none(?s:.*)`\.exclude",
        )
    )


@pytest.mark.parametrize("method", ["step", "step_"])
def test_adafactor_refuses_empty_entries_at_step(method: str) -> None:
    """A hand-made state for an empty entry is refused at the step; nothing changes."""
    opt = optim.Adafactor()

    def build() -> Any:
        params = ParamDict(w=torch.ones(2, 2), e=torch.ones(3, 0))
        full = opt.init(ParamDict(w=torch.ones(2, 2)))
        state = full._replace(
            row_var=ParamDict(w=full.row_var["w"], e=torch.zeros(3, 0)[..., :1]),
            col_var=ParamDict(w=full.col_var["w"], e=torch.zeros(1, 0)),
        )
        return params, params.full_like(0.5), state

    check(
        Case(
            method,
            build,
            getattr(opt, method),
            ValueError,
            r"without elements; \['e'\]",
        )
    )


def test_adafactor_state_counter_checked() -> None:
    """Adafactor checks its step counter as the other optimizers do."""
    opt = optim.Adafactor()

    def build() -> Any:
        params = ParamDict(w=torch.ones(2, 2))
        state = opt.init(params)._replace(step=torch.tensor(-1.0, dtype=torch.float64))
        return params, params.full_like(0.5), state

    check(Case("negative", build, opt.step_, ValueError, r"`step`(?s:.*)-1"))
