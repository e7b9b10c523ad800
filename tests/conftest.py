"""Shared test settings: hypothesis profiles bounded for CI, one CPU thread per op."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

# CI draws the same examples on every run (a red CI is a change's, not a draw's);
# `dev` and `fuzz-long` draw afresh, to find what CI's examples do not.
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=150, deadline=None)
# For the fuzzer of public entry points (`tests/hostile/fuzz.py`), which runs a
# small count per entry point in CI: a long local run, e.g.
# `HYPOTHESIS_PROFILE=fuzz-long python -m pytest tests/hostile/test_fuzz_*.py`.
settings.register_profile(
    "fuzz-long",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# One intra-op thread, in this process and in the processes the tests start, unless
# OMP_NUM_THREADS says otherwise. The tests' tensors are small: a second thread
# buys little on an idle machine, and on a busy one every parallel op waits for its
# slowest thread. The MAML tutorial's training (20 meta-iterations) took 4-7 s with
# one thread and 22-31 s with torch's default of two on a loaded two-core machine.
if "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
