"""Every Python code block in the docs and the README runs, so the docs cannot drift.

Blocks of one page share a namespace and run in order, like a reader pasting them into
one session. A block whose first line is `# not run: <reason>` is shown but skipped
(commands for several processes, say); the reason is part of the page. A plain `text`
block right after a Python block is that block's printed output and must match it; a
`text` block with a title (`text title="output"`) shows output without checking it.

Each page runs as in a project of the reader's own: in an empty directory outside the
repository, with the repository's root off `sys.path` (an editable install puts it
there), so a page can import `paramdict` and the files it tells the reader to copy
(`cp path/to/paramdict/examples/train_gpt.py .`), and nothing else of the checkout.
"""

from __future__ import annotations
import __future__

import contextlib
import functools
import io
import operator
import os
import re
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from _torch_versions import needs_torch

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
FUTURE_FLAGS = functools.reduce(
    operator.or_,
    (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names),
)
OUTPUT = re.compile(r"\s*```text\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """Return each runnable block's first line, its code and its expected output."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        code = match.group(1)
        if code.lstrip().startswith("# not run:"):
            continue
        line = text.count("\n", 0, match.start()) + 2
        shown = OUTPUT.match(text, match.end())
        found.append((line, code, shown.group(1) if shown else None))
    return found


# A bash line that copies a file of the checkout into the reader's directory.
COPY = re.compile(r"^cp path/to/paramdict/(\S+) \.$", re.MULTILINE)
BASH = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
# What an editable install exposes besides the package: the checkout's own folders.
REPOSITORY_ONLY = frozenset(
    path.stem
    for path in ROOT.iterdir()
    if not path.name.startswith(".") and path.name != "paramdict"
)


def copied_files(page: Path) -> list[Path]:
    """Return the files of the checkout that the page tells the reader to copy."""
    text = page.read_text(encoding="utf-8")
    return [ROOT / name for block in BASH.findall(text) for name in COPY.findall(block)]


def repository_imports(code: str) -> set[str]:
    """Return the top-level names `code` imports that only the checkout has."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.partition(".")[0])
    return names & REPOSITORY_ONLY


def test_repository_imports_are_found() -> None:
    """`from examples import ...` is flagged; paramdict, torch and copies are not."""
    code = "import torch\nimport train_gpt\nfrom paramdict import optim\n"
    assert repository_imports(code) == set()
    assert repository_imports(code + "from examples import train_gpt\n") == {"examples"}
    assert repository_imports("import tests.optim.optim_cases as c\n") == {"tests"}


# Pages that show what only a newer torch does: skipped with the reason on an older one.
NEWER_TORCH = {
    "docs/migrating.md": ((2, 13), "which compares with autograd.grad's dict inputs,"),
    "docs/optim.md": ((2, 8), "which compiles a step with fullgraph=True,"),
    "docs/tutorials/compile.md": ((2, 8), "which compiles with fullgraph=True,"),
    "docs/tutorials/schedules.md": ((2, 8), "which compiles a schedule in one graph,"),
    "docs/tutorials/porting.md": ((2, 8), "which compiles a step with fullgraph=True,"),
}


def _page(page: Path) -> Any:
    name = str(page.relative_to(ROOT))
    if name not in NEWER_TORCH:
        return pytest.param(page, id=name)
    (major, minor), what = NEWER_TORCH[name]
    return pytest.param(
        page, id=name, marks=needs_torch(major, minor, f"{name}, {what}")
    )


def _outside(paths: list[str]) -> list[str]:
    """Return `paths` without the repository's root (the current one included)."""
    return [p for p in paths if p and Path(p).resolve() != ROOT]


def test_newer_torch_pages_exist() -> None:
    """Every page named in `NEWER_TORCH` is a docs page, so no skip is stale."""
    assert set(NEWER_TORCH) <= {str(p.relative_to(ROOT)) for p in PAGES}


@pytest.mark.parametrize("page", [_page(p) for p in PAGES])
def test_code_blocks_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run the page's Python blocks in order in one namespace."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    # As a script in the reader's directory: that directory on the path, the
    # checkout not, and the files the page says to copy beside the script.
    monkeypatch.setattr(sys, "path", [str(tmp_path), *_outside(sys.path)])
    for source in copied_files(page):
        shutil.copy(source, tmp_path)
        monkeypatch.delitem(sys.modules, source.stem, raising=False)
    imported = {
        name for _, code, _ in _blocks(page) for name in repository_imports(code)
    }
    assert not imported, f"{page.name} imports {imported} from the checkout"
    torch.manual_seed(0)
    # A registered module, as for an imported file: `dataclasses` and pickling look
    # the defining module up in `sys.modules`.
    module = types.ModuleType(f"docs_{page.stem}")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    flags = 0  # `from __future__` imports of earlier blocks, as in a session
    for line, code, expected in _blocks(page):
        # Pad so tracebacks point at the page's own line numbers. The page's code
        # does not inherit this file's `from __future__ import annotations`.
        compiled = compile(
            "\n" * (line - 1) + code, str(page), "exec", flags, dont_inherit=True
        )
        flags |= compiled.co_flags & FUTURE_FLAGS
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compiled, namespace)  # running the docs is the point
        if expected is not None:
            assert printed.getvalue().strip() == expected.strip(), (
                f"{page.name}:{line}: the block prints something else than the "
                "output shown after it"
            )
    for source in copied_files(page):
        sys.modules.pop(source.stem, None)  # imported from this test's directory


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


def _referenced() -> tuple[set[str], set[str]]:
    """Return the dotted names that the API reference renders with `:::`.

    The first set holds every name given to `:::` and every name in a `members:`
    list; the second, the names rendered whole (no `members:` list), whose public
    members are rendered with them.
    """
    names: set[str] = set()
    whole: set[str] = set()
    for page in (ROOT / "docs" / "api").rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^::: ([\w.]+)\n((?:[ \t]+\S.*\n)*)", text, re.M):
            target = match.group(1)
            names.add(target)
            members = re.findall(r"^\s+- (\w+)\s*$", match.group(2), re.M)
            names.update(f"{target}.{m}" for m in members)
            if not re.search(r"^\s+members:", match.group(2), re.M):
                whole.add(target)
    return names, whole


def _public() -> dict[str, object]:
    """Return every public name of the package, dotted, with its object."""
    import importlib
    import pkgutil

    import paramdict

    found: dict[str, object] = {}
    modules = [paramdict]
    for info in pkgutil.iter_modules(paramdict.__path__):
        if not info.name.startswith("_"):
            modules.append(importlib.import_module(f"paramdict.{info.name}"))
    for module in modules:
        for name in getattr(module, "__all__", []):
            if name != "__version__":
                found[f"{module.__name__}.{name}"] = getattr(module, name)
    for dotted, obj in list(found.items()):
        if not isinstance(obj, type):
            continue
        for klass in obj.__mro__:
            if not klass.__module__.startswith("paramdict"):
                continue
            for name, attr in vars(klass).items():
                if not name.startswith("_"):
                    found.setdefault(f"{dotted}.{name}", attr)
    return found


def _refuses(obj: object) -> bool:
    """Whether `obj` is a mapping method that only raises (ParamDict is immutable)."""
    return getattr(obj, "__annotations__", {}).get("return") in ("NoReturn",)


def _fields(cls: type) -> set[str]:
    """Return the names `cls`'s docstring documents as arguments or fields.

    Those are the rows of its `Args:` or `Attributes:` section and the names it
    quotes in backticks, plus the options of each class it names as its own
    ("`Adam`'s options").
    """
    import inspect

    from paramdict import optim

    doc = inspect.getdoc(cls) or ""
    found = set(re.findall(r"`(\w+)`", doc))
    sections = r"^(?:Args|Attributes):\n((?:(?: {4}.*)?\n)*)"
    for section in re.finditer(sections, doc, re.M):
        found.update(re.findall(r"^ {4}(\w+)(?: \(.*\))?:", section.group(1), re.M))
    for other in re.findall(r"`(\w+)`'s", doc):
        source = getattr(optim, other, None)
        if isinstance(source, type) and source is not cls:
            found |= _fields(source)
    return found


def test_every_public_name_is_in_the_reference() -> None:
    """Each public name has a `:::` entry (or a members entry) in docs/api.

    A member that a class inherits or overrides is documented once, on the base
    class whose entry renders it (the optimizers share `Optimizer`'s `step`), and
    a constructor argument or a state field is documented by its class's
    docstring (see `_fields`); either way the class itself must have an entry.
    """
    names, whole = _referenced()
    container = (ROOT / "docs" / "api" / "container.md").read_text(encoding="utf-8")
    public = _public()
    dotted = {obj: name for name, obj in public.items() if isinstance(obj, type)}

    def rendered(name: str) -> bool:
        parts = name.split(".")
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts))}
        return name in names or bool(prefixes & whole)

    def on_a_base(name: str) -> bool:
        owner_name, _, member = name.rpartition(".")
        owner = public.get(owner_name)
        if not isinstance(owner, type) or owner_name not in names:
            return False
        if any(member in _fields(klass) for klass in owner.__mro__):
            return True
        return any(
            base in dotted and rendered(f"{dotted[base]}.{member}")
            for base in owner.__mro__[1:]
        )

    def covered(name: str, obj: object) -> bool:
        if rendered(name) or on_a_base(name):
            return True
        return _refuses(obj) and f"`{name.rpartition('.')[2]}`" in container

    missing = sorted(name for name, obj in public.items() if not covered(name, obj))
    assert not missing, f"not in the API reference: {missing}"


def _sections_missing(obj: object) -> list[str]:
    """Return the docstring parts the reference needs that `obj` lacks."""
    import inspect

    fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod)) else obj
    if not (inspect.isfunction(fn) or inspect.isclass(fn)) or _refuses(fn):
        return []  # aliases and constants carry an attribute docstring instead
    doc = inspect.getdoc(fn) or ""
    missing = [] if doc.strip() else ["a summary"]
    signature = inspect.signature(fn)
    documented = "Args:" in doc or (inspect.isclass(fn) and "Attributes:" in doc)
    if [p for p in signature.parameters if p not in ("self", "cls")] and not documented:
        missing.append("Args")
    returns = signature.return_annotation
    if (
        not inspect.isclass(fn)
        and returns not in (None, "None", inspect.Signature.empty)
        and "Returns:" not in doc
        and "Yields:" not in doc
    ):
        missing.append("Returns")
    if "Example:" not in doc and "Examples:" not in doc:
        missing.append("Example")
    return missing


def _documented_elsewhere(name: str, obj: object, public: dict[str, object]) -> bool:
    """Whether `obj`'s reference is written once, elsewhere, as the docs say.

    - A kernel operation is a row of `KernelVocabulary`'s table.
    - A method overriding a hook that a base class documents in full (an
      optimizer's `init_state`, `update`) is documented there.
    - A protocol's reference is its table of methods.
    - A class whose docstring names another documented class's options or fields
      as its own (AdamW's are "`Adam`'s") is documented by that class.
    """
    import inspect

    owner_name, _, member = name.rpartition(".")
    owner = public.get(owner_name)
    if (
        isinstance(owner, type)
        and member
        and any(
            member in vars(base)
            and base.__module__.startswith("paramdict")
            and not _sections_missing(vars(base)[member])
            for base in owner.__mro__[1:]
        )
    ):
        return True
    if getattr(obj, "_is_protocol", False):
        return True  # a protocol is a table of methods: it takes no arguments
    doc = inspect.getdoc(obj) or "" if inspect.isclass(obj) else ""
    return any(
        f"`{other.rpartition('.')[2]}`'s" in doc
        and inspect.isclass(target)
        and "Attributes:" in (inspect.getdoc(target) or "")
        for other, target in public.items()
    )


def test_public_docstrings_have_the_reference_sections() -> None:
    """Each public function and class documents its arguments, result and an example."""
    public = _public()
    gaps = {
        name: missing
        for name, obj in public.items()
        if (missing := _sections_missing(obj))
        and not _documented_elsewhere(name, obj, public)
    }
    assert not gaps, f"docstrings lacking sections: {gaps}"


def _title(page: Path) -> str:
    """Return the page's `# ` title, following a snippet include to its file."""
    text = page.read_text(encoding="utf-8")
    included = re.fullmatch(r'--8<-- "([^":]+)"\s*', text)
    if included:
        text = (ROOT / included.group(1)).read_text(encoding="utf-8")
    found = re.search(r"^# (.+)$", text, re.M)
    assert found is not None, f"{page} has no `# ` title"
    return found.group(1).strip()


def test_nav_titles_are_the_page_titles() -> None:
    """Each page is named in the navigation as it names itself.

    The home page is `Home` in the navigation; its title is the project's name.
    """
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.findall(r"^\s+- (?:\"(.+)\"|(.+)): (\S+\.md)$", config, re.M)
    assert len(nav) > 20  # the pattern still reads the navigation
    differ = {
        path: (quoted or plain, _title(ROOT / "docs" / path))
        for quoted, plain, path in nav
        if path != "index.md" and (quoted or plain) != _title(ROOT / "docs" / path)
    }
    assert not differ, f"navigation title vs page title: {differ}"
