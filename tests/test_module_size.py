"""Every module of paramdict stays small enough to hold one concept."""

from __future__ import annotations

from pathlib import Path

import paramdict

LIMIT = 600


def test_no_module_over_the_line_limit() -> None:
    """No .py file under `paramdict/` has more than 600 lines."""
    root = Path(paramdict.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert files, f"no modules found under {root}"
    long = {
        str(f.relative_to(root)): n
        for f in files
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > LIMIT
    }
    assert not long, f"modules over {LIMIT} lines (split them): {long}"
