"""`cg` solves SPD systems built from dense matrices, and says when it does not."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from paramdict import CGInfo, ParamDict, cg


def _system(n: int = 7, *, cond: float = 100.0) -> tuple[Tensor, ParamDict]:
    """A dense SPD matrix with condition number `cond`, and a keyed right side."""
    gen = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    eigenvalues = torch.logspace(0, torch.log10(torch.tensor(cond)), n).double()
    a = q @ torch.diag(eigenvalues) @ q.T
    b = ParamDict(
        w=torch.randn(2, 2, generator=gen, dtype=torch.float64),
        b=torch.randn(n - 4, generator=gen, dtype=torch.float64),
    )
    return a, b


def _matvec(a: Tensor, like: ParamDict):  # type: ignore[no-untyped-def]  # a test helper returning a closure
    return lambda v: ParamDict.from_vector(a @ v.to_vector(), like=like)


@pytest.mark.parametrize("rtol", [1e-3, 1e-8, 1e-12])
def test_cg_reaches_the_requested_relative_tolerance(rtol: float) -> None:
    """The true residual meets `rtol * |b|`, and the solution is the dense one."""
    a, b = _system()
    x, info = cg(_matvec(a, b), b, rtol=rtol)
    residual = torch.linalg.vector_norm(b.to_vector() - a @ x.to_vector())
    assert info.converged
    assert residual <= rtol * b.norm() * 1.01
    assert info.residual_norms[-1] <= info.tolerance
    assert len(info.residual_norms) == info.iterations + 1
    want = torch.linalg.solve(a, b.to_vector())
    torch.testing.assert_close(
        x.to_vector(), want, rtol=0, atol=float(rtol * 100 * want.norm())
    )
    assert list(x) == list(b)


def test_cg_absolute_tolerance_and_initial_guess() -> None:
    """`atol` bounds the residual; a solution as `x0` needs no iteration."""
    a, b = _system()
    x, info = cg(_matvec(a, b), b, rtol=0.0, atol=1e-9)
    assert info.converged
    assert info.residual_norms[-1] <= 1e-9
    again, info_again = cg(_matvec(a, b), b, x0=x, rtol=0.0, atol=1e-8)
    assert info_again.iterations == 0
    assert info_again.converged
    torch.testing.assert_close(again, x)


def test_cg_reports_non_convergence() -> None:
    """Too few iterations: `converged` is false and the history shows why."""
    a, b = _system(cond=1e6)
    x, info = cg(_matvec(a, b), b, rtol=1e-12, maxiter=2)
    assert not info.converged
    assert info.iterations == 2
    assert info.residual_norms[-1] > info.tolerance
    assert x.isfinite()


def test_cg_zero_right_side_and_zero_iterations() -> None:
    """`b = 0` gives `x = 0` at once; `maxiter=0` returns the initial guess."""
    a, b = _system()
    x, info = cg(_matvec(a, b), b.zeros_like())
    assert info == CGInfo(True, 0, (0.0,), 0.0)
    assert x.norm() == 0
    x, info = cg(_matvec(a, b), b, maxiter=0)
    assert not info.converged
    assert x.norm() == 0


def test_cg_leaves_b_unchanged() -> None:
    """`b` keeps its values."""
    a, b = _system()
    before = b.clone()
    cg(_matvec(a, b), b)
    torch.testing.assert_close(b, before)


def test_cg_hostile_inputs() -> None:
    """Wrong kinds and values name the argument; wrong keys name the keys."""
    a, b = _system()
    mv = _matvec(a, b)
    with pytest.raises(TypeError, match="`matvec` must be a callable"):
        cg(a, b)  # type: ignore[arg-type]  # the error under test
    with pytest.raises(TypeError, match="`b` must be a ParamDict, got Tensor"):
        cg(mv, a)  # type: ignore[type-var]  # the error under test
    with pytest.raises(ValueError, match="`rtol` must be a finite number >= 0"):
        cg(mv, b, rtol=-1e-3)
    with pytest.raises(ValueError, match="`atol` must be a finite number >= 0"):
        cg(mv, b, atol=float("nan"))
    with pytest.raises(TypeError, match="`rtol` must be a number, got str"):
        cg(mv, b, rtol="tight")  # type: ignore[arg-type]  # the error under test
    with pytest.raises(ValueError, match="`maxiter` must be >= 0, got -1"):
        cg(mv, b, maxiter=-1)
    with pytest.raises(ValueError, match=r"missing \['w'\]"):
        cg(mv, b, x0={"b": torch.zeros(3, dtype=torch.float64)})
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        cg(lambda v: v.select("w"), b)
    with pytest.raises(TypeError, match="must be a mapping of tensors"):
        cg(lambda v: v.to_vector(), b)  # type: ignore[arg-type, return-value]  # the error under test
