"""A real `lightning.Trainer` trains with `optim.as_torch_optimizer`, and resumes.

Lightning comes with the `test` extra (it installs beside torch without replacing
it); where it is missing the module is skipped. The run is small: a linear model
on 12 fixed rows in batches of 4, so an epoch is 3 steps and a checkpoint taken
after one epoch resumes at an epoch's start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from paramdict import optim

pytest.importorskip("lightning", reason="needs lightning (the test extra)")
import lightning
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig

pytestmark = [
    # Lightning's advice for a real run, not about this one: 12 rows need no workers.
    pytest.mark.filterwarnings(
        "ignore:The '\\w+_dataloader' does not have many workers"
    ),
    # Lightning 2.6 builds torch's `LeafSpec`, which torch 2.13 deprecates.
    pytest.mark.filterwarnings(
        "ignore:`isinstance\\(treespec, LeafSpec\\)`:FutureWarning"
    ),
]


class Regression(lightning.LightningModule):
    """A small MLP trained with AdamW behind the adapter and a cosine schedule."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(5, 7)
        self.net = nn.Sequential(self.first, nn.Tanh(), nn.Linear(7, 3))

    def training_step(self, batch: tuple[Tensor, Tensor], index: int) -> Tensor:
        """The loss of one batch."""
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        """AdamW behind the adapter, and torch's scheduler on it, stepped per step."""
        opt = optim.as_torch_optimizer(optim.AdamW(lr=0.01, weight_decay=0.1), self)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
        return {
            "optimizer": opt,
            "lr_scheduler": {"scheduler": sched, "interval": "step"},
        }


def _data() -> DataLoader[tuple[Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    rows = TensorDataset(
        torch.randn(12, 5, generator=g), torch.randn(12, 3, generator=g)
    )
    return DataLoader(rows, batch_size=4, shuffle=False)


def _trainer(root: Path, epochs: int) -> Any:
    return lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )


def test_lightning_trains_checkpoints_and_resumes_bitwise(tmp_path: Path) -> None:
    """Two epochs at once, or one, a checkpoint, and the second: the same parameters.

    The optimizer Lightning steps is the adapter; its state and the scheduler's
    go through Lightning's checkpoint and back.
    """
    whole = Regression()
    trainer = _trainer(tmp_path / "whole", epochs=2)
    trainer.fit(whole, _data())
    assert isinstance(trainer.optimizers[0], optim.TorchAdapter)
    assert int(trainer.optimizers[0].state_dict()["state"][0]["step"]) == 6

    first = Regression()
    trainer = _trainer(tmp_path / "first", epochs=1)
    trainer.fit(first, _data())
    checkpoint = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(checkpoint)
    resumed = Regression()
    with torch.no_grad():
        resumed.first.weight.zero_()  # the checkpoint restores it
    trainer = _trainer(tmp_path / "resumed", epochs=2)
    trainer.fit(resumed, _data(), ckpt_path=checkpoint)

    assert trainer.global_step == 6
    for (name, p), q in zip(
        whole.named_parameters(), resumed.parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    moved = [
        p
        for p, q in zip(whole.parameters(), Regression().parameters())
        if not torch.equal(p, q)
    ]
    assert len(moved) == 4  # trained
