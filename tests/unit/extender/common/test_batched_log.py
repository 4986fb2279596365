"""The served webhook with its mutation cache and its cheap admission log: the same answers as without the
cache, and exactly one JSON line per mutation and per denial (none for untouched pods at info)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.batched_log import FLUSH_AFTER, MAX_PENDING, BatchedLog
from extender.common.logs import Timestamps
from tests.unit.fixtures.webhook import ClientFactory, ServerUnderTest, pod, post, review, static_view, tf
from webhook import server
from webhook.admission import allow, deny, encode_review
from webhook.memo import MutationCache
from webhook.server import WebhookService, create_server

REQUESTS = [
    ("a", pod(tf(tflops_request="1"))),
    ("b", pod(tf(tflops_request="1"))),  # the same workload: a cache hit, its own index
    ("c", pod(tf(tflops_request="1", qos="urgent"))),  # denied
    ("d", {**pod(), "metadata": {"name": "plain", "labels": {}}}),  # not opted in: passed untouched
    ("e", pod(tf(tflops_request="1"))),
]


async def answers(aiohttp_client: ClientFactory, cache: MutationCache | None) -> list[tuple[int, Any]]:
    service = WebhookService(static_view, lambda: True, scheduler_name="gpu-sched", mutation_cache=cache)
    client = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    return [await post(client, review(p, uid=uid)) for uid, p in REQUESTS]


async def test_cached_service_answers_exactly_as_the_uncached_one(aiohttp_client: ClientFactory) -> None:
    cache = MutationCache()
    assert await answers(aiohttp_client, cache) == await answers(aiohttp_client, None)
    assert (cache.misses, cache.hits) == (2, 2)


@pytest.mark.parametrize("level, expected", [
    (logging.INFO, [("a", "mutated"), ("b", "mutated"), ("c", "denied"), ("e", "mutated")]),
    (logging.DEBUG,
     [("a", "mutated"), ("b", "mutated"), ("c", "denied"), ("d", "skipped"), ("e", "mutated")]),
    (logging.WARNING, []),
])
async def test_one_json_line_per_mutation_and_denial(aiohttp_client: ClientFactory, level: int,
                                                     expected: list[tuple[str, str]],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(server, "admission_log", BatchedLog(server.log, stream))
    caplog.set_level(level, logger=server.log.name)
    await answers(aiohttp_client, MutationCache())
    server.admission_log.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["uid"], line["outcome"]) for line in lines] == expected
    for line in lines:
        assert {"ts", "level", "logger", "msg", "namespace", "pod", "reason", "duration_ms"} <= set(line)
        assert (line["logger"], line["msg"]) == ("webhook.server", "admission")
    denial = [line for line in lines if line["outcome"] == "denied"]
    if denial:
        assert denial[0]["reason"] == "tensor-fusion.ai/qos" and "urgent" in denial[0]["detail"]


def test_lines_written_outside_an_event_loop_go_out_at_once() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.admission")
    logger.setLevel(logging.INFO)
    BatchedLog(logger, stream).write(logging.INFO, "admission", {"uid": "x"})
    assert json.loads(stream.getvalue())["uid"] == "x"


@pytest.mark.parametrize("review", [
    allow("u-1", [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]),
    allow("u-2"),
    allow('u"3\\', [{"op": "add", "path": "/metadata/labels/a~1b", "value": "ünïcode \"q\""}]),
    deny("u-4", 'bad "value" \\ ünïcode', 403),
    {"apiVersion": "v", "response": {"uid": "x", "patch": "abc"}, "kind": "AdmissionReview"},  # not last
    {"response": {"uid": "x", "patch": 'a"b'}},
], ids=["patch", "no patch", "escapes", "denial", "response not last", "quote in patch"])
def test_encoded_reviews_are_the_same_json(review: dict[str, Any]) -> None:
    assert json.loads(encode_review(review)) == review


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


@given(st.floats(min_value=0, max_value=4_102_444_800))  # 1970 to 2100
def test_timestamps_read_as_datetime_writes_them(now: float) -> None:
    expected = dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds")
    assert Timestamps()(now) == expected
