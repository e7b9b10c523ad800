"""Run every benchmark: `python -m benchmarks [--quick] [--out DIR]` (see `_runner`)."""

from ._runner import main

main()
