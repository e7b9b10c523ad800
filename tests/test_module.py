from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import ONE_GRAPH
from torch import nn

from paramdict import ParamDict


class Counter(nn.Module):
    """Counts its calls by assigning a new buffer (not by updating it in place)."""

    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return `x`, counting the call."""
        self.count = self.count + 1
        return x


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _snapshot(module: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    state = dict(module.named_parameters()) | dict(module.named_buffers())
    return {k: (id(v), v.detach().clone()) for k, v in state.items()}


def _assert_unchanged(
    module: nn.Module, before: dict[str, tuple[int, torch.Tensor]]
) -> None:
    assert _snapshot(module).keys() == before.keys()
    for k, (ident, value) in _snapshot(module).items():
        assert ident == before[k][0], k
        assert torch.equal(value, before[k][1]), k


def test_from_module_holds_live_parameters() -> None:
    """`from_module` keys like `named_parameters()` and keeps the objects."""
    model = _mlp()
    p = ParamDict.from_module(model)
    assert list(p) == [k for k, _ in model.named_parameters()]
    for k, v in model.named_parameters():
        assert p[k] is v
    loss = p.call(model, torch.randn(5, 3)).sum()
    loss.backward()
    assert model[0].weight.grad is not None


def test_from_module_with_buffers() -> None:
    """`buffers=True` adds `named_buffers()` after the parameters."""
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    p = ParamDict.from_module(model, buffers=True)
    assert list(p) == [
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    assert p["1.running_mean"] is model[1].running_mean


def test_call_matches_forward_with_replaced_parameters() -> None:
    """`call` runs the module with the given tensors and leaves it unchanged."""
    model = _mlp()
    before = _snapshot(model)
    x = torch.randn(5, 3)
    p = ParamDict.from_module(model) * 2
    expected = F.linear(
        F.relu(F.linear(x, p["0.weight"], p["0.bias"])), p["2.weight"], p["2.bias"]
    )
    torch.testing.assert_close(p.call(model, x), expected)
    torch.testing.assert_close(torch.func.functional_call(model, p, (x,)), expected)
    _assert_unchanged(model, before)


def test_call_with_subset_and_kwargs() -> None:
    """A subset of keys replaces only those tensors; keyword arguments pass through."""
    model = nn.MultiheadAttention(4, 2, batch_first=True)
    x = torch.randn(1, 3, 4)
    sub = ParamDict(
        {k: v * 0 for k, v in model.named_parameters() if k.startswith("out_proj.")}
    )
    out, _ = sub.call(model, x, x, x, need_weights=False)
    torch.testing.assert_close(out, torch.zeros(1, 3, 4))


def test_call_unknown_key_is_named() -> None:
    """A key the module does not have is a ValueError naming it; module unchanged."""
    model = _mlp()
    before = _snapshot(model)
    p = ParamDict.from_module(model) | {"head.bias": torch.zeros(2)}
    with pytest.raises(
        ValueError, match=r"no parameter or buffer named \['head.bias'\]"
    ):
        p.call(model, torch.randn(1, 3))
    _assert_unchanged(model, before)


def test_functional_call_accepts_paramdict_under_torch_func() -> None:
    """`functional_call` takes a ParamDict under `torch.func.grad` and `vmap`."""
    model = _mlp()
    x, y = torch.randn(6, 3), torch.randn(6, 2)
    p = ParamDict.from_module(model)

    def loss(params: ParamDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(torch.func.functional_call(model, params, (x,)), y)

    g = torch.func.grad(loss)(p, x, y)
    assert type(g) is ParamDict
    ref = p.grad(loss(p, x, y))
    for k in p:
        torch.testing.assert_close(g[k], ref[k])

    stacked = ParamDict({k: torch.stack([v, 2 * v]) for k, v in p.items()})
    out = torch.func.vmap(lambda q: torch.func.functional_call(model, q, (x,)))(stacked)
    torch.testing.assert_close(out[1], torch.func.functional_call(model, p * 2, (x,)))


@ONE_GRAPH
def test_functional_call_accepts_paramdict_under_compile() -> None:
    """`functional_call` on a ParamDict compiles with `fullgraph=True`."""
    model = _mlp()
    x = torch.randn(4, 3)
    p = ParamDict({k: v.detach() for k, v in model.named_parameters()})

    def f(params: ParamDict, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.func.functional_call(model, params - 0.1, (x,))
        return out

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(p, x), f(p, x))


def test_batchnorm_buffers_through_functional_call() -> None:
    """BatchNorm in training mode updates the buffers passed in, not the module's."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    model = nn.Sequential(nn.Linear(3, 4), bn)
    assert bn.running_mean is not None
    module_mean = bn.running_mean.clone()
    p = ParamDict.from_module(model, buffers=True)
    own = {k: v.clone() for k, v in p.items()}
    p = ParamDict({k: v.clone() for k, v in own.items()})
    x = torch.randn(8, 3)
    out = torch.func.functional_call(model, p, (x,))
    h = F.linear(x, own["0.weight"], own["0.bias"])
    expected_mean = 0.9 * own["1.running_mean"] + 0.1 * h.mean(0)
    torch.testing.assert_close(p["1.running_mean"], expected_mean)
    assert p["1.num_batches_tracked"].item() == 1
    torch.testing.assert_close(bn.running_mean, module_mean)
    ref = F.batch_norm(h, None, None, own["1.weight"], own["1.bias"], training=True)
    torch.testing.assert_close(out, ref)
    model.eval()
    evald = p.call(model, x)
    torch.testing.assert_close(
        evald,
        F.batch_norm(
            h, p["1.running_mean"], p["1.running_var"], own["1.weight"], own["1.bias"]
        ),
    )


def test_module_replacing_a_buffer_inside_functional_call_is_reported() -> None:
    """A module that swaps a buffer object cannot write it back into a ParamDict."""
    model = Counter()
    p = ParamDict.from_module(model, buffers=True)
    with pytest.raises(TypeError, match=r"would change \['count'\].*dict\(p\)"):
        torch.func.functional_call(model, p, (torch.zeros(1),))
    assert model.count.item() == 0
    d = dict(p)
    torch.func.functional_call(model, d, (torch.zeros(1),))
    assert d["count"].item() == 1


def test_swapped_into_uses_the_very_tensors_and_restores() -> None:
    """Inside the block the module holds the given non-leaf tensors; then its own."""
    model = _mlp()
    before = _snapshot(model)
    base = ParamDict.from_module(model)
    scale = torch.tensor(2.0, requires_grad=True)
    p = base * scale
    x = torch.randn(5, 3)
    with p.swapped_into(model) as m:
        assert m is model
        assert model[0].weight is p["0.weight"]
        assert not isinstance(model[0].weight, nn.Parameter)
        out = model(x).sum()
    _assert_unchanged(model, before)
    (g,) = torch.autograd.grad(out, scale, retain_graph=True)
    (ref,) = torch.autograd.grad(p.call(model, x).sum(), scale)
    torch.testing.assert_close(g, ref)


def test_swapped_into_restores_after_exception() -> None:
    """The originals come back when the block raises, and the error propagates."""
    model = _mlp()
    before = _snapshot(model)
    p = ParamDict.from_module(model) * 0

    def fail_inside() -> None:
        with p.swapped_into(model):
            assert model[0].weight is p["0.weight"]
            msg = "boom"
            raise RuntimeError(msg)

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    _assert_unchanged(model, before)


def test_swapped_into_unknown_key_leaves_module_untouched() -> None:
    """An unknown key is refused before anything is swapped."""
    model = _mlp()
    before = _snapshot(model)
    p = (ParamDict.from_module(model) * 0) | {"nope": torch.zeros(1)}
    with pytest.raises(ValueError, match=r"\['nope'\]"), p.swapped_into(model):
        pass
    _assert_unchanged(model, before)


def test_swapped_into_follows_tied_weights() -> None:
    """A tied alias of a swapped parameter is swapped too."""
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    p = ParamDict.from_module(model)
    assert list(p) == ["0.weight"]
    new = torch.eye(2)
    with ParamDict({"0.weight": new}).swapped_into(model):
        assert model[1].weight is new
    assert model[1].weight is model[0].weight


def test_to_module_copies_in_place_keeping_parameter_objects() -> None:
    """`to_module` writes values in place; Parameters and optimizers stay valid."""
    model = _mlp()
    ids = {k: id(v) for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = ParamDict.from_module(model)
    target = ParamDict({k: v.detach() * 0.5 + 1 for k, v in p.items()})
    target.to_module(model)
    for k, v in model.named_parameters():
        assert id(v) == ids[k]
        assert isinstance(v, nn.Parameter)
        assert v.grad_fn is None
        torch.testing.assert_close(v, target[k])
    model(torch.randn(2, 3)).sum().backward()
    opt.step()  # the optimizer still holds the module's parameters


def test_to_module_mismatch_copies_nothing() -> None:
    """Key, shape or dtype mismatches are named and nothing is copied."""
    model = _mlp()
    before = _snapshot(model)
    p = ParamDict({k: v.detach() + 1 for k, v in model.named_parameters()})
    with pytest.raises(ValueError, match=r"missing \['2.bias'\].*strict=False"):
        ParamDict({k: v for k, v in p.items() if k != "2.bias"}).to_module(model)
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        (p | {"extra": torch.zeros(1)}).to_module(model)
    with pytest.raises(
        ValueError, match=r"shape differs for '0.bias' \(\(5,\) vs \(4,\)\)"
    ):
        (p | {"0.bias": torch.zeros(5)}).to_module(model)
    with pytest.raises(ValueError, match=r"dtype differs for '0.bias'"):
        (p | {"0.bias": torch.zeros(4, dtype=torch.float64)}).to_module(model)
    _assert_unchanged(model, before)


def test_to_module_non_strict_subset_and_buffers() -> None:
    """`strict=False` writes a subset; buffers are written too."""
    lin, bn = nn.Linear(2, 2), nn.BatchNorm1d(2)
    model = nn.Sequential(lin, bn)
    ParamDict(
        {"0.bias": torch.ones(2), "1.running_mean": torch.full((2,), 3.0)}
    ).to_module(model, strict=False)
    torch.testing.assert_close(lin.bias.detach(), torch.ones(2))
    torch.testing.assert_close(bn.running_mean, torch.full((2,), 3.0))


def test_load_state_dict_accepts_paramdict() -> None:
    """`module.load_state_dict` takes a ParamDict."""
    model, other = _mlp(), nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    p = ParamDict({k: v.detach() for k, v in other.named_parameters()})
    model.load_state_dict(p)
    for k, v in model.named_parameters():
        torch.testing.assert_close(v.detach(), p[k])


def test_call_matches_functional_call_in_float64_to_second_order() -> None:
    """`call` and `functional_call` agree on outputs and on second-order grads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()
    p = ParamDict.from_module(model).detach().requires_grad_()
    x, y = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 1).double()

    def meta(run: Callable[[ParamDict], torch.Tensor]) -> tuple[torch.Tensor, ...]:
        loss = F.mse_loss(run(p), y)
        fast = p.sub(p.grad(loss, create_graph=True), alpha=0.1)
        outer = F.mse_loss(run(fast), y)
        return torch.autograd.grad(outer, tuple(p.values()))

    ours = meta(lambda q: q.call(model, x))
    ref = meta(lambda q: torch.func.functional_call(model, dict(q), (x,)))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_call_restores_the_module_when_forward_raises() -> None:
    """An exception inside the forward leaves the module with its own tensors."""

    class Boom(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            msg = "boom"
            raise RuntimeError(msg)

    model = Boom(2, 2)
    before = _snapshot(model)
    p = ParamDict.from_module(model) * 0
    with pytest.raises(RuntimeError, match="boom"):
        p.call(model, torch.ones(1, 2))
    _assert_unchanged(model, before)


def test_call_follows_tied_weights_like_functional_call() -> None:
    """One alias given: both tied names use it; disagreeing aliases are refused."""
    model = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    model[1].weight = model[0].weight
    before = _snapshot(model)
    x = torch.randn(3, 2)
    new = torch.randn(2, 2)
    expected = x @ new.T @ new.T
    torch.testing.assert_close(ParamDict({"0.weight": new}).call(model, x), expected)
    torch.testing.assert_close(
        torch.func.functional_call(model, {"0.weight": new}, (x,)), expected
    )
    same = ParamDict({"0.weight": new, "1.weight": new})
    torch.testing.assert_close(same.call(model, x), expected)
    differ = ParamDict({"0.weight": new, "1.weight": new + 1})
    with pytest.raises(ValueError, match=r"\['0.weight', '1.weight'\] are tied"):
        differ.call(model, x)
    _assert_unchanged(model, before)


def test_call_reports_a_tensor_the_module_replaced() -> None:
    """A module that assigns a new buffer: TypeError naming it; module restored."""
    model = Counter()
    before = _snapshot(model)
    p = ParamDict.from_module(model, buffers=True)
    with pytest.raises(TypeError, match=r"replaced \['count'\].*dict\(p\)"):
        p.call(model, torch.zeros(1))
    _assert_unchanged(model, before)
    assert p["count"].item() == 0


def test_call_keeps_buffers_updated_in_place() -> None:
    """BatchNorm's in-place running-stat updates land in the given buffers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    before = _snapshot(model)
    p = ParamDict({k: v.detach().clone() for k, v in model.state_dict().items()})
    d = {k: v.clone() for k, v in p.items()}
    x = torch.randn(8, 3)
    torch.testing.assert_close(
        p.call(model, x), torch.func.functional_call(model, d, (x,))
    )
    for k in p:
        torch.testing.assert_close(p[k], d[k])
    assert p["1.num_batches_tracked"].item() == 1
    _assert_unchanged(model, before)


def test_call_runs_parametrized_modules_like_functional_call() -> None:
    """Weight-normed and user-parametrized weights: as with functional_call."""
    torch.manual_seed(0)
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))

    class Symmetric(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).T

    sym = nn.Linear(3, 3)
    nn.utils.parametrize.register_parametrization(sym, "weight", Symmetric())
    x = torch.randn(4, 3)
    for model in (normed, sym):
        before = _snapshot(model)
        p = ParamDict.from_module(model).detach() * 1.5
        assert any(k.startswith("parametrizations.") for k in p)
        got = p.call(model, x)
        torch.testing.assert_close(
            got, torch.func.functional_call(model, dict(p), (x,))
        )
        assert not torch.allclose(got, model(x))
        _assert_unchanged(model, before)
