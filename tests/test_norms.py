"""Norm layers under `torch.func.vmap`: `call` refuses what torch gets silently wrong.

torch 2.13 differentiates the batch-norm and layer-norm backward wrongly when it runs
under vmap and autograd differentiates it again (second-order MAML with the tasks
vmapped). `call` refuses that case with an error naming the fix, and allows the
correct ones: first order under vmap, no vmap, eval-mode batch norm, no affine
weight, networks without norm layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict

D = torch.float64
WAYS = 5
INNER_LR = 0.4
SECOND_ORDER = "torch gets that|would be silently wrong"

Weights = tuple[Tensor, ...]
Task = tuple[Tensor, Tensor, Tensor, Tensor]


@pytest.fixture(autouse=True)
def _own_random_state() -> Iterator[None]:
    """Seed each test and give the global generator back as it was (doctests draw)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


# ------------------------------------------------------------- the Omniglot-shaped CNN


def _cnn(channels: int = 4, **norm: bool) -> nn.Sequential:
    """Conv-BatchNorm-ReLU-MaxPool x4 and a linear head, on 1 x 28 x 28 images."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(4):
        layers += [
            nn.Conv2d(1 if i == 0 else channels, channels, 3, padding=1),
            nn.BatchNorm2d(channels, **norm),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, WAYS))
    with torch.no_grad():  # affine weights away from 1, so their gradients matter
        for layer in model:
            if isinstance(layer, nn.BatchNorm2d) and layer.weight is not None:
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.5, 0.5)
    return model.to(D)


def _tasks(count: int = 3, queries: int = 2) -> list[Task]:
    """5-way 1-shot tasks of synthetic 28 x 28 images: support and query sets."""
    gen = torch.Generator().manual_seed(1)
    tasks = []
    for _ in range(count):
        x = torch.randn(WAYS, 1, 28, 28, generator=gen, dtype=D)
        x_query = torch.randn(WAYS * queries, 1, 28, 28, generator=gen, dtype=D)
        labels = torch.arange(WAYS)
        tasks.append((x, labels, x_query, labels.repeat(queries)))
    return tasks


def _stacked(tasks: list[Task]) -> Task:
    x, y, xq, yq = zip(*tasks)
    return torch.stack(x), torch.stack(y), torch.stack(xq), torch.stack(yq)


def _reference_forward(weights: Weights, x: Tensor) -> Tensor:
    """The CNN written out with plain functions: batch statistics, no running ones."""
    h = x
    for i in range(4):
        conv_w, conv_b, bn_w, bn_b = weights[4 * i : 4 * i + 4]
        h = F.conv2d(h, conv_w, conv_b, padding=1)
        h = F.batch_norm(h, None, None, bn_w, bn_b, training=True)
        h = F.max_pool2d(F.relu(h), 2)
    return F.linear(h.flatten(1), weights[16], weights[17])


def _reference(
    weights: Weights, tasks: list[Task], *, steps: int, first_order: bool
) -> Weights:
    """MAML's meta-gradient with tuples, a loop and `torch.autograd.grad` only."""
    losses = []
    for x, y, x_query, y_query in tasks:
        fast = weights
        for _ in range(steps):
            loss = F.cross_entropy(_reference_forward(fast, x), y)
            grads = torch.autograd.grad(loss, fast, create_graph=not first_order)
            fast = tuple(w - INNER_LR * g for w, g in zip(fast, grads))
        losses.append(F.cross_entropy(_reference_forward(fast, x_query), y_query))
    return torch.autograd.grad(torch.stack(losses).mean(), weights)


def _loss(params: ParamDict, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(params.call(model, x), y)


def _loop(
    params: ParamDict,
    model: nn.Module,
    tasks: list[Task],
    *,
    steps: int = 1,
    first_order: bool = False,
) -> ParamDict:
    """The loop form: one task after the other, `params.grad` for the inner step."""
    losses = []
    for x, y, x_query, y_query in tasks:
        fast = params
        for _ in range(steps):
            grads = fast.grad(_loss(fast, model, x, y), create_graph=not first_order)
            fast = fast - INNER_LR * grads
        losses.append(_loss(fast, model, x_query, y_query))
    return params.grad(torch.stack(losses).mean())


def _vmapped(
    params: ParamDict,
    model: nn.Module,
    tasks: list[Task],
    *,
    steps: int = 1,
    first_order: bool = False,
) -> ParamDict:
    """The vmap form: every task at once, `torch.func.grad` for the inner step."""
    x, y, x_query, y_query = _stacked(tasks)
    fast = params
    for step in range(steps):
        task_grads = torch.func.vmap(
            torch.func.grad(_loss), in_dims=(0 if step else None, None, 0, 0)
        )
        with torch.set_grad_enabled(not first_order):
            grads = task_grads(fast, model, x, y)
        fast = fast - INNER_LR * grads
    query = torch.func.vmap(_loss, in_dims=(0, None, 0, 0))
    return params.grad(query(fast, model, x_query, y_query).mean())


def _expected(params: ParamDict, tasks: list[Task], **how: object) -> ParamDict:
    weights = tuple(v.detach().clone().requires_grad_() for v in params.values())
    return ParamDict(zip(params, _reference(weights, tasks, **how)))  # type: ignore[arg-type]  # steps/first_order, checked by the callers


@pytest.mark.parametrize("steps", [1, 2])
def test_cnn_loop_form_equals_plain_torch(steps: int) -> None:
    """The loop form's second-order meta-gradient is the plain-torch reference's."""
    model = _cnn(track_running_stats=False)
    params = ParamDict.from_module(model)
    tasks = _tasks()
    got = _loop(params, model, tasks, steps=steps)
    want = _expected(params, tasks, steps=steps, first_order=False)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)
    assert want["0.bias"].abs().max() < 1e-12  # BatchNorm cancels the conv bias
    assert want["1.weight"].abs().max() > 1e-4  # and its own weight matters


def test_cnn_vmap_second_order_is_refused() -> None:
    """The vmap form at second order raises, naming the layer and the loop form."""
    model = _cnn(track_running_stats=False)
    params = ParamDict.from_module(model)
    with pytest.raises(ValueError, match=r"the layer '1' \(`batch_norm`\)") as info:
        _vmapped(params, model, _tasks())
    message = str(info.value)
    assert "create_graph=True" in message
    assert "torch.no_grad()" in message
    assert "params.detach()" in message
    assert all(p.grad is None for p in model.parameters())
    assert ParamDict.from_module(model).keys() == params.keys()
    for key, value in ParamDict.from_module(model).items():
        assert value is params[key], key  # the module got its own tensors back


@pytest.mark.parametrize("steps", [1, 2])
def test_cnn_vmap_first_order_equals_loop_and_reference(steps: int) -> None:
    """First order under vmap is allowed and equals the loop and plain torch."""
    model = _cnn(track_running_stats=False)
    params = ParamDict.from_module(model)
    tasks = _tasks()
    vmapped = _vmapped(params, model, tasks, steps=steps, first_order=True)
    loop = _loop(params, model, tasks, steps=steps, first_order=True)
    want = _expected(params, tasks, steps=steps, first_order=True)
    torch.testing.assert_close(loop, want, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(vmapped, want, rtol=1e-8, atol=1e-12)


def test_cnn_without_affine_norm_is_allowed_under_vmap() -> None:
    """`affine=False` BatchNorm: vmap's second-order meta-gradient is right."""
    model = _cnn(track_running_stats=False, affine=False)
    params = ParamDict.from_module(model)
    tasks = _tasks(count=2)
    torch.testing.assert_close(
        _vmapped(params, model, tasks),
        _loop(params, model, tasks),
        rtol=1e-8,
        atol=1e-12,
    )


def test_eval_mode_batch_norm_is_allowed_under_vmap() -> None:
    """A BatchNorm in eval mode normalizes with running statistics: allowed, equal."""
    model = _cnn().eval()
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("running_mean"):
                buffer.uniform_(-0.1, 0.1)
            elif key.endswith("running_var"):
                buffer.uniform_(0.5, 2.0)
    params = ParamDict.from_module(model)
    tasks = _tasks(count=2)
    torch.testing.assert_close(
        _vmapped(params, model, tasks),
        _loop(params, model, tasks),
        rtol=1e-8,
        atol=1e-12,
    )


def _mlp(norm: Callable[[int], nn.Module] | None = None) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(3, 8)]
    layers += [norm(8)] if norm is not None else []
    layers += [nn.Tanh(), nn.Linear(8, WAYS)]
    return nn.Sequential(*layers).to(D)


def _mlp_tasks(count: int = 3) -> list[Task]:
    gen = torch.Generator().manual_seed(2)
    return [
        (
            torch.randn(WAYS, 3, generator=gen, dtype=D),
            torch.arange(WAYS),
            torch.randn(WAYS, 3, generator=gen, dtype=D),
            torch.arange(WAYS),
        )
        for _ in range(count)
    ]


def test_mlp_without_norm_layers_is_allowed_under_vmap() -> None:
    """No norm layer, no refusal: vmap and loop agree at second order."""
    model = _mlp()
    params = ParamDict.from_module(model)
    tasks = _mlp_tasks()
    torch.testing.assert_close(
        _vmapped(params, model, tasks),
        _loop(params, model, tasks),
        rtol=1e-8,
        atol=1e-12,
    )


@pytest.mark.parametrize(
    "norm",
    [
        pytest.param(lambda n: nn.GroupNorm(2, n), id="GroupNorm"),
        pytest.param(lambda n: nn.RMSNorm(n), id="RMSNorm"),
    ],
)
def test_norms_that_vmap_gets_right_are_allowed(
    norm: Callable[[int], nn.Module],
) -> None:
    """GroupNorm and RMSNorm are right under vmap at second order, so allowed."""
    model = _mlp(norm)
    params = ParamDict.from_module(model)
    tasks = _mlp_tasks()
    torch.testing.assert_close(
        _vmapped(params, model, tasks),
        _loop(params, model, tasks),
        rtol=1e-8,
        atol=1e-12,
    )


class _Channels(nn.Module):
    """Run `norm` on the features split into 2 channels (InstanceNorm1d's layout)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, h: Tensor) -> Tensor:
        out: Tensor = self.norm(h.reshape(*h.shape[:-1], 2, -1))
        return out.flatten(-2)


@pytest.mark.parametrize(
    ("norm", "layer"),
    [
        pytest.param(lambda n: nn.LayerNorm(n), "'1' (`layer_norm`)", id="LayerNorm"),
        pytest.param(
            lambda n: nn.BatchNorm1d(n, track_running_stats=False),
            "'1' (`batch_norm`)",
            id="BatchNorm1d",
        ),
        pytest.param(
            lambda n: _Channels(nn.InstanceNorm1d(2, affine=True)),
            "'1.norm' (`instance_norm`)",
            id="InstanceNorm1d",
        ),
    ],
)
def test_norms_that_vmap_gets_wrong_are_refused_at_second_order(
    norm: Callable[[int], nn.Module], layer: str
) -> None:
    """LayerNorm and InstanceNorm share the defect: refused at second order only."""
    model = _mlp(norm)
    params = ParamDict.from_module(model)
    tasks = _mlp_tasks()
    with pytest.raises(ValueError, match=re.escape(f"the layer {layer}")):
        _vmapped(params, model, tasks)
    torch.testing.assert_close(
        _vmapped(params, model, tasks, first_order=True),
        _loop(params, model, tasks, first_order=True),
        rtol=1e-8,
        atol=1e-12,
    )


def test_inner_steps_under_no_grad_are_allowed() -> None:
    """Evaluation (vmapped steps under `torch.no_grad()`) is first order: allowed."""
    model = _cnn(track_running_stats=False)
    params = ParamDict.from_module(model)
    x, y, _, _ = _stacked(_tasks(count=2))
    with torch.no_grad():
        grads = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, None, 0, 0))(
            params, model, x, y
        )
    for t in range(2):
        want = params.grad(_loss(params, model, x[t], y[t]))
        torch.testing.assert_close(grads.map(lambda g, t=t: g[t]), want)


def test_detached_params_are_allowed_with_grad_mode_on() -> None:
    """With nothing for autograd to record, grad mode on is still first order."""
    model = _cnn(track_running_stats=False)
    params = ParamDict.from_module(model).detach()
    x, y, _, _ = _stacked(_tasks(count=2))
    grads = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, None, 0, 0))(
        params, model, x, y
    )
    assert all(not g.requires_grad for g in grads.values())


# -------------------------------------------------------------- the torch-only repro


def _repro_loss(w: Tensor, x: Tensor) -> Tensor:
    return F.batch_norm(x * w, None, None, weight=w, training=True).tanh().sum()


class _Scaled(nn.Module):
    """The repro as a module: a weight that scales the input and the normalization."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, dtype=D))

    def forward(self, x: Tensor) -> Tensor:
        return _repro_loss(self.w, x)


def test_torch_only_repro_is_wrong_outside_call() -> None:
    """The issue's repro, plain torch.func: the wrong result `call` cannot intercept.

    The check lives in `ParamDict.call`; a functional forward that calls
    `F.batch_norm` itself, outside `call`, is not seen. If this test fails, torch
    has fixed its batching rule and the refusal can be relaxed.
    """
    torch.manual_seed(0)
    w = torch.randn(4, dtype=D, requires_grad=True)
    x = torch.randn(3, 6, 4, dtype=D)
    batched = torch.func.vmap(torch.func.grad(_repro_loss), in_dims=(None, 0))(w, x)
    looped = torch.stack([torch.func.grad(_repro_loss)(w, x_t) for x_t in x])
    (got,) = torch.autograd.grad((batched**2).sum(), w)
    (want,) = torch.autograd.grad((looped**2).sum(), w)
    with pytest.raises(AssertionError, match="not close"):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)


def test_torch_only_repro_through_call_is_refused_when_differentiated() -> None:
    """The repro's `F.batch_norm` run by `call`: first order works, second raises."""
    module = _Scaled()
    params = ParamDict.from_module(module)
    x = torch.randn(3, 6, 4, dtype=D)

    def loss(p: ParamDict, x_t: Tensor) -> Tensor:
        out: Tensor = p.call(module, x_t)
        return out

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for t in range(3):
        torch.testing.assert_close(
            grads["w"][t].detach(),
            params.grad(loss(params, x[t]))["w"],
            rtol=1e-8,
            atol=1e-12,
        )
    for allow_unused in (False, True):
        again = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
        with pytest.raises(ValueError, match=r"the `batch_norm` given 'w'"):
            params.grad((again["w"] ** 2).sum(), allow_unused=allow_unused)
    with torch.no_grad():
        first = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    torch.testing.assert_close(first["w"], grads["w"].detach(), rtol=0, atol=0)


def test_batch_norm_with_an_outer_func_grad_is_refused() -> None:
    """`torch.func.grad` below the vmap differentiates the backward again: refused."""
    module = _Scaled()
    x = torch.randn(3, 6, 4, dtype=D)

    def loss(p: ParamDict, x_t: Tensor) -> Tensor:
        out: Tensor = p.call(module, x_t)
        return out

    def meta(p: ParamDict) -> Tensor:
        grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(p, x)
        return (grads["w"] ** 2).sum()  # type: ignore[no-any-return]  # vmap is untyped

    params = ParamDict.from_module(module).detach()
    with pytest.raises(ValueError, match=r"torch\.func\.vmap"):
        torch.func.grad(meta)(params)


def test_vmap_inside_an_outer_grad_is_allowed() -> None:
    """`grad(vmap(f))` runs the backward outside the vmap, which torch gets right."""
    module = _Scaled()
    params = ParamDict.from_module(module)
    x = torch.randn(3, 6, 4, dtype=D)

    def total(p: ParamDict) -> Tensor:
        out: Tensor = torch.func.vmap(p.call, in_dims=(None, 0))(module, x)
        return out.sum()

    got = torch.func.grad(total)(params)
    want = params.grad(sum(params.call(module, x_t) for x_t in x))
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)


# ---------------------------------------------------------------- running statistics


def test_running_statistics_under_vmap_get_a_clear_error() -> None:
    """A default BatchNorm under vmap: an error naming the fixes, not torch's."""
    model = _cnn()
    params = ParamDict.from_module(model)
    x, y, _, _ = _stacked(_tasks(count=2))
    before = {k: v.clone() for k, v in model.named_buffers()}
    grad_fn = torch.func.vmap(torch.func.grad(_loss), in_dims=(None, None, 0, 0))
    for run in (
        lambda: torch.func.vmap(_loss, in_dims=(None, None, 0, 0))(params, model, x, y),
        lambda: grad_fn(params.detach(), model, x, y),
    ):
        with pytest.raises(ValueError, match="would update running statistics") as info:
            run()
        message = str(info.value)
        assert "the layers '1' (BatchNorm2d), '13' (BatchNorm2d)" in message
        assert "track_running_stats=False" in message
        assert "torch.func.replace_all_batch_norm_modules_" in message
    for key, value in model.named_buffers():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_replace_all_batch_norm_modules_then_first_order_vmap() -> None:
    """After `replace_all_batch_norm_modules_`, first order vmaps; second refuses."""
    model = torch.func.replace_all_batch_norm_modules_(_cnn())
    params = ParamDict.from_module(model)
    tasks = _tasks(count=2)
    torch.testing.assert_close(
        _vmapped(params, model, tasks, first_order=True),
        _expected(params, tasks, steps=1, first_order=True),
        rtol=1e-8,
        atol=1e-12,
    )
    with pytest.raises(ValueError, match=SECOND_ORDER):
        _vmapped(params, model, tasks)


def test_batched_buffers_through_call_under_vmap() -> None:
    """Per-task running statistics passed through `call` are updated, per task."""
    model = _cnn()
    params = ParamDict.from_module(model)
    buffers = ParamDict.from_module(model, buffers=True).exclude(*params)
    own = {k: v.clone() for k, v in buffers.items()}
    per_task = buffers.map(lambda b: torch.stack([b, b]).clone())
    x, y, _, _ = _stacked(_tasks(count=2))

    def loss(b: ParamDict, x_t: Tensor, y_t: Tensor) -> Tensor:
        return _loss(params | b, model, x_t, y_t)

    torch.func.vmap(loss)(per_task, x, y)
    assert per_task["1.num_batches_tracked"].tolist() == [1, 1]
    for t in range(2):
        fresh = buffers.clone()
        _loss(params | fresh, model, x[t], y[t])
        torch.testing.assert_close(per_task.map(lambda b: b[t]), fresh)  # noqa: B023  # used at once
    for key, value in model.named_buffers():
        torch.testing.assert_close(value, own[key], rtol=0, atol=0)


def test_loop_form_updates_the_module_running_statistics() -> None:
    """In the loop, every `call` updates the module's own running statistics."""
    model = _cnn()
    params = ParamDict.from_module(model)
    tasks = _tasks(count=2)
    _loop(params, model, tasks)
    counts = [v.item() for k, v in model.named_buffers() if "num_batches" in k]
    assert counts == [2 * len(tasks)] * 4  # a support and a query call per task
    buffers = ParamDict.from_module(model, buffers=True).exclude(*params)
    before = {k: v.clone() for k, v in buffers.items()}
    x, y, _, _ = tasks[0]
    _loss(params | buffers.clone(), model, x, y)  # a copy absorbs the update
    for key, value in model.named_buffers():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
