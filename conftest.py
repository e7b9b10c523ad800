"""Doctest namespace: docstring examples may use `torch` and `ParamDict` directly."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _pytest.doctest import DoctestItem

import paramdict


@pytest.fixture(autouse=True)
def _doctest_namespace(
    request: pytest.FixtureRequest, doctest_namespace: dict[str, Any]
) -> None:
    if isinstance(request.node, DoctestItem):
        # Examples that build modules draw their weights: from one seed, whatever
        # ran before (`Linear(2, 1)` weights times 0 print `0.` or `-0.` by sign).
        torch.manual_seed(0)
    doctest_namespace["torch"] = torch
    doctest_namespace["ParamDict"] = paramdict.ParamDict
    doctest_namespace["paramdict"] = paramdict
