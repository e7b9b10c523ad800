"""Doctest namespace: docstring examples may use `torch` and `ParamDict` directly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import paramdict


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace: dict[str, Any]) -> None:
    doctest_namespace["torch"] = torch
    doctest_namespace["ParamDict"] = paramdict.ParamDict
    doctest_namespace["paramdict"] = paramdict
