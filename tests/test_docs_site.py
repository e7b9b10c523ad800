"""The built documentation site reads as a reference: no broken tables, short pages.

The site is built once with `mkdocs build --strict` into a temporary directory and
every page's HTML is read with the standard library's parser. mkdocs comes with the
`docs` extra (in `dev`), not with `test`: without it these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The most headings an API page may have: past this a page is a catalogue of
# repeated members rather than a reference one reads (the optimizers' page had
# 284 when every optimizer repeated the shared interface).
MAX_HEADINGS = 60

# A table cell's text ends a sentence (or a parenthesis).
SENTENCE_END = re.compile(r"[.!?)]$")
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*$")


class _Page(HTMLParser):
    """Collect a page's headings and its `Returns:` and `Raises:` tables.

    mkdocstrings renders a docstring section as a `doc-section-title` span
    followed by a table with one `doc-section-item` row per item: a type cell,
    then a description cell.
    """

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []  # the id of each <h1>...<h6>, in order
        # (section title, the object's heading id, rows of (type, description))
        self.sections: list[tuple[str, str, list[tuple[str, str]]]] = []
        self._title: str | None = None  # text of a section title being read
        self._section: str | None = None  # title waiting for its table
        self._rows: list[tuple[str, str]] | None = None  # rows of a table being read
        self._cells: list[str] | None = None  # cells of a row being read
        self._cell: str | None = None  # text of a cell being read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Open a heading, section title, table, row or cell."""
        attributes = dict(attrs)
        if re.fullmatch(r"h[1-6]", tag):
            self.headings.append(attributes.get("id") or "")
        elif tag == "span" and attributes.get("class") == "doc-section-title":
            self._title = ""
        elif tag == "table" and self._section is not None:
            self._rows = []
        elif tag == "tr" and self._rows is not None:
            self._cells = []
        elif tag == "td" and self._cells is not None:
            self._cell = ""

    def handle_endtag(self, tag: str) -> None:
        """Close what `handle_starttag` opened."""
        if tag == "span" and self._title is not None:
            title = self._title.strip()
            self._section = title if title in ("Returns:", "Raises:") else None
            self._title = None
        elif tag == "td" and self._cells is not None and self._cell is not None:
            self._cells.append(" ".join(self._cell.split()))
            self._cell = None
        elif tag == "tr" and self._rows is not None and self._cells is not None:
            if self._cells:  # the header row has <th> cells only
                self._rows.append((self._cells[0], self._cells[-1]))
            self._cells = None
        elif tag == "table" and self._rows is not None and self._section is not None:
            owner = next((h for h in reversed(self.headings) if h), "")
            self.sections.append((self._section, owner, self._rows))
            self._rows = None
            self._section = None

    def handle_data(self, data: str) -> None:
        """Add text to the title or cell being read."""
        if self._title is not None:
            self._title += data
        if self._cell is not None:
            self._cell += data


def read_page(html: str) -> _Page:
    """Return the parsed page."""
    page = _Page()
    page.feed(html)
    page.close()
    return page


def split_sections(page: _Page) -> list[str]:
    """Return a line for each `Returns`/`Raises` section rendered as split rows.

    A Returns section is one description (its type is the signature's), so a
    second row is a wrapped line read as a further value. A row whose
    description stops mid-sentence, or a Raises row whose type is not an
    exception's name, is a piece of a wrapped item.
    """
    found: list[str] = []
    for title, owner, rows in page.sections:
        broken = title == "Returns:" and len(rows) > 1
        for kind, description in rows:
            if not SENTENCE_END.search(description):
                broken = True
            if title == "Raises:" and not EXCEPTION.match(kind):
                broken = True
        if broken:
            found.append(f"{owner} {title} {rows}")
    return found


BROKEN = """
<h3 id="paramdict.ParamDict.allclose">allclose</h3>
<p><span class="doc-section-title">Returns:</span></p>
<table><thead><tr><th>Type</th><th>Description</th></tr></thead><tbody>
<tr class="doc-section-item"><td><code>bool</code></td>
<td><p><code>True</code> when <code>torch.allclose</code> holds for every key. The
result is a plain</p></td></tr>
<tr class="doc-section-item"><td><code>bool</code></td>
<td><p><code>bool</code> (it reads values, so it synchronizes).</p></td></tr>
</tbody></table>
<p><span class="doc-section-title">Raises:</span></p>
<table><thead><tr><th>Type</th><th>Description</th></tr></thead><tbody>
<tr class="doc-section-item"><td><code>ValueError</code></td>
<td><p>If the keys differ.</p></td></tr>
</tbody></table>
"""


def test_split_sections_finds_a_broken_table() -> None:
    """The check flags a Returns table of wrapped lines, not a sound Raises one."""
    page = read_page(BROKEN)
    assert page.headings == ["paramdict.ParamDict.allclose"]
    assert [title for title, _, _ in page.sections] == ["Returns:", "Raises:"]
    found = split_sections(page)
    assert len(found) == 1
    assert found[0].startswith("paramdict.ParamDict.allclose Returns:")


def test_split_sections_finds_a_wrapped_raises_row() -> None:
    """A Raises row cut mid-sentence, or typed by a fragment, is flagged."""
    page = read_page(
        '<h3 id="f">f</h3><p><span class="doc-section-title">Raises:</span></p>'
        "<table><tr><td>ValueError</td><td>If the keys differ, or an</td></tr>"
        "<tr><td>entry's shape (say</td><td>it) differs.</td></tr></table>"
    )
    assert len(split_sections(page)) == 1


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the site once, strictly, and return its directory."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (it comes with the `docs` extra)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
    built = subprocess.run(  # the build is what these tests read
        [*command, "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return out


def _pages(site: Path) -> dict[str, _Page]:
    return {
        str(path.relative_to(site)): read_page(path.read_text(encoding="utf-8"))
        for path in sorted(site.rglob("*.html"))
    }


def test_no_returns_or_raises_section_is_split(site: Path) -> None:
    """Every Returns and Raises table of the site has one row per item."""
    pages = _pages(site)
    sections = [s for page in pages.values() for s in page.sections]
    # The parser still understands the markup: the reference has many of each.
    assert sum(title == "Returns:" for title, _, _ in sections) > 50
    assert sum(title == "Raises:" for title, _, _ in sections) > 50
    broken = [
        f"{name}: {line}"
        for name, page in pages.items()
        for line in split_sections(page)
    ]
    assert not broken, "sections rendered as split rows:\n" + "\n".join(broken)


def test_api_pages_have_at_most_max_headings(site: Path) -> None:
    """Each API page, the optimizers' included, stays a readable reference."""
    counts = {
        name: len(page.headings)
        for name, page in _pages(site).items()
        if name.startswith("api/")
    }
    assert "api/optim/index.html" in counts
    assert min(counts.values()) > 1  # a title and at least one entry: headings seen
    long = {name: n for name, n in counts.items() if n > MAX_HEADINGS}
    assert not long, f"API pages with more than {MAX_HEADINGS} headings: {long}"
