"""Watch-fed caches of API objects (a small informer).

A cache lists its resource, then watches from the list's resourceVersion. The blocking list and
watch stream run on threads and hand every event to the event loop with ``call_soon_threadsafe``,
so the store and the ``on_change`` callback are only touched on the loop thread, in order. When the
watch is too old (410 Gone) the cache relists and emits synthetic events for what changed meanwhile.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from kubernetes import client

from extender.kube.client import ApiException, error_message, error_status, open_request, request_json
from extender.kube.resources import Resource, collection_path

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

OnChange = Callable[[str, dict[str, Any]], None]

# Watches hold a thread for up to a minute each; keep them away from the short-call pool.
_WATCH_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="kube-watch")


class Gone(Exception):
    """The resourceVersion is too old to watch from: relist."""


class WatchError(Exception):
    """The server ended the watch with an error event."""


def object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def apply_event(store: dict[str, dict[str, Any]], event_type: str, obj: dict[str, Any]) -> bool:
    """Apply one watch event to ``store``. False when the event changes nothing worth reporting."""
    key = object_key(obj)
    if event_type == DELETED:
        return store.pop(key, None) is not None
    if event_type in (ADDED, MODIFIED):
        store[key] = obj
        return True
    return False


def relist_events(old: Mapping[str, dict[str, Any]],
                  items: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Events that turn the ``old`` store into the freshly listed ``items``.

    Vanished objects give DELETED (with the last known object), new ones ADDED, and objects whose
    resourceVersion moved give MODIFIED. Unchanged objects give nothing.
    """
    events: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    for obj in items:
        key = object_key(obj)
        seen.add(key)
        previous = old.get(key)
        if previous is None:
            events.append((ADDED, obj))
        elif resource_version(previous) != resource_version(obj):
            events.append((MODIFIED, obj))
    events.extend((DELETED, obj) for key, obj in old.items() if key not in seen)
    return events


def line_batches(chunks: Iterable[bytes]) -> Iterator[list[bytes]]:
    """The complete newline-terminated lines each chunk of a stream finishes (a trailing partial line is
    dropped); chunks that finish none give nothing.

    A watch event (a whole Pod) often spans several chunks: the pieces of an unfinished line are kept
    apart and joined once, when its newline arrives, so each byte is scanned and copied once."""
    pending: list[bytes] = []
    for chunk in chunks:
        if b"\n" not in chunk:
            if chunk:
                pending.append(chunk)
            continue
        head, *lines = chunk.split(b"\n")
        if pending:
            pending.append(head)
            head = b"".join(pending)
            pending = []
        tail = lines.pop()
        if tail:
            pending.append(tail)
        batch = [line for line in (head, *lines) if line.strip()]
        if batch:
            yield batch


class Backoff:
    """Capped exponential backoff with jitter: base, 2*base, 4*base ... up to ``cap``, each +-jitter."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, factor: float = 2.0, jitter: float = 0.2,
                 rng: Callable[[], float] = random.random) -> None:
        self.base, self.cap, self.factor, self.jitter = base, cap, factor, jitter
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        delay = min(self.cap, self.base * self.factor ** self._attempt)
        self._attempt = min(self._attempt + 1, 64)
        return max(0.0, delay * (1 + self.jitter * (2 * self._rng() - 1)))

    def reset(self) -> None:
        self._attempt = 0


class WatchCache:
    """An in-memory, watch-fed copy of one resource collection.

    ``optional`` caches treat a resource type the API server does not serve (404, e.g. a CRD that
    is not installed) as empty and synced, and keep checking for it.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: OnChange | None = None,
        name: str | None = None,
        optional: bool = False,
        watch_timeout: int = 60,
        page_size: int = 500,
        backoff: Backoff | None = None,
    ) -> None:
        self.api_client = api_client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name or resource.plural
        self.optional = optional
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.synced = asyncio.Event()
        self._backoff = backoff or Backoff()
        self._store: dict[str, dict[str, Any]] = {}

    # -- reading -------------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[dict[str, Any]]:
        return list(self._store.values())

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never returns otherwise; errors are retried."""
        loop = asyncio.get_running_loop()
        version: str | None = None
        while True:
            try:
                if version is None:
                    items, listed = await loop.run_in_executor(_WATCH_EXECUTOR, self._list_blocking)
                    self.replace(items)
                    self._backoff.reset()
                    version = listed
                version = await self._watch(loop, version)
                self._backoff.reset()
            except asyncio.CancelledError:
                raise
            except Gone as exc:
                log.info("watch expired, relisting", extra={"cache": self.name, "detail": str(exc)})
                version = None
            except Exception as exc:
                if version is None and self.optional and error_status(exc) == 404:
                    self.replace([])
                    await asyncio.sleep(self._backoff.cap)
                    continue
                delay = self._backoff.next()
                log.warning("watch failed, retrying", extra={
                    "cache": self.name, "error": error_message(exc), "retry_in_s": round(delay, 2)})
                await asyncio.sleep(delay)

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        """Swap in a full listing, emitting the difference; marks the cache synced."""
        for event_type, obj in relist_events(self._store, items):
            self._emit(event_type, obj)
        self.synced.set()

    def handle(self, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (loop thread)."""
        self._emit(event_type, obj)

    def _emit(self, event_type: str, obj: dict[str, Any]) -> None:
        if not apply_event(self._store, event_type, obj) or self.on_change is None:
            return
        try:
            self.on_change(event_type, obj)
        except Exception:
            log.exception("on_change failed", extra={"cache": self.name, "object": object_key(obj)})

    def _query(self) -> dict[str, str | int | bool]:
        query: dict[str, str | int | bool] = {}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        if self.field_selector:
            query["fieldSelector"] = self.field_selector
        return query

    def _path(self) -> str:
        return collection_path(self.resource, self.namespace)

    def _with_kind(self, obj: dict[str, Any]) -> dict[str, Any]:
        # List items come without kind/apiVersion; watch events carry them. Keep one shape.
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        return obj

    def _list_blocking(self) -> tuple[builtins.list[dict[str, Any]], str]:
        items: builtins.list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query = self._query() | {"limit": self.page_size}
            if token:
                query["continue"] = token
            try:
                page = request_json(self.api_client, "GET", self._path(), query=query, timeout=(5.0, 60.0))
            except ApiException as exc:
                if exc.status == 410:
                    raise Gone(error_message(exc)) from exc
                raise
            items.extend(self._with_kind(item) for item in page.get("items") or [])
            metadata = page.get("metadata") or {}
            token = metadata.get("continue")
            if not token:
                return items, str(metadata.get("resourceVersion", ""))

    async def _watch(self, loop: asyncio.AbstractEventLoop, version: str) -> str:
        stop = threading.Event()
        responses: builtins.list[Any] = []

        def deliver(events: builtins.list[tuple[str, dict[str, Any]]]) -> None:
            for event_type, obj in events:
                if stop.is_set():
                    return
                self.handle(event_type, obj)

        def emit(events: builtins.list[tuple[str, dict[str, Any]]]) -> None:
            # one wake-up of the loop per chunk read, not per event: under load a chunk carries several
            if events and not stop.is_set():
                loop.call_soon_threadsafe(deliver, events)

        future = loop.run_in_executor(_WATCH_EXECUTOR, self._watch_blocking, version, emit, stop, responses)
        try:
            return await future
        except BaseException:
            # Cancelled (or failed): stop the thread now rather than at the watch timeout.
            stop.set()
            for response in responses:
                _interrupt(response)
            raise

    def _watch_blocking(self, version: str, emit: Callable[[builtins.list[tuple[str, dict[str, Any]]]], None],
                        stop: threading.Event, responses: builtins.list[Any]) -> str:
        query = self._query() | {
            "watch": True, "resourceVersion": version, "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout,
        }
        try:
            response = open_request(self.api_client, "GET", self._path(), query=query,
                                    timeout=(5.0, self.watch_timeout + 30.0))
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(error_message(exc)) from exc
            raise
        responses.append(response)
        try:
            for lines in line_batches(response.stream(amt=None, decode_content=True)):
                if stop.is_set():
                    break
                events: builtins.list[tuple[str, dict[str, Any]]] = []
                try:
                    for line in lines:
                        version = self._handle_line(line, version, events)
                finally:
                    emit(events)  # the events before an ERROR line still count
        finally:
            with contextlib.suppress(Exception):
                response.release_conn()
        return version

    def _handle_line(self, line: bytes, version: str, out: builtins.list[tuple[str, dict[str, Any]]]) -> str:
        event = orjson.loads(line)
        event_type = event.get("type")
        obj = event.get("object") or {}
        if event_type == "ERROR":
            message = str(obj.get("message", ""))
            if obj.get("code") == 410 or "too old resource version" in message:
                raise Gone(message)
            raise WatchError(message or json.dumps(obj))
        version = resource_version(obj) or version
        if event_type in (ADDED, MODIFIED, DELETED):
            out.append((event_type, self._with_kind(obj)))
        return version


def _interrupt(response: Any) -> None:
    for method in ("shutdown", "close"):
        with contextlib.suppress(Exception):
            getattr(response, method)()
