"""Each tutorial's code, pasted into a reader's own project, passes strict pyright.

The runnable Python blocks of each tutorial (those `tests/test_docs.py` runs, outside
the repository) are written, in order, into one `tutorial.py` in an empty directory
outside the repository, beside the files the tutorial tells the reader to copy, and
`pyright` checks them in strict mode with this environment's Python, where
`paramdict` is installed. pyright comes with the `lint` extra (in `dev`), not with
`test`: without it these tests are skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_docs import FENCE, ROOT, copied_files

TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
CHECKED = TUTORIALS
# Code that strict pyright must refuse: proof that the configuration is strict.
CANARY = "def untyped(x):\n    return [x]\n\n\nitems = []\n"


def script(page: Path) -> str:
    """Return the page's runnable Python blocks as one file, in order."""
    text = page.read_text(encoding="utf-8")
    blocks = [
        code
        for code in FENCE.findall(text)
        if not code.lstrip().startswith("# not run:")
    ]
    return "\n\n".join(blocks)


def _pyright() -> str | None:
    """Return the pyright of this environment, else one on the PATH, else None."""
    here = Path(sys.executable).parent
    return shutil.which("pyright", path=str(here)) or shutil.which("pyright")


@pytest.fixture(scope="module")
def diagnostics(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Check every tutorial in one pyright run; return each one's errors."""
    pyright = _pyright()
    if pyright is None:
        pytest.skip("pyright is not installed (it comes with the `lint` extra)")
    root = tmp_path_factory.mktemp("tutorials")  # outside the repository
    assert ROOT not in root.resolve().parents
    projects = {page.stem: page for page in CHECKED}
    for name, page in projects.items():
        (root / name).mkdir()
        for source in copied_files(page):
            shutil.copy(source, root / name)
        (root / name / "tutorial.py").write_text(script(page), encoding="utf-8")
    (root / "canary").mkdir()
    (root / "canary" / "tutorial.py").write_text(CANARY, encoding="utf-8")
    # Each tutorial is a project of its own: its directory is an import root.
    environments = [{"root": name} for name in [*projects, "canary"]]
    config = {"typeCheckingMode": "strict", "executionEnvironments": environments}
    (root / "pyrightconfig.json").write_text(json.dumps(config), encoding="utf-8")
    files = [f"{name}/tutorial.py" for name in [*projects, "canary"]]
    run = subprocess.run(  # pyright's verdict is what these tests read
        [pyright, "--outputjson", "--pythonpath", sys.executable, *files],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    report: dict[str, Any] = json.loads(run.stdout)
    assert report["summary"]["filesAnalyzed"] >= len(files), run.stdout[-2000:]
    found: dict[str, list[str]] = {name: [] for name in [*projects, "canary"]}
    for item in report["generalDiagnostics"]:
        if item["severity"] != "error":
            continue
        name = Path(item["file"]).parent.name
        line = item["range"]["start"]["line"] + 1
        rule = item.get("rule", "")
        found[name].append(f"tutorial.py:{line}: {item['message']} ({rule})")
    return found


def test_strict_pyright_refuses_the_canary(diagnostics: dict[str, list[str]]) -> None:
    """The configuration is strict: an unannotated function and list are errors."""
    assert any("reportMissingParameterType" in d for d in diagnostics["canary"])
    assert any("reportUnknownVariableType" in d for d in diagnostics["canary"])


@pytest.mark.parametrize("page", CHECKED, ids=[page.name for page in CHECKED])
def test_tutorial_is_clean_under_strict_pyright(
    page: Path, diagnostics: dict[str, list[str]]
) -> None:
    """The tutorial's code, as a reader's file, has no pyright error in strict mode."""
    errors = diagnostics[page.stem]
    assert not errors, f"{page.name}:\n" + "\n".join(errors)
