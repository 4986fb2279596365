"""Frequent log lines, batched (the webhook's admission lines): written at once outside an event loop, else
waiting briefly and going out in one write, at once when the batch is full, each with the time of its
admission. The served webhook's lines are tested in tests/unit/webhook/test_server.py."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from extender.common.batched_log import FLUSH_AFTER, MAX_PENDING, BatchedLog, render_members


def test_lines_written_outside_an_event_loop_go_out_at_once() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.admission")
    logger.setLevel(logging.INFO)
    BatchedLog(logger, stream).write(logging.INFO, "admission", {"uid": "x"})
    assert json.loads(stream.getvalue())["uid"] == "x"


class CountingStream(io.StringIO):
    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


async def test_lines_wait_briefly_and_go_out_in_one_write() -> None:
    stream = CountingStream()
    logger = logging.getLogger("test.admission.batch")
    logger.setLevel(logging.INFO)
    admission = BatchedLog(logger, stream)
    for uid in ("a", "b", "c"):
        admission.write(logging.INFO, "admission", {"uid": uid})
    assert stream.getvalue() == ""
    for _ in range(200):  # polled: the write is due FLUSH_AFTER seconds after the first line
        if stream.getvalue():
            break
        await asyncio.sleep(FLUSH_AFTER)
    assert [json.loads(line)["uid"] for line in stream.getvalue().splitlines()] == ["a", "b", "c"]
    assert stream.writes == 1


async def test_a_full_batch_is_written_at_once() -> None:
    stream = CountingStream()
    logger = logging.getLogger("test.admission.full")
    logger.setLevel(logging.INFO)
    admission = BatchedLog(logger, stream)
    for n in range(MAX_PENDING):
        admission.write(logging.INFO, "admission", {"n": n})
    assert len(stream.getvalue().splitlines()) == MAX_PENDING and stream.writes == 1


async def test_a_line_carries_the_time_of_its_admission_not_of_its_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.admission.time")
    logger.setLevel(logging.INFO)
    admission = BatchedLog(logger, stream)
    now = [1_700_000_000.25]
    monkeypatch.setattr("extender.common.batched_log.time.time", lambda: now[0])
    admission.write(logging.INFO, "admission", {"uid": "a"})  # waits for its batch
    now[0] += 9.5
    admission.flush()
    line = json.loads(stream.getvalue())
    assert (line["uid"], line["ts"]) == ("a", "2023-11-14T22:13:20.250+00:00")




@pytest.mark.parametrize("fields", [
    {"uid": "0f4f-1", "operation": "CREATE", "namespace": "team-a", "pod": "infer-", "outcome": "mutated",
     "reason": None, "detail": None, "duration_ms": 0.412},
    {"pod": "ünïcode-pod", "detail": 'quotes " and \\ and \n', "n": 3, "ok": True, "nested": {"a": [1, 2]}},
    {"detail": "a lone surrogate \ud800 (the standard library encodes it)"},
    {},
])
def test_rendered_members_write_the_same_line_as_the_fields(fields: dict[str, object],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger("test.admission.members")
    logger.setLevel(logging.INFO)
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.25)
    as_dict, as_members = io.StringIO(), io.StringIO()
    BatchedLog(logger, as_dict).write(logging.INFO, "admission", dict(fields))
    BatchedLog(logger, as_members).write_members(logging.INFO, "admission", render_members(fields))
    assert json.loads(as_members.getvalue()) == json.loads(as_dict.getvalue())
    if "surrogate" not in str(fields):  # orjson's bytes, the same ones (the standard library spaces them)
        assert as_members.getvalue() == as_dict.getvalue()
