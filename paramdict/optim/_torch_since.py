"""What torch.optim gained after the oldest torch supported (2.6), by release."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_class_exists", "check_settings_exist"]

_CLASS_SINCE = {"Muon": "2.9"}

_SETTING_SINCE = {  # the release, and the way around it on an older torch
    ("Adam", "decoupled_weight_decay"): (
        "2.7",
        "use `optim.AdamW`, the same update, whose counterpart is torch.optim.AdamW",
    )
}


def check_class_exists(name: str) -> None:
    """Raise if torch.optim's class `name` came after the installed torch."""
    if (since := _CLASS_SINCE.get(name)) is not None:
        msg = (
            f"{name}'s state converts to torch.optim.{name}, which torch {since} "
            f"added; this torch is {torch.__version__}. Install torch>={since} "
            "to convert it."
        )
        raise TypeError(msg)


def check_settings_exist(
    opt: Any, cls: type[torch.optim.Optimizer], defaults: Any
) -> None:
    """Raise if `opt` uses (other than False) a setting this torch's `cls` lacks."""
    for (name, setting), (since, instead) in _SETTING_SINCE.items():
        if cls.__name__ == name and setting not in defaults:
            if getattr(opt, setting, False) is False:
                continue
            msg = (
                f"{type(opt).__name__}({setting}=True) converts to torch.optim."
                f"{name}({setting}=True), which torch {since} added; this torch "
                f"is {torch.__version__}. Install torch>={since} to convert it, or "
                f"{instead}."
            )
            raise ValueError(msg)
