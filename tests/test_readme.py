"""The README's opening, its one test count and the install text the docs share.

Counting the tests (`pytest --collect-only`) takes about 20 s on two cores, so these
tests check the form of what `scripts/readme_count.py` writes, not the number; the
script's `--check` compares the number.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
from _helpers import script

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def readme_count() -> ModuleType:
    """Import `scripts/readme_count.py` (not a package) as a module."""
    return script("readme_count")


def test_readme_holds_the_sentence_the_script_writes(readme_count: ModuleType) -> None:
    """The count sentence is there once, in the form `sentence` writes."""
    matches = list(readme_count.PATTERN.finditer(README))
    assert len(matches) == 1, "README.md must hold one test count sentence"
    found = matches[0]
    count = int(found.group("count").replace(",", ""))
    assert found.group(0) == readme_count.sentence(count, found.group("torch"))


def test_sentence_round_trips_through_the_pattern(readme_count: ModuleType) -> None:
    """What the script writes is what it finds again, with thousands separators."""
    written = readme_count.sentence(12345, "2.13.0")
    assert "12,345 tests" in written
    found = readme_count.PATTERN.fullmatch(written)
    assert found is not None
    assert (found.group("count"), found.group("torch")) == ("12,345", "2.13.0")
    text = f"Before.\n{readme_count.sentence(7, '2.13.0')}\nAfter.\n"
    assert readme_count.rewrite(text, written) == f"Before.\n{written}\nAfter.\n"


def test_rewrite_refuses_a_readme_without_one_sentence(
    readme_count: ModuleType,
) -> None:
    """A README with no count sentence, or two, is an error naming the form."""
    written = readme_count.sentence(1, "2.13.0")
    with pytest.raises(SystemExit, match=r"exactly once.*found 0"):
        readme_count.rewrite("No count here.\n", written)
    with pytest.raises(SystemExit, match=r"exactly once.*found 2"):
        readme_count.rewrite(f"{written}\n{written}\n", written)


def test_readme_has_no_other_test_count() -> None:
    """No second, disagreeing count of tests, passes or skips in README or docs home."""
    count = re.compile(r"\b\d[\d,]*\s+(?:tests?|passed|skipped)\b")
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert len(count.findall(README)) == 1, count.findall(README)
    assert count.findall(home) == []


def _opening() -> tuple[str, list[str]]:
    """Return the README's text before its first bash block, and that block's lines."""
    found = re.search(r"^```bash\n(.*?)^```$", README, re.M | re.S)
    assert found is not None
    return README[: found.start()], found.group(1).splitlines()


def test_readme_opens_with_what_and_why_then_the_two_commands() -> None:
    """One or two sentences say what paramdict is, then the commands `.ci/run` reads."""
    before, commands = _opening()
    title, _, prose = before.partition("\n")
    assert title == "# paramdict"
    assert "\n\n" not in prose.strip(), "one paragraph before the commands"
    plain = re.sub(r"`[^`]*`", "code", prose)  # code spans hold dots of their own
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z])", plain.strip())
    assert 1 <= len(sentences) <= 2, sentences
    assert "paramdict" in sentences[0]
    assert len(commands) == 2
    assert commands[0].endswith("examples/maml_sinusoid.py")
    assert commands[1].endswith("-m pytest")


def test_docs_home_installs_as_the_readme_does() -> None:
    """The docs home includes the README's install text instead of its own."""
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for section in ("install", "versions"):
        assert f'--8<-- "README.md:{section}"' in home
        assert f"<!-- --8<-- [start:{section}] -->" in README
        assert f"<!-- --8<-- [end:{section}] -->" in README
    assert "pip install" not in home, "install commands belong to README's section"
    install = README.split("[start:install]")[1].split("[end:install]")[0]
    assert "pip install path/to/paramdict" in install
    assert "pip install torch-paramdict" not in install
