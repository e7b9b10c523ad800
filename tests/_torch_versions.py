"""The installed torch's release, a skip marker for newer features, and TorchScript.

The suite runs on every torch from the oldest that ``pyproject.toml`` declares to the
newest release. Tests of a feature that only a newer torch has are skipped on older
ones with :func:`needs_torch`, which names the release, and a torch.optim class that
an older torch lacks comes from :func:`torch_optimizer`, whose stand-in skips the
test that makes one; tests that make a TorchScript
module to check that it is refused go through :func:`script` and :func:`trace`,
which expect the deprecation warnings that torch 2.14 gives.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

__all__ = [
    "ONE_GRAPH",
    "TORCH",
    "needs_torch",
    "script",
    "torch_at_least",
    "torch_optimizer",
    "trace",
]


def _release(version: str) -> tuple[int, int]:
    """The (major, minor) of a version string such as ``"2.14.1+cu130"``."""
    found = re.match(r"(\d+)\.(\d+)", version)
    assert found is not None, version
    return int(found[1]), int(found[2])


TORCH = _release(torch.__version__)


def torch_at_least(major: int, minor: int) -> bool:
    """Whether the installed torch is ``major.minor`` or newer."""
    return (major, minor) <= TORCH


def needs_torch(major: int, minor: int, what: str) -> pytest.MarkDecorator:
    """Skip a test on a torch older than ``major.minor``, saying what is missing."""
    return pytest.mark.skipif(
        not torch_at_least(major, minor),
        reason=f"{what} needs torch>={major}.{minor} (found {torch.__version__})",
    )


ONE_GRAPH = needs_torch(
    2,
    8,
    "torch.compile(fullgraph=True) through a ParamDict (older dynamo breaks the "
    "graph on dict subclasses and named tuples; without fullgraph the results "
    "are the same)",
)
"""Skip a test that compiles a ParamDict program in one graph on torch before 2.8."""


def torch_optimizer(name: str, major: int, minor: int) -> type[torch.optim.Optimizer]:
    """Return ``torch.optim.<name>``, which torch ``major.minor`` added.

    On an older torch, return a stand-in of that name whose construction skips the
    test, naming the release: a table row can name the class at import time, and
    only the tests that compare with it are skipped.
    """
    found = getattr(torch.optim, name, None)
    if found is not None:
        return found  # type: ignore[no-any-return]  # torch.optim's class by name
    found_version = f"found {torch.__version__}"
    reason = f"torch.optim.{name} needs torch>={major}.{minor} ({found_version})"

    class Missing(torch.optim.Optimizer):
        def __init__(self, params: Any, **kwargs: Any) -> None:
            pytest.skip(reason)

    Missing.__name__ = Missing.__qualname__ = name
    return Missing


@contextlib.contextmanager
def _deprecated(name: str) -> Iterator[None]:
    """Expect torch 2.14's deprecation warning for ``torch.jit.<name>``.

    Older torch gives none of its own (2.13's TorchScript internals may warn with a
    DeprecationWarning, which is not the point of these tests and is ignored).
    """
    if torch_at_least(2, 14):
        match = rf"`torch\.jit\.{name}(_method)?` is deprecated"
        with pytest.warns(FutureWarning, match=match):
            yield
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield


def script(module: nn.Module) -> Any:
    """``torch.jit.script(module)``, expecting the warning the installed torch gives."""
    with _deprecated("script"):
        return torch.jit.script(module)


def trace(module: nn.Module, example: torch.Tensor) -> Any:
    """``torch.jit.trace(module, example)``, expecting the installed torch's warning."""
    with _deprecated("trace"):
        return torch.jit.trace(module, example)  # type: ignore[no-untyped-call]  # untyped in torch
