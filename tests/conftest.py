"""Suite-wide settings shared by the unit and end-to-end tests: Hypothesis, the order modules run in, and
the slowest modules at the end of a run.

Hypothesis: one profile for the whole suite. Generated inputs here are wide (annotation maps, extender bodies)
and the CI machine is small and often busy, so timing must never decide a result: no per-example deadline, no
"input generation is slow" or "too slow" health checks, and a bounded number of examples so a run's length is
predictable. ``HYPOTHESIS_PROFILE=thorough`` runs many more examples for a local deep check.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

_NOT_ABOUT_CORRECTNESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

for _name, _examples in (("suite", 100), ("thorough", 2000)):
    settings.register_profile(
        _name,
        deadline=None,
        max_examples=_examples,
        suppress_health_check=_NOT_ABOUT_CORRECTNESS,
        print_blob=True,
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


# ------------------------------------------------------------------------------------ order and timing

# The order test modules are handed to pytest-xdist workers in (``--dist loadfile``, see LongestFirst below):
# a worker takes the next module whenever it is about to finish one, so the longest modules go first and
# the many short ones fill the gaps at the end. First of all the smoke tests of the bare control plane: they
# include one that needs nothing listening on the extender port, which holds on a worker only until its
# first test starts the real extender. A serial run keeps the same order.
_SMOKE_FIRST = ("tests/e2e/test_controlplane.py", "tests/e2e/test_manifests.py")
# Longest first, by each module's wall time in a parallel run (the "slowest modules" section of a run):
# seconds, the mean of two runs with four workers on two shared cores.
_LONGEST_FIRST = (
    "tests/e2e/test_demo.py",  # 360
    "tests/e2e/test_capacity_e2e.py",  # 274
    "tests/e2e/test_cluster_autoscaler.py",  # 223 (with TF_CLUSTER_AUTOSCALER)
    "tests/e2e/test_expansion_disruption.py",  # 184
    "tests/e2e/test_expansion.py",  # 183
    "tests/e2e/test_defrag_e2e.py",  # 116
    "tests/e2e/test_autoscale_e2e.py",  # 142 alone on a loaded machine (not yet measured in parallel)
    "tests/e2e/test_bind_load_e2e.py",  # 96
    "tests/e2e/test_operating_e2e.py",  # 75
    "tests/e2e/test_burst_e2e.py",  # 64
    "tests/e2e/test_expansion_overlay.py",  # 63
    "tests/e2e/test_helm_chart.py",  # 35
    "tests/e2e/test_autoscaler_pods.py",  # 34
)


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _rank(module: str) -> tuple[int, int]:
    if module in _SMOKE_FIRST:
        return 0, _SMOKE_FIRST.index(module)
    if module in _LONGEST_FIRST:
        return 1, _LONGEST_FIRST.index(module)
    return (2, 0) if module.startswith("tests/e2e/") else (3, 0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(_module_of(item.nodeid)))  # stable: each module's own order is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` handing out whole modules in collection order, each when a worker is about to
    run out (xdist's own loadfile sends each worker two modules ahead, so a long module could wait behind
    another long one while a worker idles)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):  # type: ignore[misc]
        def _reschedule(self, node: Any) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            assigned = self.assigned_work.get(node, {})
            pending = [(scope, nodeid) for scope, unit in assigned.items()
                       for nodeid, done in unit.items() if not done]
            if len(pending) > 1:
                return
            # A worker starts a test only once it holds the next one (pytest tears a module down knowing
            # which test comes after), so its one pending test waits for what is sent now. When that test is
            # a whole module (the demo, say), send the shortest module left, so nothing long waits behind it.
            whole = bool(pending) and len(assigned[pending[0][0]]) == 1
            scope, unit = self.workqueue.popitem(last=whole)
            assigned = self.assigned_work.setdefault(node, {})
            assigned[scope] = unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in unit.items() if not done])

    return LongestFirst(config, log)


_SLOWEST_SHOWN = 25


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The slowest test modules: setup, call and teardown of their tests added up, with the worker that ran
    them, so that a parallel run shows what bounds its wall time."""
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    workers: dict[str, str] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            module = _module_of(report.nodeid)
            seconds[module] += report.duration
            tests[module].add(report.nodeid)
            node = getattr(report, "node", None)
            if node is not None:
                workers[module] = str(node.gateway.id)
    if not seconds:
        return
    terminalreporter.section("slowest modules")
    for module, total in sorted(seconds.items(), key=lambda kv: -kv[1])[:_SLOWEST_SHOWN]:
        where = f"  [{workers[module]}]" if module in workers else ""
        terminalreporter.write_line(f"{total:8.1f}s  {len(tests[module]):4d} tests  {module}{where}")
