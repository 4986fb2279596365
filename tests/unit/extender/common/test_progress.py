"""The offline tools' progress lines on stderr: none for a quick run, the step and count for a slow one."""

from __future__ import annotations

import io
import time

import pytest

from extender.common.progress import Progress


def test_a_quick_run_prints_nothing() -> None:
    stream = io.StringIO()
    with Progress("tool", stream, delay=5) as progress:
        progress.begin("placing pods", 3)
        progress.done = 3
    assert stream.getvalue() == ""


def test_a_slow_run_prints_its_step_and_count_then_the_total() -> None:
    stream = io.StringIO()
    with Progress("tool", stream, delay=0.05, every=0.05) as progress:
        progress.begin("placing pods", 10)
        progress.done = 4
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("tool: placing pods 4/10 (")
    assert lines[-1].startswith("tool: done in ")


def test_a_failed_run_prints_no_total() -> None:
    stream = io.StringIO()
    with pytest.raises(RuntimeError), Progress("tool", stream, delay=0.01, every=0.01):
        time.sleep(0.1)
        raise RuntimeError("x")
    assert "done in" not in stream.getvalue()

