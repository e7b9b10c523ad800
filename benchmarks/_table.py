"""The optimizers the benchmarks time, read from the tests' optimizer table.

`tests/optim/optim_cases.py` holds `TABLE`, the one list of the library's optimizers
that every optimizer test reads; each row's `bench` is its benchmark entry (the
options, the name in the reports, torchopt's function). The sections `optim` and
`optim-scale` build their optimizer rows from `entries()`, so a row added to the
table is timed too, with no list in `benchmarks/` to keep in step.

The table stays with the tests and is loaded from its file, rather than moved to a
module both import: its rows hold pytest marks and references written for the tests
(`TorchLion`, Muon on an MLP's weights), and the benchmarks run from a checkout,
where the file is. `tests/` is not a package (pytest puts `tests/optim` on
`sys.path`), so the file is loaded by its path, under the name the tests import it
by (`optim_cases`): a process that runs both, as the benchmarks' tests do, holds one
table and one class of each reference. It imports the tests' `_torch_versions`
from `tests/`, which is on `sys.path` while it loads, and pytest (the `test` extra);
it is loaded only when an optimizer section runs or `--optimizers` names some, so the
other sections run without pytest.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from paramdict import optim

from . import _device

__all__ = ["PATH", "Entry", "entries", "entry", "names"]

PATH = Path(__file__).resolve().parent.parent / "tests" / "optim" / "optim_cases.py"
"""The file that holds the table."""
_NAME = "optim_cases"
"""The module name the tests import the table by."""


@dataclass(frozen=True)
class Entry:
    """One optimizer as the benchmarks time it: a row of the table and its `bench`."""

    name: str
    """The name in the reports and for `--optimizers`."""
    ours: Callable[..., optim.Optimizer[Any]]
    """The `paramdict.optim` class."""
    theirs: Callable[..., torch.optim.Optimizer]
    """torch.optim's class, or the table's plain-torch reference where torch has
    none; its signature tells which of torch's paths (`foreach`, `fused`) it offers."""
    options: dict[str, Any]
    """Options of both classes."""
    torchopt: str
    """torchopt's function for the same update ("": torchopt has none)."""
    matrices_only: bool
    """The optimizer takes 2-D entries only (Muon): it is timed on matrices."""
    in_torch: bool
    """`theirs` is torch's own class (False: a reference written in the tests,
    which has no fused kernel whatever it accepts)."""

    def takes(self, option: str) -> bool:
        """Whether `theirs` takes the keyword `option` (torch's `foreach`, `fused`)."""
        return option in inspect.signature(self.theirs).parameters

    @property
    def fused(self) -> bool:
        """Whether torch has a fused kernel for it on the measured device.

        Its class takes `fused`, and takes it for tensors on that device
        (`_device.fused_on_device`: torch's Adagrad has a CPU kernel only).
        """
        return (
            self.in_torch
            and self.takes("fused")
            and _device.fused_on_device(self.theirs)
        )


def _load() -> ModuleType:
    """Return the table's module: the tests' own if imported, else loaded by path."""
    imported = sys.modules.get(_NAME)
    if imported is not None:
        if Path(str(getattr(imported, "__file__", ""))).resolve() == PATH:
            return imported
        name = f"_benchmarks_{_NAME}"  # another module took the name: keep it
    else:
        name = _NAME
    if not PATH.is_file():
        msg = (
            f"The optimizer benchmarks read their optimizers from {PATH}, which is "
            "missing: run them from a checkout of the repository."
        )
        raise ImportError(msg)
    spec = importlib.util.spec_from_file_location(name, PATH)
    assert spec is not None  # a .py file's spec, with its loader
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: its dataclasses look their module up by name.
    sys.modules[name] = module
    tests = str(PATH.parents[1])  # its own imports (`_torch_versions`), as pytest's
    sys.path.insert(0, tests)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as err:
        del sys.modules[name]
        msg = (
            "The optimizer benchmarks read their optimizers from the tests' table "
            f"({PATH.relative_to(PATH.parents[2])}), which imports {err.name}: "
            "install the test extra (pip install -e '.[test]')."
        )
        raise ImportError(msg) from err
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(tests)
    return module


def _entry(case: Any) -> Entry:
    """Read a row of the table (`optim_cases.Case`) as a benchmark entry."""
    # A row whose `ours`/`theirs` are factories (Muon on the MLP's weights) names
    # its classes in `classes`; the benchmarks time the classes.
    ours, theirs = case.classes or (case.ours, case.theirs)
    bench = case.bench
    return Entry(
        name=bench.name or ours.__name__,
        ours=ours,
        theirs=theirs,
        options=dict(bench.options),
        torchopt=bench.torchopt,
        matrices_only=case.matrices_only,
        in_torch=case.in_torch,
    )


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Return every row's benchmark entry, in the table's order.

    A row whose torch.optim class the installed torch lacks (Muon before torch
    2.9) has no entry: there is nothing to time ours against.

    Raises:
        ImportError: The table's file is missing, or pytest (the `test` extra)
            is not installed.
        ValueError: Two rows have one name in the reports.
    """
    found = tuple(
        e
        for e in map(_entry, _load().TABLE)
        if not e.in_torch or hasattr(torch.optim, e.theirs.__name__)
    )
    seen = [e.name for e in found]
    doubled = sorted({n for n in seen if seen.count(n) > 1})
    if doubled:
        msg = f"Rows of the optimizer table share the names {doubled}."
        raise ValueError(msg)
    return found


def names() -> tuple[str, ...]:
    """Return the names of every row's benchmark entry, in the table's order."""
    return tuple(e.name for e in entries())


def entry(name: str) -> Entry:
    """Return the entry called `name`.

    Raises:
        KeyError: No row has that name.
    """
    for found in entries():
        if found.name == name:
            return found
    msg = f"No optimizer {name!r} in the table; it has {list(names())}."
    raise KeyError(msg)
