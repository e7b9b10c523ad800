"""Every Python code block in the docs and the README runs, so the docs cannot drift.

Blocks of one page share a namespace and run in order, like a reader pasting them into
one session. A block whose first line is `# not run: <reason>` is shown but skipped
(commands for several processes, say); the reason is part of the page.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(page: Path) -> list[tuple[int, str]]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        code = match.group(1)
        if code.lstrip().startswith("# not run:"):
            continue
        line = text.count("\n", 0, match.start()) + 2
        found.append((line, code))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run the page's Python blocks in order in one namespace."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    torch.manual_seed(0)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for line, code in _blocks(page):
        # Pad so tracebacks point at the page's own line numbers.
        exec(
            compile("\n" * (line - 1) + code, str(page), "exec"), namespace
        )  # running the docs is the point


def test_skipped_blocks_give_a_reason() -> None:
    """A skipped block says why, so a reader knows it is not an oversight."""
    for page in PAGES:
        for match in FENCE.finditer(page.read_text(encoding="utf-8")):
            first = (
                match.group(1).lstrip().splitlines()[0]
                if match.group(1).strip()
                else ""
            )
            if first.startswith("# not run"):
                assert re.match(r"# not run: \S", first), f"{page}: {first!r}"
