"""The webhook's HTTP server: ``POST /mutate``, ``/healthz``, ``/readyz`` and ``/metrics``.

Every request to ``/mutate`` gets an answer within the request timeout: a patch, a denial, or (when no
request uid can be recovered) an HTTP 4xx error with a message; never an HTTP 500. Unexpected exceptions
are logged as one line each, without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

from aiohttp import web

from extender.common.batched_log import BatchedLog, render_members
from extender.common.contract import DEFAULT_SCHEDULER_NAME
from extender.common.logs import describe_exception, one_line_server_errors
from webhook.admission import (
    Decision,
    Outcome,
    Request,
    ReviewError,
    admit,
    deny,
    encode_review,
    parse_review,
)
from webhook.deadline import DEFAULT_REQUEST_TIMEOUT, DEFAULT_TICK, Deadlines
from webhook.index import IndexAllocator
from webhook.memo import MutationCache
from webhook.metrics import CONTENT_TYPE, WebhookMetrics
from webhook.mutation import EVERYWHERE
from webhook.priority import PriorityPolicy
from webhook.replay import Replay, ReviewReplay
from webhook.view import ClusterView, KubeObject
from webhook.workload import owner_to_fetch

log = logging.getLogger("webhook.server")
admission_log = BatchedLog(log)

MAX_BODY_BYTES = 3 * 1024 * 1024
# Below the API server's webhook timeoutSeconds (10 in the shipped configuration), so we answer first.

MONITORING_MAX_BODY_BYTES = 64 * 1024

ViewProvider = Callable[[KubeObject, str], Awaitable[ClusterView]]
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class WebhookService:
    """What the handlers need: the per-request view, readiness, the index allocator and metrics."""

    def __init__(self, view_for: ViewProvider, ready: Callable[[], bool], *,
                 scheduler_name: str = DEFAULT_SCHEDULER_NAME, allocator: IndexAllocator | None = None,
                 metrics: WebhookMetrics | None = None,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 do_not_disrupt: Callable[[], bool] = lambda: False,
                 mutation_cache: MutationCache | None = None,
                 generation: Callable[[], Hashable] = lambda: 0,
                 replay: ReviewReplay | None = None,
                 owner_token: Callable[[Hashable], object] = lambda owner: None,
                 priority: PriorityPolicy = EVERYWHERE) -> None:
        """``mutation_cache`` and ``replay`` need ``generation`` to change whenever what ``view_for`` sees of
        pools, profiles and templates does (``ServingCaches.generation``); ``replay`` also needs
        ``owner_token`` to give, for an owner key (namespace, kind, name), a value equal to the last one
        exactly while the owner object ``view_for`` would use is the same (``ServingCaches.owner_token``)."""
        self.view_for = view_for
        self.mutation_cache = mutation_cache
        self.generation = generation
        self.replay = replay
        self.owner_token = owner_token
        self.priority = priority  # where the high and critical priority classes are granted
        self.do_not_disrupt = do_not_disrupt
        self.ready = ready
        self.scheduler_name = scheduler_name
        self.allocator = allocator or IndexAllocator()
        self.metrics = metrics or WebhookMetrics()
        self.request_timeout = request_timeout
        # requests end within a quarter of their bound past it (DEFAULT_TICK at most)
        self.deadlines = Deadlines(max(min(DEFAULT_TICK, request_timeout / 4), 0.001))

    def replay_context(self, owner: Hashable) -> Hashable:
        """What a decision reads beside the review and the pod index (see ``webhook.replay``)."""
        return self.generation(), self.do_not_disrupt(), self.owner_token(owner)


class Routes:
    """Dispatch by path for aiohttp's low-level server (``web.Server``): an exact path and one method each
    (GET also answers HEAD). The webhook has a handful of fixed paths, so it skips the Application layer
    (router, match info, middleware chain): about a tenth of a review's CPU at thousands a second."""

    def __init__(self, routes: Mapping[str, tuple[str, Handler]]) -> None:
        self._routes = dict(routes)

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        route = self._routes.get(request.path)
        if route is None:
            return web.Response(status=404, text="404: Not Found")
        method, handle = route
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            allowed = "GET, HEAD" if method == "GET" else method
            return web.Response(status=405, text="405: Method Not Allowed", headers={"Allow": allowed})
        return await handle(request)


def create_server(service: WebhookService, *, max_body_bytes: int = MAX_BODY_BYTES) -> web.Server:
    """The admission server: ``POST /mutate``, ``/healthz``, ``/readyz`` and ``/metrics``. Call it from the
    event loop that will serve it; run it with ``web.ServerRunner``, and ``admission_log.flush()`` after
    the runner's cleanup."""
    one_line_server_errors()
    endpoints = Endpoints(service, max_body_bytes)
    return _server(Routes({"/mutate": ("POST", endpoints.mutate), **endpoints.monitoring()}), max_body_bytes)


def create_monitoring_server(service: WebhookService) -> web.Server:
    """/metrics, /healthz and /readyz over plain HTTP on a port of their own (``--metrics-port``), so that a
    NetworkPolicy can admit the API server to the admission port and Prometheus to this one."""
    one_line_server_errors()
    endpoints = Endpoints(service, MONITORING_MAX_BODY_BYTES)
    return _server(Routes(endpoints.monitoring()), MONITORING_MAX_BODY_BYTES)


def _server(routes: Routes, max_body_bytes: int) -> web.Server:
    loop = asyncio.get_running_loop()

    def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body_bytes)

    return web.Server(routes, request_factory=request, access_log=None)


class Endpoints:
    def __init__(self, service: WebhookService, max_body_bytes: int) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes

    def monitoring(self) -> dict[str, tuple[str, Handler]]:
        return {"/healthz": ("GET", self.healthz), "/readyz": ("GET", self.readyz),
                "/metrics": ("GET", self.metrics)}

    async def healthz(self, _request: web.BaseRequest) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _request: web.BaseRequest) -> web.Response:
        if self.service.ready():
            return web.Response(text="ok")
        return web.Response(status=503, text="caches not synced yet")

    async def metrics(self, _request: web.BaseRequest) -> web.Response:
        return web.Response(body=self.service.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def mutate(self, request: web.BaseRequest) -> web.Response:
        return await handle_mutate(self.service, self.max_body_bytes, request)


async def handle_mutate(service: WebhookService, max_body_bytes: int,
                        request: web.BaseRequest) -> web.Response:
    started = time.perf_counter()
    index = _IndexDraw(service.allocator)
    replay = service.replay
    tried = False
    # A review whose body is all in already, and which repeats one answered before (the pods of a ReplicaSet
    # or a Job), is answered here: no wait can come, so no deadline; nothing decoded, no dict per line.
    if replay is not None and request.content.is_eof() and "Content-Encoding" not in request.headers:
        try:
            replayed = replay.answer(await request.read(), service.replay_context, index.draw)
            tried = True
            if replayed is not None:
                return _replayed(service, replayed, started)
        except Exception:  # the full path below answers it, with its denial and log line
            tried = False
    return await _answer(service, max_body_bytes, request, started, index, replay if not tried else None)


async def _answer(service: WebhookService, max_body_bytes: int, request: web.BaseRequest, started: float,
                  index: _IndexDraw, replay: ReviewReplay | None) -> web.Response:
    """The full path: the body read under the request's deadline, the review decoded and decided (or
    replayed, when ``replay`` is given), every failure a denial or an HTTP error with one log line."""
    uid: str | None = None
    fields: dict[str, Any] = {}
    reading = True  # until the whole body is in: a timeout then is the client's (408), not ours
    try:
        with service.deadlines.bound(service.request_timeout):
            encoding = request.headers.get("Content-Encoding")
            if encoding is not None and (encoding := encoding.strip().lower()) not in ("", "identity"):
                # The API server sends reviews uncompressed. Refused before reading: aiohttp can wait for
                # the rest of a one-byte deflate body that will never come, until the request's deadline.
                raise ReviewError(f"Content-Encoding {encoding[:40]!r} is not accepted: send the "
                                  "AdmissionReview uncompressed")
            try:
                body = await request.read()
            except (web.HTTPException, TimeoutError):
                raise
            except Exception as exc:  # e.g. a Content-Encoding the body does not decode with
                raise ReviewError(f"body cannot be read: {describe_exception(exc, 200)}") from exc
            reading = False
            replayed = replay.answer(body, service.replay_context, index.draw) if replay is not None else None
            if replayed is not None:
                return _replayed(service, replayed, started)
            review = parse_review(body)
            uid = review.uid
            fields = {"uid": uid[:100], "operation": review.operation[:20],
                      "namespace": (review.namespace or "")[:63], "pod": _pod_name(review.object)}
            decision, answer = await _decide(service, body, review, index, fields)
        response = web.Response(body=answer, content_type="application/json")
    except web.HTTPRequestEntityTooLarge:
        message = f"AdmissionReview larger than {max_body_bytes} bytes"
        decision = Decision({}, Outcome.ERROR, "review-too-large", message)
        response = _error(413, message)
    except ReviewError as exc:
        uid = exc.uid
        outcome = Outcome.DENIED if uid else Outcome.ERROR
        decision = Decision({}, outcome, "malformed-review", str(exc))
        response = web.json_response(deny(uid, str(exc), 400)) if uid else _error(400, str(exc))
    except TimeoutError:
        if reading:  # the client did not send its body in time: its error (408), not ours
            message = f"the AdmissionReview body did not arrive within {service.request_timeout}s"
            decision = Decision({}, Outcome.ERROR, "body-timeout", message)
            response = _error(408, message)
        else:
            message = f"admission timed out after {service.request_timeout}s"
            decision = Decision({}, Outcome.ERROR, "timeout", message)
            response = web.json_response(deny(uid, message, 504)) if uid else _error(504, message)
    except Exception as exc:  # the catch-all: a denial (or a 400 without a uid) and one log line
        detail = describe_exception(exc)
        log.warning("admission failed", extra={**fields, "error": detail})
        message = f"the webhook could not process this pod: {detail}"
        decision = Decision({}, Outcome.ERROR, "internal", message)
        response = web.json_response(deny(uid, message, 500)) if uid else _error(400, message)
    elapsed = time.perf_counter() - started
    # Every answer that is a denial review (rather than an HTTP error) counts as a denial.
    denied = decision.outcome is Outcome.DENIED or (decision.outcome is Outcome.ERROR and uid is not None)
    service.metrics.observe(elapsed, decision.outcome, decision.reason if denied else None)
    # One line per mutation, denial or error; pods passed untouched only at debug.
    fields.update(outcome=decision.outcome.value, reason=decision.reason, detail=decision.message,
                  duration_ms=round(elapsed * 1000, 3))
    admission_log.write(logging.DEBUG if decision.outcome is Outcome.SKIPPED else logging.INFO, "admission",
                        fields)
    return response


def _replayed(service: WebhookService, replayed: Replay, started: float) -> web.Response:
    """The answer to a replayed review, its metrics and its log line: the line the full path writes, from
    the fields rendered when the answer was remembered (``_log_members``)."""
    response = web.Response(body=replayed.answer, content_type="application/json")
    elapsed = time.perf_counter() - started
    outcome = replayed.outcome  # a replayed answer is a review: a denial or an error counts as a denial
    denied = outcome is Outcome.DENIED or outcome is Outcome.ERROR
    service.metrics.observe(elapsed, outcome, replayed.reason if denied else None)
    micros = int(elapsed * 1_000_000)  # milliseconds with three decimals, without formatting a float
    fields = f"{replayed.note}," if replayed.note else ""  # the uid is letters, digits and dashes (replay)
    admission_log.write_members(logging.DEBUG if outcome is Outcome.SKIPPED else logging.INFO, "admission",
                                f'"uid":"{replayed.uid[:100]}",{fields}'
                                f'"duration_ms":{micros // 1000}.{_THOUSANDTHS[micros % 1000]}')
    return response


_THOUSANDTHS = tuple(f"{n:03d}" for n in range(1000))


def _log_members(fields: dict[str, Any], decision: Decision) -> str:
    """A replayed answer's log line members between its uid and its duration (``_replayed``)."""
    return render_members({**fields, "outcome": decision.outcome.value, "reason": decision.reason,
                           "detail": decision.message})


class _IndexDraw:
    """The request's pod index, drawn from the allocator at most once, and whether the decision used it."""

    __slots__ = ("_allocator", "index", "used")

    def __init__(self, allocator: IndexAllocator) -> None:
        self._allocator = allocator
        self.index: int | None = None
        self.used = False

    def draw(self) -> int:
        if self.index is None:
            self.index = self._allocator.next()
        return self.index

    def __call__(self) -> int:  # admit's ``next_index``
        self.used = True
        return self.draw()


async def _decide(service: WebhookService, body: bytes, review: Request, index: _IndexDraw,
                  fields: dict[str, Any]) -> tuple[Decision, bytes]:
    namespace = review.namespace or "default"
    view = await service.view_for(review.object or {}, namespace)
    decision = admit(review, view, scheduler_name=service.scheduler_name, next_index=index,
                     do_not_disrupt=service.do_not_disrupt(), cache=service.mutation_cache,
                     generation=service.generation(), priority=service.priority)
    answer = encode_review(decision.response)
    if service.replay is not None and review.plain_json:
        wanted = owner_to_fetch(review.object) if review.object is not None else None
        owner = (namespace, *wanted) if wanted is not None else None
        service.replay.remember(body, review.uid, answer, owner=owner, context=service.replay_context(owner),
                                index=index.index if index.used else None, outcome=decision.outcome,
                                reason=decision.reason,
                                note=_log_members({k: v for k, v in fields.items() if k != "uid"}, decision))
    return decision, answer


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"message": message}, status=status)


def _pod_name(pod: KubeObject | None) -> str | None:
    metadata = (pod or {}).get("metadata")
    if not isinstance(metadata, dict):
        return None
    name = metadata.get("name") or metadata.get("generateName") or ""
    return (name[:253] or None) if isinstance(name, str) else None

