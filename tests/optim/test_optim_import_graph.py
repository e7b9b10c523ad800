"""The optimizer package imports without cycles, and without torch's compiler.

Every import a module of `paramdict.optim` makes when it runs is an edge: those at
the top and those inside functions (a function-level import that hides a cycle is
still a cycle); imports under `if TYPE_CHECKING:` are for the type checkers only.

Importing the package loads only the state classes (`_states.py`,
`_schedules/states.py`) and registers them with `torch.load`; every other public
name loads its module on first use, through the package's `__getattr__`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import paramdict.optim

OPTIM = Path(paramdict.optim.__file__).parent
PACKAGE = "paramdict.optim"


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(OPTIM).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> list[str]:
    """The absolute names an import statement of `module` refers to."""
    if node.level == 0:
        bases = [node.module or ""]
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep])
        bases = [f"{base}.{node.module}" if node.module else base]
    found = list(bases)
    if node.module is None or node.level:  # `from . import x`: x may be a module
        found += [f"{bases[0]}.{alias.name}" for alias in node.names]
    return found


def _runtime_imports(path: Path) -> set[str]:
    """The `paramdict.optim` modules `path` imports outside TYPE_CHECKING blocks."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            found.update(_resolve(module, node, path.name == "__init__.py"))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in OPTIM.rglob("*.py")}
    return {
        name: {m for m in _runtime_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle among modules other than packages' `__init__` (Tarjan's SCCs)."""
    edges = {
        k: {v for v in vs if not graph.get(v) or not v.endswith("optim")}
        for k, vs in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_optimizer_package() -> None:
    """No two modules of `paramdict.optim` import each other, at any depth."""
    graph = _graph()
    packages = {name for name in graph if (OPTIM / "__init__.py").exists()}
    assert packages
    # Only the package `__init__`s import their modules back; leave them out.
    inner = {
        k: {v for v in vs if not _is_package(v)}
        for k, vs in graph.items()
        if not _is_package(k)
    }
    assert _cycles(inner) == []


def _is_package(name: str) -> bool:
    relative = name.removeprefix(PACKAGE).lstrip(".")
    return (OPTIM / relative.replace(".", "/") / "__init__.py").exists() or not relative


def test_the_check_finds_a_cycle_hidden_in_a_function() -> None:
    """The parser sees a function-level import, and skips a TYPE_CHECKING one."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ._schedules.plateau import PlateauState\n"
        "if TYPE_CHECKING:\n"
        "    from ._schedules.slot import SlotState\n"
        "def f():\n"
        "    from ._base import x\n"
    )
    tree = ast.parse(source)
    path = OPTIM / "_probe.py"
    found: set[str] = set()
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            found.update(_resolve(_module_name(path), node, False))
        pending.extend(ast.iter_child_nodes(node))
    assert "paramdict.optim._schedules.plateau" in found
    assert "paramdict.optim._base" in found
    assert "paramdict.optim._schedules.slot" not in found
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]


@pytest.mark.parametrize(
    "module", ["torch._dynamo", "sympy", "torch.distributed.tensor", "torch._inductor"]
)
def test_importing_optim_leaves_the_compiler_unloaded(module: str) -> None:
    """`from paramdict import optim` after `import torch` loads no compiler stack."""
    code = (
        "import sys, torch\n"
        f"before = {module!r} in sys.modules\n"
        "from paramdict import optim\n"
        "import paramdict\n"
        f"print(before, {module!r} in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    if out[0] == "True":
        pytest.skip(f"this torch imports {module} with itself")
    assert out == ["False", "False"]


_LOADED = """
import json, sys, torch
before = set(sys.modules)
from paramdict import optim
loaded = sorted(m for m in set(sys.modules) - before if m.startswith("paramdict.optim"))
first = "attr" in sys.modules
missing = [name for name in optim.__all__ if name not in dir(optim)]
resolved = sum(getattr(optim, name) is not None for name in optim.__all__)
print(json.dumps([loaded, first, missing, resolved]))
"""


def test_importing_optim_loads_the_states_only() -> None:
    """The import loads the state modules and no attrs; each public name resolves."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, check=True
    ).stdout
    loaded, attrs_loaded, missing, resolved = json.loads(out)
    assert loaded == [
        "paramdict.optim",
        "paramdict.optim._registry",
        "paramdict.optim._schedules",
        "paramdict.optim._schedules.states",
        "paramdict.optim._states",
    ]
    assert not attrs_loaded
    assert missing == []
    assert resolved == len(paramdict.optim.__all__)


def test_a_misspelt_name_is_an_attribute_error() -> None:
    """An unknown name raises AttributeError naming it, as any module does."""
    with pytest.raises(AttributeError, match="has no attribute 'Adamw'"):
        _ = paramdict.optim.Adamw  # type: ignore[attr-defined]  # the misspelling


_SUBMODULE = """
import json, paramdict
print(json.dumps([paramdict.optim.lr_scheduler.StepLR.__name__,
                  paramdict.optim.swa_utils.WeightAverage.__name__,
                  paramdict.optim.adam.AdamW.__name__]))
"""


def test_a_public_submodule_is_an_attribute_on_first_use() -> None:
    """`paramdict.optim.lr_scheduler.StepLR` works as `torch.optim.lr_scheduler`'s."""
    out = subprocess.run(
        [sys.executable, "-c", _SUBMODULE], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == ["StepLR", "WeightAverage", "AdamW"]
