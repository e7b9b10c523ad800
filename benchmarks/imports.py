"""Import time: `import paramdict` after `import torch`, against `import tensordict`.

Also `from paramdict import optim` after `import torch`: its time, the memory
Python allocates for it (`tracemalloc`, in a process of its own), and the time of
the first `optim.AdamW(lr=1e-3)` after it, which loads the optimizer's modules (the
import loads only the state classes).

Each sample is a fresh Python process that imports torch, then the package, and
reports both wall-clock times; the packages' processes alternate, and one unmeasured
process of each runs first so the files are in the page cache and their compiled
bytecode is written, as an installed package has it (the processes may write
`__pycache__` even where `PYTHONDONTWRITEBYTECODE` is set: without it, every import
would time the compilation of the sources, about 40 ms of paramdict's). Part of
`python -m benchmarks` (run only this with `--only import`).
"""

from __future__ import annotations

import statistics

from . import _peers
from ._report import OURS, Config, Row, Section, Target
from ._timing import format_seconds, run_fresh

__all__ = ["measure"]

_WORKER = """
import json, time
start = time.perf_counter()
import torch
middle = time.perf_counter()
import {module}
end = time.perf_counter()
print(json.dumps([middle - start, end - middle]))
"""

_OPTIM_WORKER = """
import json, time
import torch
start = time.perf_counter()
from paramdict import optim
middle = time.perf_counter()
optim.AdamW(lr=1e-3)
end = time.perf_counter()
print(json.dumps([middle - start, end - middle]))
"""

LIMIT = 0.030
OPTIM_LIMIT = 0.050
OPTIM_MEMORY = 5 * 2**20

_OPTIM_MEMORY = """
import json, tracemalloc
import torch
tracemalloc.start()
from paramdict import optim
print(json.dumps(tracemalloc.get_traced_memory()[1]))
"""

# Subpackages that `import paramdict` leaves for their first use.
_LAZY = ("paramdict.distributed", "paramdict.optim")

_EAGER = """
import json, sys
import torch
before = set(sys.modules)
import paramdict
print(json.dumps(sorted(
    name for name in set(sys.modules) - before
    if name in {lazy!r} or name.startswith("torch.distributed")
)))
"""


def _sample(module: str, threads: int) -> tuple[float, float]:
    """Return `(import torch, import module after torch)` in a fresh process."""
    torch_time, module_time = run_fresh(
        ["-c", _WORKER.format(module=module)],
        threads=threads,
        what=f"Importing {module}",
        bytecode=True,
    )
    return float(torch_time), float(module_time)


def _optim_sample(threads: int) -> tuple[float, float]:
    """Return `(from paramdict import optim, the first AdamW after it)`."""
    import_time, first_use = run_fresh(
        ["-c", _OPTIM_WORKER], threads=threads, what="Importing optim", bytecode=True
    )
    return float(import_time), float(first_use)


def measure(config: Config) -> Section:
    """Time the imports in fresh processes; check paramdict's against the limit."""
    section = Section(
        "import",
        "Import time",
        "Wall-clock time of `import X` in a fresh process that has just imported "
        "torch (medians over processes, alternating); `import torch` for scale.",
    )
    modules = {OURS: "paramdict"}
    if config.quick:
        section.notes.append("tensordict: not measured in a quick run (seconds each).")
    elif _peers.load("tensordict") is not None:
        modules["tensordict"] = "tensordict"
    else:
        section.notes.append(_peers.skipped("tensordict", what="tensordict"))
    if not config.quick:
        for module in modules.values():
            _sample(module, config.threads)
    after: dict[str, list[float]] = {name: [] for name in modules}
    torch_times: list[float] = []
    names = list(modules)
    for i in range(config.processes):
        for name in names if i % 2 == 0 else names[::-1]:
            torch_time, module_time = _sample(modules[name], config.threads)
            after[name].append(module_time)
            torch_times.append(torch_time)
    medians = {name: statistics.median(s) for name, s in after.items()}
    spreads = {name: (max(s) - min(s)) / medians[name] for name, s in after.items()}
    section.rows.append(
        Row("import after torch", "fresh process", medians, spreads, after)
    )
    torch_median = statistics.median(torch_times)
    section.notes.append(
        f"{config.processes} processes per package; the spread is (max - min) / "
        f"median; `import torch` itself: {format_seconds(torch_median)} (median)."
    )
    ours = medians[OURS]
    section.targets.append(
        Target(
            f"`import paramdict` under {LIMIT * 1e3:.0f} ms over `import torch`",
            f"{format_seconds(ours)}"
            + (
                f" (tensordict {format_seconds(medians['tensordict'])})"
                if "tensordict" in medians
                else ""
            ),
            ours < LIMIT,
        )
    )
    _optim_sample(config.threads)  # bytecode written, files cached
    samples = [_optim_sample(config.threads) for _ in range(config.processes)]
    optim_times = [s[0] for s in samples]
    optim_median = statistics.median(optim_times)
    for case, times in [
        ("`from paramdict import optim` after torch", optim_times),
        ("then the first `optim.AdamW(lr=1e-3)`", [s[1] for s in samples]),
    ]:
        median = statistics.median(times)
        section.rows.append(
            Row(
                case,
                "fresh process",
                {OURS: median},
                {OURS: (max(times) - min(times)) / median},
                {OURS: times},
            )
        )
    allocated = float(
        run_fresh(["-c", _OPTIM_MEMORY], threads=config.threads, what="Import")
    )
    section.targets += [
        Target(
            f"`from paramdict import optim` under {OPTIM_LIMIT * 1e3:.0f} ms over "
            "`import torch`",
            format_seconds(optim_median),
            optim_median < OPTIM_LIMIT,
        ),
        Target(
            f"`from paramdict import optim` allocates under {OPTIM_MEMORY >> 20} MB",
            f"{allocated / 2**20:.2f} MB (tracemalloc's peak)",
            allocated < OPTIM_MEMORY,
        ),
    ]
    eager = run_fresh(
        ["-c", _EAGER.format(lazy=_LAZY)], threads=config.threads, what="Import"
    )
    section.targets.append(
        Target(
            "`import paramdict` leaves `distributed` and `optim` for their first use",
            "eager: " + (", ".join(eager) if eager else "none"),
            not eager,
        )
    )
    return section
