"""The e2e harness under a parallel run: ports never handed to two live processes, a unit-only run that never
builds the control plane, and a module order that names only modules that exist."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.harness import processes
from tests.unit.fixtures import ROOT

# A child process that takes ports from the harness and holds them until its stdin closes.
_ALLOCATE = textwrap.dedent("""
    import sys
    from tests.harness import processes
    if len(sys.argv) > 2:  # a narrow range of its own: [start, stop)
        processes._PORTS = processes._PortAllocator(range(int(sys.argv[2]), int(sys.argv[3])),
                                                    processes.PORT_LOCK_DIR)
    print(" ".join(str(processes.free_port()) for _ in range(int(sys.argv[1]))), flush=True)
    sys.stdin.read()
""")


def _allocators(lock_dir: Path, *argvs: list[str]) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "TF_E2E_PORT_LOCK_DIR": str(lock_dir), "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen([sys.executable, "-c", _ALLOCATE, *argv], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT) for argv in argvs]


def _ports(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    return [int(p) for p in proc.stdout.readline().split()]


def _release(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        proc.communicate("", timeout=30)


def test_workers_allocating_at_once_never_get_the_same_port(tmp_path: Path) -> None:
    procs = _allocators(tmp_path, *[["60"]] * 4)
    try:
        taken = [_ports(proc) for proc in procs]
    finally:
        _release(procs)
    every = [port for ports in taken for port in ports]
    assert len(every) == 240
    assert len(set(every)) == len(every), "two processes were given the same port"
    # below the ephemeral range, where no outgoing connection of the suite takes its local port
    assert all(port in processes.PORT_RANGE for port in every)


def test_a_port_stays_reserved_while_its_process_lives_even_with_nothing_listening(tmp_path: Path) -> None:
    first = _allocators(tmp_path, ["1", "24000", "24003"])
    try:
        (held,) = _ports(first[0])  # the first process holds it; nothing listens on it
        second = _allocators(tmp_path, ["2", "24000", "24003"])
        try:
            assert held not in _ports(second[0])
        finally:
            _release(second)
    finally:
        _release(first)
    third = _allocators(tmp_path, ["3", "24000", "24003"])  # once the holder is gone, the port is free again
    try:
        assert sorted(_ports(third[0])) == [24000, 24001, 24002]
    finally:
        _release(third)


def test_a_unit_only_run_selects_no_e2e_test_and_builds_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    # no PATH: were any e2e test selected, the build (bash, go) would fail the run instead of a quiet exit 5
    env = {**os.environ, "TF_CACHE_DIR": str(cache), "PATH": ""}
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "not e2e", "-q", "-p", "no:cacheprovider",
                          "tests/e2e"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 5, run.stdout[-3000:] + run.stderr[-3000:]  # 5: every test deselected
    assert "deselected" in run.stdout
    assert not any(cache.iterdir())


def test_the_module_order_names_only_modules_that_exist() -> None:
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    for module in (*suite._SMOKE_FIRST, *suite._LONGEST_FIRST):
        assert (ROOT / module).is_file(), module
