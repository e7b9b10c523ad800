"""Run scenarios in several gloo processes on 127.0.0.1 and bring their results back.

`run(world_size, module, scenarios, tmp)` starts `world_size` processes with the
`spawn` start method, joins them into one gloo group through a `TCPStore` that the
calling process serves on a port the OS picks, runs the named scenarios in order on
every rank (warnings are errors there, as under pytest), and returns
`{scenario: [result of rank 0, ...]}`. Scenarios named in `then=` run afterwards, in
torchrun's environment, and make their own group. Everything is bounded: the group has
a short timeout, the caller waits at most `timeout` seconds and kills what is left,
and children die with their parent.

Scenarios are plain functions of `(rank, world_size)` in the `SCENARIOS` table of an
importable module; they run in the children, which import that module by name.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore  # typed; `dist.TCPStore` is not
from torch.multiprocessing.spawn import ProcessContext, start_processes

Scenario = Callable[[int, int], Any]

GROUP_TIMEOUT = datetime.timedelta(seconds=30)


@contextlib.contextmanager
def _warnings_are_errors() -> Iterator[None]:
    """Turn warnings into errors, as pytest's configuration does, but torch's own.

    torch 2.6's DTensor warns on every CPU mesh that its random operators "may not
    have complete support" there (torch 2.13's does not); no scenario draws random
    numbers from a DTensor.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings(
            "ignore", "DTensor random operators may not have complete", UserWarning
        )
        yield


def _child(
    rank: int,
    world_size: int,
    port: int,
    module: str,
    scenarios: Sequence[str],
    then: Sequence[str],
    out: str,
) -> None:
    torch.set_num_threads(1)
    table: dict[str, Scenario] = importlib.import_module(module).SCENARIOS
    results: dict[str, Any] = {}
    store = TCPStore(
        "127.0.0.1", port, world_size, is_master=False, timeout=GROUP_TIMEOUT
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT
    )
    try:
        with _warnings_are_errors():
            for name in scenarios:
                results[name] = table[name](rank, world_size)
    finally:
        dist.destroy_process_group()
    # The next scenarios make their own group from torchrun's environment; they
    # connect to the caller's store rather than serve one, as torchrun's workers do.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    with _warnings_are_errors():
        for name in then:
            results[name] = table[name](rank, world_size)
    torch.save(results, Path(out) / f"rank{rank}.pt")
    # The results are on disk. Leave now, skipping the interpreter's and the C++
    # libraries' teardown: with gloo's threads and a store client about, that
    # teardown has been seen to hang now and then, holding up the test run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(
    world_size: int,
    module: str,
    scenarios: Sequence[str],
    tmp: Path,
    *,
    then: Sequence[str] = (),
    timeout: float = 150.0,
    attempts: int = 2,
) -> dict[str, list[Any]]:
    """Run `scenarios`, then `then`, from `module.SCENARIOS` on `world_size` processes.

    Args:
        world_size: How many processes.
        module: The importable name of the module holding `SCENARIOS`.
        scenarios: Names of the scenarios to run, in this order on every rank, in a
            gloo group made for them.
        tmp: An empty directory for the results.
        then: Names of scenarios to run after that group is destroyed, with
            torchrun's environment variables set (`MASTER_ADDR`, `MASTER_PORT`,
            `RANK`, `WORLD_SIZE`), so they can call `init_process_group("gloo")`
            as a script under torchrun does.
        timeout: The most seconds to wait for all processes, per attempt.
        attempts: How many times to start fresh processes when an attempt times
            out. Under heavy load a start-up has been seen to stall; a stall is
            retried, a failure inside a scenario is not.

    Returns:
        For each scenario, its results on ranks 0, 1, ...

    Raises:
        torch.multiprocessing.ProcessRaisedException: If a process raised; the message
            holds its traceback.
        TimeoutError: If no attempt finished within `timeout` seconds; the processes
            are killed.
    """
    for attempt in range(1, attempts + 1):
        try:
            return _run_once(world_size, module, scenarios, tmp, then, timeout)
        except TimeoutError:
            if attempt == attempts:
                raise
            for stale in tmp.glob("rank*.pt"):
                stale.unlink()
    msg = "`attempts` must be at least 1."
    raise ValueError(msg)


def _run_once(
    world_size: int,
    module: str,
    scenarios: Sequence[str],
    tmp: Path,
    then: Sequence[str],
    timeout: float,
) -> dict[str, list[Any]]:
    # The calling process serves the store on a port the OS picks, so there is no
    # race for a free port; the children connect to it as clients.
    store = TCPStore(
        "127.0.0.1",
        0,
        world_size + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=GROUP_TIMEOUT,
        use_libuv=True,
    )
    port = store.port
    start = cast("Callable[..., ProcessContext]", start_processes)  # unannotated
    context = start(
        _child,
        args=(world_size, port, module, tuple(scenarios), tuple(then), str(tmp)),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            msg = f"{world_size} gloo processes did not finish within {timeout} s."
            raise TimeoutError(msg)
    per_rank = [
        torch.load(tmp / f"rank{rank}.pt", weights_only=False)
        for rank in range(world_size)
    ]
    return {name: [r[name] for r in per_rank] for name in (*scenarios, *then)}
