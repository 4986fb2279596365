"""Watch-fed caches of API objects (a small informer).

A cache lists its resource, then watches from the list's resourceVersion. The (paged, blocking) list
runs on a thread; the watch streams on the event loop through its own aiohttp connection, so the
store and the ``on_change`` callback are only touched on the loop thread, in order, and an event costs
no thread hand-off. When the watch is too old (410 Gone) the cache relists and emits synthetic
events for what changed meanwhile; when it breaks, it resumes after the last event it delivered.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from kubernetes import client

from extender.kube.aio import AsyncKube
from extender.kube.client import ApiException, error_message, not_found, request_json
from extender.kube.resources import Resource, collection_path

log = logging.getLogger(__name__)

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

OnChange = Callable[[str, dict[str, Any]], None]

# Lists (paged, slow on a big cluster) run on threads of their own, away from the short-call pool.
_LIST_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="kube-list")


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


class LineSplitter:
    """Splits a stream, fed in the chunks it arrives in, into its complete newline-terminated lines.

    A watch event (a whole Pod) often spans several chunks: the pieces of an unfinished line are kept
    apart and joined once, when its newline arrives, so each byte is scanned and copied once. Blank
    lines are dropped."""

    def __init__(self) -> None:
        self._pending: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` finishes, in order (often none)."""
        if b"\n" not in chunk:
            if chunk:
                self._pending.append(chunk)
            return []
        head, *lines = chunk.split(b"\n")
        if self._pending:
            self._pending.append(head)
            head = b"".join(self._pending)
            self._pending = []
        tail = lines.pop()
        if tail:
            self._pending.append(tail)
        return [line for line in (head, *lines) if line.strip()]


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
    is not installed) as empty and synced, and keep checking for it every ``absent_recheck`` seconds
    (one cheap GET), so a CRD installed after the extender started is served within seconds.
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
        absent_recheck: float = 5.0,
    ) -> None:
        self.api_client = api_client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.name = name or resource.plural
        self.optional = optional
        self.absent_recheck = absent_recheck
        self.watch_timeout = watch_timeout
        self.page_size = page_size
        self.synced = asyncio.Event()
        self._backoff = backoff or Backoff()
        self._store: dict[str, dict[str, Any]] = {}
        self._watched_to = ""  # the resourceVersion of the last event the running watch delivered
        self._listeners: builtins.list[OnChange] = []

    # -- reading -------------------------------------------------------------------------------

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[dict[str, Any]]:
        return list(self._store.values())

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never returns otherwise; errors are retried."""
        loop = asyncio.get_running_loop()
        kube = AsyncKube(self.api_client.configuration, pool_size=1)  # the watch's own connection
        version: str | None = None
        try:
            while True:
                try:
                    if version is None:
                        items, listed = await loop.run_in_executor(_LIST_EXECUTOR, self._list_blocking)
                        self.replace(items)
                        self._backoff.reset()
                        version = listed
                    self._watched_to = version
                    await self._watch(kube, version)
                    self._backoff.reset()
                except Gone as exc:
                    log.info("watch expired, relisting", extra={"cache": self.name, "detail": str(exc)})
                    version = None
                    continue
                except Exception as exc:
                    if version is None and self.optional and not_found(exc):
                        self.replace([])
                        await asyncio.sleep(self.absent_recheck)
                        continue
                    delay = self._backoff.next()
                    log.warning("watch failed, retrying", extra={
                        "cache": self.name, "error": error_message(exc), "retry_in_s": round(delay, 2)})
                    await asyncio.sleep(delay)
                if version is not None:
                    version = self._watched_to  # resume after the last event seen, not replay from the list
        finally:
            await kube.close()

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        """Swap in a full listing, emitting the difference; marks the cache synced."""
        for event_type, obj in relist_events(self._store, items):
            self._emit(event_type, obj)
        self.synced.set()

    def handle(self, event_type: str, obj: dict[str, Any]) -> None:
        """Apply one watch event (loop thread)."""
        self._emit(event_type, obj)

    def subscribe(self, listener: OnChange) -> None:
        """Also report every change to ``listener``, after ``on_change``: a second reader of the same
        resource shares this watch instead of opening its own."""
        self._listeners.append(listener)

    def _emit(self, event_type: str, obj: dict[str, Any]) -> None:
        if not apply_event(self._store, event_type, obj):
            return
        for listener in (self.on_change, *self._listeners):
            if listener is None:
                continue
            try:
                listener(event_type, obj)
            except Exception:
                log.exception("on_change failed", extra={"cache": self.name, "object": object_key(obj)})

    def _query(self) -> dict[str, str]:
        query: dict[str, str] = {}
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
            query: dict[str, str | int | bool] = {**self._query(), "limit": self.page_size}
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

    async def _watch(self, kube: AsyncKube, version: str) -> None:
        """Watch from ``version`` until the server ends the watch; ``_watched_to`` follows the events."""
        query = {
            **self._query(), "watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout),
        }
        lines = LineSplitter()
        try:
            async for chunk in kube.stream(self._path(), query=query, read_timeout=self.watch_timeout + 30.0):
                for line in lines.feed(chunk):
                    self._handle_line(line)
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(error_message(exc)) from exc
            raise

    def _handle_line(self, line: bytes) -> None:
        event = orjson.loads(line)
        event_type = event.get("type")
        obj = event.get("object") or {}
        if event_type == "ERROR":
            message = str(obj.get("message", ""))
            if obj.get("code") == 410 or "too old resource version" in message:
                raise Gone(message)
            raise WatchError(message or json.dumps(obj))
        self._watched_to = resource_version(obj) or self._watched_to
        if event_type in (ADDED, MODIFIED, DELETED):
            self.handle(event_type, self._with_kind(obj))



class Informers:
    """The one cache factory of a process (client-go's ``SharedInformerFactory``): every watch is made here,
    shared by whoever asks for the same resource, namespace and selectors, and run as one task each by
    whoever runs the process's loops (``caches()``)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._caches: dict[tuple[str, str, str, str, str], WatchCache] = {}

    def cache(self, resource: Resource, *, namespace: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None, optional: bool = False,
              name: str | None = None) -> WatchCache:
        """The cache of ``resource`` (in ``namespace``, narrowed by the selectors), made on first request.
        ``optional``: a resource the API server does not serve counts as empty (a CRD not installed); a
        cache any caller needs is not optional. ``name`` (its task's and log lines' name) is the first
        caller's."""
        key = (resource.group, resource.plural, namespace or "", label_selector or "", field_selector or "")
        cache = self._caches.get(key)
        if cache is None:
            cache = WatchCache(self.api_client, resource, namespace=namespace, label_selector=label_selector,
                               field_selector=field_selector, optional=optional, name=name)
            self._caches[key] = cache
        elif not optional:
            cache.optional = False
        return cache

    def caches(self) -> builtins.list[WatchCache]:
        """Every cache made so far, in the order they were first asked for."""
        return builtins.list(self._caches.values())
