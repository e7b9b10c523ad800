"""FSDP2 and DTensor parameters: optimizers, `backward`, `call`, the example.

The module fixtures start 2 and 3 gloo processes once each (`_distributed_worker.run`,
bounded by timeouts) and run the scenarios of `_fsdp_scenarios` there; the tests
compare what came back with torch.optim on twin FSDP2 models (bitwise) and with
single-process full-batch training here. The in-process tests put DTensors on a
one-process mesh, where DTensor still dispatches through its sharding rules.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)
fsdp = pytest.importorskip("torch.distributed.fsdp", reason="needs torch.distributed")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("needs FSDP2 (`fully_shard`, torch >= 2.6)", allow_module_level=True)

from _distributed_worker import run  # noqa: E402 (after the skips)
from _fsdp_scenarios import (  # noqa: E402
    CHECKPOINT_VARIABLE,
    MAX_NORM,
    OPTIMIZERS,
    STEPS,
    batch,
    local_batch,
    model,
)
from _torch_versions import needs_torch  # noqa: E402
from torch import Tensor  # noqa: E402
from torch._C._distributed_c10d import HashStore  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import (  # noqa: E402
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.nn.utils import clip_grad_norm_  # noqa: E402

from paramdict import ParamDict, optim  # noqa: E402
from paramdict._foreach import call, copy_  # noqa: E402

SCENARIOS = "_fsdp_scenarios"

Results = dict[str, list[Any]]


# torch 2.6's CPU stream has no `record_event`, which FSDP2's all-gather calls
# (AttributeError inside torch); torch 2.7 gave the CPU stream one.
cpu_fsdp2 = needs_torch(2, 7, "FSDP2 on the CPU")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoint")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Results:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHECKPOINT_VARIABLE, str(checkpoint))  # the children inherit it
        return run(
            2,
            SCENARIOS,
            ("optimizers", "grads", "takeover", "torch_adamw_save"),
            tmp_path_factory.mktemp("two"),
            then=["example"],
        )


@pytest.fixture(scope="module")
def three(
    tmp_path_factory: pytest.TempPathFactory, checkpoint: Path, two: Results
) -> Results:
    # After `two`, which wrote the checkpoint this run resumes from.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHECKPOINT_VARIABLE, str(checkpoint))
        return run(
            3,
            SCENARIOS,
            ("optimizers", "grads", "takeover", "torch_adamw_resume"),
            tmp_path_factory.mktemp("three"),
            then=["resume"],
        )


@pytest.fixture(params=[2, 3], ids=["2 processes", "3 processes"])
def world(request: pytest.FixtureRequest) -> tuple[int, Results]:
    size: int = request.param
    results: Results = request.getfixturevalue("two" if size == 2 else "three")
    return size, results


@pytest.fixture(scope="module")
def mesh() -> Iterator[Any]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def full_batch_training(name: str, *, steps: int = STEPS) -> dict[str, Tensor]:
    """The parameters after `steps` steps of torch.optim on the whole batch."""
    _, theirs, options = OPTIMIZERS[name.removesuffix("-differentiable")]
    net = model()
    opt = theirs(net.parameters(), **options)
    x, y = batch()
    for _ in range(steps):
        torch.autograd.backward(F.mse_loss(net(x), y))
        if name.startswith("clipped"):
            clip_grad_norm_(net.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in net.named_parameters()}


# ---------------------------------------------------------------- optimizers


@cpu_fsdp2
@pytest.mark.parametrize(
    "name", [*OPTIMIZERS, *(f"{n}-differentiable" for n in OPTIMIZERS)]
)
def test_optimizers_on_fsdp2_equal_torch_optim_bitwise(
    world: tuple[int, Results], name: str
) -> None:
    """Five steps on an FSDP2 model give torch.optim's shards bit for bit."""
    _, results = world
    for per_rank in results["optimizers"]:
        run_ = per_rank[name]
        assert run_["dtensors"]
        torch.testing.assert_close(
            dict(run_["ours"]), dict(run_["theirs"]), rtol=0, atol=0
        )


@cpu_fsdp2
@pytest.mark.parametrize(
    "name", [*OPTIMIZERS, *(f"{n}-differentiable" for n in OPTIMIZERS)]
)
def test_optimizers_on_fsdp2_equal_full_batch_training(
    world: tuple[int, Results], name: str
) -> None:
    """The gathered parameters equal single-process full-batch training."""
    _, results = world
    expected = full_batch_training(name)
    for per_rank in results["optimizers"]:
        got = dict(per_rank[name]["full"])
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------- autograd


@cpu_fsdp2
def test_backward_returns_the_sharded_grads_of_loss_backward(
    world: tuple[int, Results],
) -> None:
    """`backward` fills and returns FSDP2's sharded `.grad`s, keyed like the params."""
    _, results = world
    for result in results["grads"]:
        assert result["keys"] == result["param keys"]
        assert result["identity"]
        assert result["dtensors"]
        torch.testing.assert_close(
            dict(result["ours"]), dict(result["theirs"]), rtol=0, atol=0
        )
        # A second `backward` accumulates, as a second `loss.backward()` does.
        doubled = {k: 2 * v for k, v in result["ours"].items()}
        torch.testing.assert_close(dict(result["twice"]), doubled, rtol=0, atol=0)


@cpu_fsdp2
def test_backward_on_fsdp2_equals_full_batch_gradients(
    world: tuple[int, Results],
) -> None:
    """The gathered gradients are the single-process full-batch gradients."""
    _, results = world
    net = model()
    x, y = batch()
    torch.autograd.backward(F.mse_loss(net(x), y))
    expected = {k: cast(Tensor, v.grad) for k, v in net.named_parameters()}
    for result in results["grads"]:
        torch.testing.assert_close(
            dict(result["full"]), expected, rtol=1e-10, atol=1e-14
        )


@cpu_fsdp2
def test_grad_on_fsdp2_names_fsdp2_and_points_to_backward(
    world: tuple[int, Results],
) -> None:
    """`grad` cannot reach FSDP2's sharded parameters and says so."""
    _, results = world
    for result in results["grads"]:
        error = result["refused"]
        assert isinstance(error, ValueError)
        assert "FSDP2" in str(error)
        assert "`.backward(loss)`" in str(error)
        assert "'0.bias', '0.weight'" in str(error)  # sorted


# ---------------------------------------------------------------- modules


@cpu_fsdp2
def test_call_refuses_to_swap_into_an_fsdp2_module(
    world: tuple[int, Results],
) -> None:
    """`call` and `swapped_into` with other tensors raise, the module unchanged."""
    size, results = world
    for rank, result in enumerate(results["takeover"]):
        call_error, swap_error = result["errors"]
        assert isinstance(call_error, TypeError)
        assert "`call`" in str(call_error)
        assert "FSDP2" in str(call_error)
        assert "`p.to_module(model)`" in str(call_error)
        assert isinstance(swap_error, TypeError)
        assert "`swapped_into`" in str(swap_error)
        assert result["same objects"]
        torch.testing.assert_close(
            dict(result["after"]), dict(result["before"]), rtol=0, atol=0
        )
        # Its own parameters, not the zeros: the output of the unsharded model.
        x, _ = local_batch(rank, size)
        expected = model()(x).detach()
        torch.testing.assert_close(result["out"], expected, rtol=0, atol=0)
        torch.testing.assert_close(result["own"], expected, rtol=0, atol=0)


# ---------------------------------------------------------------- the example


@cpu_fsdp2
def test_example_trains_and_restores_its_checkpoint_bitwise(two: Results) -> None:
    """`train_fsdp2.py --quick` on 2 processes: the restored next step is bitwise."""
    for result in two["example"]:
        losses = result["losses"]
        assert all(math.isfinite(loss) for loss in losses)
        again = torch.tensor(result["again"], dtype=torch.float64)
        saved_next = torch.tensor(losses[result["save_at"]], dtype=torch.float64)
        torch.testing.assert_close(again, saved_next, rtol=0, atol=0)


@cpu_fsdp2
def test_example_checkpoint_reshards_from_two_to_three_processes(
    two: Results, three: Results
) -> None:
    """The 2-process checkpoint loads on 3 processes: every tensor bitwise whole."""
    saved = two["example"][0]
    for result in three["resume"]:
        assert result["start"] == saved["save_at"]
        restored = result["restored"]
        assert sorted(restored) == sorted(saved["saved"])
        torch.testing.assert_close(restored, saved["saved"], rtol=0, atol=0)
        # Same parameters and state; the loss differs by the float32 sums only.
        first = torch.tensor(result["losses"][0])
        expected = torch.tensor(two["example"][0]["losses"][saved["save_at"]])
        torch.testing.assert_close(first, expected, rtol=1e-5, atol=0)


@cpu_fsdp2
def test_torch_optim_checkpoint_resumes_in_paramdict_on_three_processes(
    two: Results, three: Results
) -> None:
    """A DCP save of torch's AdamW on 2 processes resumes in paramdict on 3.

    Both resume from the resharded checkpoint and step `STEPS` more times:
    paramdict's parameters equal torch.optim's, shard by shard, bit for bit, and
    gathered whole they equal `2 * STEPS` steps of full-batch training.
    """
    saved = two["torch_adamw_save"][0]["full"]
    expected = full_batch_training("adamw", steps=2 * STEPS)
    for result in three["torch_adamw_resume"]:
        assert result["start"] == STEPS
        torch.testing.assert_close(result["ours"], result["theirs"], rtol=0, atol=0)
        torch.testing.assert_close(
            dict(result["full"]), expected, rtol=1e-12, atol=1e-13
        )
    torch.testing.assert_close(
        dict(saved), full_batch_training("adamw"), rtol=1e-12, atol=1e-13
    )


# ---------------------------------------------------------------- kernels


@pytest.mark.parametrize(
    "placement", [Shard(0), Replicate()], ids=["shard", "replicate"]
)
def test_foreach_without_sharding_rules_runs_on_dtensors(
    mesh: Any, placement: Any
) -> None:
    """The kernels torch gives no DTensor rule match the plain-tensor results."""
    g = torch.Generator().manual_seed(0)
    plain = [[torch.rand(4, 3, generator=g) + 1 for _ in range(2)] for _ in range(3)]
    sharded = [[distribute_tensor(t, mesh, [placement]) for t in ts] for ts in plain]
    for op, extra in [
        (torch._foreach_addcdiv, (0.5,)),
        (torch._foreach_addcdiv, ([0.5, -2.0],)),
        (torch._foreach_addcmul, ([0.5, -2.0],)),
    ]:
        got = call(op, *sharded, *extra)
        assert all(isinstance(t, DTensor) for t in got)
        expected = call(op, *plain, *extra)
        for ours, theirs in zip(got, expected):
            torch.testing.assert_close(
                cast(DTensor, ours).full_tensor(), theirs, rtol=0, atol=0
            )
    # `_foreach_copy_` has no rule either: copied entry by entry.
    targets: list[Tensor] = [t.clone() for t in sharded[0]]
    copy_(targets, list[Tensor](sharded[1]))
    for ours, theirs in zip(targets, plain[1]):
        torch.testing.assert_close(
            cast(DTensor, ours).full_tensor(), theirs, rtol=0, atol=0
        )


@needs_torch(2, 13, "a DTensor sharding rule for clamp_min and clamp_max")
@pytest.mark.parametrize(
    "placement", [Shard(0), Replicate()], ids=["shard", "replicate"]
)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_and_minimum_with_a_number_run_on_dtensors(
    mesh: Any, placement: Any, name: str
) -> None:
    """`maximum`/`minimum` with a number, per entry on DTensors: plain results."""
    g = torch.Generator().manual_seed(0)
    plain = [torch.rand(4, 3, generator=g) + 1 for _ in range(2)]
    sharded = [distribute_tensor(t, mesh, [placement]) for t in plain]
    op = getattr(torch, f"_foreach_{name}")
    got = call(op, sharded, 1.5)
    expected = call(op, plain, 1.5)
    for ours, theirs in zip(got, expected):
        torch.testing.assert_close(
            cast(DTensor, ours).full_tensor(), theirs, rtol=0, atol=0
        )


@pytest.mark.parametrize(
    "placement", [Shard(0), Replicate()], ids=["shard", "replicate"]
)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_modes_on_dtensors_equal_plain_tensors(
    mesh: Any, placement: Any, name: str
) -> None:
    """Default, differentiable and in-place steps on DTensors: the plain results."""
    ours, _, options = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(0)
    shapes = {"w": (5, 3), "b": (3,), "s": ()}
    plain = ParamDict(
        {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in shapes.items()}
    )
    grads = [plain.map(lambda t: torch.randn_like(t)) for _ in range(3)]
    pristine = plain.clone()  # the in-place loops below write into `plain`

    def place(p: ParamDict) -> ParamDict:
        return p.map(
            lambda t: distribute_tensor(
                t, mesh, [placement if t.dim() else Replicate()]
            )
        )

    # The foreach rule on both: a fused kernel takes plain tensors only.
    fusable = (
        "fused" in attrs.fields_dict(ours)
        if attrs.has(ours)
        else name == "clipped-adamw"
    )
    unfused = {"fused": False} if fusable else {}
    for differentiable in (False, True):
        opt: optim.Optimizer[Any] = ours(
            **options, **unfused, differentiable=differentiable
        )
        expected, state = plain.requires_grad_(), opt.init(plain)
        got, dstate = place(plain).requires_grad_(), opt.init(place(plain))
        for grad in grads:
            expected, state = opt.step(expected, grad, state)
            got, dstate = opt.step(got, place(grad), dstate)
        for key, value in got.items():
            assert isinstance(value, DTensor)
            torch.testing.assert_close(
                value.full_tensor(), expected[key], rtol=0, atol=0
            )
    opt = ours(**options, **unfused)
    expected, state = plain, opt.init(plain)
    got, dstate = place(plain), opt.init(place(plain))
    for grad in grads:
        expected, state = opt.step(expected, grad, state)
        with torch.no_grad():  # the rule alone, writing into DTensors
            dstate = opt.update_(got, place(grad), dstate)
    for key, value in got.items():
        torch.testing.assert_close(
            cast(DTensor, value).full_tensor(), expected[key], rtol=0, atol=0
        )
    # The public in-place mode: torch's fused SGD/Adagrad kernels have no DTensor
    # rules, so `step_` takes the generic in-place path, bitwise `step`'s result.
    start = place(pristine)
    got, dstate = start, opt.init(start)
    for grad in grads:
        got, dstate = opt.step_(got, place(grad), dstate)
    for key, value in got.items():
        assert isinstance(value, DTensor)
        torch.testing.assert_close(value.full_tensor(), expected[key], rtol=0, atol=0)
