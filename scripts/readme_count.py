"""Write the number of tests into the README's one sentence that holds it.

Usage (from anywhere, with the environment that runs the tests):

    python scripts/readme_count.py          # rewrite the sentence
    python scripts/readme_count.py --check  # exit 1 if the sentence is stale

The count is what `pytest --collect-only -q` collects from the repository root
(every test function, parametrized case and doctest), with the running torch,
whose version the sentence names. The README holds the sentence once, on a
line of its own, in the form `sentence` writes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PATTERN = re.compile(
    r"^The test suite has (?P<count>\d{1,3}(?:,\d{3})*) tests "
    r"\(counted by `scripts/readme_count\.py`, torch (?P<torch>\d+\.\d+\.\d+)\)\.$",
    re.MULTILINE,
)


def sentence(count: int, torch_version: str) -> str:
    """Return the README's sentence for `count` tests collected with that torch."""
    return (
        f"The test suite has {count:,} tests "
        f"(counted by `scripts/readme_count.py`, torch {torch_version})."
    )


def collected() -> int:
    """Return the number of tests pytest collects from the repository root."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    found = re.fullmatch(r"(\d+) tests? collected in [\d.]+s", last)
    if run.returncode != 0 or found is None:
        msg = (
            f"pytest --collect-only did not collect cleanly (exit status "
            f"{run.returncode}, last line {last!r}); fix the collection first.\n"
            f"{run.stdout[-2000:]}{run.stderr[-2000:]}"
        )
        raise SystemExit(msg)
    return int(found.group(1))


def rewrite(text: str, new: str) -> str:
    """Return `text` with its one count sentence replaced by `new`."""
    matches = PATTERN.findall(text)
    if len(matches) != 1:
        msg = (
            f"README.md must hold the test count sentence exactly once, on a line of "
            f"its own, found {len(matches)}; write it as: {new}"
        )
        raise SystemExit(msg)
    return PATTERN.sub(new, text)


def main() -> int:
    """Count the tests and rewrite (or check) the README's sentence."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the sentence is stale"
    )
    args = parser.parse_args()
    import torch

    new = sentence(collected(), torch.__version__.split("+")[0])
    text = README.read_text(encoding="utf-8")
    updated = rewrite(text, new)
    if args.check:
        if updated != text:
            print(f"README.md's test count is stale; run this script. Now: {new}")
            return 1
        print(new)
        return 0
    README.write_text(updated, encoding="utf-8")
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
