"""LBFGS: a closure-driven step that takes torch.optim.LBFGS's steps."""

from __future__ import annotations

import inspect
import io
from typing import Any

import attrs
import pytest
import torch
import torch.nn.functional as F
from _torch_versions import needs_torch, torch_at_least
from hypothesis import given, settings
from hypothesis import strategies as st
from optim_cases import batches, forward, make_model
from torch import Tensor

from paramdict import ParamDict, optim
from paramdict.optim.lbfgs import _flattened, _Run

SETTINGS = [
    pytest.param({}, id="default"),
    pytest.param({"line_search_fn": "strong_wolfe"}, id="strong-wolfe"),
    pytest.param(
        {"lr": 0.5, "max_iter": 7, "history_size": 3, "line_search_fn": "strong_wolfe"},
        id="short-history-wolfe",
    ),
    pytest.param(
        {"lr": 0.1, "max_iter": 5, "max_eval": 4, "tolerance_change": 1e-6},
        id="max-eval",
    ),
]


def _rosenbrock(xy: Tensor) -> Tensor:
    x, y = xy[0], xy[1]
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_rosenbrock_matches_torch(kwargs: dict[str, Any]) -> None:
    """Five steps on the float64 Rosenbrock function equal torch.optim.LBFGS."""
    start = torch.tensor([-1.5, 2.0], dtype=torch.float64)
    theirs = start.clone().requires_grad_()
    torch_opt = torch.optim.LBFGS([theirs], **kwargs)

    def closure() -> Tensor:
        torch_opt.zero_grad()
        loss = _rosenbrock(theirs)
        torch.autograd.backward(loss)
        return loss

    opt = optim.LBFGS(**kwargs)
    params = ParamDict(xy=start.clone())
    state = opt.init(params)
    for _ in range(5):
        torch_opt.step(closure)  # type: ignore[no-untyped-call]  # torch's annotation
        params, state = opt.step(params, lambda p: _rosenbrock(p["xy"]), state)
        torch.testing.assert_close(params["xy"], theirs.detach(), rtol=1e-10, atol=0)
    torch_state = torch_opt.state[theirs]
    assert state.n_iter == torch_state["n_iter"]
    assert state.func_evals == torch_state["func_evals"]


@needs_torch(2, 14, "torch.optim.LBFGS(maximize=True)")
@pytest.mark.parametrize("kwargs", SETTINGS)
def test_maximize_matches_torch(kwargs: dict[str, Any]) -> None:
    """Five steps maximizing the negated Rosenbrock equal torch's `maximize=True`."""
    start = torch.tensor([-1.5, 2.0], dtype=torch.float64)
    theirs = start.clone().requires_grad_()
    torch_opt = torch.optim.LBFGS([theirs], **{**kwargs, "maximize": True})  # 2.14

    def closure() -> Tensor:
        torch_opt.zero_grad()
        gain = -_rosenbrock(theirs)
        torch.autograd.backward(gain)
        return gain

    opt = optim.LBFGS(maximize=True, **kwargs)
    params = ParamDict(xy=start.clone())
    state = opt.init(params)
    for _ in range(5):
        torch_opt.step(closure)  # type: ignore[no-untyped-call]  # torch's annotation
        params, state = opt.step(params, lambda p: -_rosenbrock(p["xy"]), state)
        torch.testing.assert_close(params["xy"], theirs.detach(), rtol=1e-10, atol=0)
    torch_state = torch_opt.state[theirs]
    assert state.n_iter == torch_state["n_iter"]
    assert state.func_evals == torch_state["func_evals"]
    assert state.prev_loss == torch_state["prev_loss"]


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_maximizing_the_negated_loss_is_minimizing_it(kwargs: dict[str, Any]) -> None:
    """`maximize=True` on `-f` takes the steps that the default takes on `f`."""
    start = ParamDict(xy=torch.tensor([-1.5, 2.0], dtype=torch.float64))
    low, high = optim.LBFGS(**kwargs), optim.LBFGS(maximize=True, **kwargs)
    down, down_state = start, low.init(start)
    up, up_state = start, high.init(start)
    for _ in range(3):
        down, down_state = low.step(down, lambda p: _rosenbrock(p["xy"]), down_state)
        up, up_state = high.step(up, lambda p: -_rosenbrock(p["xy"]), up_state)
    torch.testing.assert_close(up["xy"], down["xy"], rtol=0, atol=0)
    assert up_state.func_evals == down_state.func_evals
    assert not torch.equal(up["xy"], start["xy"])


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_full_batch_mlp_matches_torch(kwargs: dict[str, Any]) -> None:
    """Four full-batch steps on the small MLP (float64) equal torch.optim.LBFGS."""
    model = make_model(torch.float64)
    x, y = next(batches(torch.float64))
    torch_opt = torch.optim.LBFGS(model.parameters(), **kwargs)

    def closure() -> Tensor:
        torch_opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        return loss

    opt = optim.LBFGS(**kwargs)
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    state = opt.init(params)
    for _ in range(4):
        torch_opt.step(closure)  # type: ignore[no-untyped-call]  # torch's annotation
        params, state = opt.step(params, lambda p: F.mse_loss(forward(p, x), y), state)
    expected = {k: v.detach() for k, v in model.named_parameters()}
    torch.testing.assert_close(dict(params), expected, rtol=1e-10, atol=1e-12)


def test_closure_may_return_its_gradients() -> None:
    """`closure(params) -> (loss, grads)` gives the same step as a plain loss."""
    params = ParamDict(xy=torch.tensor([-1.5, 2.0], dtype=torch.float64))
    opt = optim.LBFGS(line_search_fn="strong_wolfe")

    def with_grads(p: ParamDict) -> tuple[Tensor, ParamDict]:
        loss = _rosenbrock(p["xy"])
        return loss, p.grad(loss)

    a, _ = opt.step(params, lambda p: _rosenbrock(p["xy"]), opt.init(params))
    b, _ = opt.step(params, with_grads, opt.init(params))
    torch.testing.assert_close(dict(a), dict(b), rtol=0, atol=0)


def test_history_state_loads_with_weights_only() -> None:
    """The state, history included, round-trips through torch.save/weights_only."""
    params = ParamDict(xy=torch.tensor([-1.5, 2.0], dtype=torch.float64))
    opt = optim.LBFGS(line_search_fn="strong_wolfe", max_iter=5)
    straight, state = opt.step(params, lambda p: _rosenbrock(p["xy"]), opt.init(params))
    assert state.old_dirs
    buffer = io.BytesIO()
    torch.save((straight, state), buffer)
    buffer.seek(0)
    loaded_params, loaded = torch.load(buffer, weights_only=True)
    assert type(loaded) is optim.LBFGSState
    again, _ = opt.step(loaded_params, lambda p: _rosenbrock(p["xy"]), loaded)
    expected, _ = opt.step(straight, lambda p: _rosenbrock(p["xy"]), state)
    torch.testing.assert_close(dict(again), dict(expected), rtol=0, atol=0)


def test_step_leaves_params_and_state_unchanged() -> None:
    """A step returns new values; the inputs keep theirs."""
    params = ParamDict(xy=torch.tensor([-1.5, 2.0], dtype=torch.float64))
    before = params["xy"].clone()
    opt = optim.LBFGS()
    new, state = opt.step(params, lambda p: _rosenbrock(p["xy"]), opt.init(params))
    torch.testing.assert_close(params["xy"], before, rtol=0, atol=0)
    assert new["xy"] is not params["xy"]
    assert state.n_iter > 0


def test_hyperparameters_are_torchs_names_and_defaults() -> None:
    """Every field is named and defaulted as in torch.optim.LBFGS's signature."""
    signature = inspect.signature(torch.optim.LBFGS)
    fields = attrs.fields_dict(optim.LBFGS)
    if not torch_at_least(2, 14):
        del fields["maximize"]  # torch.optim.LBFGS has it from 2.14
    assert set(signature.parameters) - {"params"} == set(fields)
    for name, field in fields.items():
        assert field.default == signature.parameters[name].default, name


BAD = [
    ({"line_search_fn": "armijo"}, ValueError, r"`line_search_fn` must be None"),
    ({"max_iter": 0}, ValueError, r"`max_iter` must be at least 1"),
    ({"max_eval": 2.5}, TypeError, r"`max_eval` must be an int"),
    ({"history_size": True}, TypeError, r"`history_size` must be an int"),
    ({"lr": -1.0}, ValueError, r"`lr`"),
    ({"tolerance_grad": -1.0}, ValueError, r"`tolerance_grad` must be non-negative"),
    ({"maximize": 1}, TypeError, r"`maximize` must be True or False"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD)
def test_bad_hyperparameters_are_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad option raises at construction, naming it."""
    with pytest.raises(error, match=match):
        optim.LBFGS(**kwargs)


def test_bad_step_input_is_refused() -> None:
    """Mixed dtypes, a non-callable closure, another state, wrong grads: named."""
    opt = optim.LBFGS()
    params = ParamDict(w=torch.ones(2), b=torch.ones(1))
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"one dtype and device"):
        opt.init(ParamDict(w=torch.ones(2), b=torch.ones(1, dtype=torch.float64)))
    with pytest.raises(TypeError, match=r"takes a closure"):
        opt.step(params, torch.ones(()), state)  # type: ignore[arg-type]  # the bad input under test
    with pytest.raises(TypeError, match=r"`LBFGSState`"):
        opt.step(params, lambda p: p["w"].sum(), optim.SGD().init(params))  # type: ignore[arg-type]  # the bad input under test
    with pytest.raises(ValueError, match=r"'b'"):
        opt.step(params, lambda p: (p["w"].sum(), {"w": torch.ones(2)}), state)
    with pytest.raises(TypeError, match=r"ParamDict"):
        opt.init({"w": torch.ones(2)})  # type: ignore[arg-type]  # the bad input under test


def test_compiling_the_step_is_refused_by_dynamo() -> None:
    """`torch.compile(fullgraph=True)` cannot trace the host-driven loop."""
    opt = optim.LBFGS(max_iter=2)
    params = ParamDict(w=torch.ones(2, dtype=torch.float64))
    compiled = torch.compile(opt.step, fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(params, lambda p: (p["w"] ** 2).sum(), opt.init(params))
    torch._dynamo.reset()


def test_entries_the_loss_does_not_use_get_zero_gradients() -> None:
    """An unused entry has a zero gradient, as torch gives `grad=None` entries."""
    params = ParamDict(
        xy=torch.tensor([-1.5, 2.0], dtype=torch.float64),
        unused=torch.ones(3, dtype=torch.float64),
    )
    opt = optim.LBFGS(line_search_fn="strong_wolfe")
    new, _ = opt.step(params, lambda p: _rosenbrock(p["xy"]), opt.init(params))
    torch.testing.assert_close(new["unused"], params["unused"], rtol=0, atol=0)
    assert not torch.equal(new["xy"], params["xy"])


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    shapes=st.lists(
        st.lists(st.integers(0, 4), min_size=0, max_size=3), min_size=1, max_size=5
    ),
    transposed=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_flat_vectors_are_the_entries_in_order(
    shapes: list[list[int]], transposed: bool, dtype: torch.dtype
) -> None:
    """LBFGS's flat vector and its keyed views are `cat` and `split` + `view`.

    Any shapes (0-dim, empty, one entry), entries transposed (not contiguous):
    a new vector holding each entry's elements in order, never a view of an
    entry; and views of it shaped as the parameters, sharing its memory.
    """
    gen = torch.Generator().manual_seed(len(shapes))
    values = [torch.randn(s, generator=gen, dtype=dtype) for s in shapes]
    if transposed:
        values = [v.t() if v.dim() == 2 else v for v in values]
    params = ParamDict({f"p{i}": v for i, v in enumerate(values)})
    flat = _flattened(values)
    torch.testing.assert_close(
        flat, torch.cat([v.reshape(-1) for v in values]), rtol=0, atol=0
    )
    assert all(
        flat.untyped_storage().data_ptr() != v.untyped_storage().data_ptr()
        for v in values
        if v.numel()
    )
    run = _Run(optim.LBFGS(), params, lambda p: p["p0"].sum())
    views = run.unflat(flat)
    assert list(views) == list(params)
    for key, v in params.items():
        assert views[key].shape == v.shape
        torch.testing.assert_close(views[key], v, rtol=0, atol=0)
        if v.numel():
            assert (
                views[key].untyped_storage().data_ptr()
                == flat.untyped_storage().data_ptr()
            )
