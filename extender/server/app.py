"""The HTTP face of the extender: the four scheduler verbs plus health, readiness and metrics.

Every verb answers something the scheduler understands, whatever it was sent: filter, bind and
preempt put problems in ``Error``; prioritize (whose answer is a bare list) answers 400 for a malformed body
(kube-scheduler ignores a failed prioritize like any other) and 503 only while the caches are not synced. A
malformed body (``BadRequest``: not JSON, not the message's shape, a Pod whose fields are not what Kubernetes
has there) is logged in one bounded line. A catch-all
around each verb turns any unexpected exception into that answer too, with one log line (no traceback:
a flood of hostile bodies must not become a flood of tracebacks), so no body ever gets an HTTP 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from extender.common.logs import describe_exception, one_line_server_errors
from extender.scheduling.state import ClusterState, PdbCheck
from extender.server.binder import Binder
from extender.server.hooks import FilterHooks
from extender.server.metrics import CONTENT_TYPE, Metrics
from extender.server.protocol import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    binding_answer,
    filter_answer,
    filter_error,
    host_priority_list,
)

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

DEFAULT_PREFIX = "/scheduler"
DEFAULT_DEADLINE = 4.0  # kube-scheduler's extender httpTimeout defaults to 5 s
# A bind answers by then even if its outcome is still unknown; chosen together with the httpTimeout of
# manifests/scheduler/kube-scheduler-config.yaml (60 s), which explains both numbers.
DEFAULT_BIND_DEADLINE = 55.0
DEFAULT_MAX_BODY = 64 * 1024 * 1024  # full-Node filter calls of a large cluster are big

STATE_KEY = web.AppKey("state", ClusterState)
METRICS_KEY = web.AppKey("metrics", Metrics)


class BadRequest(Exception):
    """The body is not a message of the expected shape."""


class Handlers:
    def __init__(self, state: ClusterState, binder: Binder, metrics: Metrics, *,
                 unsynced: Callable[[], list[str]], hooks: FilterHooks | None = None,
                 deadline: float = DEFAULT_DEADLINE, bind_deadline: float = DEFAULT_BIND_DEADLINE,
                 first_choice_only: bool = False, pdb: PdbCheck | None = None,
                 role: Callable[[], str] | None = None) -> None:
        self.state = state
        self.pdb = pdb  # PodDisruptionBudgets for the preempt verb's victims and NumPDBViolations
        self.binder = binder
        self.metrics = metrics
        self.unsynced = unsynced
        self.hooks = hooks or FilterHooks()  # the controllers' parts in the filter (server/hooks.py)
        self.deadline = deadline
        self.bind_deadline = bind_deadline
        # filter answers only the node prioritize would score 10 (the scheduler then skips prioritize)
        self.first_choice_only = first_choice_only
        self._metric_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        # what /readyz says of this replica beside "ok": "leader" or "standby" (None: no leader election)
        self.role = role

    def _not_ready(self) -> str | None:
        waiting = self.unsynced()
        return f"extender not ready: caches not synced yet ({', '.join(waiting)})" if waiting else None

    async def _parse(self, request: web.Request, model: type[M]) -> M:
        """The body as ``model``, or ``BadRequest`` saying what is wrong, logged once (bounded: a
        hostile body's values never reach the log whole)."""
        try:
            return await self._read(request, model)
        except BadRequest as exc:
            log.warning("malformed request", extra={"path": request.path[:100], "error": str(exc)})
            raise

    async def _read(self, request: web.Request, model: type[M]) -> M:
        try:
            if request.content.is_eof():  # the whole body came with the headers (the usual case): no wait
                raw = await request.read()
            else:
                async with asyncio.timeout(self.deadline / 2):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise BadRequest(f"request body too large: {exc.text}") from exc
        except TimeoutError as exc:
            raise BadRequest("request body not received in time") from exc
        except Exception as exc:  # e.g. a Content-Encoding the body does not decode with
            raise BadRequest(f"request body cannot be read: {describe_exception(exc, 200)}") from exc
        try:
            data = orjson.loads(raw)  # a third of json.loads' time on a 5,000-name body
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise BadRequest(f"request body is not JSON: {describe_exception(exc, 200)}") from exc
        name = model.__name__.removesuffix("Args")
        try:
            return model.model_validate(data)
        except RecursionError as exc:
            raise BadRequest(f"malformed {name} request: nested too deeply") from exc
        except ValidationError as exc:
            problems = "; ".join(
                f"{_bounded('.'.join(str(p)[:60] for p in e['loc'][:8]) or 'body')}: {_bounded(e['msg'])}"
                for e in exc.errors(include_input=False, include_url=False)[:5])
            raise BadRequest(f"malformed {name} request: {problems}") from exc

    async def _timed(self, verb: str, handle: Callable[[], Awaitable[tuple[web.StreamResponse, str]]],
                     failed: Callable[[str], web.StreamResponse]) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response, outcome = await handle()
        except Exception as exc:  # the catch-all: the verb's own error answer, one log line
            detail = describe_exception(exc)
            log.warning("request failed", extra={"verb": verb, "error": detail})
            response, outcome = failed(f"extender {verb} failed: {detail}"), "internal_error"
        duration, count = self._verb_metrics(verb, outcome)
        duration.observe(time.perf_counter() - started)
        count.inc()
        return response

    def _verb_metrics(self, verb: str, outcome: str) -> tuple[Any, Any]:
        # labels() locks and validates on every call; verbs x outcomes are a handful, looked up once each
        found = self._metric_children.get((verb, outcome))
        if found is None:
            found = self._metric_children[(verb, outcome)] = (
                self.metrics.request_duration.labels(verb), self.metrics.requests.labels(verb, outcome))
        return found

    async def filter(self, request: web.Request) -> web.StreamResponse:
        async def handle() -> tuple[web.StreamResponse, str]:
            try:
                args = await self._parse(request, ExtenderArgs)
            except BadRequest as exc:
                return _json(filter_error(str(exc)).wire()), "bad_request"
            if (problem := self._not_ready()) is not None:
                return _json(filter_error(problem).wire()), "not_ready"
            names = args.candidate_names()
            outcome = self.hooks.before_filter(args.pod, names)
            if outcome is None:
                outcome = self.state.filter(args.pod, names)
            self.metrics.count_rejections([*outcome.failed.values(), *outcome.unresolvable.values()])
            self.hooks.after_filter(args.pod, outcome)
            outcome = self.hooks.narrow(args.pod, outcome)
            if self.first_choice_only:
                outcome = self.state.first_choice(args.pod, outcome)
            if not outcome.fits and (reason := self.hooks.hold_back(args.pod)):
                return _json(filter_error(reason).wire()), "waiting"
            # kube-scheduler reads why nodes failed only when none passes (the pod's event, preemption);
            # with a node to go to, the hundreds of reasons of a full cluster are encoded, sent and
            # decoded for nothing (they are still counted above)
            failed, unresolvable = ({}, {}) if outcome.fits else (outcome.failed, outcome.unresolvable)
            answer = filter_answer(args, outcome.fits, failed, unresolvable, outcome.error or "")
            return _json(answer), "error" if outcome.error else "ok"

        return await self._timed("filter", handle, lambda m: _json(filter_error(m).wire()))

    async def prioritize(self, request: web.Request) -> web.StreamResponse:
        async def handle() -> tuple[web.StreamResponse, str]:
            try:
                args = await self._parse(request, ExtenderArgs)
            except BadRequest as exc:
                return _json({"error": str(exc)}, status=400), "bad_request"
            if (problem := self._not_ready()) is not None:
                return _json({"error": problem}, status=503), "not_ready"
            scores = self.state.prioritize(args.pod, args.candidate_names())
            return _json(host_priority_list(scores)), "ok"

        # 503, not 500: the scheduler ignores this extender's scores for the cycle and carries on
        return await self._timed("prioritize", handle, lambda m: _json({"error": m}, status=503))

    async def bind(self, request: web.Request) -> web.StreamResponse:
        async def handle() -> tuple[web.StreamResponse, str]:
            try:
                args = await self._parse(request, ExtenderBindingArgs)
            except BadRequest as exc:
                return _json(binding_answer(str(exc))), "bad_request"
            if (problem := self._not_ready()) is not None:
                return _json(binding_answer(problem)), "not_ready"
            task = self.binder.start_bind(args)
            try:
                # shield: on timeout the bind goes on (and cleans up after itself) in the background
                error = await asyncio.wait_for(asyncio.shield(task), self.bind_deadline)
            except TimeoutError:
                error = (f"bind of {args.pod_namespace}/{args.pod_name} still in progress "
                         f"after {self.bind_deadline}s (a retry joins it)")
                return _json(binding_answer(error)), "timeout"
            return _json(binding_answer(error)), "error" if error else "ok"

        return await self._timed("bind", handle, lambda m: _json(binding_answer(m)))

    async def preempt(self, request: web.Request) -> web.StreamResponse:
        async def handle() -> tuple[web.StreamResponse, str]:
            try:
                args = await self._parse(request, ExtenderPreemptionArgs)
            except BadRequest as exc:
                return _json(ExtenderPreemptionResult(error=str(exc)).wire()), "bad_request"
            if (problem := self._not_ready()) is not None:
                return _json(ExtenderPreemptionResult(error=problem).wire()), "not_ready"
            options = self.state.preempt(args.pod, args.candidate_names(), self.pdb)
            pdb = self.pdb
            result = ExtenderPreemptionResult(node_to_meta_victims={
                node: MetaVictims(pods=[MetaPod(uid=v.uid) for v in victims], num_pdb_violations=(
                    pdb.violations([f"{v.namespace}/{v.name}" for v in victims]) if pdb is not None else 0))
                for node, victims in options.items()
            })
            return _json(result.wire()), "ok"

        return await self._timed("preempt", handle,
                                 lambda m: _json(ExtenderPreemptionResult(error=m).wire()))

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.StreamResponse:
        problem = self._not_ready()
        if problem:
            return web.Response(text=problem, status=503)
        # both replicas serve the verbs; the body says which one's leader-only controllers act
        return web.Response(text=f"ok: {self.role()}" if self.role is not None else "ok")

    async def metrics_page(self, request: web.Request) -> web.StreamResponse:
        body = await self.metrics.render_async()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def create_app(handlers: Handlers, *, prefix: str = DEFAULT_PREFIX,
               max_body: int = DEFAULT_MAX_BODY) -> web.Application:
    one_line_server_errors()
    app = web.Application(client_max_size=max_body)
    app[STATE_KEY] = handlers.state
    app[METRICS_KEY] = handlers.metrics
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    app.router.add_post(f"{prefix}/filter", handlers.filter)
    app.router.add_post(f"{prefix}/prioritize", handlers.prioritize)
    app.router.add_post(f"{prefix}/bind", handlers.bind)
    app.router.add_post(f"{prefix}/preempt", handlers.preempt)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_page)
    return app


def create_monitoring_app(handlers: Handlers) -> web.Application:
    """/metrics, /healthz and /readyz alone, for a listener on the pod IP (``--metrics-port``), so that
    Prometheus and the kubelet reach them while the scheduler verbs stay on loopback."""
    one_line_server_errors()
    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    app.router.add_get("/metrics", handlers.metrics_page)
    return app


def _bounded(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _json(body: Any, status: int = 200) -> web.Response:
    # orjson: a 5,000-node prioritize answer encodes in ~0.2 ms against ~2 ms with json.dumps
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
