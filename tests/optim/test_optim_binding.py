"""A bound optimizer trusts nothing that changed: it acts as a first call would.

`step_` and `step` bind the optimizer to what they are handed and keep the
binding (`Bound`, `_binding.py`): its checks ran once, and later calls compare
the facts they read. Each case here changes one thing between two calls (a
tensor resized, re-pointed, restrided or converted; another ParamDict or
buffer; a gradient that shares memory or has another shape, dtype or device;
inference mode; a `grad_fn` appearing) and makes the second call in two
identical worlds: one whose optimizer kept its binding from the first call, and
one whose second call is made by a fresh optimizer of the same options, which
binds afresh. Both must refuse with the same error and message and write
nothing, or both must write the same bytes.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim
from paramdict.optim import _binding

sys.path.insert(0, str(Path(__file__).parents[1] / "hostile"))
from _unchanged import equal
from _unchanged import state as snapshot

Opt = optim.Optimizer[Any]
World = tuple[ParamDict, ParamDict, Any]
SHAPES = {"w": (3, 4), "sq": (4, 4), "b": (4,), "e": (0,)}

FACTORIES: dict[str, Callable[[], Opt]] = {
    "adam": lambda: optim.Adam(lr=0.1),
    "sgd-momentum": lambda: optim.SGD(lr=0.1, momentum=0.9),
    "rmsprop": lambda: optim.RMSprop(lr=0.01),
    "groups": lambda: optim.ParamGroups(
        {"b": optim.SGD(lr=0.1, momentum=0.9)}, default=optim.Adam(lr=0.1)
    ),
    "clip": lambda: optim.ClipGradNorm(optim.AdamW(lr=0.1), max_norm=1.0),
    "multisteps": lambda: optim.MultiSteps(optim.Adam(lr=0.1), every_k=2),
}


def _values(seed: int) -> ParamDict:
    gen = torch.Generator().manual_seed(seed)
    return ParamDict({k: torch.randn(s, generator=gen) for k, s in SHAPES.items()})


def _world(opt: Opt, in_place: bool = True) -> World:
    """Parameters, gradients and state after one `step_` (or `step`) of `opt`."""
    params, grads = _values(0), _values(1)
    step = opt.step_ if in_place else opt.step
    params, state = step(params, grads, opt.init(params))
    return params, _values(2), state


def _kept(opt: Opt) -> bool:
    """Whether `opt` keeps a binding from its last call."""
    return getattr(opt, "_last", None) is not None


def _buffer(state: Any, key: str) -> ParamDict:
    """The first ParamDict of `state` that holds `key` (a buffer of that entry)."""
    found = [
        node
        for node in _nodes(state)
        if isinstance(node, ParamDict) and key in node and node[key].dim() > 0
    ]
    return found[0]


def _nodes(tree: object) -> Iterator[object]:
    yield tree
    if isinstance(tree, tuple):
        for field in tree:
            yield from _nodes(field)


def _replaced(tree: Any, old: object, new: object) -> Any:
    """`tree` with the node `old` (by identity) replaced by `new`."""
    if tree is old:
        return new
    if isinstance(tree, tuple):
        fields = [_replaced(f, old, new) for f in tree]
        return type(tree)(*fields) if hasattr(tree, "_fields") else tuple(fields)
    return tree


# ---------------------------------------------------------------- the changes


def _grow_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["sq"].resize_(5, 4)  # a fused kernel would write past the buffers' end
    return p, g, s


def _shrink_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["sq"].resize_(2, 4)  # the same address and strides
    return p, g, s


def _shrink_buffer(p: ParamDict, g: ParamDict, s: Any) -> World:
    _buffer(s, "sq")["sq"].resize_(2, 4)
    return p, g, s


def _repoint_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["sq"].data = torch.full((4, 4), 0.5)  # fresh memory, same shape
    return p, g, s


def _reshape_param_data(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["sq"].data = p["sq"].data.view(16)  # the same memory, another shape
    return p, g, s


def _convert_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["b"].data = p["b"].data.double()  # what `module.double()` does
    return p, g, s


def _reinterpret_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["b"].data = p["b"].data.view(torch.int32)  # same address, size, strides
    return p, g, s


def _data_into_another_entry(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["b"].data = p["w"][0]
    return p, g, s


def _set_buffer_to_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    b = p["b"]  # the buffer now reads the parameter's memory
    _buffer(s, "b")["b"].set_(
        b.untyped_storage(), b.storage_offset(), b.shape, b.stride()
    )
    return p, g, s


def _set_to_expand(p: ParamDict, g: ParamDict, s: Any) -> World:
    b = p["b"]
    b.set_(b.untyped_storage(), b.storage_offset(), (4,), (0,))
    return p, g, s


def _transpose_param_in_place(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["sq"].as_strided_((4, 4), (1, 4))  # same shape and memory, other strides
    return p, g, s


def _transpose_buffer_in_place(p: ParamDict, g: ParamDict, s: Any) -> World:
    _buffer(s, "sq")["sq"].as_strided_((4, 4), (1, 4))
    return p, g, s


def _transposed_param_swapped_in(p: ParamDict, g: ParamDict, s: Any) -> World:
    return ParamDict({**p, "sq": p["sq"].t()}), g, s


def _equal_params(p: ParamDict, g: ParamDict, s: Any) -> World:
    return ParamDict(dict(p)), g, s


def _reordered_params(p: ParamDict, g: ParamDict, s: Any) -> World:
    return ParamDict({k: p[k] for k in reversed(p.keys())}), g, s


def _renamed_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    def renamed(d: ParamDict) -> ParamDict:
        return ParamDict({("x" if k == "b" else k): v for k, v in d.items()})

    return renamed(p), renamed(g), s


def _replaced_buffer(p: ParamDict, g: ParamDict, s: Any) -> World:
    old = _buffer(s, "sq")
    return p, g, _replaced(s, old, old.clone())


def _replaced_buffer_of_other_shape(p: ParamDict, g: ParamDict, s: Any) -> World:
    old = _buffer(s, "sq")
    return p, g, _replaced(s, old, old.map(lambda t: t[:1]))


def _buffer_in_a_tuple(p: ParamDict, g: ParamDict, s: Any) -> World:
    old = _buffer(s, "sq")
    return p, g, _replaced(s, old, (old,))  # the same tensors, another structure


def _grad_is_a_buffer(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "sq": _buffer(s, "sq")["sq"]}), s


def _grad_is_a_param(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "b": p["b"]}), s


def _grad_of_other_shape(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "sq": torch.ones(16)}), s


def _grad_of_other_dtype(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "b": g["b"].double()}), s


def _grad_on_meta(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "b": torch.empty(4, device="meta")}), s


def _grad_transposed(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "sq": g["sq"].t().contiguous().t()}), s


def _sparse_grad(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "b": g["b"].to_sparse()}), s


def _grad_requiring_grad(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "b": g["b"].clone().requires_grad_()}), s


class _Subclass(Tensor):
    """A tensor subclass that adds nothing."""


def _subclass_grad(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, ParamDict({**g, "sq": g["sq"].clone().as_subclass(_Subclass)}), s


def _grad_fn_appears(p: ParamDict, g: ParamDict, s: Any) -> World:
    p["b"].mul_(torch.ones((), requires_grad=True))  # recorded by autograd now
    return p, g, s


def _buffer_grad_fn_appears(p: ParamDict, g: ParamDict, s: Any) -> World:
    _buffer(s, "b")["b"].add_(torch.zeros((), requires_grad=True))
    return p, g, s


@dataclass(frozen=True)
class Change:
    """One change between two calls, and what the second call must do."""

    name: str
    apply: Callable[[ParamDict, ParamDict, Any], World]
    refused: str | None  # a pattern of the refusal, or None: the step runs
    inference: bool = False  # the second call inside `torch.inference_mode()`


def _unchanged(p: ParamDict, g: ParamDict, s: Any) -> World:
    return p, g, s


CHANGES = [
    Change("nothing", _unchanged, None),
    Change("param resize_ larger", _grow_param, "must match"),
    Change("param resize_ smaller", _shrink_param, "must match"),
    Change("buffer resize_ smaller", _shrink_buffer, "must match"),
    Change("param .data = fresh memory", _repoint_param, None),
    Change("param .data = view of another shape", _reshape_param_data, "must match"),
    Change("param .data = double", _convert_param, "must match"),
    Change("param .data = int32 view", _reinterpret_param, "real floating-point"),
    Change("param .data = another entry", _data_into_another_entry, "share memory"),
    Change("buffer set_ to a param", _set_buffer_to_param, "share memory"),
    Change("param set_ to an expand", _set_to_expand, "one memory location"),
    Change("param as_strided_ transposed", _transpose_param_in_place, None),
    Change("buffer as_strided_ transposed", _transpose_buffer_in_place, None),
    Change("transposed param swapped in", _transposed_param_swapped_in, None),
    Change("an equal ParamDict", _equal_params, None),
    Change("a reordered ParamDict", _reordered_params, "must match|another order"),
    Change("a renamed entry", _renamed_param, "'x'"),
    Change("buffer _replace'd", _replaced_buffer, None),
    Change("buffer _replace'd, other shape", _replaced_buffer_of_other_shape, "sq"),
    Change("buffer wrapped in a tuple", _buffer_in_a_tuple, "ParamDict"),
    Change("grad is a buffer", _grad_is_a_buffer, "share memory"),
    Change("grad is a param", _grad_is_a_param, "share memory"),
    Change("grad of other shape", _grad_of_other_shape, "must match"),
    Change("grad of other dtype", _grad_of_other_dtype, "must match"),
    Change("grad on meta", _grad_on_meta, "must match"),
    Change("grad transposed", _grad_transposed, None),
    Change("grad sparse", _sparse_grad, "dense layout"),
    Change("grad requiring grad", _grad_requiring_grad, None),
    Change("grad of a tensor subclass", _subclass_grad, None),
    Change("param grad_fn appears", _grad_fn_appears, "grad_fn"),
    Change("buffer grad_fn appears", _buffer_grad_fn_appears, "grad_fn"),
    Change("inference mode on", _unchanged, None, inference=True),
]


def _call(
    opt: Opt, world: World, inference: bool, in_place: bool = True
) -> tuple[Exception | None, World]:
    """`step_` (or `step`) on `world`: its error (or None), and what it returned."""
    params, grads, state = world
    mode = torch.inference_mode() if inference else contextlib.nullcontext()
    step = opt.step_ if in_place else opt.step
    try:
        with mode:
            params, state = step(params, grads, state)
    except (TypeError, ValueError) as error:
        return error, world
    return None, (params, grads, state)


def _tensors(world: World) -> list[Tensor]:
    params, _, state = world
    leaves = pytree.tree_leaves(state)
    return [*params.values(), *(t for t in leaves if isinstance(t, Tensor))]


@pytest.fixture(params=["torch's check", "listed facts"])
def facts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Kept facts checked by torch's C++ tensor check, or by `_binding`'s own lists."""
    if request.param == "listed facts":
        monkeypatch.setattr(_binding, "_TORCH_CHECK", None)
    return str(request.param)


@pytest.mark.parametrize("factory", list(FACTORIES), ids=str)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.name)
def test_a_change_between_calls_is_met_as_a_first_call_meets_it(
    change: Change, factory: str, facts: str
) -> None:
    """The call with a kept record refuses or steps exactly as one checked in full."""
    make = FACTORIES[factory]
    full_error, full_after = _call(
        make(), change.apply(*_world(make())), change.inference
    )
    opt = make()
    changed = change.apply(*_world(opt))
    assert _kept(opt)
    if change.refused is None:
        assert full_error is None, full_error
        _, kept_after = _call(opt, changed, change.inference)
        for mine, theirs in zip(
            _tensors(kept_after), _tensors(full_after), strict=True
        ):
            assert mine.dtype == theirs.dtype
            assert torch.equal(mine, theirs)
        return
    assert full_error is not None
    assert re.search(change.refused, str(full_error)), full_error
    before = snapshot(changed)
    with pytest.raises(type(full_error), match=re.escape(str(full_error))):
        _call_raising(opt, changed, change.inference)
    assert equal(before, snapshot(changed)), "a refused step wrote"


def _call_raising(opt: Opt, world: World, inference: bool) -> None:
    mode = torch.inference_mode() if inference else contextlib.nullcontext()
    with mode:
        opt.step_(*world)


FULL_CHECKS = {
    "state": "paramdict.optim._torch_optimizer.check_buffers",
    "writable": "paramdict.optim._binding.check_writable",
    "path": "paramdict.optim._fused.fused_refusal",
}


@pytest.mark.parametrize("factory", list(FACTORIES), ids=str)
def test_repeated_calls_run_the_full_checks_once(
    monkeypatch: pytest.MonkeyPatch, factory: str
) -> None:
    """Nothing changed: the checks on params and state run on the first call only."""
    calls: dict[str, int] = dict.fromkeys(FULL_CHECKS, 0)

    def counting(name: str, target: str) -> None:
        module, attr = target.rsplit(".", 1)
        original = getattr(sys.modules[module], attr)

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(target, counted)

    for name, target in FULL_CHECKS.items():
        counting(name, target)
    opt = FACTORIES[factory]()
    params, grads, state = _world(opt)
    params, state = opt.step_(params, grads, state)  # MultiSteps: a step at last
    first = dict(calls)
    for _ in range(4):
        params, state = opt.step_(params, grads, state)
    assert calls == first, calls
    assert first["writable"] == 1


STEPPING = [c for c in CHANGES if c.refused is None]


@settings(
    max_examples=16,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_loop_of_changes_equals_one_checked_in_full_every_call(
    data: st.DataObject,
) -> None:
    """Steps between allowed changes: the kept loop writes the fresh loop's bytes.

    In place (`step_`, a record of the tensors) or not (`step`, of their facts).
    """
    factory = data.draw(st.sampled_from(sorted(FACTORIES)), label="optimizer")
    changes = data.draw(
        st.lists(st.sampled_from(STEPPING), min_size=1, max_size=5), label="changes"
    )
    in_place = data.draw(st.booleans(), label="step_")
    make = FACTORIES[factory]
    opt = make()
    kept_world, fresh_world = _world(opt, in_place), _world(make(), in_place)
    for change in changes:
        for world, stepper in ((kept_world, opt), (fresh_world, make())):
            changed = change.apply(*world)
            error, after = _call(stepper, changed, change.inference, in_place)
            assert error is None, (change.name, error)
            if stepper is opt:
                kept_world = after
            else:
                fresh_world = after
    for mine, theirs in zip(_tensors(kept_world), _tensors(fresh_world), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("kind", ["Adam", "SGD", "Adagrad"])
def test_rates_and_gradients_are_read_on_every_repeated_call(kind: str) -> None:
    """A tensor `lr` written between calls and fresh gradients: torch's fused bytes.

    The verdicts are kept; the rates are not: each call reads the `lr` tensor
    as torch.optim's fused step does, on a ParamDict rebuilt around the same
    tensors every call.
    """
    ours_cls, theirs_cls = getattr(optim, kind), getattr(torch.optim, kind)
    options: dict[str, Any] = {"momentum": 0.9} if kind == "SGD" else {}
    start = _values(0)
    lr, torch_lr = torch.tensor(0.1), torch.tensor(0.1)
    opt = ours_cls(lr=lr, **options)
    params = start.clone()
    state = opt.init(params)
    tensors = [t.clone().requires_grad_() for t in start.values()]
    torch_opt = theirs_cls(tensors, lr=torch_lr, fused=True, **options)
    for step in range(5):
        grads = _values(10 + step)
        params, state = opt.step_(ParamDict(dict(params)), grads, state)
        for t, g in zip(tensors, grads.values(), strict=True):
            t.grad = g.clone()
        torch_opt.step()
        lr.fill_(0.1 / (step + 2))
        torch_lr.fill_(0.1 / (step + 2))
    assert _kept(opt)
    for mine, theirs in zip(params.values(), tensors, strict=True):
        assert torch.equal(mine, theirs.detach())


class _Slotted(optim.Optimizer[tuple[()]]):
    """An optimizer of `__slots__` alone: it cannot be weakly referenced."""

    __slots__ = ()
    differentiable = False

    def init(self, params: ParamDict, /) -> tuple[()]:
        return ()

    def update_(
        self, params: ParamDict, grads: ParamDict, state: tuple[()], /
    ) -> tuple[()]:
        params.add_(grads, alpha=-0.5)
        return state


def test_an_optimizer_of_slots_alone_steps() -> None:
    """A subclass of `__slots__` alone keeps its binding in the base's slot."""
    opt = _Slotted()
    params = ParamDict(w=torch.ones(2))
    for _ in range(2):
        params, _ = opt.step_(params, params.ones_like(), ())
    assert torch.equal(params["w"], torch.zeros(2))


class _Meddling(dict[str, Tensor]):
    """Gradients whose look-up re-points a parameter into another's memory."""

    def __init__(self, grads: ParamDict, params: ParamDict) -> None:
        super().__init__(grads)
        self.params = params

    def __getitem__(self, key: str) -> Tensor:
        self.params["b"].data = self.params["w"][0]
        return super().__getitem__(key)


def test_facts_are_read_after_the_gradients_mapping_ran_its_code() -> None:
    """A mapping that changes a parameter while it is read: refused, nothing written."""
    opt = optim.Adam(lr=0.1)
    params, grads, state = _world(opt)
    before = snapshot(state)
    with pytest.raises(ValueError, match="share memory"):
        opt.step_(params, _Meddling(grads, params), state)
    assert equal(before, snapshot(state))


@pytest.mark.parametrize("field", ["params", "state"])
def test_a_grad_fn_on_a_tensor_that_required_grad_is_refused(
    field: str, facts: str
) -> None:
    """A `grad_fn` that appears on a bound tensor that required grad is refused.

    Its facts (`requires_grad` included) stay as they were when the flag is
    turned off and an in-place operation records the tensor again.
    """
    opt = optim.Adam(lr=0.1)
    params, grads, state = _world(opt)
    tensor = params["b"] if field == "params" else _buffer(state, "b")["b"]
    tensor.requires_grad_()
    params, state = opt.step_(params, grads, state)  # a record with it
    params, state = opt.step_(params, grads, state)  # kept
    tensor.requires_grad_(False)
    tensor.mul_(torch.ones((), requires_grad=True))  # a grad_fn, requires_grad again
    assert tensor.grad_fn is not None
    before = snapshot((params, grads, state))
    with pytest.raises(ValueError, match="grad_fn"):
        opt.step_(params, grads, state)
    assert equal(before, snapshot((params, grads, state)))


def test_a_binding_holds_its_tensors_not_their_ids() -> None:
    """A binding holds the parameters and state it checked, so no `id` is reused."""
    opt = optim.SGD(lr=0.1, momentum=0.9)
    params, _, state = _world(opt)
    bound = getattr(opt, "_last", None)
    assert isinstance(bound, optim.Bound)
    assert bound.params is params
    assert bound.state is state


@pytest.mark.parametrize("factory", list(FACTORIES), ids=str)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.name)
def test_step_after_a_change_acts_as_a_first_call(
    change: Change, factory: str, facts: str
) -> None:
    """`step` keeps its binding for the tensors it returned, and nothing else.

    The second call, after the change, refuses with the same error or returns
    the same bytes as a fresh optimizer's call, which checks in full.
    """
    make = FACTORIES[factory]
    fresh_error, fresh_after = _call(
        make(), change.apply(*_world(make(), False)), change.inference, False
    )
    opt = make()
    changed = change.apply(*_world(opt, False))
    assert _kept(opt)
    before = snapshot(changed)
    error, after = _call(opt, changed, change.inference, False)
    assert type(error) is type(fresh_error)
    assert str(error) == str(fresh_error)
    assert equal(before, snapshot(changed)), "`step` changed its inputs"
    if error is not None:  # (a resized tensor's new elements are not the same)
        return
    for mine, theirs in zip(_tensors(after), _tensors(fresh_after), strict=True):
        assert mine.dtype == theirs.dtype
        assert torch.equal(mine, theirs)


_WITHOUT_STRIDES = """
import warnings
import torch
from paramdict import ParamDict, optim

warnings.simplefilter("ignore")  # nested tensors are a prototype
ODD = {
    "sparse": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.reshape(2, -1).to_sparse_csr(),
    "nested": lambda t: torch.nested.nested_tensor([t[:1], t[1:]]),
}
for kind, odd in ODD.items():
    for where in ("params", "grads"):
        for method in ("step", "step_"):
            opt = optim.Adam(lr=0.1)
            params = ParamDict(w=torch.randn(4), b=torch.randn(4))
            grads = ParamDict(w=torch.randn(4), b=torch.randn(4))
            state = opt.init(params)
            for _ in range(2):  # a kept record of plain tensors first
                params, state = getattr(opt, method)(params, grads, state)
            if where == "params":
                params = ParamDict(w=params["w"], b=odd(params["b"]))
            else:
                grads = ParamDict(w=grads["w"], b=odd(grads["b"]))
            before = [t.clone() for t in (params["w"], state.exp_avg["w"])]
            try:
                getattr(opt, method)(params, grads, state)
            except (TypeError, ValueError, RuntimeError, NotImplementedError):
                pass
            after = (params["w"], state.exp_avg["w"])
            assert all(torch.equal(a, b) for a, b in zip(before, after)), kind
print("survived")
"""


def test_tensors_without_strides_after_a_kept_record_raise_not_abort() -> None:
    """Sparse, CSR or nested tensors where kept ones were: an error, the process lives.

    torch's C++ tensor check, which `Bound` uses for plain dense tensors,
    ends the process on a tensor without strides instead of raising; such
    tensors must never reach it. In a subprocess, so an abort fails the test.
    """
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_STRIDES],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "survived" in done.stdout
