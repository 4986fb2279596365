"""Owner objects (ReplicaSets, Jobs) for the workload label, through a bounded LRU + TTL cache.

Only a miss reaches the API server, and concurrent misses for the same object share one GET. A missing
object (404) is cached too, for a shorter time, so a burst of pods from a deleted owner costs one GET.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from extender.kube.client import get_or_none
from extender.kube.resources import JOBS, REPLICASETS, object_path
from webhook.view import KubeObject
from webhook.workload import owner_to_fetch

log = logging.getLogger(__name__)

OwnerKey = tuple[str, str, str]  # namespace, kind, name
Fetcher = Callable[[str, str, str], Awaitable[KubeObject | None]]  # (namespace, kind, name) -> object

DEFAULT_MAX_ENTRIES = 4096
DEFAULT_TTL = 300.0
DEFAULT_MISSING_TTL = 10.0


class OwnerCache:
    def __init__(self, fetch: Fetcher, *, max_entries: int = DEFAULT_MAX_ENTRIES, ttl: float = DEFAULT_TTL,
                 missing_ttl: float = DEFAULT_MISSING_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._fetch = fetch
        self._max_entries = max_entries
        self._ttl = ttl
        self._missing_ttl = missing_ttl
        self._clock = clock
        self._entries: OrderedDict[OwnerKey, tuple[float, KubeObject | None]] = OrderedDict()
        self._inflight: dict[OwnerKey, asyncio.Future[KubeObject | None]] = {}
        self.fetches = 0  # API GETs made, for tests and debugging

    def __len__(self) -> int:
        return len(self._entries)

    def cached(self, namespace: str, kind: str, name: str) -> tuple[bool, KubeObject | None]:
        """``(True, object or None)`` when the cache holds an unexpired answer, else ``(False, None)``:
        what ``get`` would return without awaiting anything."""
        key = (namespace, kind, name)
        entry = self._entries.get(key)
        if entry is not None and entry[0] > self._clock():
            self._entries.move_to_end(key)
            return True, entry[1]
        return False, None

    async def get(self, namespace: str, kind: str, name: str) -> KubeObject | None:
        """The object, from the cache or one GET; fetch errors propagate and are not cached."""
        key = (namespace, kind, name)
        known, obj = self.cached(namespace, kind, name)
        if known:
            return obj
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[KubeObject | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            self.fetches += 1
            obj = await self._fetch(namespace, kind, name)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody else may be waiting
            raise
        finally:
            self._inflight.pop(key, None)
        self._store(key, obj)
        future.set_result(obj)
        return obj

    def _store(self, key: OwnerKey, obj: KubeObject | None) -> None:
        ttl = self._ttl if obj is not None else self._missing_ttl
        self._entries[key] = (self._clock() + ttl, obj)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


async def owners_of(pod: KubeObject, namespace: str, cache: OwnerCache,
                    timeout: float) -> dict[OwnerKey, KubeObject]:
    """The owner objects the workload label needs for ``pod``. Best effort: on an error or timeout the
    label falls back to what the pod itself says, so the pod is not rejected for it."""
    wanted = owner_to_fetch(pod)
    if wanted is None:
        return {}
    kind, name = wanted
    known, obj = cache.cached(namespace, kind, name)  # the pods of a workload after the first: no timer
    if known:
        return {(namespace, kind, name): obj} if obj is not None else {}
    try:
        async with asyncio.timeout(timeout):
            obj = await cache.get(namespace, kind, name)
    except Exception as exc:  # any API failure degrades to the fallback label
        log.warning("cannot read pod owner", extra={"namespace": namespace, "kind": kind, "owner": name,
                                                     "error": f"{type(exc).__name__}: {exc}"})
        return {}
    return {(namespace, kind, name): obj} if obj is not None else {}


def api_fetcher(api_client: Any) -> Fetcher:
    """A ``Fetcher`` that GETs ReplicaSets and Jobs from the API server, None when they do not exist."""
    resources = {"ReplicaSet": REPLICASETS, "Job": JOBS}

    async def fetch(namespace: str, kind: str, name: str) -> KubeObject | None:
        resource = resources.get(kind)
        if resource is None:
            return None
        return await get_or_none(api_client, object_path(resource, name, namespace))

    return fetch
