"""PyTorch's `test/test_autograd.py` checks of `inputs=` and dict inputs, on ParamDict.

`ParamDict.grad` is the keyed `torch.autograd.grad(loss, inputs)` and
`ParamDict.backward` the keyed `torch.autograd.backward(loss, inputs=...)`; these tests
check what upstream checks for those two, in float64 against plain torch.
"""

from __future__ import annotations

import pytest
import torch
from _torch_versions import needs_torch

from paramdict import ParamDict


def _leaves() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, dtype=torch.float64, generator=gen).requires_grad_()
    y = torch.randn(2, 2, dtype=torch.float64, generator=gen).requires_grad_()
    return x, y


def test_grad_matches_torch_on_a_tuple() -> None:
    """Keyed grads equal `torch.autograd.grad` on the same inputs, in order."""
    x, y = _leaves()
    loss = (x * y.exp()).sum() + (x**2).sum()
    expected = torch.autograd.grad(loss, (x, y), retain_graph=True)
    got = ParamDict(x=x, y=y).grad(loss)
    torch.testing.assert_close(got["x"], expected[0])
    torch.testing.assert_close(got["y"], expected[1])


@needs_torch(2, 13, "torch.autograd.grad with a dict of inputs")
def test_torch_dict_inputs_match_and_refuse_a_paramdict() -> None:
    """Torch 2.13 returns a dict for dict inputs, and refuses a dict subclass."""
    x, y = _leaves()
    loss = (x * y).sum()
    p = ParamDict(x=x, y=y)
    expected = torch.autograd.grad(loss, dict(p), retain_graph=True)
    assert type(expected) is dict
    got = p.grad(loss, retain_graph=True)
    for key in p:
        torch.testing.assert_close(got[key], expected[key])
    with pytest.raises(TypeError, match="must be a dict, not ParamDict"):
        torch.autograd.grad(loss, p)
    with pytest.raises(TypeError, match="must be a dict, not ParamDict"):
        torch.autograd.backward(loss, inputs=p)


def test_backward_accumulates_into_the_inputs_only() -> None:
    """Only the given tensors receive `.grad`, and it accumulates across calls."""
    x, y = _leaves()
    z = x * y
    ParamDict(x=x).backward(z.sum(), retain_graph=True)
    torch.testing.assert_close(x.grad, y.detach())
    assert y.grad is None
    got = ParamDict(x=x, y=y).backward(z.sum())
    torch.testing.assert_close(got["x"], 2 * y.detach())
    torch.testing.assert_close(got["y"], x.detach())
    assert got["x"] is x.grad


def test_backward_with_non_leaf_inputs() -> None:
    """A non-leaf input receives a `.grad` of its own, as with `inputs=`."""
    x, y = _leaves()
    mid = x * 2
    loss = (mid * y).sum()
    got = ParamDict(mid=mid).backward(loss)
    torch.testing.assert_close(mid.grad, y.detach())
    assert got["mid"] is mid.grad
    assert x.grad is None


def test_empty_inputs_are_refused() -> None:
    """Torch refuses empty inputs; so do both keyed forms."""
    x, _ = _leaves()
    with pytest.raises(RuntimeError, match="cannot be empty"):
        torch.autograd.backward((x * 2).sum(), inputs=[])
    for run in (ParamDict().grad, ParamDict().backward):
        with pytest.raises(ValueError, match="ParamDict is empty"):
            run((x * 2).sum())


def test_unreachable_inputs() -> None:
    """Unreached inputs are an error, or zeros with `allow_unused=True`."""
    x, y = _leaves()
    loss = (x * 2).sum()
    assert (
        torch.autograd.grad(loss, [x, y], allow_unused=True, retain_graph=True)[1]
        is None
    )
    with pytest.raises(ValueError, match=r"does not depend on \['y'\]"):
        ParamDict(x=x, y=y).grad(loss, retain_graph=True)
    got = ParamDict(x=x, y=y).grad(loss, allow_unused=True)
    torch.testing.assert_close(got["y"], torch.zeros_like(y))


def test_materialized_zeros_require_grad_under_create_graph() -> None:
    """As `materialize_grads=True`, the zeros require grad: a third derivative is 0."""
    x, y = _leaves()
    loss = (x**3).sum()
    t_x, t_y = torch.autograd.grad(
        loss, [x, y], create_graph=True, materialize_grads=True
    )
    g = ParamDict(x=x, y=y).grad(loss, create_graph=True, allow_unused=True)
    assert g["y"].requires_grad == t_y.requires_grad
    torch.testing.assert_close(g["x"], t_x)
    gg = ParamDict(x=x, y=y).grad(
        (g["x"] ** 2).sum() + g["y"].sum(), create_graph=True, allow_unused=True
    )
    third = ParamDict(x=x, y=y).grad(gg["y"].sum(), allow_unused=True)
    torch.testing.assert_close(third["y"], torch.zeros_like(y))
    torch.testing.assert_close(third["x"], torch.zeros_like(x))


def test_constant_loss() -> None:
    """A loss that requires no grad: torch raises; zeros with `allow_unused=True`."""
    x, y = _leaves()
    constant = torch.ones((), dtype=torch.float64)
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(constant, [x])
    with pytest.raises(ValueError, match="`loss` does not require grad"):
        ParamDict(x=x).grad(constant)
    with pytest.raises(ValueError, match="`loss` does not require grad"):
        ParamDict(x=x).backward(constant)
    got = ParamDict(x=x, y=y).grad(constant, allow_unused=True)
    torch.testing.assert_close(got.to_vector(), torch.zeros(8, dtype=torch.float64))
    assert x.grad is None


def test_grad_outputs_and_batched_grads() -> None:
    """`grad_outputs` and `is_grads_batched` mean what they mean for torch."""
    x, y = _leaves()
    out = x * y
    v = torch.randn(3, 2, 2, dtype=torch.float64)
    expected = torch.autograd.grad(
        out, (x, y), grad_outputs=v, is_grads_batched=True, retain_graph=True
    )
    got = ParamDict(x=x, y=y).grad(
        out, grad_outputs=v, is_grads_batched=True, retain_graph=True
    )
    torch.testing.assert_close(got["x"], expected[0])
    torch.testing.assert_close(got["y"], expected[1])
    with pytest.raises(ValueError, match="`grad_outputs` does not fit"):
        ParamDict(x=x).grad(out, grad_outputs=torch.ones(3))


def test_second_backward_without_retain_graph() -> None:
    """A freed graph is named, with the fix."""
    x, _ = _leaves()
    loss = (x.exp()).sum()
    ParamDict(x=x).grad(loss)
    with pytest.raises(ValueError, match="retain_graph=True"):
        ParamDict(x=x).grad(loss)


def test_frozen_inputs_are_named_before_anything_runs() -> None:
    """An input that does not require grad is named; nothing accumulates."""
    x, _ = _leaves()
    frozen = torch.ones(2, 2, dtype=torch.float64)
    loss = (x * frozen).sum()
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(loss, [x, frozen], retain_graph=True)
    for run in (ParamDict(x=x, f=frozen).grad, ParamDict(x=x, f=frozen).backward):
        with pytest.raises(ValueError, match=r"\['f'\]"):
            run(loss, retain_graph=True)
    assert x.grad is None
