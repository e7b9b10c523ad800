"""The optimizer base imports nothing of the schedules: they plug in through `_slot`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import paramdict.optim

OPTIM = Path(paramdict.optim.__file__).parent
SCHEDULES = ("_schedules", "lr_scheduler")


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Return the modules imported outside `if TYPE_CHECKING:` blocks."""
    found: list[str] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if _type_checking(node):
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found += [base] if base else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        pending.extend(ast.iter_child_nodes(node))
    return found


@pytest.mark.parametrize("module", ["_base.py", "_protocol.py"])
def test_base_imports_no_schedule(module: str) -> None:
    """`_base.py` and `_protocol.py` import no schedule module at run time."""
    tree = ast.parse((OPTIM / module).read_text(encoding="utf-8"))
    imports = _runtime_imports(tree)
    assert imports, f"no imports parsed from {module}"
    edges = sorted(m for m in imports if m.lstrip(".").startswith(SCHEDULES))
    assert not edges, f"{module} imports schedule modules {edges}; use `_slot.py`"


def test_the_check_sees_a_schedule_import() -> None:
    """The parser finds a schedule import, and skips one under TYPE_CHECKING."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ._schedules.plateau import PlateauState\n"
        "if TYPE_CHECKING:\n"
        "    from ._schedules.slot import SlotState\n"
    )
    imports = _runtime_imports(ast.parse(source))
    assert sorted(imports) == ["_schedules.plateau", "typing"]
    assert [m for m in imports if m.lstrip(".").startswith(SCHEDULES)]
