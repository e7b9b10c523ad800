"""FSDP2 (DTensor parameters) through `optim.as_torch_optimizer`, as through torch's.

The module fixtures start 2 and then 3 gloo processes (`_distributed_worker.run`,
as `test_fsdp.py` does) and run `_fsdp_adapter_scenarios` there: each optimizer
of `test_fsdp.py` behind the adapter on an FSDP2 model beside torch.optim's on a
twin, and torch.distributed.checkpoint saving the adapter's state on 2 processes
and loading it into the adapter and into torch's AdamW on 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("needs torch.distributed with gloo", allow_module_level=True)
fsdp = pytest.importorskip("torch.distributed.fsdp", reason="needs torch.distributed")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("needs FSDP2 (`fully_shard`, torch >= 2.6)", allow_module_level=True)

from _distributed_worker import run  # noqa: E402 (after the skips)
from _fsdp_adapter_scenarios import CHECKPOINT_VARIABLE  # noqa: E402
from _fsdp_scenarios import OPTIMIZERS, STEPS  # noqa: E402
from _torch_versions import needs_torch  # noqa: E402
from test_fsdp import full_batch_training  # noqa: E402

pytestmark = needs_torch(2, 7, "FSDP2 on the CPU")

SCENARIOS = "_fsdp_adapter_scenarios"

Results = dict[str, list[Any]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("adapter-checkpoint")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> Results:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CHECKPOINT_VARIABLE, str(checkpoint))  # the children inherit it
        return run(
            2, SCENARIOS, ("optimizers", "adapter_save"), tmp_path_factory.mktemp("two")
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
            ("optimizers", "adapter_resume"),
            tmp_path_factory.mktemp("three"),
        )


@pytest.fixture(params=[2, 3], ids=["2 processes", "3 processes"])
def world(request: pytest.FixtureRequest) -> Results:
    results: Results = request.getfixturevalue("two" if request.param == 2 else "three")
    return results


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_through_the_adapter_equal_torch_optim_bitwise(
    world: Results, name: str
) -> None:
    """Five steps on an FSDP2 model: torch.optim's shards bit for bit, and whole.

    The adapter steps FSDP2's own sharded parameters (DTensors), in place; a
    clip is the loop's `clip_grad_norm_`, as with torch.optim.
    """
    expected = full_batch_training(name)
    for per_rank in world["optimizers"]:
        result = per_rank[name]
        assert result["same objects"]
        torch.testing.assert_close(
            dict(result["ours"]), dict(result["theirs"]), rtol=0, atol=0
        )
        torch.testing.assert_close(
            dict(result["full"]), expected, rtol=1e-10, atol=1e-14
        )


def test_dcp_reads_the_adapters_state_as_torchs(two: Results) -> None:
    """`get_optimizer_state_dict` of the adapter: torch's AdamW's, by name, bitwise."""
    for result in two["adapter_save"]:
        ours, theirs = result["ours"], result["theirs"]
        assert sorted(ours) == sorted(theirs)
        for fqn, entry in theirs.items():
            assert sorted(ours[fqn]) == sorted(entry)
            for key, value in entry.items():
                torch.testing.assert_close(ours[fqn][key], value, rtol=0, atol=0)


def test_a_dcp_checkpoint_of_the_adapter_resumes_on_three_processes(
    two: Results, three: Results
) -> None:
    """Saved from the adapter on 2 processes, resumed by it and by torch's on 3.

    Both take the saved rate and state (resharded) and step `STEPS` more: the
    same shards bit for bit, and gathered, `2 * STEPS` steps of full-batch
    training.
    """
    expected = full_batch_training("adamw", steps=2 * STEPS)
    torch.testing.assert_close(
        dict(two["adapter_save"][0]["full"]),
        full_batch_training("adamw"),
        rtol=1e-12,
        atol=1e-13,
    )
    for result in three["adapter_resume"]:
        assert result["lr"] == [OPTIMIZERS["adamw"][2]["lr"]]
        torch.testing.assert_close(result["ours"], result["theirs"], rtol=0, atol=0)
        torch.testing.assert_close(
            dict(result["full"]), expected, rtol=1e-12, atol=1e-13
        )
