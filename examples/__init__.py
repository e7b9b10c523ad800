"""Runnable examples; importable as `examples.<name>` so the tests can reach them."""
