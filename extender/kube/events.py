"""Posting core/v1 Events about objects, from a background task.

``record`` never blocks and never raises: events are best effort. An identical (object, reason,
message) seen again within the window is folded into the earlier Event (count and lastTimestamp)
instead of creating a new one. A few posts run at once, so a slow API server (each post waiting for its
answer) does not fill the queue; when it is full anyway, events are dropped and counted, with one log line
per ``DROP_REPORT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from extender.common.tasks import cancel_and_wait
from extender.kube.aio import AsyncKube
from extender.kube.client import api_call, error_message, not_found, request_json
from extender.kube.resources import EVENTS, collection_path, object_path

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024
POSTERS = 4  # events posted at once
DROP_REPORT_SECONDS = 10.0


@dataclass
class _Posted:
    name: str
    namespace: str
    count: int
    first: str
    last_sent: float


EventKey = tuple[str, str, str, str, str]


class EventRecorder:
    def __init__(self, api_client: client.ApiClient, component: str, *, window: float = 60.0,
                 max_queued: int = 1000, clock: Callable[[], float] = time.monotonic,
                 kube: AsyncKube | None = None) -> None:
        self.api_client = api_client
        self.kube = kube  # when given, events go out on the event loop instead of the thread pool
        self.component = component
        self.window = window
        self._clock = clock
        self._queue: asyncio.Queue[tuple[dict[str, Any], str, str, str]] = asyncio.Queue(max_queued)
        # oldest post first, so the ones past the window are found at the front
        self._posted: OrderedDict[EventKey, _Posted] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._posting: dict[EventKey, asyncio.Event] = {}
        self._instance = (os.environ.get("POD_NAME") or socket.gethostname())[:128]
        self.dropped = 0
        self._dropped_unreported = 0
        self._drop_reported_at = float("-inf")

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        try:
            self._queue.put_nowait((obj, reason, message[:MAX_MESSAGE], type_))
        except asyncio.QueueFull:
            self._count_drop(reason)
        except Exception:
            log.exception("event dropped")

    def _count_drop(self, reason: str) -> None:
        self.dropped += 1
        self._dropped_unreported += 1
        now = self._clock()
        if now - self._drop_reported_at >= DROP_REPORT_SECONDS:
            log.warning("events dropped: queue full", extra={
                "reason": reason, "dropped": self._dropped_unreported, "dropped_total": self.dropped})
            self._drop_reported_at = now
            self._dropped_unreported = 0

    async def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._drain(), name=f"events-{self.component}-{i}")
                           for i in range(POSTERS)]

    async def stop(self, flush_timeout: float = 2.0) -> None:
        """Post what is queued (up to ``flush_timeout``), then stop."""
        if not self._tasks:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._queue.join(), flush_timeout)
        await cancel_and_wait(self._tasks)
        self._tasks = []

    async def _drain(self) -> None:
        while True:
            obj, reason, message, type_ = await self._queue.get()
            try:
                await self._post(obj, reason, message, type_)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("event not posted", extra={"reason": reason, "error": error_message(exc)})
            finally:
                self._queue.task_done()

    async def _post(self, obj: dict[str, Any], reason: str, message: str, type_: str) -> None:
        involved = involved_object(obj)
        key: EventKey = (involved.get("uid", ""), involved["kind"], involved["name"], reason, message)
        # the same event twice at once: the second waits for the first, then folds into it
        while (posting := self._posting.get(key)) is not None:
            await posting.wait()
        self._posting[key] = done = asyncio.Event()
        try:
            await self._post_once(key, involved, reason, message, type_)
        finally:
            del self._posting[key]
            done.set()

    async def _post_once(self, key: EventKey, involved: dict[str, str], reason: str, message: str,
                         type_: str) -> None:
        now = self._clock()
        self._forget_older_than(now - self.window)
        stamp = _timestamp()
        earlier = self._posted.get(key)
        if earlier is not None:
            earlier.count += 1
            earlier.last_sent = now
            self._posted.move_to_end(key)
            patch = {"count": earlier.count, "lastTimestamp": stamp}
            try:
                await self._request("PATCH", object_path(EVENTS, earlier.name, earlier.namespace), patch,
                                    "application/merge-patch+json")
                return
            except Exception as exc:
                if not not_found(exc):
                    raise
        body = self.event_body(involved, reason, message, type_, stamp)
        namespace = body["metadata"]["namespace"]
        await self._request("POST", collection_path(EVENTS, namespace), body)
        self._posted[key] = _Posted(body["metadata"]["name"], namespace, 1, stamp, now)

    async def _request(self, method: str, path: str, body: Any,
                       content_type: str = "application/json") -> None:
        if self.kube is not None:
            await self.kube.request(method, path, body=body, content_type=content_type)
        else:
            await api_call(request_json, self.api_client, method, path, body=body, content_type=content_type)

    def event_body(self, involved: dict[str, str], reason: str, message: str, type_: str,
                   stamp: str) -> dict[str, Any]:
        namespace = involved.get("namespace") or "default"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self._instance,
        }

    def _forget_older_than(self, horizon: float) -> None:
        posted = self._posted
        while posted:
            key, oldest = next(iter(posted.items()))
            if oldest.last_sent >= horizon:
                return
            del posted[key]


def involved_object(obj: dict[str, Any]) -> dict[str, str]:
    metadata = obj.get("metadata") or {}
    involved = {
        "apiVersion": str(obj.get("apiVersion") or "v1"),
        "kind": str(obj.get("kind") or "Pod"),
        "name": str(metadata.get("name", "")),
    }
    for field, source in (("namespace", "namespace"), ("uid", "uid"), ("resourceVersion", "resourceVersion")):
        if metadata.get(source):
            involved[field] = str(metadata[source])
    return involved


def _timestamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
