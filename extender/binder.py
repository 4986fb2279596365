"""Bind: commit the chosen GPUs into the pod, then bind it to the node.

The reservation is taken before the first await, so two concurrent binds can never be handed the
same capacity. On any failure the reservation is released and the ``gpu-ids`` annotation written by
this bind is removed again before the scheduler hears about the error, so its retry starts clean.
After a successful bind the reservation stays until the watched pod shows the allocation (the ledger
then replaces it); a grace timer drops it in case the pod is never seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Protocol

from extender.contract import (
    ALLOCATED,
    COMPONENT_LABEL,
    COMPONENT_WORKER,
    GPU_IDS,
    POD_INDEX,
    GPURequest,
    format_allocated,
    format_bytes,
    format_tflops,
)
from extender.kube.client import error_message, error_status
from extender.kube.pods import PodApi
from extender.metrics import Metrics
from extender.protocol import ExtenderBindingArgs
from extender.state import pod_index

log = logging.getLogger(__name__)


class ReservationLike(Protocol):
    @property
    def pod_uid(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def gpu_ids(self) -> tuple[str, ...]: ...
    @property
    def request(self) -> GPURequest: ...


class BindState(Protocol):
    def reserve(self, pod: dict[str, Any], node: str) -> ReservationLike: ...
    def release(self, reservation: Any) -> None: ...
    def pending_index_holder(self, node: str, index: int, pod_uid: str) -> str | None: ...


class PodLookup(Protocol):
    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...


class EventSink(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


class BindError(Exception):
    """The bind cannot go ahead; the message is what the scheduler and the pod's events show."""


def describe_allocation(gpu_ids: tuple[str, ...], node: str, request: GPURequest) -> str:
    plural = "GPU" if len(gpu_ids) == 1 else "GPUs"
    if request.takes_whole_gpu:
        amount = "whole GPUs"
    else:
        compute = (f"{format_tflops(request.percent_request)}% compute" if request.percent_request is not None
                   else f"{format_tflops(request.tflops_request or Fraction(0))} TFLOPS")
        amount = f"{compute} and {format_bytes(request.vram_request)} per GPU"
    return f"allocated {plural} {','.join(gpu_ids)} on node {node}: {amount}"


def _annotation_path(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


class Binder:
    def __init__(self, state: BindState, pods: PodLookup, api: PodApi, events: EventSink,
                 metrics: Metrics | None = None, *, index_poll: float = 1.0, index_wait: float = 600.0,
                 settle_grace: float = 60.0) -> None:
        self.state = state
        self.pods = pods
        self.api = api
        self.events = events
        self.metrics = metrics
        self.index_poll = index_poll
        self.index_wait = index_wait
        self.settle_grace = settle_grace
        self._in_flight: set[asyncio.Task[str]] = set()
        self._background: set[asyncio.Task[None]] = set()

    def start_bind(self, args: ExtenderBindingArgs) -> asyncio.Task[str]:
        """Run a bind as a task of its own: the HTTP answer may time out, the bind still completes
        (and cleans up) so the ledger never loses track of capacity whose fate is unknown."""
        task = asyncio.create_task(self.bind(args), name=f"bind-{args.pod_namespace}/{args.pod_name}")
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return task

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error message for the scheduler."""
        pod: dict[str, Any] | None = None
        try:
            pod = await self._pod(args)
            error = await self._bind(pod, args)
        except BindError as exc:
            error = str(exc)
        except Exception as exc:  # an unexpected failure must still answer the scheduler
            log.exception("bind failed", extra={"pod": f"{args.pod_namespace}/{args.pod_name}"})
            error = f"bind failed: {error_message(exc)}"
        if self.metrics is not None:
            self.metrics.binds.labels("success" if not error else "error").inc()
        if error and pod is not None:
            self.events.record(pod, "GPUDeviceAllocationFailed", error, "Warning")
        return error

    async def _pod(self, args: ExtenderBindingArgs) -> dict[str, Any]:
        pod = self.pods.get(args.pod_name, args.pod_namespace)
        if pod is None or (args.pod_uid and _uid(pod) != args.pod_uid):
            try:
                pod = await self.api.get(args.pod_namespace, args.pod_name)
            except Exception as exc:
                raise BindError(f"cannot read pod {args.pod_namespace}/{args.pod_name}: "
                                f"{error_message(exc)}") from exc
        if args.pod_uid and _uid(pod) != args.pod_uid:
            raise BindError(f"pod {args.pod_namespace}/{args.pod_name} has uid {_uid(pod)}, "
                            f"not {args.pod_uid}: it was replaced")
        return pod

    async def _bind(self, pod: dict[str, Any], args: ExtenderBindingArgs) -> str:
        ns, name, uid, node = args.pod_namespace, args.pod_name, _uid(pod), args.node
        try:
            reservation = self.state.reserve(pod, node)
        except Exception as exc:  # PlacementError, or a pod whose request no longer parses
            return f"cannot place pod {ns}/{name} on node {node}: {exc}"
        gpu_ids = ",".join(reservation.gpu_ids)
        index = pod_index(pod)
        index_now = index is not None and self.state.pending_index_holder(node, index, uid) is None
        annotated = committed = False
        try:
            annotations = {GPU_IDS: gpu_ids, ALLOCATED: format_allocated(reservation.request)}
            if index is not None and index_now:
                annotations[POD_INDEX] = str(index)
            metadata: dict[str, Any] = {"uid": uid, "annotations": annotations}  # uid: a precondition
            labels = (pod.get("metadata") or {}).get("labels") or {}
            if labels.get(COMPONENT_LABEL) != COMPONENT_WORKER:
                # The pods cache watches this label; without it the allocation would be invisible.
                metadata["labels"] = {COMPONENT_LABEL: COMPONENT_WORKER}
            try:
                await self.api.merge_patch(ns, name, {"metadata": metadata})
            except Exception as exc:
                return f"cannot write {GPU_IDS} on pod {ns}/{name}: {error_message(exc)}"
            annotated = True
            try:
                await self.api.bind(ns, name, uid, node)
            except Exception as exc:
                if not await self._bound_anyway(ns, name, uid, node):
                    return f"cannot bind pod {ns}/{name} to node {node}: {error_message(exc)}"
            committed = True
        finally:
            if not committed:
                self.state.release(reservation)
                if annotated:
                    await self._roll_back(ns, name, uid, gpu_ids, index_now and index is not None)
        self.events.record(pod, "GPUDeviceAllocated", describe_allocation(reservation.gpu_ids, node,
                                                                           reservation.request))
        log.info("bound", extra={"pod": f"{ns}/{name}", "node": node, "gpus": gpu_ids, "index": index})
        self._spawn(self._settle(reservation))
        if index is not None and not index_now:
            self._spawn(self._set_index_later(ns, name, uid, node, index))
        return ""

    async def _bound_anyway(self, ns: str, name: str, uid: str, node: str) -> bool:
        """After a binding error of unknown outcome (a timeout), look whether it happened."""
        try:
            current = await self.api.get(ns, name)
        except Exception:
            return False
        return _uid(current) == uid and (current.get("spec") or {}).get("nodeName") == node

    async def _roll_back(self, ns: str, name: str, uid: str, gpu_ids: str, with_index: bool) -> None:
        # A JSON patch with tests: only remove what this bind wrote, never a later bind's record.
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": _annotation_path(GPU_IDS), "value": gpu_ids},
            {"op": "remove", "path": _annotation_path(GPU_IDS)},
            {"op": "remove", "path": _annotation_path(ALLOCATED)},
        ]
        if with_index:
            ops.append({"op": "remove", "path": _annotation_path(POD_INDEX)})
        try:
            await self.api.json_patch(ns, name, ops)
        except Exception as exc:
            if error_status(exc) not in (404, 409, 422):
                log.warning("could not remove gpu-ids after a failed bind",
                            extra={"pod": f"{ns}/{name}", "error": error_message(exc)})

    async def _settle(self, reservation: ReservationLike) -> None:
        await asyncio.sleep(self.settle_grace)
        self.state.release(reservation)

    async def _set_index_later(self, ns: str, name: str, uid: str, node: str, index: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.index_wait
        while loop.time() < deadline:
            await asyncio.sleep(self.index_poll)
            pod = self.pods.get(name, ns)
            if pod is not None and (_uid(pod) != uid or (pod.get("metadata") or {}).get("deletionTimestamp")):
                return
            if pod is not None and POD_INDEX in ((pod.get("metadata") or {}).get("annotations") or {}):
                return
            if self.state.pending_index_holder(node, index, uid) is not None:
                continue
            try:
                await self.api.merge_patch(ns, name, {"metadata": {"uid": uid,
                                                                   "annotations": {POD_INDEX: str(index)}}})
                log.info("index set", extra={"pod": f"{ns}/{name}", "index": index})
                return
            except Exception as exc:
                if error_status(exc) in (404, 409):
                    return
                log.warning("could not set index", extra={"pod": f"{ns}/{name}", "error": error_message(exc)})
        log.warning("gave up setting index", extra={"pod": f"{ns}/{name}", "index": index})

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, timeout: float = 10.0) -> None:
        """Let in-flight binds finish (up to ``timeout``), then stop background work."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=timeout)
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))
