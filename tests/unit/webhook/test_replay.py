"""Replayed answers (reviews that repeat but for request.uid) are byte for byte the answers the webhook
decides afresh, whatever the uid, the pod or the context; what could change the decision is a miss."""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
from collections.abc import Hashable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.common.batched_log import BatchedLog
from tests.unit.fixtures.webhook import NS, OBJECTS, REPLICASET, pod, review, tf, view
from webhook import server
from webhook.admission import Outcome
from webhook.index import IndexAllocator
from webhook.memo import MutationCache
from webhook.replay import ReviewReplay
from webhook.server import WebhookService, handle_mutate
from webhook.view import ClusterView, KubeObject


class Body:
    """What handle_mutate reads of an aiohttp request: its headers, its body, and whether the body is all in
    (a replayed answer skips the deadline only then)."""

    def __init__(self, body: bytes, complete: bool = True) -> None:
        self.headers: dict[str, str] = {}
        self._body = body
        self.content = self
        self.complete = complete

    def is_eof(self) -> bool:
        return self.complete

    async def read(self) -> bytes:
        return self._body


class Context:
    def __init__(self) -> None:
        self.generation = 0
        self.do_not_disrupt = False
        self.owner_tokens: dict[Hashable, object] = {}


# the same ReplicaSet under another Deployment: the workload label differs
REPARENTED = {**REPLICASET, "metadata": {**REPLICASET["metadata"], "ownerReferences": [
    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "other", "controller": True}]}}


def service(context: Context, replay: ReviewReplay | None, indexes: int = 128) -> WebhookService:
    async def view_for(_pod: KubeObject, _namespace: str) -> ClusterView:
        return view(*OBJECTS, REPLICASET if context.generation % 2 == 0 else REPARENTED)

    return WebhookService(view_for, lambda: True, scheduler_name="gpu-sched",
                          allocator=IndexAllocator(size=indexes),
                          mutation_cache=MutationCache(), generation=lambda: context.generation,
                          do_not_disrupt=lambda: context.do_not_disrupt, replay=replay,
                          owner_token=lambda owner: context.owner_tokens.get(owner))


async def answer(svc: WebhookService, body: bytes, complete: bool = True) -> bytes:
    response = await handle_mutate(svc, 1 << 20, Body(body, complete))  # type: ignore[arg-type]
    assert response.body is not None
    return bytes(response.body)  # type: ignore[arg-type]


def encoded(obj: Any, uid: str, **fields: Any) -> bytes:
    return orjson.dumps(review(obj, uid=uid, **fields))


def owned(p: dict[str, Any]) -> dict[str, Any]:
    p = copy.deepcopy(p)
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                                        "uid": "rs-uid", "controller": True}]
    return p


PODS = {
    "fractional": pod(tf(tflops_request="1")),
    "owned by a ReplicaSet": owned(pod(tf(tflops_request="1"))),
    "denied": pod(tf(tflops_request="1", qos="urgent")),
    "not opted in": {**pod(), "metadata": {"name": "plain", "labels": {}}},
}


def uid(n: int) -> str:
    return f"0f4f9b0e-6d1c-4e59-9d42-{n:012d}"


def both(context: Context, indexes: int = 128) -> tuple[WebhookService, WebhookService, ReviewReplay]:
    replay = ReviewReplay()
    return service(context, replay, indexes), service(context, None, indexes), replay


@pytest.mark.parametrize("complete", [True, False], ids=["body all in", "body still arriving"])
def test_replayed_answers_are_the_decided_answers_byte_for_byte(complete: bool) -> None:
    async def run() -> None:
        context = Context()
        with_replay, without, replay = both(context)
        for name, p in PODS.items():
            for n in range(300):  # more than the 128 pod indexes
                body = encoded(p, uid(n))
                assert await answer(with_replay, body, complete) == await answer(without, body), (name, n)
            for operation in ("UPDATE", "DELETE"):
                body = encoded(p, uid(1), operation=operation)
                assert await answer(with_replay, body) == await answer(without, body), (name, operation)
        assert replay.hits > 4 * 150
    asyncio.run(run())


def test_a_replayed_answer_logs_the_line_of_a_decided_one(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Outcome, reason, detail, pod and namespace as the decision logged them: only ts and duration differ."""
    stream = io.StringIO()
    monkeypatch.setattr(server, "admission_log", BatchedLog(server.log, stream))
    caplog.set_level(logging.DEBUG, logger=server.log.name)  # the skipped pod's line too

    async def run() -> None:
        context = Context()
        with_replay, without, replay = both(context, indexes=1)
        for p in PODS.values():
            for n in range(4):
                body = encoded(p, uid(n))
                await answer(with_replay, body)
                await answer(without, body)
        assert replay.hits == 4 * 2
    asyncio.run(run())
    server.admission_log.flush()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(lines) == 4 * 4 * 2 and {line["outcome"] for line in lines} == {"mutated", "denied", "skipped"}
    for replayed, decided in zip(lines[::2], lines[1::2], strict=True):
        for line in (replayed, decided):
            assert isinstance(line["duration_ms"], float) and 0 <= line["duration_ms"] < 10_000
            del line["ts"], line["duration_ms"]
        assert replayed == decided


def test_a_changed_context_is_never_answered_from_the_past() -> None:
    async def run() -> None:
        context = Context()
        with_replay, without, replay = both(context, indexes=1)  # one index: every review could replay
        p = PODS["owned by a ReplicaSet"]
        owner = (NS, "ReplicaSet", "web-7d9f")
        for n, change in enumerate(["generation", "do_not_disrupt", "owner", "none"] * 3):
            if change == "generation":
                context.generation += 1
            elif change == "do_not_disrupt":
                context.do_not_disrupt = not context.do_not_disrupt
            elif change == "owner":
                context.owner_tokens[owner] = object()
            for m in range(3):
                body = encoded(p, uid(10 * n + m))
                hits = replay.hits
                assert await answer(with_replay, body) == await answer(without, body), (change, m)
                if m == 0 and change != "none":
                    assert replay.hits == hits, f"replayed across a change of {change}"
                elif n > 0:
                    assert replay.hits == hits + 1
    asyncio.run(run())


def test_a_pod_index_not_answered_yet_is_decided() -> None:
    async def run() -> None:
        context = Context()
        with_replay, _, replay = both(context)
        bodies = [encoded(PODS["fractional"], uid(n)) for n in range(130)]
        answers = [json.loads(await answer(with_replay, body)) for body in bodies]
        patches = [a["response"]["patch"] for a in answers]
        assert patches[0] == patches[128] and patches[1] == patches[129]  # index 1 and 2 again
        assert len(set(patches[:128])) == 128  # each index its own patch
        # remembered on its second sighting (index 2), so index 2 again is replayed and index 1 decided
        assert replay.hits == 1
    asyncio.run(run())


uids = st.one_of(st.text(min_size=1, max_size=40),
                 st.text(alphabet="abcdef0123456789-", min_size=1, max_size=40))


@settings(max_examples=150, deadline=None)
@given(first=uids, second=uids, label=st.one_of(st.none(), uids), flip=st.integers(min_value=0))
def test_any_uid_and_any_difference_answer_as_decided(first: str, second: str, label: str | None,
                                                      flip: int) -> None:
    p = copy.deepcopy(PODS["fractional"])
    if label is not None:  # a label that may hold the uid itself
        p["metadata"]["labels"]["echo"] = label

    async def run() -> None:
        context = Context()
        with_replay, without, _ = both(context)
        bodies = [encoded(p, first), encoded(p, second), encoded(p, first)]
        changed = bytearray(bodies[1])
        at = flip % len(changed)
        changed[at] = (changed[at] + 1) % 128  # any one byte changed: malformed, another pod, another uid
        bodies.append(bytes(changed))
        for body in bodies:
            assert await answer(with_replay, body) == await answer(without, body)
    asyncio.run(run())


def keep(replay: ReviewReplay, body: bytes, uid_: str) -> bool:
    """``remember`` an answer carrying ``uid_``, with no owner, one context and no index."""
    return replay.remember(body, uid_, json.dumps({"uid": uid_}).encode(), owner=None, context=0, index=None,
                           outcome=Outcome.MUTATED, reason=None)


def test_only_the_request_uid_slot_is_replayed() -> None:
    replay = ReviewReplay()
    p = PODS["fractional"]
    plain = encoded(p, "abc-1")
    kept = [keep(replay, plain, "abc-1") for _ in range(2)]
    assert kept == [False, True]  # noted on its first sighting, kept on its second
    # the uid twice (here also a label), given with escapes, or with characters JSON could escape: not kept
    twice = encoded({**p, "metadata": {**p["metadata"], "labels": {"echo": "abc-2"}}}, "abc-2")
    escaped = plain.replace(b'"uid":"abc-1"', b'"uid":"\\u0061bc-3"')
    escaped = escaped.replace(b'"name":"', b'"name":"abc-3', 1)
    quoted = encoded(p, 'a"b')
    for body, uid_ in ((twice, "abc-2"), (escaped, "abc-3"), (quoted, 'a"b')):
        for _ in range(2):  # seen twice: checked, and refused
            assert not keep(replay, body, uid_)
    assert len(replay) == 1
    replayed = replay.answer(encoded(p, "xyz-9"), lambda owner: 0, lambda: 1)
    assert replayed is not None and replayed.answer == b'{"uid": "xyz-9"}'
    # another length is another layout, not kept
    assert replay.answer(encoded(p, "xy\\z-9"), lambda owner: 0, lambda: 1) is None


def test_memory_stays_within_the_byte_budget() -> None:
    replay = ReviewReplay(budget_bytes=20_000)
    for n in range(200):
        p = pod(tf(tflops_request=str(n + 1)))
        body = encoded(p, uid(n))
        for _ in range(2):
            keep(replay, body, uid(n))
    assert 0 < len(replay) < 200
    assert replay._bytes <= 20_000


def test_reviews_seen_once_are_only_noted() -> None:
    replay = ReviewReplay()
    for n in range(10_000):  # pods that never repeat (their names differ)
        p = {**PODS["fractional"], "metadata": {**PODS["fractional"]["metadata"], "name": f"web-{n}"}}
        assert not keep(replay, encoded(p, uid(n)), uid(n))
    assert len(replay) == 0 and len(replay._seen_once) <= 4096


def test_metrics_count_replayed_answers() -> None:
    async def run() -> None:
        context = Context()
        with_replay, _, replay = both(context, indexes=1)
        with_replay.metrics.track_replay(replay)
        for n in range(5):
            await answer(with_replay, encoded(PODS["fractional"], uid(n)))
        text = with_replay.metrics.exposition().decode()
        # noted, remembered, then three replays
        assert "tf_webhook_replayed_answers_total 3.0" in text and "tf_webhook_replay_entries 1.0" in text
    asyncio.run(run())


def test_an_answer_remembered_without_log_fields_still_logs_a_json_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(server, "admission_log", BatchedLog(server.log, stream))
    caplog.set_level(logging.INFO, logger=server.log.name)
    replay = ReviewReplay()
    svc = service(Context(), replay)
    body = encoded(PODS["fractional"], uid(1))
    for sighting in range(2):  # kept on its second sighting, with no note
        kept = replay.remember(body, uid(1), json.dumps({"uid": uid(1)}).encode(), owner=None,
                               context=svc.replay_context(None), index=None, outcome=Outcome.MUTATED,
                               reason=None)
        assert kept == (sighting == 1)

    async def run() -> None:
        await answer(svc, encoded(PODS["fractional"], uid(2)))
    asyncio.run(run())
    server.admission_log.flush()
    line = json.loads(stream.getvalue())
    assert line["uid"] == uid(2) and line["duration_ms"] >= 0 and replay.hits == 1
