"""PyTorch's `test/test_stateless.py` functional-call checks, run on ParamDict.

Each test states what upstream checks and runs it with a ParamDict through
`torch.func.functional_call`, the deprecated `torch.nn.utils.stateless.functional_call`
and `ParamDict.call`. Where ParamDict differs on purpose (it is immutable, and `call`
refuses keys the module lacks), the test asserts the documented behaviour.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _torch_versions import script, trace
from torch import Tensor, nn
from torch.nn.utils import stateless

from paramdict import ParamDict


def _t(value: object) -> Tensor:
    """The tensor a module attribute holds (`nn.Module.__getattr__` is untyped)."""
    assert isinstance(value, Tensor)
    return value


class Mock(nn.Module):
    """Upstream's mock: a linear layer, a buffer, and a float attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(1, 1)
        self.register_buffer("buffer", torch.ones(1))
        self.foo = 0.0

    def forward(self, x: Tensor) -> Tensor:
        """Return `l1(x) + buffer`."""
        out: Tensor = self.l1(x) + self.buffer
        return out


class MockTied(nn.Module):
    """Upstream's tied mock: a bias and a buffer each under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(1, 1)
        self.tied_bias = self.l1.bias
        self.register_buffer("buffer", torch.ones(1))
        self.register_buffer("tied_buffer", _t(self.buffer))

    def forward(self, x: Tensor) -> Tensor:
        """Add each tied tensor under both names."""
        out: Tensor = self.l1(x) + self.tied_bias + self.buffer + self.tied_buffer
        return out


def _torch_func(module: nn.Module, p: Any, x: Any, **kw: Any) -> Any:
    return torch.func.functional_call(module, p, x, **kw)


def _stateless(module: nn.Module, p: Any, x: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated since torch 2.0
        return stateless.functional_call(module, p, x, **kw)


def _call(module: nn.Module, p: Any, x: Any, **kw: Any) -> Any:
    assert not kw  # `call` has no options: it always ties
    return p.call(module, x)


CALLERS = pytest.mark.parametrize(
    "fcall", [_torch_func, _stateless, _call], ids=["torch_func", "stateless", "call"]
)
FUNCTIONAL = pytest.mark.parametrize(
    "fcall", [_torch_func, _stateless], ids=["torch_func", "stateless"]
)


@contextlib.contextmanager
def unchanged(module: nn.Module) -> Iterator[None]:
    """The module keeps its very tensor objects and their values."""
    before = [*module.parameters(), *module.buffers()]
    values = [t.detach().clone() for t in before]
    yield
    after = [*module.parameters(), *module.buffers()]
    assert len(after) == len(before)
    for a, b, v in zip(before, after, values):
        assert a is b
        torch.testing.assert_close(b.detach(), v, rtol=0, atol=0)


def _identity() -> ParamDict:
    return ParamDict(
        {
            "l1.weight": torch.tensor([[1.0]]),
            "l1.bias": torch.tensor([0.0]),
            "buffer": torch.tensor([0.0]),
        }
    )


@CALLERS
def test_identity_parameters_give_the_input(fcall: Callable[..., Any]) -> None:
    """Swapped-in identity weights map x to x; the module keeps its own."""
    module = Mock()
    x = torch.rand(1, 1)
    with unchanged(module):
        out = fcall(module, _identity(), x)
    torch.testing.assert_close(out, x)


@CALLERS
def test_jit_modules_are_refused_before_running(fcall: Callable[..., Any]) -> None:
    """Scripted and traced modules are refused with a clear error, nothing runs."""
    module = Mock()
    x = torch.rand(1, 1)
    for jitted in (script(module), trace(module, x)):
        kind = TypeError if fcall is _call else RuntimeError
        match = "TorchScript" if fcall is _call else "Jitted modules"
        with unchanged(module), pytest.raises(kind, match=match):
            fcall(jitted, _identity(), x)


@CALLERS
def test_gradients_reach_the_given_tensors_only(fcall: Callable[..., Any]) -> None:
    """Backward fills the given tensors' `.grad`, not the module's."""
    module = Mock()
    w = torch.tensor([[1.0]], requires_grad=True)
    b = torch.tensor([0.0], requires_grad=True)
    buf = torch.tensor([0.0])
    p = ParamDict({"l1.weight": w, "l1.bias": b, "buffer": buf})
    fcall(module, p, torch.rand(1, 1)).sum().backward()
    assert w.grad is not None
    assert b.grad is not None
    assert buf.grad is None
    assert module.l1.weight.grad is None
    assert module.l1.bias.grad is None


@CALLERS
def test_batch_norm_running_mean_goes_to_the_given_tensor(
    fcall: Callable[..., Any],
) -> None:
    """A swapped-in running mean is updated in place; the module's stays."""
    module = nn.BatchNorm1d(10).train()
    x = torch.full((20, 10), 128.0)
    rm = torch.zeros(10)
    before = _t(module.running_mean).clone()
    fcall(module, ParamDict(running_mean=rm), x)
    torch.testing.assert_close(module.running_mean, before)
    torch.testing.assert_close(rm, torch.full((10,), 12.8))
    fcall(module, ParamDict(), x)
    torch.testing.assert_close(module.running_mean, torch.full((10,), 12.8))


def test_circular_references_with_functional_call() -> None:
    """Names through a cycle reach the same tensors (upstream: `tie_weights=False`)."""
    module = Mock()
    module.l1.m = module  # a cycle on purpose
    x = torch.rand(1, 1)
    p = ParamDict(
        {
            "l1.m.l1.weight": torch.tensor([[1.0]]),
            "l1.bias": torch.tensor([0.0]),
            "l1.m.buffer": torch.tensor([0.0]),
        }
    )
    with unchanged(module):
        out = torch.func.functional_call(module, p, x, tie_weights=False)
    torch.testing.assert_close(out, x)


def test_circular_references_with_call_and_swapped_into() -> None:
    """A self-referencing module works with `call`, `swapped_into`, `to_module`."""
    module = Mock()
    module.l1.m = module  # a cycle on purpose
    x = torch.rand(1, 1)
    p = _identity()
    assert set(ParamDict.from_module(module, buffers=True)) == set(p)
    with unchanged(module):
        torch.testing.assert_close(p.call(module, x), x)
        with p.swapped_into(module):
            torch.testing.assert_close(module(x), x)
    p.to_module(module)
    torch.testing.assert_close(module(x), x)


@CALLERS
def test_parametrized_original_can_be_swapped(fcall: Callable[..., Any]) -> None:
    """Swapping a parametrization's original keeps the parametrization applied."""
    module = Mock()
    nn.utils.parametrizations.spectral_norm(module.l1)
    key = "l1.parametrizations.weight.original"
    assert key in dict(module.named_parameters())
    before = module.l1.weight.detach().clone()
    p = ParamDict(
        {
            key: torch.tensor([[1.0]]),
            "l1.bias": torch.tensor([0.0]),
            "buffer": torch.tensor([0.0]),
        }
    )
    x = torch.rand(1, 1)
    torch.testing.assert_close(fcall(module, p, x), x)
    assert key in dict(module.named_parameters())
    torch.testing.assert_close(module.l1.weight.detach(), before)


@CALLERS
def test_a_failing_forward_restores_the_module(fcall: Callable[..., Any]) -> None:
    """When forward raises, the module gets its own tensors back."""
    module = Mock()
    with unchanged(module), pytest.raises(RuntimeError, match="cannot be multiplied"):
        fcall(module, _identity(), torch.rand(4, 5))


@CALLERS
def test_some_weights(fcall: Callable[..., Any]) -> None:
    """A subset is swapped in; the rest are the module's own."""
    module = Mock()
    w = torch.tensor([[2.0]])
    x = torch.randn(1, 1)
    out = fcall(module, ParamDict({"l1.weight": w}), x)
    torch.testing.assert_close(out, x * w + _t(module.l1.bias) + _t(module.buffer))


def test_extra_keys_pass_functional_call_and_are_refused_by_call() -> None:
    """functional_call ignores an unknown key; `call` names it and runs nothing."""
    module = Mock()
    w = torch.tensor([[2.0]])
    x = torch.randn(1, 1)
    p = ParamDict({"l1.weight": w, "extra": torch.tensor([1.0])})
    out = torch.func.functional_call(module, p, x)
    torch.testing.assert_close(out, x * w + _t(module.l1.bias) + _t(module.buffer))
    assert not hasattr(module, "extra")
    with unchanged(module), pytest.raises(ValueError, match=r"\['extra'\]"):
        p.call(module, x)


@FUNCTIONAL
def test_strict(fcall: Callable[..., Any]) -> None:
    """`strict=True` accepts the full set and names missing and unexpected keys."""
    module = Mock()
    w, b, buf = torch.tensor([[2.0]]), torch.tensor([5.0]), torch.tensor([3.0])
    x = torch.randn(1, 1)
    full = ParamDict({"l1.weight": w, "l1.bias": b, "buffer": buf})
    with unchanged(module):
        torch.testing.assert_close(fcall(module, full, x, strict=True), x * w + b + buf)
    cases = {
        "Missing key(s): 'buffer', 'l1.bias'.": ParamDict({"l1.weight": w}),
        "Unexpected key(s): 'extra'.": full | {"extra": buf},
    }
    for message, p in cases.items():
        with unchanged(module), pytest.raises(RuntimeError, match=re.escape(message)):
            fcall(module, p, x, strict=True)


@CALLERS
def test_tied_weights_follow_the_given_name(fcall: Callable[..., Any]) -> None:
    """Tied aliases take the value given under one of their names."""
    module = MockTied()
    w, b, buf = torch.tensor([[2.0]]), torch.tensor([5.0]), torch.tensor([3.0])
    x = torch.randn(1, 1)
    p = ParamDict({"l1.weight": w, "l1.bias": b, "buffer": buf})
    with unchanged(module):
        out = fcall(module, p, x)
    torch.testing.assert_close(out, x * w + b + b + buf + buf)


@CALLERS
def test_partially_tied_weights(fcall: Callable[..., Any]) -> None:
    """Given only some tied names, the others keep the module's tensors."""
    module = MockTied()
    w, buf = torch.tensor([[2.0]]), torch.tensor([3.0])
    x = torch.randn(1, 1)
    p = ParamDict({"l1.weight": w, "buffer": buf})
    with unchanged(module):
        out = fcall(module, p, x)
    expected = x * 2.0 + _t(module.l1.bias) + _t(module.tied_bias) + buf + buf
    torch.testing.assert_close(out, expected)


@CALLERS
def test_tied_names_with_one_tensor_are_fine(fcall: Callable[..., Any]) -> None:
    """Both tied names may be given when they hold the same tensor."""
    module = MockTied()
    b, buf = torch.tensor([0.0]), torch.tensor([0.0])
    p = ParamDict(
        {
            "l1.weight": torch.tensor([[1.0]]),
            "l1.bias": b,
            "buffer": buf,
            "tied_bias": b,
            "tied_buffer": buf,
        }
    )
    x = torch.randn(1, 1)
    torch.testing.assert_close(fcall(module, p, x), x)


@CALLERS
def test_tied_names_with_different_tensors_are_refused(
    fcall: Callable[..., Any],
) -> None:
    """Different tensors under tied names are refused, naming both names."""
    module = MockTied()
    base = {
        "l1.weight": torch.tensor([[1.0]]),
        "l1.bias": torch.tensor([0.0]),
        "buffer": torch.tensor([0.0]),
    }
    x = torch.randn(1, 1)
    pairs = {"tied_bias": "['l1.bias', 'tied_bias']", "tied_buffer": "['buffer', "}
    for alias, names in pairs.items():
        p = ParamDict(base | {alias: torch.tensor([5.0])})
        with unchanged(module), pytest.raises(ValueError, match=re.escape(names)):
            fcall(module, p, x)


def test_tied_names_with_different_values_are_refused_by_to_module() -> None:
    """`to_module` refuses tied names holding different values, writing nothing."""
    module = MockTied()
    p = ParamDict.from_module(module, buffers=True).detach().clone()
    q = p | {"l1.bias": torch.tensor([5.0])}
    with (
        unchanged(module),
        pytest.raises(ValueError, match=r"\['l1.bias', 'tied_bias'\]"),
    ):
        q.to_module(module)
    same = p | {"l1.bias": p["tied_bias"].clone()}
    same.to_module(module)  # equal values: either name says the same


def test_tie_weights_false_leaves_aliases_alone() -> None:
    """`tie_weights=False` swaps only the given names, as upstream."""
    module = MockTied()
    b = torch.tensor([5.0])
    p = ParamDict({"l1.bias": b})
    x = torch.randn(1, 1)
    out = torch.func.functional_call(module, p, x, tie_weights=False)
    bias, tied, buffer = _t(module.l1.bias), _t(module.tied_bias), _t(module.buffer)
    expected = module.l1(x) - bias + b + tied + 2 * buffer
    torch.testing.assert_close(out, expected)


@FUNCTIONAL
def test_tie_weights_strict(fcall: Callable[..., Any]) -> None:
    """With ties, strict counts aliases as covered; without, it names them."""
    module = MockTied()
    w, b, buf = torch.tensor([[2.0]]), torch.tensor([5.0]), torch.tensor([3.0])
    x = torch.randn(1, 1)
    p = ParamDict({"l1.weight": w, "l1.bias": b, "buffer": buf})
    with unchanged(module):
        out = fcall(module, p, x, tie_weights=True, strict=True)
    torch.testing.assert_close(out, x * w + b + b + buf + buf)
    message = "Missing key(s): 'tied_bias', 'tied_buffer'."
    with unchanged(module), pytest.raises(RuntimeError, match=re.escape(message)):
        fcall(module, p, x, tie_weights=False, strict=True)
    some = ParamDict({"l1.weight": w, "buffer": buf})
    message = "Missing key(s): 'l1.bias', 'tied_bias'."
    with unchanged(module), pytest.raises(RuntimeError, match=re.escape(message)):
        fcall(module, some, x, tie_weights=True, strict=True)


def test_to_module_strict_with_ties() -> None:
    """`to_module(strict=True)` counts tied aliases once, and names what is missing."""
    module = MockTied()
    p = ParamDict.from_module(module, buffers=True).detach() * 0
    assert set(p) == {"l1.weight", "tied_bias", "buffer"}  # first names only
    p.to_module(module)
    assert module.tied_bias is module.l1.bias
    torch.testing.assert_close(module.l1.bias.detach(), torch.zeros(1))
    with pytest.raises(ValueError, match=r"missing \['tied_bias'\]"):
        p.exclude("tied_bias").to_module(module)


def test_a_module_that_replaces_a_buffer_cannot_write_into_a_paramdict() -> None:
    """Upstream writes the replacement into the dict; ParamDict refuses (immutable)."""

    class Foo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.foo: Tensor
            self.register_buffer("foo", torch.tensor([0.0]))

        def forward(self, x: Tensor) -> Tensor:
            self.foo = self.foo + 1
            out: Tensor = x + self.foo
            return out

    foo = torch.tensor([2.0])
    mod = Foo()
    p = ParamDict(foo=foo)
    with pytest.raises(TypeError, match=r"immutable.*\['foo'\]"):
        torch.func.functional_call(mod, p, torch.randn(1))
    torch.testing.assert_close(mod.foo, torch.tensor([0.0]))
    assert p["foo"] is foo
    with pytest.raises(TypeError, match=r"replaced \['foo'\]"):
        p.call(mod, torch.randn(1))
    torch.testing.assert_close(mod.foo, torch.tensor([0.0]))
    d = dict(p)  # the documented way to receive replacements
    torch.func.functional_call(mod, d, torch.randn(1))
    torch.testing.assert_close(d["foo"], torch.tensor([3.0]))


@CALLERS
def test_in_place_updates_reach_the_given_tensor(fcall: Callable[..., Any]) -> None:
    """An in-place buffer update writes into the given tensor, not the module's."""

    class Foo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.foo: Tensor
            self.register_buffer("foo", torch.tensor([0.0]))

        def forward(self, x: Tensor) -> Tensor:
            self.foo.add_(1)
            out: Tensor = x + self.foo
            return out

    foo = torch.tensor([2.0])
    mod = Foo()
    p = ParamDict(foo=foo)
    fcall(mod, p, torch.randn(1))
    torch.testing.assert_close(mod.foo, torch.tensor([0.0]))
    torch.testing.assert_close(foo, torch.tensor([3.0]))
    assert p["foo"] is foo


@CALLERS
def test_keyword_arguments(fcall: Callable[..., Any]) -> None:
    """Keyword-only forward arguments pass through."""

    class Foo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.x = nn.Parameter(torch.randn(2, 3))

        def forward(self, inp: Tensor, *, other: Tensor) -> Tensor:
            out: Tensor = inp * self.x + other
            return out

    mod = Foo()
    p = ParamDict(x=torch.zeros(2, 3))
    inp, other = torch.randn(2, 3), torch.randn(2, 3)
    with pytest.raises(TypeError, match="other"):
        fcall(mod, p, inp)
    torch.testing.assert_close(p.call(mod, inp, other=other), other)
    out = torch.func.functional_call(mod, p, (inp,), {"other": other})
    torch.testing.assert_close(out, other)


def test_tuples_of_paramdicts() -> None:
    """A tuple of ParamDicts is merged; a key in two of them is refused."""
    mod = Mock()
    x = torch.rand(1, 1)
    params = ParamDict.from_module(mod).ones_like()
    buffers = ParamDict(buffer=torch.zeros(1))
    out = torch.func.functional_call(mod, (params, buffers), x)
    torch.testing.assert_close(out, x + 1)
    with pytest.raises(ValueError, match="appeared in multiple dictionaries"):
        torch.func.functional_call(mod, (params, params.select("l1.weight")), x)


def test_member_reference_sees_the_swapped_tensors() -> None:
    """Inside forward, `self.parameters()` yields the swapped-in tensors."""

    class Module(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(1, 1)

        def forward(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
            return self.l1(x), tuple(self.parameters())

    module = Module()
    p = ParamDict({"l1.weight": torch.tensor([[2.0]]), "l1.bias": torch.tensor([5.0])})
    runs: list[Callable[[], Any]] = [
        lambda: p.call(module, torch.ones(1, 1)),
        lambda: torch.func.functional_call(module, p, (torch.ones(1, 1),)),
    ]
    for run in runs:
        out, seen = run()
        torch.testing.assert_close(out, torch.tensor([[7.0]]))
        assert seen[0] is p["l1.weight"]
        assert seen[1] is p["l1.bias"]


def test_tied_language_model_under_functional_call_grad_and_call() -> None:
    """A tied embedding/head runs and differentiates through every entry point."""
    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)).double()
    lm[1].weight = lm[0].weight
    p = ParamDict.from_module(lm)
    assert list(p) == ["0.weight"]
    tokens = torch.tensor([1, 2, 3])
    w = p["0.weight"]
    reference = (w[tokens] @ w.T).sum()
    via_fc = torch.func.functional_call(lm, p, (tokens,)).sum()
    via_call = p.call(lm, tokens).sum()
    torch.testing.assert_close(via_fc, reference)
    torch.testing.assert_close(via_call, reference)
    leaf = w.detach().clone().requires_grad_()
    (expected,) = torch.autograd.grad((leaf[tokens] @ leaf.T).sum(), [leaf])
    q = ParamDict({"0.weight": leaf.detach()})
    for fn in (
        lambda r: torch.func.functional_call(lm, r, (tokens,)).sum(),
        lambda r: r.call(lm, tokens).sum(),
    ):
        grads = torch.func.grad(fn)(q)
        assert type(grads) is ParamDict
        torch.testing.assert_close(grads["0.weight"], expected)
    r = ParamDict({"0.weight": leaf})
    keyed = r.grad(r.call(lm, tokens).sum())
    torch.testing.assert_close(keyed["0.weight"], expected)
