"""A pod's GPU request as placement reads it, parsed once per pod version and once per distinct set of
request annotations.

Memory stays bounded whatever pods arrive (pods that skip the webhook reach the filter as they are): each
cache holds at most ``REQUEST_CACHE_SIZE`` entries, only for keys of sane length, and an error is kept as
its short message (a fresh exception with no traceback: a traceback would keep the whole pod alive).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.contract import (
    ALLOCATED,
    DOMAIN,
    GPU_IDS,
    POD_INDEX,
    ContractError,
    GPURequest,
    RequestContext,
    parse_request,
)
from extender.common.pods import as_map, pod_uid
from extender.scheduling.placement import Demand

REQUEST_CACHE_SIZE = 8192
MAX_CACHED_KEY = 1024  # longer uids, resourceVersions or request strings are parsed every time
MAX_ERROR_TEXT = 1024  # a contract error quotes the value: keep the message short

# Written per pod after admission, never read by parse_request: not part of what identifies a request.
_PER_POD_KEYS = frozenset((GPU_IDS, POD_INDEX, ALLOCATED))
_DOMAIN_PREFIX = DOMAIN + "/"


class PlacementError(Exception):
    """The pod cannot be placed as asked; the message is meant for the user."""


@dataclass(frozen=True)
class Parsed:
    request: GPURequest
    shape: tuple[object, ...]  # what decides where the request fits: the key of its verdict table
    demand: Demand

    @property
    def size(self) -> int:
        """Characters of free text the request holds (what caching it costs beyond a fixed size)."""
        r = self.request
        return len(r.pool) + len(r.gpu_model or "") + len(r.vendor or "") + len(r.workload_profile or "")


_Cached = Parsed | tuple[str, str]  # a request, or a contract error as its key and short message


def shape(request: GPURequest) -> tuple[object, ...]:
    """The fields that decide where a request fits (not limits, QoS or autoscaling)."""
    return (request.pool, request.tflops_request, request.percent_request, request.vram_request,
            request.gpu_count, request.gpu_model, request.vendor, request.gpu_indices, request.isolation,
            request.topology_required, request.topology_max_tier, request.topology_source)


def contract_error(key: str, message: str) -> ContractError:
    """A ContractError that was never raised (no traceback) with a message of bounded length."""
    error = ContractError(key[:MAX_CACHED_KEY], "", "")
    error.args = (message if len(message) <= MAX_ERROR_TEXT else message[:MAX_ERROR_TEXT] + "...",)
    return error


def parse(annotations: Mapping[str, Any], default_pool: str | None) -> Parsed | ContractError:
    """The request these annotations make, or the contract error that rejects it (never raises)."""
    try:
        request = parse_request(annotations, RequestContext(default_pool=default_pool))
        return Parsed(request, shape(request), Demand.of(request))
    except ContractError as exc:
        # the message alone: neither the traceback (it keeps the pod alive) nor a huge quoted value
        return contract_error(exc.key, str(exc))
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        return contract_error("metadata.annotations", f"metadata.annotations cannot be read: {exc}")


def _request_text(annotations: Mapping[str, Any], default_pool: str | None) -> tuple[object, ...] | None:
    """What ``parse_request`` reads of these annotations (the tensor-fusion.ai ones, in their order), as a
    cache key; None when a value is not a string or the text is too long to keep."""
    key: list[object] = [default_pool]
    size = 0
    for name, value in annotations.items():
        if type(name) is not str:
            return None
        if name.startswith(_DOMAIN_PREFIX) and name not in _PER_POD_KEYS:
            if type(value) is not str:
                return None
            size += len(name) + len(value)
            key += (name, value)
    return tuple(key) if size <= MAX_CACHED_KEY else None


def _remember(cache: dict[Any, _Cached], key: object, result: Parsed | ContractError) -> None:
    """Keep a parse result: a request of sane size as it is, an error as its key and short message (no
    traceback, no pod kept alive). The cache starts over when full."""
    if len(cache) >= REQUEST_CACHE_SIZE:
        cache.clear()
    if isinstance(result, Parsed):
        if result.size <= MAX_CACHED_KEY:
            cache[key] = result
    else:
        cache[key] = (result.key[:MAX_CACHED_KEY], str(result))


def _recall(cached: _Cached) -> Parsed | ContractError:
    return cached if isinstance(cached, Parsed) else contract_error(*cached)


class RequestCache:
    """Parse results by pod version (uid, resourceVersion, default pool) and by request text."""

    def __init__(self) -> None:
        self._by_pod: dict[tuple[str, str, str | None], _Cached] = {}
        self._by_text: dict[tuple[object, ...], _Cached] = {}

    def parse(self, pod: Mapping[str, Any], default_pool: str | None) -> Parsed | ContractError:
        """The pod's request, or the contract error that rejects it."""
        meta = as_map(pod.get("metadata"))
        rv = meta.get("resourceVersion")
        key = (pod_uid(pod), str(rv or ""), default_pool)
        cacheable = bool(rv) and len(key[0]) + len(key[1]) <= MAX_CACHED_KEY
        if cacheable:
            cached = self._by_pod.get(key)
            if cached is not None:
                return _recall(cached)
        result = self.parse_annotations(as_map(meta.get("annotations")), default_pool)
        if cacheable:
            _remember(self._by_pod, key, result)
        return result

    def parse_annotations(self, annotations: Mapping[str, Any],
                          default_pool: str | None) -> Parsed | ContractError:
        """Pods of one workload carry the same request annotations: each distinct set is parsed once, and
        its pods share one ``GPURequest``."""
        key = _request_text(annotations, default_pool)
        if key is None:
            return parse(annotations, default_pool)
        cached = self._by_text.get(key)
        if cached is not None:
            return _recall(cached)
        result = parse(annotations, default_pool)
        _remember(self._by_text, key, result)
        return result

    def request_of(self, pod: Mapping[str, Any], default_pool: str | None) -> GPURequest:
        """The pod's effective request; raises ``PlacementError`` with the contract's message."""
        parsed = self.parse(pod, default_pool)
        if isinstance(parsed, ContractError):
            raise PlacementError(str(parsed))
        return parsed.request
