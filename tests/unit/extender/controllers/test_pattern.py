"""The controller pattern, held on the source: every controller is a package (or module) of the registry's one
tuple and runs on the one runner, so no controller module starts a task, waits for a cache to sync, checks
leadership or loops on its own; and no module of the product grows past 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from extender.controllers import registry

ROOT = Path(__file__).resolve().parents[4]
CONTROLLERS = ROOT / "extender" / "controllers"
# The machinery every controller runs on: the runner, what a package builds from, the tuple, the Lease.
MACHINERY = {"__init__.py", "runner.py", "wiring.py", "registry.py", "leadership.py", "isolation.py"}
MAX_LINES = 600


def _controller_modules() -> list[Path]:
    return sorted(p for p in CONTROLLERS.rglob("*.py")
                  if not (p.parent == CONTROLLERS and p.name in MACHINERY))


def _offences(path: Path) -> list[str]:
    """What in ``path`` belongs to the runner: a task started, a sync waited for, leadership read, a loop."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Attribute):
            if node.attr in ("create_task", "ensure_future", "TaskGroup"):
                found.append(f"{where} starts a task ({node.attr})")
            elif node.attr == "is_leader":
                found.append(f"{where} checks leadership (is_leader)")
            elif (node.attr == "wait" and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "synced"):
                found.append(f"{where} waits for a cache to sync")
        elif isinstance(node, ast.Name) and node.id in ("leader_gated_loop", "wait_synced", "create_task"):
            found.append(f"{where} uses {node.id}")
        elif isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and node.test.value is True:
            found.append(f"{where} loops on its own (while True)")
    return found


def test_no_controller_module_starts_tasks_waits_for_sync_checks_leadership_or_loops() -> None:
    offences = [o for path in _controller_modules() for o in _offences(path)]
    assert offences == []


def test_the_rule_finds_what_it_forbids(tmp_path: Path) -> None:
    sample = tmp_path / "loop.py"
    sample.write_text(
        "import asyncio\n"
        "async def run(self):\n"
        "    await self.cache.synced.wait()\n"
        "    asyncio.create_task(self.other())\n"
        "    while True:\n"
        "        if self.leader.is_leader:\n"
        "            await leader_gated_loop()\n", encoding="utf-8")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        kinds = sorted(o.split(" ", 1)[1] for o in _offences(sample))
    finally:
        ROOT = saved
    assert kinds == ["checks leadership (is_leader)", "loops on its own (while True)",
                     "starts a task (create_task)", "uses leader_gated_loop", "waits for a cache to sync"]


def test_every_controller_package_is_in_the_registry() -> None:
    folders = {p.name for p in CONTROLLERS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in CONTROLLERS.glob("*.py") if p.name not in MACHINERY}
    listed = {getattr(package, "__name__", "").rsplit(".", 1)[-1] for package in registry.CONTROLLERS}
    assert listed == folders | modules
    names = [package.NAME for package in registry.CONTROLLERS]
    assert len(names) == len(set(names))


def test_no_module_is_over_600_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for top in ("extender", "webhook", "certs")
            for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
