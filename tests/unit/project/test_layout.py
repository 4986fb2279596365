"""The layout's import rules, read from the source with ``ast`` (every import, also inside functions and
under ``TYPE_CHECKING``).

- ``webhook/`` imports only ``extender.common`` (the shared vocabulary), ``extender.kube`` (Kubernetes I/O)
  and ``certs`` (serving TLS files and their reload), besides itself.
- ``certs/`` imports nothing of ``extender`` or ``webhook``: both import it (``serve`` and the webhook reload
  their serving certificates through it), so an import back would be a cycle, and ``tf-certs`` stays a
  small program of its own.
- ``extender/common/`` imports nothing else of the project: it is what ``tf-webhook`` shares.
- ``extender/kube/`` imports only ``extender.common``: both binaries do their Kubernetes I/O through it.
- ``extender/scheduling/`` (the pure core) imports nothing from ``extender.server``, ``extender.planning``
  or ``extender.controllers``, and never awaits (no ``async def``, ``await``, ``async for``/``with``).
- No folder imports a folder that imports it back: folders are package directories, compared with their
  siblings at every level (``extender/controllers/expansion`` beside ``extender/controllers/capacity``,
  ``extender/planning`` beside ``extender/scheduling``, ``webhook`` beside ``extender``); any cycle among
  siblings, however long, breaks the rule.
- ``tests/unit/`` mirrors the source tree: the tests of ``extender/kube/lease.py`` are in
  ``tests/unit/extender/kube/test_lease.py``; tests of the repository as a whole are in
  ``tests/unit/project/``, helpers shared between test modules in ``tests/unit/fixtures/``, and no test
  module imports another (it would collect that module's tests a second time, and tie the two together).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.fixtures import ROOT

PACKAGES = ("extender", "webhook", "certs")


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repository
    line: int
    source: str  # the importing module, dotted
    target: str  # the imported module (or package), dotted

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.target}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


MODULES = {_module_name(p) for p in _files()}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(module, is_package, node)
        for alias in node.names:
            # ``from extender.controllers import defrag`` imports the package extender.controllers.defrag
            submodule = f"{base}.{alias.name}"
            yield submodule if submodule in MODULES else base


def _project(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


@functools.cache
def imports() -> tuple[Import, ...]:
    out: list[Import] = []
    for path in _files():
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            # once per statement and module, however many of its names the statement takes
            for target in sorted(set(_targets(node, module, path.name == "__init__.py"))):
                if _project(target):
                    line = getattr(node, "lineno", 0)
                    out.append(Import(str(path.relative_to(ROOT)), line, module, target))
    return tuple(out)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _breaking(source: str, allowed: tuple[str, ...]) -> list[Import]:
    return [i for i in imports()
            if _within(i.source, source) and not any(_within(i.target, a) for a in allowed)]


def _failures(found: list[Import], rule: str) -> str:
    return "\n".join(f"{i}: {rule}" for i in found)


@pytest.mark.parametrize(("package", "allowed", "rule"), [
    ("webhook", ("webhook", "extender.common", "extender.kube", "certs"),
     "webhook/ imports only extender.common, extender.kube and certs"),
    ("certs", ("certs",), "certs/ imports nothing of extender or webhook (both import certs)"),
    ("extender.common", ("extender.common",), "extender/common/ imports nothing else of the project"),
    ("extender.kube", ("extender.common", "extender.kube"), "extender/kube/ imports only extender.common"),
    ("extender.autoscaling", ("extender.common", "extender.autoscaling"),
     "extender/autoscaling/ (the pure recommender) imports only extender.common"),
])
def test_a_package_imports_only_what_its_rule_allows(package: str, allowed: tuple[str, ...],
                                                     rule: str) -> None:
    assert not (found := _breaking(package, allowed)), _failures(found, rule)


def test_the_scheduling_core_imports_no_server_planning_or_controller() -> None:
    forbidden = ("extender.server", "extender.planning", "extender.controllers")
    found = [i for i in imports() if _within(i.source, "extender.scheduling")
             and any(_within(i.target, f) for f in forbidden)]
    assert not found, _failures(found, "extender/scheduling/ imports nothing from server/, planning/ or "
                                       "controllers/")


def test_the_scheduling_core_never_awaits() -> None:
    found = []
    for path in sorted((ROOT / "extender" / "scheduling").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} has {type(node).__name__}")
    assert not found, "\n".join(f"{f}: extender/scheduling/ has no I/O and never awaits" for f in found)


def _is_folder(module: str) -> bool:
    return (ROOT / module.replace(".", "/") / "__init__.py").is_file()


def sibling_edges() -> dict[tuple[str, str], list[Import]]:
    """(folder, sibling folder) -> the imports that make the first import the second."""
    edges: dict[tuple[str, str], list[Import]] = {}
    for found in imports():
        source, target = found.source.split("."), found.target.split(".")
        common = 0
        while common < min(len(source), len(target)) and source[common] == target[common]:
            common += 1
        if common >= min(len(source), len(target)):
            continue  # one contains the other: a package and its own parts are no siblings
        a, b = ".".join(source[: common + 1]), ".".join(target[: common + 1])
        if _is_folder(a) and _is_folder(b):
            edges.setdefault((a, b), []).append(found)
    return edges


def _cycles(edges: dict[tuple[str, str], list[Import]]) -> list[list[str]]:
    """The strongly connected groups of more than one folder (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            group.append(node)
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_folder_imports_a_folder_that_imports_it_back() -> None:
    edges = sibling_edges()
    problems = []
    for group in _cycles(edges):
        members = set(group)
        for (a, b), found in sorted(edges.items()):
            if a in members and b in members:
                more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
                problems.append(f"{found[0]}{more}: folder {a} imports {b}, and no folder imports a folder "
                                f"that imports it back (cycle among {', '.join(group)})")
    assert not problems, "\n".join(problems)


def test_the_rules_see_imports_inside_functions_and_relative_ones() -> None:
    """The reader is what the rules stand on: it must find what a lazy or relative import names."""
    tree = ast.parse("def f():\n    from .x import y\n    import extender.kube.client\n")
    found = [t for node in ast.walk(tree) for t in _targets(node, "extender.common.quantity", False)]
    assert found == ["extender.common.x", "extender.kube.client"]


def test_a_cycle_through_three_folders_is_found() -> None:
    some = Import("a.py", 1, "x.a", "x.b")
    edges = {("x.a", "x.b"): [some], ("x.b", "x.c"): [some], ("x.c", "x.a"): [some], ("x.c", "x.d"): [some]}
    assert _cycles(edges) == [["x.a", "x.b", "x.c"]]


# --- the unit tests' own layout -----------------------------------------------------------------------

UNIT = ROOT / "tests" / "unit"
UNIT_OWN = ("fixtures", "project")  # folders of tests/unit that mirror no source package


def _unit_files() -> list[Path]:
    return sorted(p for p in UNIT.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_unit_test_folder_mirrors_a_source_package() -> None:
    strays = []
    for folder in sorted({p.parent for p in _unit_files()} - {UNIT}):
        relative = folder.relative_to(UNIT)
        if relative.parts[0] in UNIT_OWN:
            continue
        if not (ROOT / relative / "__init__.py").is_file():
            strays.append(f"tests/unit/{relative}/: no source package {relative}/ to mirror")
    strays += [f"tests/unit/{p.name}: a test module belongs in the folder of the package it tests"
               for p in UNIT.glob("test_*.py")]
    assert not strays, "\n".join(strays)


def test_no_test_module_imports_another() -> None:
    found = []
    for path in _unit_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            # the suite's own modules: tests.*, unit.* (tests/ on sys.path), relative, or a bare test_x
            ours = [t for t in targets if t.startswith(("tests.", "unit.", ".", "test_"))]
            if any(part.startswith("test_") for target in ours for part in target.split(".")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports a test module: shared helpers "
                             "belong in tests/unit/fixtures/")
    assert not found, "\n".join(found)
