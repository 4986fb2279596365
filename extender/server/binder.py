"""Bind: commit the chosen GPUs into the pod and bind it to the node, in one API call.

The reservation is taken before the first await, so two concurrent binds can never be handed the
same capacity. The pod's GPUs travel in the Binding itself: kube-apiserver copies a Binding's
``metadata.annotations`` onto the pod in the same write that sets ``spec.nodeName``, so a pod is never
bound without its ``gpu-ids`` and nothing has to be rolled back.

A bind is keyed by the pod's uid. A bind asked for again while one is in flight (the scheduler gave up
waiting and retried) joins it and answers its outcome; a bind of a pod already bound to that node answers
success at once, of a pod bound elsewhere an error saying so. When the API server's answer is lost (a
timeout, a dropped connection) the write may still happen, even later (kube-apiserver finishes a request
after its own timeout), so the binder never releases the reservation on an unknown outcome: it reads the
pod, and while the pod is still unbound it posts the same Binding again, until one answer is definite
(bound with these GPUs, or refused). After a successful bind the reservation stays until the watched pod
shows the allocation (the ledger then replaces it), or a read of the pod after a grace period confirms it
bound or gone (extender/confirm.py): a stalled watch never lets the capacity go twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping
from enum import Enum
from fractions import Fraction
from typing import Any, Protocol

from extender.common.batched_log import BatchedLog
from extender.common.contract import (
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
from extender.common.tasks import cancel_and_wait
from extender.kube.aio import NotSent
from extender.kube.client import error_message, error_status, not_found
from extender.kube.pods import PodApi
from extender.scheduling.state import pod_index
from extender.scheduling.topology import Tier
from extender.server.confirm import hold_until_confirmed
from extender.server.hooks import FilterHooks
from extender.server.metrics import Metrics
from extender.server.protocol import ExtenderBindingArgs

log = logging.getLogger(__name__)
bind_log = BatchedLog(log)  # one line per bind, written in batches: flush() at shutdown


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
    def reservation(self, uid: str) -> ReservationLike | None: ...
    def confirm(self, pod: dict[str, Any]) -> None: ...


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


def bind_annotations(reservation: ReservationLike, index: int | None) -> dict[str, str]:
    """Every annotation a bind writes onto the pod (sent in the Binding's metadata, one write): the GPUs,
    what was granted on each (the ledger counts that), and the pod index when it is free."""
    annotations = {GPU_IDS: ",".join(reservation.gpu_ids), ALLOCATED: format_allocated(reservation.request)}
    if index is not None:
        annotations[POD_INDEX] = str(index)
    return annotations


class _Seen(Enum):
    OURS = "bound to the node with this bind's GPUs"
    EARLIER = "bound to the node by an earlier bind, with its GPUs"
    UNBOUND = "not bound (yet)"


class Binder:
    def __init__(self, state: BindState, pods: PodLookup, api: PodApi, events: EventSink,
                 metrics: Metrics | None = None, *, index_poll: float = 1.0, index_wait: float = 600.0,
                 settle_grace: float = 60.0, retry_delay: float = 0.2, max_retry_delay: float = 5.0,
                 confirm_interval: float = 30.0, hooks: FilterHooks | None = None) -> None:
        self.state = state
        self.pods = pods
        self.api = api
        self.events = events
        self.metrics = metrics
        self.index_poll = index_poll
        self.index_wait = index_wait
        self.settle_grace = settle_grace  # then a pod the watch has not shown bound yet is read
        self.confirm_interval = confirm_interval
        self.hooks = hooks or FilterHooks()  # the controllers' parts in the verbs (server/hooks.py): admit
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self._running: dict[str, tuple[str, asyncio.Task[str]]] = {}  # pod uid -> (node, bind)
        self._background: set[asyncio.Task[None]] = set()

    def start_bind(self, args: ExtenderBindingArgs) -> asyncio.Task[str]:
        """Run a bind as a task of its own: the HTTP answer may time out, the bind still completes
        (and cleans up) so the ledger never loses track of capacity whose fate is unknown. A bind of a
        pod whose bind is in flight joins that one."""
        key = args.pod_uid or f"{args.pod_namespace}/{args.pod_name}"
        running = self._running.get(key)
        coro = self.bind(args) if running is None else self._join(running, args)
        task = asyncio.create_task(coro, name=f"bind-{args.pod_namespace}/{args.pod_name}")
        self._running[key] = (args.node, task)
        task.add_done_callback(functools.partial(self._finished, key))
        return task

    def _finished(self, key: str, task: asyncio.Task[str]) -> None:
        running = self._running.get(key)
        if running is not None and running[1] is task:
            del self._running[key]

    async def _join(self, running: tuple[str, asyncio.Task[str]], args: ExtenderBindingArgs) -> str:
        node, task = running
        log.info("bind joins the one in flight", extra={"pod": f"{args.pod_namespace}/{args.pod_name}",
                                                        "node": args.node, "in_flight_node": node})
        outcome = await asyncio.shield(task)
        if node == args.node:
            return outcome
        return await self.bind(args)  # answers "bound elsewhere" if the earlier bind succeeded

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error message for the scheduler."""
        pod: dict[str, Any] | None = None
        try:
            pod = await self._pod(args)
            done = self._already(pod, args)
            error = done if done is not None else await self._bind(pod, args)
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

    def _already(self, pod: dict[str, Any], args: ExtenderBindingArgs) -> str | None:
        """The answer for a pod that is already bound ("" or an error), None when it is not."""
        key, node = f"{args.pod_namespace}/{args.pod_name}", args.node
        bound_to = (pod.get("spec") or {}).get("nodeName")
        has_gpus = bool(((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_IDS))
        if not bound_to:
            # A reservation with no bind in flight is a bind that succeeded, not yet seen in the watch.
            held = self.state.reservation(_uid(pod))
            if held is None:
                return None
            bound_to, has_gpus = held.node, True
        if bound_to != node:
            return f"pod {key} is already bound to node {bound_to}, not {node}"
        if not has_gpus:
            return f"pod {key} is already bound to node {node} without {GPU_IDS}: not bound by this extender"
        log.info("already bound", extra={"pod": key, "node": node})
        return ""

    async def _bind(self, pod: dict[str, Any], args: ExtenderBindingArgs) -> str:
        ns, name, uid, node = args.pod_namespace, args.pod_name, _uid(pod), args.node
        if reason := self.hooks.admit(pod, node):
            return f"cannot place pod {ns}/{name} on node {node}: {reason}"
        try:
            reservation = self.state.reserve(pod, node)
        except Exception as exc:  # PlacementError, or a pod whose request no longer parses
            return f"cannot place pod {ns}/{name} on node {node}: {exc}"
        if reason := self.hooks.admit_reserved(pod, node, reservation.gpu_ids):
            self.state.release(reservation)
            return f"cannot place pod {ns}/{name} on node {node}: {reason}"
        index = pod_index(pod)
        index_now = index is not None and self.state.pending_index_holder(node, index, uid) is None
        annotations = bind_annotations(reservation, index if index_now else None)
        try:
            seen, error = await self._commit(pod, ns, name, uid, node, annotations)
        except Exception:
            # Nothing about the API answer is known here: keep the reservation until a read settles it.
            self._spawn(self._settle(reservation, ns, name))
            raise
        if seen is not _Seen.OURS:
            self.state.release(reservation)
            if seen is _Seen.UNBOUND:
                return error
            return ""  # EARLIER: the pod holds the GPUs of an earlier bind, now counted by confirm()
        tier = getattr(reservation, "tier", None)  # multi-GPU pods only
        message = describe_allocation(reservation.gpu_ids, node, reservation.request)
        if tier is not None:
            message += f"; GPU topology {Tier(tier).text}"
            if self.metrics is not None:
                self.metrics.topology_placements.labels(reservation.request.pool, str(tier)).inc()
        self.events.record(pod, "GPUDeviceAllocated", message)
        bind_log.write(logging.INFO, "bound", {"pod": f"{ns}/{name}", "node": node,
                                               "gpus": annotations[GPU_IDS], "index": index})
        self._spawn(self._settle(reservation, ns, name))
        if index is not None and not index_now:
            self._spawn(self._set_index_later(ns, name, uid, node, index))
        return ""

    async def _commit(self, pod: dict[str, Any], ns: str, name: str, uid: str, node: str,
                      annotations: dict[str, str]) -> tuple[_Seen, str]:
        """Post the Binding until its outcome is known: (OURS or EARLIER, "") or (UNBOUND, error)."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(COMPONENT_LABEL) != COMPONENT_WORKER:
            # The pods cache watches this label; without it the allocation would be invisible. A Binding's
            # labels reach the pod only where the PodTopologyLabelsAdmission gate is on, so this is a write
            # of its own, before the bind: the label alone holds nothing, nothing to undo if the bind fails.
            try:
                await self.api.merge_patch(ns, name, {"metadata": {
                    "uid": uid, "labels": {COMPONENT_LABEL: COMPONENT_WORKER}}})
            except Exception as exc:
                return _Seen.UNBOUND, f"cannot label pod {ns}/{name}: {error_message(exc)}"
        delay = self.retry_delay
        while True:
            try:
                await self.api.bind(ns, name, uid, node, annotations)
                return _Seen.OURS, ""
            except NotSent as exc:  # nothing left: post again after the backoff
                status, problem, sent = None, error_message(exc), False
            except Exception as exc:
                status, problem, sent = error_status(exc), error_message(exc), True
            if status is not None and status < 500 and status not in (409, 429):
                return _Seen.UNBOUND, f"cannot bind pod {ns}/{name} to node {node}: {problem}"
            # 409: bound already (perhaps by an earlier attempt of this bind) or the uid differs;
            # 429, 5xx, no answer: the Binding may have been written, or may still be.
            if sent:
                seen, error = await self._observe(ns, name, uid, node, annotations[GPU_IDS])
                if seen is not None:
                    return seen, error
            log.warning("bind outcome unknown, posting the Binding again" if sent
                        else "Binding not sent, posting it again",
                        extra={"pod": f"{ns}/{name}", "node": node, "error": problem})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_retry_delay)

    async def _observe(self, ns: str, name: str, uid: str, node: str,
                       gpu_ids: str) -> tuple[_Seen | None, str]:
        """Read the pod to learn what became of a Binding; (None, "") while still unknown or unbound."""
        try:
            current = await self.api.get(ns, name)
        except Exception as exc:
            if not_found(exc):
                return _Seen.UNBOUND, f"cannot bind pod {ns}/{name}: it was deleted"
            return None, ""
        if _uid(current) != uid:
            return _Seen.UNBOUND, f"cannot bind pod {ns}/{name}: it was replaced (uid {_uid(current)})"
        bound_to = (current.get("spec") or {}).get("nodeName")
        if not bound_to:
            if (current.get("metadata") or {}).get("deletionTimestamp"):
                return _Seen.UNBOUND, f"cannot bind pod {ns}/{name}: it is being deleted"
            return None, ""
        if bound_to != node:
            return _Seen.UNBOUND, f"pod {ns}/{name} is already bound to node {bound_to}, not {node}"
        held = ((current.get("metadata") or {}).get("annotations") or {}).get(GPU_IDS)
        if held == gpu_ids:
            return _Seen.OURS, ""
        if held:
            self.state.confirm(current)
            return _Seen.EARLIER, ""
        return _Seen.UNBOUND, f"pod {ns}/{name} is already bound to node {node} without {GPU_IDS}"

    async def _settle(self, reservation: ReservationLike, ns: str, name: str) -> None:
        await hold_until_confirmed(self.state, self.api, reservation, ns, name,
                                   first_check=self.settle_grace, interval=self.confirm_interval)

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
        if self._running:
            await asyncio.wait({task for _, task in self._running.values()}, timeout=timeout)
        await cancel_and_wait(self._background)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))
