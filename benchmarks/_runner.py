"""The benchmark suite's command line: `python -m benchmarks`.

    python -m benchmarks                  # everything, single-threaded: a few minutes
    python -m benchmarks --quick          # a smoke run of seconds; numbers are rough
    python -m benchmarks --out results    # also write results.md and results.json
    python -m benchmarks --only update,grad --threads 2
    python -m benchmarks --only optim-scale --optimizers Muon,LBFGS
    python -m benchmarks --only optim,optim-scale --device cuda --no-compile
    python -m benchmarks --only gpu       # every optimizer on a CUDA GPU, ~5 minutes

Every section times its candidates side by side in this process (interleaved
rounds after a warm-up, medians; see `_timing`), except peak memory and import
time, which need fresh processes. Peers (tensordict, torchopt, higher) are measured
when they import and skipped with a note otherwise. The report lists each target
from the issue with the numbers and whether it was met; a missed target does not
make the command fail, since speed depends on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from . import (
    _device,
    _peers,
    adapter,
    autograd,
    gpu,
    imaml,
    imports,
    maml,
    maml_cnn,
    optim,
    optim_papers,
    optim_scale,
    pytree,
    update,
)
from ._report import Config, Section, render_markdown

__all__ = ["SECTIONS", "main"]

SECTIONS: dict[str, Callable[[Config], Section]] = {
    "update": update.measure,
    "grad": autograd.measure,
    "pytree": pytree.measure,
    "optim": optim.measure,
    "optim-scale": optim_scale.measure,
    "optim-papers": optim_papers.measure,
    "adapter": adapter.measure,
    "maml": maml.measure,
    "memory": maml.measure_memory,
    "cnn": maml_cnn.measure,
    "cnn-memory": maml_cnn.measure_memory,
    "imaml": imaml.measure,
    "import": imports.measure,
    "gpu": gpu.measure,
}
"""Section key (for `--only`) to the function that measures it."""

SIZES = ((8, 1600), (160, 64), (1000, 16))
"""`(entries, elements)`: few large entries, the issue's reference size, many small."""
QUICK_SIZES = ((160, 64),)


def _config(args: argparse.Namespace) -> Config:
    if args.quick:
        return Config(
            quick=True,
            rounds=args.rounds or 3,
            target=0.001,
            warmup=1,
            threads=args.threads,
            processes=args.processes or 1,
            sizes=QUICK_SIZES,
            clock=args.clock,
            optimizers=args.optimizers,
            compile=args.compile,
        )
    return Config(
        quick=False,
        rounds=args.rounds or 101,
        target=0.003,
        warmup=3,
        threads=args.threads,
        processes=args.processes or 7,
        sizes=SIZES,
        clock=args.clock,
        optimizers=args.optimizers,
        compile=args.compile,
    )


def _accelerator() -> str | None:
    """The optimizer sections' device, named, if it is not the CPU."""
    device = _device.current()
    if not _device.accelerated():
        return None
    return f"{device} ({torch.cuda.get_device_name(device)})"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=root,
            check=False,
        )
    except OSError:
        return None
    return done.stdout.strip() or None


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _machine(config: Config) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "commit": _commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "threads": config.threads,
        "clock": config.clock,
        "peers": _peers.versions(),
        "quick": config.quick,
        "rounds": config.rounds,
        "processes": config.processes,
        "optimizers": list(config.optimizers),
        "device": _accelerator(),
        "compile": config.compile,
    }


def _header(meta: dict[str, Any]) -> list[str]:
    peers = ", ".join(
        f"{name} {version}" if version else f"{name} (not installed)"
        for name, version in meta["peers"].items()
    )
    load = meta["load_average"]
    mode = (
        "quick smoke run: few, short samples, rough numbers, verdicts not meaningful"
        if meta["quick"]
        else "full run"
    )
    picked = (
        [f"- optimizers: {', '.join(meta['optimizers'])} only"]
        if meta["optimizers"]
        else []
    )
    return [
        "# paramdict benchmarks",
        "",
        f"- {mode}, {meta['date']}, commit {meta['commit'] or 'unknown'}",
        f"- torch {meta['torch']}, Python {meta['python']}, {meta['platform']}",
        f"- {meta['cpu']}, {meta['logical_cpus']} logical CPUs, "
        f"{meta['threads']} torch thread(s), {meta['clock']}-clock time",
        f"- peers: {peers}",
        f"- load average (1, 5, 15 min): {load['before']} before, "
        f"{load['after']} after",
        f"- {meta['rounds']} interleaved rounds per timing (medians); "
        f"{meta['processes']} fresh process(es) per memory/import candidate; "
        "ratios: the median over rounds of the candidate's sample over ParamDict's "
        "sample of the same round",
        *picked,
        *(
            [
                f"- the optimizer sections on {meta['device']}, synchronized before "
                "each clock reading; peak memory: the CUDA caching allocator's"
            ]
            if meta["device"]
            else []
        ),
        *([] if meta["compile"] else ["- compiled steps not timed (`--no-compile`)"]),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line, run the sections, print and write the report."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of seconds: few, short samples; numbers are rough",
    )
    parser.add_argument(
        "--out", type=Path, help="folder to write results.md and results.json into"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default: 1)"
    )
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time elapsed (default) or this process's CPU time (steadier on a "
        "shared machine)",
    )
    parser.add_argument("--rounds", type=int, help="timing samples per candidate")
    parser.add_argument(
        "--processes", type=int, help="fresh processes per memory/import candidate"
    )
    parser.add_argument(
        "--optimizers",
        help="comma-separated optimizers for the sections optim, optim-scale and "
        "optim-papers (default: all), by their names in the report: the rows of the "
        "tests' optimizer table (tests/optim/optim_cases.py), e.g. Adam, "
        "'SGD momentum', Lion, and LBFGS, 'AdamW warm-up + cosine', 'nanoGPT "
        "recipe', and ScheduleFreeAdamW, AdEMAMix, Adan, SOAP",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="device of the sections optim and optim-scale (default: cpu), e.g. "
        "cuda; the others run on the CPU",
    )
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="leave out the compiled steps of the section optim-scale",
    )
    args = parser.parse_args(argv)
    try:
        _device.use(args.device)
    except ValueError as error:
        parser.error(str(error))
    if _device.accelerated() and args.clock == "cpu":
        parser.error("--clock cpu times the host only: use the wall clock on a GPU")
    picked = [n.strip() for n in (args.optimizers or "").split(",") if n.strip()]
    if picked:  # the table is read only when asked for (it needs pytest)
        optimizers = sorted(
            {*optim.optimizers(), *optim_scale.optimizers(), *optim_papers.OPTIONS}
        )
        unknown = sorted(set(picked) - set(optimizers))
        if unknown:
            parser.error(f"unknown optimizers {unknown}; choose from {optimizers}")
    args.optimizers = tuple(picked)
    keys = list(SECTIONS)
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = sorted(set(keys) - set(SECTIONS))
        if unknown:
            parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    config = _config(args)
    load_before = _load()
    meta = _machine(config)
    sections = []
    started = time.perf_counter()
    for key in keys:
        begun = time.perf_counter()
        print(f"[{key}] ...", file=sys.stderr, flush=True)
        sections.append(SECTIONS[key](config))
        print(
            f"[{key}] done in {time.perf_counter() - begun:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    meta["load_average"] = {"before": load_before, "after": _load()}
    meta["seconds"] = round(time.perf_counter() - started, 1)
    report = render_markdown(_header(meta), sections)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(report, encoding="utf-8")
        payload = {"meta": meta, "sections": [s.as_json() for s in sections]}
        (args.out / "results.json").write_text(
            json.dumps(payload, indent=2) + "\n", encoding="utf-8"
        )
