"""Keyed collectives on 2 and 3 gloo processes, checked against plain-torch references.

Each module fixture starts its processes once (`_distributed_worker.run`) and runs every
scenario of `_distributed_scenarios` there; the tests compare what came back with
single-process references computed here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _distributed_scenarios import (
    DOCS_PAGE,
    DTYPES,
    ENTRIES,
    FENCE,
    INNER_LR,
    MAML_TASKS,
    PER_TENSOR,
    entries,
    floating,
    mlp,
    real,
    regression_batch,
    sinusoid_tasks,
)
from _distributed_worker import run
from torch import Tensor
from torch._C._distributed_c10d import HashStore  # typed; `dist.HashStore` is not

from paramdict import ParamDict
from paramdict.distributed import all_gather, all_reduce, broadcast

SCENARIOS = "_distributed_scenarios"
EVERYWHERE = ("reduce", "broadcast", "gather", "mismatch", "maml")
# DTensor is public, as `torch.distributed.tensor`, from torch 2.5 on.
PUBLIC_DTENSOR = torch.__version__ >= "2.5"
ONLY_TWO = ("count", "autograd", "ddp", *(("dtensor",) if PUBLIC_DTENSOR else ()))

Results = dict[str, list[Any]]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return run(
        2,
        SCENARIOS,
        EVERYWHERE + ONLY_TWO,
        tmp_path_factory.mktemp("two"),
        then=["docs"],
    )


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return run(3, SCENARIOS, EVERYWHERE, tmp_path_factory.mktemp("three"))


@pytest.fixture(params=[2, 3], ids=["2 processes", "3 processes"])
def world(request: pytest.FixtureRequest) -> tuple[int, Results]:
    size: int = request.param
    results: Results = request.getfixturevalue("two" if size == 2 else "three")
    return size, results


@pytest.fixture
def one_process_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def reraise(outcome: object) -> None:
    """Raise `outcome` if it is the exception a process caught."""
    if isinstance(outcome, BaseException):
        raise outcome


def reference(
    world_size: int,
    combine: Callable[[Tensor, Tensor], Tensor],
    keep: Callable[[ParamDict], ParamDict] = lambda p: p,
) -> dict[str, Tensor]:
    """Combine `entries(rank)` over the ranks one key at a time, in plain torch."""
    per_rank = [dict(keep(entries(rank))) for rank in range(world_size)]
    return {
        key: functools.reduce(combine, [values[key] for values in per_rank])
        for key in per_rank[0]
    }


# ---------------------------------------------------------------- all_reduce


def test_all_reduce_sum_equals_the_single_process_sum(
    world: tuple[int, Results],
) -> None:
    """Summing 160 entries of five dtypes gives the plain per-key sum on every rank."""
    size, results = world
    expected = reference(size, torch.add)
    for result in results["reduce"]:
        assert type(result["sum"]) is ParamDict
        assert list(result["sum"]) == list(expected)
        torch.testing.assert_close(dict(result["sum"]), expected, rtol=0, atol=0)


def test_all_reduce_mean_equals_the_single_process_mean(
    world: tuple[int, Results],
) -> None:
    """The mean is the plain per-key sum divided by the number of processes."""
    size, results = world
    sums = reference(size, torch.add, floating)
    expected = {k: v / size for k, v in sums.items()}
    for result in results["reduce"]:
        assert list(result["mean"]) == list(expected)
        torch.testing.assert_close(dict(result["mean"]), expected)


def test_all_reduce_max_and_min_equal_the_single_process_ones(
    world: tuple[int, Results],
) -> None:
    """`max` and `min` are the per-key elementwise extremes over the processes."""
    size, results = world
    highest = reference(size, torch.maximum, real)
    lowest = reference(size, torch.minimum, real)
    for result in results["reduce"]:
        torch.testing.assert_close(dict(result["max"]), highest, rtol=0, atol=0)
        torch.testing.assert_close(dict(result["min"]), lowest, rtol=0, atol=0)


def test_all_reduce_leaves_its_input_unchanged(two: Results) -> None:
    """After the reductions every rank's input still equals a fresh copy of it."""
    assert [result["unchanged"] for result in two["reduce"]] == [True, True]


def test_collectives_for_160_entries_are_a_handful(two: Results) -> None:
    """160 entries cost one check plus one collective per dtype, not 160 collectives."""
    for counts in two["count"]:
        assert counts["per tensor"] == PER_TENSOR  # the counter sees each collective
        assert counts["float32"] == 1 + 1
        assert counts["mixed"] == 1 + len(DTYPES)
        assert counts["mixed, huge cap"] == 1 + len(DTYPES)
        assert counts["broadcast mixed"] == 1 + len(DTYPES)


def test_bucket_cap_splits_buffers_and_keeps_results(two: Results) -> None:
    """A 0.01 MiB cap puts ten 1 KiB entries in a bucket: 16 buckets for 160."""
    per_bucket = int(0.01 * 2**20) // 1024
    expected_count = 1 + math.ceil(ENTRIES / per_bucket)
    expected = {f"w{i}": torch.full((256,), float(2 * i + 1)) for i in range(ENTRIES)}
    for counts in two["count"]:
        assert counts["1 KiB entries, 0.01 MiB cap"] == expected_count
        torch.testing.assert_close(dict(counts["capped result"]), expected)


def test_all_reduce_results_are_detached(two: Results) -> None:
    """Inputs that require grad (leaves or not) give results that do not."""
    for result in two["autograd"]:
        assert result["params require grad"]
        assert result["fast has grad_fn"]
        assert not any(result["results require grad"])
        assert result["params untouched"]
        torch.testing.assert_close(
            dict(result["reduced params"]), dict(result["params"])
        )


# ---------------------------------------------------------------- broadcast, gather


def test_broadcast_gives_every_rank_the_source_values(
    world: tuple[int, Results],
) -> None:
    """Broadcasting from the last rank gives its entries and dtypes everywhere."""
    size, results = world
    expected = dict(entries(size - 1))
    for result in results["broadcast"]:
        assert list(result) == list(expected)
        torch.testing.assert_close(dict(result), expected, rtol=0, atol=0)


def test_all_gather_returns_every_rank_in_rank_order(
    world: tuple[int, Results],
) -> None:
    """Every rank gets one ParamDict per rank, each equal to that rank's entries."""
    size, results = world
    expected = [dict(entries(rank)) for rank in range(size)]
    for result in results["gather"]:
        assert len(result) == size
        for got, want in zip(result, expected):
            torch.testing.assert_close(dict(got), want, rtol=0, atol=0)


# ---------------------------------------------------------------- mismatches

MISMATCHES = {
    "order": r"rank 1 orders the keys differently from rank 0 \(position 0 holds "
    r"'b\.weight' there and 'a\.weight' on rank 0\)",
    "keys": r"rank 1 lacks \['a\.bias'\] and has extra \['a\.beta'\] compared to "
    r"rank 0",
    "shape": r"rank 1 differs in shape: 'a\.bias' is \(3,\) there and \(2,\) on "
    r"rank 0",
    "dtype": r"rank 1 differs in dtype: 'a\.bias' is float64 there and float32 on "
    r"rank 0",
    "options": r"rank 1 calls `all_reduce\(op='mean', bucket_cap_mb=25\.0\)` while "
    r"rank 0 calls `all_reduce\(op='sum', bucket_cap_mb=25\.0\)`",
    "operation": r"rank 1 calls `broadcast\(src=0, bucket_cap_mb=25\.0\)` while rank 0 "
    r"calls `all_reduce\(op='sum'",
}


@pytest.mark.parametrize("case", sorted(MISMATCHES))
def test_mismatch_between_ranks_raises_a_clear_error_on_every_rank(
    world: tuple[int, Results], case: str
) -> None:
    """When rank 1 differs, every rank (rank 2 too) raises naming the difference."""
    _, results = world
    errors = [result[case] for result in results["mismatch"]]
    for error in errors:
        with pytest.raises(ValueError, match=MISMATCHES[case]):
            reraise(error)
    details = {str(error).split(" but ", 1)[1] for error in errors}
    assert len(details) == 1


def test_group_still_works_after_a_mismatch(world: tuple[int, Results]) -> None:
    """After the errors the same processes reduce correctly again."""
    _, results = world
    for result in results["mismatch"]:
        torch.testing.assert_close(dict(result["after"]), dict(result["base"]))


# ---------------------------------------------------------------- MAML


def single_process_meta_gradient() -> dict[str, Tensor]:
    """Second-order MAML meta-gradient over all tasks, in plain torch (float64)."""
    model = mlp(0, torch.float64)
    params: dict[str, Tensor] = dict(model.named_parameters())
    meta_loss = torch.zeros((), dtype=torch.float64)
    for x_support, y_support, x_query, y_query in sinusoid_tasks(1, MAML_TASKS):
        prediction = torch.func.functional_call(model, params, (x_support,))
        inner = torch.autograd.grad(
            F.mse_loss(prediction, y_support), list(params.values()), create_graph=True
        )
        fast = {k: v - INNER_LR * g for (k, v), g in zip(params.items(), inner)}
        prediction = torch.func.functional_call(model, fast, (x_query,))
        meta_loss = meta_loss + F.mse_loss(prediction, y_query)
    grads = torch.autograd.grad(meta_loss / MAML_TASKS, list(params.values()))
    return dict(zip(params, grads))


def test_data_parallel_maml_meta_gradient_equals_single_process(
    world: tuple[int, Results],
) -> None:
    """25 tasks split unevenly over ranks give the single-process meta-gradient."""
    _, results = world
    expected = single_process_meta_gradient()
    for result in results["maml"]:
        torch.testing.assert_close(dict(result), expected, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- interop


def test_ddp_module_gives_the_same_keys_and_gradients(two: Results) -> None:
    """`from_module(ddp.module)`: plain keys, DDP's own params, DDP's averaged grads."""
    for result in two["ddp"]:
        assert result["keys"] == result["module keys"]
        assert result["wrapper keys"] == [f"module.{k}" for k in result["module keys"]]
        assert result["same objects"]
        torch.testing.assert_close(
            dict(result["ddp grads"]), dict(result["keyed mean"])
        )


@pytest.mark.skipif(
    not PUBLIC_DTENSOR,
    reason="DTensor is public (torch.distributed.tensor) from torch 2.5 on",
)
def test_dtensor_parameters_work_and_all_reduce_refuses_them(two: Results) -> None:
    """DTensor params give DTensor grads equal to the full-batch ones; no all_reduce."""
    model = mlp(0)
    x, y = (torch.cat(t) for t in zip(*(regression_batch(r) for r in range(2))))
    params: dict[str, Tensor] = dict(model.named_parameters())
    prediction = torch.func.functional_call(model, params, (x,))
    loss = F.mse_loss(prediction, y, reduction="sum")
    expected = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
    for result in two["dtensor"]:
        assert result["keys"] == list(expected)
        assert result["params are DTensors"]
        assert result["grads are DTensors"]
        assert result["stepped are DTensors"]
        torch.testing.assert_close(dict(result["full grads"]), expected)
        with pytest.raises(TypeError, match=r"not DTensors; \['0\.bias', '0\.weight'"):
            reraise(result["refused"])


def test_docs_page_code_runs_on_two_processes(two: Results) -> None:
    """The python blocks of docs/distributed.md ran as one script on two processes."""
    blocks = FENCE.findall(DOCS_PAGE.read_text(encoding="utf-8"))
    assert any("dist.init_process_group(" in block for block in blocks)
    assert two["docs"] == [None, None]  # it returned, on both ranks


# ---------------------------------------------------------------- one process


def test_collectives_need_a_process_group() -> None:
    """Without `init_process_group` the error says to call it."""
    assert not dist.is_initialized()
    p = ParamDict(w=torch.ones(2))
    for call in (all_reduce, broadcast, all_gather):
        with pytest.raises(
            ValueError, match=r"needs a process group: call `torch\.dis"
        ):
            call(p)


@pytest.mark.usefixtures("one_process_group")
def test_one_process_results_are_copies_of_the_same_type() -> None:
    """With one process every collective returns new tensors equal to the input."""

    class Grads(ParamDict):
        __slots__ = ()

    p = Grads(w=torch.arange(6.0).reshape(2, 3).t(), n=torch.tensor([1, 2]))
    outputs: Sequence[ParamDict] = [
        all_reduce(p, op="sum"),
        broadcast(p),
        *all_gather(p),
    ]
    for out in outputs:
        assert type(out) is Grads
        assert list(out) == ["w", "n"]
        torch.testing.assert_close(dict(out), dict(p), rtol=0, atol=0)
        for key in p:
            assert (
                out[key].untyped_storage().data_ptr()
                != p[key].untyped_storage().data_ptr()
            )


@pytest.mark.usefixtures("one_process_group")
def test_empty_paramdict_reduces_to_empty() -> None:
    """An empty ParamDict gives an empty ParamDict."""
    assert all_reduce(ParamDict(), op="mean") == ParamDict()
    assert all_gather(ParamDict()) == [ParamDict()]


@pytest.mark.usefixtures("one_process_group")
def test_mean_refuses_integer_entries() -> None:
    """`op="mean"` names the integer entries and suggests `op="sum"`."""
    p = ParamDict(w=torch.ones(2), step=torch.tensor(3), count=torch.tensor([1]))
    with pytest.raises(
        TypeError, match=r"\['count', 'step'\] are not\. Reduce them with"
    ):
        all_reduce(p, op="mean")


@pytest.mark.usefixtures("one_process_group")
def test_max_refuses_complex_entries() -> None:
    """`op="max"` names the complex entries."""
    p = ParamDict(w=torch.ones(2), z=torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match=r"real entries for `op=\"max\"`; \['z'\]"):
        all_reduce(p, op="max")


@pytest.mark.usefixtures("one_process_group")
def test_sparse_entries_are_refused() -> None:
    """Sparse entries are named; they cannot be packed into a flat buffer."""
    p = ParamDict(w=torch.ones(2), s=torch.eye(2).to_sparse())
    with pytest.raises(
        TypeError, match=r"dense tensors that are not DTensors; \['s'\]"
    ):
        all_reduce(p)


@pytest.mark.usefixtures("one_process_group")
def test_unknown_op_is_refused() -> None:
    """An unknown name, or a `ReduceOp`, is refused with the accepted names."""
    p = ParamDict(w=torch.ones(2))
    with pytest.raises(TypeError, match=r"takes `op` in \['sum', 'mean'.*got 'avg'\.$"):
        all_reduce(p, op="avg")  # type: ignore[arg-type]  # the wrong value under test
    with pytest.raises(TypeError, match=r"Pass the name instead of a `torch\.distri"):
        all_reduce(p, op=dist.ReduceOp.SUM)  # type: ignore[arg-type]  # under test


@pytest.mark.usefixtures("one_process_group")
def test_bucket_cap_must_be_a_positive_number() -> None:
    """`bucket_cap_mb` must be a number above zero."""
    p = ParamDict(w=torch.ones(2))
    with pytest.raises(ValueError, match=r"needs `bucket_cap_mb` > 0, got 0\."):
        all_reduce(p, bucket_cap_mb=0)
    with pytest.raises(TypeError, match=r"takes a number for `bucket_cap_mb`, got str"):
        broadcast(p, bucket_cap_mb="25")  # type: ignore[arg-type]  # under test


@pytest.mark.usefixtures("one_process_group")
def test_infinite_bucket_cap_means_one_buffer_per_dtype() -> None:
    """`bucket_cap_mb=inf` puts everything of one dtype in one buffer."""
    p = ParamDict(w=torch.ones(2), b=torch.zeros(3))
    out = all_reduce(p, bucket_cap_mb=math.inf)
    assert (
        out["w"].untyped_storage().data_ptr() == out["b"].untyped_storage().data_ptr()
    )
    torch.testing.assert_close(dict(out), dict(p))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_and_cpu_entries_reduce_on_their_own_backends() -> None:
    """With gloo for CPU and NCCL for CUDA, mixed entries keep devices and values."""
    dist.init_process_group(
        "cpu:gloo,cuda:nccl", store=HashStore(), rank=0, world_size=1
    )
    try:
        p = ParamDict(w=torch.ones(3, device="cuda"), b=torch.arange(2.0))
        out = all_reduce(p, op="mean")
        assert [v.device.type for v in out.values()] == ["cuda", "cpu"]
        torch.testing.assert_close(dict(out), dict(p))
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_process_group")
def test_plain_dict_is_refused() -> None:
    """A plain dict is refused with the fix."""
    with pytest.raises(TypeError, match=r"takes a ParamDict, got dict\. Wrap"):
        all_reduce({"w": torch.ones(2)})  # type: ignore[type-var]  # under test
