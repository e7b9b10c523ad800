"""Benchmarks: ParamDict against plain dicts, bare foreach calls and peers."""
