"""The README is a path for users and the documents beside it stay true to the repository.

- README.md is under 12 KB and names no module path: it says what to run, the docs say where code lives.
- Every relative link in README.md, docs/ and bench/README.md reaches a file, and every #anchor a heading of
  that file (GitHub's heading slugs).
- Every repository path written in code font in the hand-written documents exists, and every module named
  for ``python -m`` or in bench/README.md imports from a file that defines the name.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.fixtures import ROOT
from tests.unit.fixtures.markdown import FENCE, HEADING, anchors, prose, slug

README = ROOT / "README.md"
README_LIMIT = 12_288
DOCS = ROOT / "docs"
BENCH_README = ROOT / "bench" / "README.md"
# Generated from the argument parser and the metric registries by their own tool; until that tool's output is
# in the tree (the whole folder absent), links to these two are the only ones allowed to dangle.
GENERATED = (DOCS / "reference" / "flags.md", DOCS / "reference" / "metrics.md")
# The design document is kept by the layout work, which rewrites its module table; its links are checked
# here, its code-font paths once that table follows the layout.
NOT_PATH_CHECKED: tuple[Path, ...] = ()

TOP_LEVEL = ("extender", "webhook", "certs", "tests", "bench", "manifests", "charts", "docs")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
REPO_PATH = re.compile(rf"^(?:{'|'.join(TOP_LEVEL)})/[\w./-]*$")
MODULE = re.compile(r"(?<![\w./-])((?:extender|webhook|certs|bench)(?:\.[A-Za-z_]\w*)+)")
RUN_MODULE = re.compile(r"python3? -m ((?:extender|webhook|certs|bench|tests)(?:\.\w+)+)")
# What a module path looks like in prose: a folder of Python code, a .py file, a dotted import.
README_MODULE_PATH = re.compile(
    r"(?<![\w-])(?:extender|webhook|certs|tests)/|\.py\b|(?<![\w./-])(?:extender|webhook|certs|bench|tests)\.[a-z_]")


def documents() -> list[Path]:
    return [README, BENCH_README, *sorted(DOCS.rglob("*.md"))]


def hand_written() -> list[Path]:
    return [p for p in documents() if p not in GENERATED and p not in NOT_PATH_CHECKED]


def code(text: str) -> Iterator[str]:
    """Code spans of the prose, then the lines of fenced code blocks."""
    for line in prose(text):
        yield from (match.group(2).strip() for match in CODE_SPAN.finditer(line))
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif fenced:
            yield line


def links(path: Path) -> Iterator[str]:
    for line in prose(path.read_text()):
        yield from LINK.findall(CODE_SPAN.sub("", line))


def broken_links(path: Path) -> list[str]:
    broken = []
    pending = not (DOCS / "reference").exists()
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        if pending and destination in GENERATED:
            continue
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    return broken


def defines(module_file: Path, name: str) -> bool:
    tree = ast.parse(module_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
                (alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
            return True
    return False


def module_problem(dotted: str) -> str | None:
    """None when ``dotted`` is a module of the repository, or a name defined at the top of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not module.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return None
        if defines(module, rest[0]):
            return None
        return f"{dotted}: {module.relative_to(ROOT)} defines no {rest[0]}"
    return f"{dotted}: no such module"


def test_the_readme_is_under_12_kb():
    size = len(README.read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes; move reference material into docs/"


def test_the_readme_names_no_module_path():
    found = [line.strip() for line in README.read_text().splitlines() if README_MODULE_PATH.search(line)]
    assert not found, f"README.md names module paths (they belong in docs/): {found}"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path):
    assert not broken_links(path), f"{path.relative_to(ROOT)}: {broken_links(path)}"


@pytest.mark.parametrize("path", hand_written(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_in_code_font_exists(path: Path):
    missing = sorted({span for span in code(path.read_text())
                      if REPO_PATH.match(span) and not (ROOT / span).exists()})
    assert not missing, f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("path", hand_written(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_named_exists(path: Path):
    text = "\n".join(code(path.read_text()))
    named = set(RUN_MODULE.findall(text))
    if path == BENCH_README:
        named |= set(MODULE.findall(text))
    problems = sorted(filter(None, map(module_problem, named)))
    assert not problems, f"{path.relative_to(ROOT)}: {problems}"


def test_the_generated_references_are_in_the_tree():
    if not (DOCS / "reference").exists():
        pytest.skip("docs/reference/ is generated by the reference tool, which has not run in this tree")
    missing = [str(p.relative_to(ROOT)) for p in GENERATED if not p.exists()]
    assert not missing, f"the README links to generated references that are missing: {missing}"


@pytest.mark.parametrize(("heading", "anchor"), [
    ("## The webhook's certificate", "the-webhooks-certificate"),
    ("## One screen: `tf-extender status`", "one-screen-tf-extender-status"),
    ("### 1. Scale from zero: node-group template hints", "1-scale-from-zero-node-group-template-hints"),
])
def test_slugs_follow_github(heading: str, anchor: str):
    assert slug(HEADING.match(heading).group(2)) == anchor  # type: ignore[union-attr]
