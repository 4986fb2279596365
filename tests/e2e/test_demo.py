"""`make demo ONCE=1`: the demo places every sample pod where its placement mode says (the burst pool's on
nodes the real Karpenter launched for the expander), and exits 0, leaving no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harness as cpl

pytestmark = pytest.mark.e2e

# The demo starts a whole control plane, Karpenter included, and grows a pool from zero: a few minutes on
# an idle machine, many more at a load average of 20. Its bound sits under the test's own timeout, so the
# test (not pytest-timeout, which would SIGKILL the demo before it stops its children) ends a late demo.
DEMO_BOUND = 1200
STOP_BOUND = 60  # for the demo to stop its children after SIGTERM


def holding_files_under(directory: Path) -> set[int]:
    """Processes (other than this one) with a file under ``directory`` open: every process the demo
    starts logs to a file in its workdir."""
    prefix = f"{directory}/"
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir()):
                found.add(int(entry.name))
    return found


def kill_leftovers(directory: Path) -> set[int]:
    """SIGKILL the process group of every process still holding a file under ``directory``."""
    left = holding_files_under(directory)
    for pid in left:
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group == os.getpgrp():
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
    return left


def stop_demo(proc: subprocess.Popen[str], workdir: Path) -> None:
    """SIGTERM the demo's process group (the demo then stops each child's own group), SIGKILL what is left
    after STOP_BOUND, then any child whose group outlived the demo."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=STOP_BOUND)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    kill_leftovers(workdir)


@pytest.mark.timeout(DEMO_BOUND + STOP_BOUND + 120)
def test_demo_once_places_every_sample_pod_as_expected(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo", "--once", "--workdir", str(tmp_path)],
        cwd=cpl.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: a late demo is stopped as a whole
    )
    try:
        stdout, stderr = proc.communicate(timeout=DEMO_BOUND)
    except BaseException:  # late, or the test itself interrupted
        stop_demo(proc, tmp_path)
        raise
    left = kill_leftovers(tmp_path)
    assert proc.returncode == 0, stdout[-4000:] + stderr[-4000:]
    assert not left, f"the demo exited leaving processes {sorted(left)} running"
    assert "every sample pod was placed as expected" in stdout
    assert 'tensor-fusion.ai/tflops-request="lots"' in stdout  # the webhook's denial is shown
    assert "1200 TFLOPS exceeds the largest GPU here (989 TFLOPS)" in stdout  # the Pending reason
    # pool burst grew from zero through the real Karpenter: two nodes, both the expander's claims
    assert "Karpenter launched 2 NodeClaims in NodePool burst-a100, 2 of them created by the expander" \
        in stdout
