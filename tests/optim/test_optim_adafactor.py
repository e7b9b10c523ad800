"""Adafactor: the differentiable mode follows the default one and reaches `lr`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from optim_cases import batches, forward, make_model

from paramdict import ParamDict, optim
from paramdict.optim import _adafactor_factors as factors
from paramdict.optim import adafactor


def test_differentiable_steps_equal_default_and_reach_the_learning_rate() -> None:
    """3 differentiable float64 steps give the default values and d(loss)/d(lr)."""
    start = ParamDict.from_module(make_model(torch.float64)).detach()
    data = list(batches(torch.float64, steps=4))
    lr = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
    results = []
    for differentiable in (False, True):
        opt = optim.Adafactor(
            lr=lr, weight_decay=0.01, d=1.5, differentiable=differentiable
        )
        params = start.requires_grad_()
        state = opt.init(params)
        for x, y in data[:3]:
            loss = F.mse_loss(forward(params, x), y)
            grads = params.grad(loss, create_graph=differentiable)
            params, state = opt.step(params, grads, state)
        results.append(params)
    default, recorded = results
    torch.testing.assert_close(
        dict(recorded.detach()), dict(default.detach()), rtol=1e-12, atol=1e-14
    )
    (meta,) = torch.autograd.grad(
        F.mse_loss(forward(recorded, *data[3][:1]), data[3][1]), lr
    )
    assert meta.isfinite()
    assert meta != 0


@pytest.mark.parametrize(
    "shapes", [[(3,), (4,)], [(2, 3), (3, 2)]], ids=["vectors", "matrices"]
)
def test_in_place_step_with_one_kind_of_entry_equals_step(
    shapes: list[tuple[int, ...]],
) -> None:
    """`step_` works when no entry is a matrix, or every one is (one buffer empty)."""
    gen = torch.Generator().manual_seed(0)
    start = ParamDict(
        {f"w{i}": torch.randn(s, generator=gen) for i, s in enumerate(shapes)}
    )
    grads = start.map(lambda v: torch.randn(v.shape, generator=gen))
    opt = optim.Adafactor(lr=0.1)
    want, want_state = start, opt.init(start)
    got, got_state = start.map(torch.clone), opt.init(start)
    for _ in range(3):
        want, want_state = opt.step(want, grads, want_state)
        got, got_state = opt.step_(got, grads, got_state)
    torch.testing.assert_close(dict(got), dict(want), rtol=0, atol=0)
    torch.testing.assert_close(int(got_state.step), 3)


SHAPES = [(), (5,), (3, 4), (2, 3, 2)]
MIXED = [torch.float32, torch.bfloat16, torch.float64]


def _entries(
    dtypes: list[torch.dtype], shapes: list[tuple[int, ...]], steps: int
) -> tuple[ParamDict, list[ParamDict]]:
    """Parameters of `shapes` (dtypes in turn) and `steps` gradients for them."""
    gen = torch.Generator().manual_seed(0)

    def draw(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)

    kinds = [dtypes[i % len(dtypes)] for i in range(len(shapes))]
    params = ParamDict(
        {f"w{i}": draw(s, d) for i, (s, d) in enumerate(zip(shapes, kinds))}
    )
    grads = [params.map(lambda v: draw(v.shape, v.dtype)) for _ in range(steps)]
    return params, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"weight_decay": 0.1, "maximize": True, "d": 1.5, "eps": (1e-3, 1e-2)}],
    ids=["defaults", "decay-maximize-d-eps"],
)
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_eager_steps_are_torch_default_path_bitwise(
    dtype: torch.dtype, kwargs: dict[str, object], in_place: bool
) -> None:
    """30 eager steps give torch.optim.Adafactor's parameters bit for bit.

    Its default path steps entry by entry, reading each norm with `.item()`; the
    relative step size comes from the parameters before their decay.
    """
    start, grads = _entries([dtype], SHAPES, steps=30)
    tensors = [v.clone() for v in start.values()]
    theirs = torch.optim.Adafactor(tensors, lr=0.01, **kwargs)  # type: ignore[arg-type]
    opt = optim.Adafactor(lr=0.01, **kwargs)  # type: ignore[arg-type]
    params, state = start.map(torch.clone), opt.init(start)
    for g in grads:
        for tensor, grad in zip(tensors, g.values()):
            tensor.grad = grad
        theirs.step()  # type: ignore[no-untyped-call]  # torch's annotation
        params, state = (opt.step_ if in_place else opt.step)(params, g, state)
        for ours, torch_value in zip(params.values(), tensors):
            assert torch.equal(ours, torch_value)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bytes as integers, so that NaNs compare equal."""
    kinds = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(kinds[t.element_size()])


def _lr(kind: str, params: ParamDict) -> object:
    if kind == "tensor":
        return torch.tensor(0.07)
    if kind == "per-key":
        return params.map(lambda v: torch.tensor(0.02 * (v.dim() + 1)))
    if kind == "schedule":
        return optim.CosineAnnealingLR(base_lr=0.5, T_max=3)
    return {"small": 0.05, "large": 3.0}[kind]


@pytest.mark.parametrize(
    "dtypes",
    [[torch.float32], [torch.float64], [torch.bfloat16], MIXED],
    ids=["float32", "float64", "bfloat16", "mixed"],
)
@pytest.mark.parametrize("lr", ["small", "large", "tensor", "per-key", "schedule"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"weight_decay": 0.2, "maximize": True, "eps": (1e-3, 1e-2), "d": 1.5},
        {"eps": (0.0, 0.0), "beta2_decay": -0.5},
    ],
    ids=["defaults", "options", "zero-eps"],
)
def test_host_numbers_equal_the_tensor_form(
    dtypes: list[torch.dtype],
    lr: str,
    kwargs: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The eager step's host-side factors give the tensor form's bytes.

    The tensor form is what traced, differentiable and non-CPU steps compute;
    forced here on eager steps (`step` and `step_`), with a NaN and an infinite
    gradient among the entries.
    """
    # (A 0-dim entry of half precision among others would be promoted by the
    # double-precision lerp weight: only with one single or double dtype.)
    shapes = SHAPES if dtypes in ([torch.float32], [torch.float64]) else SHAPES[1:]
    shapes = [*shapes, (7,)]
    start, grads = _entries(dtypes, shapes, steps=4)
    grads[1]["w1"].view(-1)[0] = float("nan")
    grads[2][f"w{len(shapes) - 1}"].view(-1)[-1] = float("inf")
    results: dict[tuple[str, str], list[torch.Tensor]] = {}
    # The host form with the update by foreach kernels (small entries), then
    # entry by entry (large ones), then the device form (its foreach kernels
    # over the 0-dim norms, run here on the CPU), then the tensor form.
    for form in ("foreach", "entrywise", "device", "tensor"):
        if form == "entrywise":
            monkeypatch.setattr(factors, "_SMALL", 0)
        if form == "device":
            monkeypatch.setattr(adafactor, "factor_form", lambda *_: "device")
        if form == "tensor":
            monkeypatch.setattr(adafactor, "factor_form", lambda *_: "traced")
        opt = optim.Adafactor(lr=_lr(lr, start), **kwargs)  # type: ignore[arg-type]
        for mode in ("step", "step_"):
            params, state = start.map(torch.clone), opt.init(start)
            for g in grads:
                params, state = getattr(opt, mode)(params, g, state)
            results[form, mode] = [
                *params.values(),
                *state.variance.values(),
                *state.row_var.values(),
            ]
    for (form, mode), values in results.items():
        reference = results["foreach", mode]
        for got, want in zip(values, reference, strict=True):
            assert got.dtype == want.dtype, form
            assert torch.equal(_bits(got), _bits(want)), form


@pytest.mark.skipif(
    torch.__version__ < "2.8",
    reason="torch.compile traces a ParamDict in one graph from torch 2.8 on",
)
@pytest.mark.parametrize(
    "shapes", [[(3,), (4,)], [(2, 3), (3, 2)]], ids=["vectors", "matrices"]
)
def test_compiled_steps_with_one_kind_of_entry_equal_eager(
    shapes: list[tuple[int, ...]],
) -> None:
    """`step` and `step_` compile where one buffer is empty, and equal eager.

    The empty buffer is left as it is: a foreach kernel refuses an empty list
    while traced.
    """
    torch._dynamo.reset()
    start, grads = _entries([torch.float32], shapes, steps=3)
    opt = optim.Adafactor(lr=0.1, weight_decay=0.1)
    compiled = {
        "step": torch.compile(opt.step, fullgraph=True, backend="eager"),
        "step_": torch.compile(opt.step_, backend="aot_eager"),
    }
    for name, step in compiled.items():
        eager = getattr(opt, name)
        want, want_state = start.map(torch.clone), opt.init(start)
        got, got_state = start.map(torch.clone), opt.init(start)
        for g in grads:
            want, want_state = eager(want, g, want_state)
            got, got_state = step(got, g, got_state)
        # Traced, the per-entry factor stays a tensor: one more rounding.
        torch.testing.assert_close(dict(got), dict(want), rtol=1e-6, atol=1e-7)
        assert int(got_state.step) == 3
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["step", "step_"])
def test_half_precision_steps_are_torch_s_and_keep_their_state(
    dtype: torch.dtype, mode: str
) -> None:
    """0-dim, vector and matrix entries in half precision: torch.optim's bytes.

    The moments' weight is a number, as torch.optim's: a float64 0-dim weight
    promoted a 0-dim entry's buffer to float64, which the next step refused.
    """
    gen = torch.Generator().manual_seed(0)
    shapes = {"s": (), "v": (5,), "m": (4, 3)}
    start = {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items()}
    grads = [
        {k: torch.randn(s, generator=gen).to(dtype) for k, s in shapes.items()}
        for _ in range(5)
    ]
    opt = optim.Adafactor(lr=0.01)
    params = ParamDict({k: v.clone() for k, v in start.items()})
    state = opt.init(params)
    theirs = {k: v.clone().requires_grad_() for k, v in start.items()}
    torch_opt: torch.optim.Optimizer = torch.optim.Adafactor(
        list(theirs.values()), lr=0.01
    )
    step = opt.step if mode == "step" else opt.step_
    for g in grads:
        params, state = step(params, ParamDict(g), state)
        for k, t in theirs.items():
            t.grad = g[k].clone()
        torch_opt.step()
    assert state.variance["s"].dtype == dtype
    for k, t in theirs.items():
        assert torch.equal(params[k], t.detach()), k


def test_mixed_dtypes_keep_each_buffer_s_dtype() -> None:
    """A half-precision 0-dim entry beside float32 ones steps again and again."""
    params = ParamDict(s=torch.tensor(1.0, dtype=torch.float16), w=torch.ones(3, 2))
    opt = optim.Adafactor(lr=0.01)
    state = opt.init(params)
    for _ in range(3):
        params, state = opt.step(params, params.map(torch.ones_like), state)
    assert state.variance["s"].dtype == torch.float16
    assert params["s"].dtype == torch.float16
