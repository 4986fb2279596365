"""Resize in place: change what a bound pod takes from its GPUs, in the ledger and on the pod together.

The ledger decides, synchronously, on the event loop that also runs reserve and bind, so no bind can be
handed the room a resize is taking (and the other way round). Then the pod is patched: its request and
limit annotations for the resources that move and its ``allocated`` record, in one write. The order keeps
the ledger on the safe side of the pod: a scale-up takes its room in the ledger before the patch (and gives
it back if the patch fails); a scale-down frees its room only after the patch succeeded. The event comes
after the decision: ``ResourceScaledUp`` or ``ResourceScaledDown`` when the pod was resized,
``ResizeLimited`` (a warning) when a scale-up was cut to the room left or refused. Nothing is evicted, the
pod is not restarted (same uid), and a restarted extender reads the same figures back from the pod.

A namespace's GPU quota bounds a scale-up by its delta (``quota``: the growth, times the pod's GPUs, within
what the totals leave, each figure within the single caps); a cut says so in ``ResizeResult.quota``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Protocol

from extender.common.contract import (
    ALLOCATED,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VRAM_LIMIT,
    VRAM_REQUEST,
    format_allocated,
    format_bytes,
    format_tflops,
)
from extender.common.pods import pod_key, pod_uid
from extender.kube.client import error_message
from extender.kube.pods import PodApi
from extender.scheduling.ledger import Allocation, Resized, ResizeOutcome

log = logging.getLogger(__name__)

SCALED_UP = "ResourceScaledUp"
SCALED_DOWN = "ResourceScaledDown"
RESIZE_LIMITED = "ResizeLimited"


class ResizeState(Protocol):
    def resize(self, uid: str, tflops: Fraction | None, vram: int | None) -> ResizeOutcome: ...

    def bound_allocation(self, uid: str) -> Allocation | None: ...


class QuotaRoom(Protocol):
    def resize_room(self, pod: dict[str, Any], allocation: Allocation, tflops: Fraction | None,
                    vram: int | None) -> tuple[Fraction | None, int | None, str]: ...


class EventSink(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


@dataclass(frozen=True)
class Target:
    """What a worker should hold per GPU; None for a resource that does not move."""

    tflops_request: Fraction | None = None
    tflops_limit: Fraction | None = None
    vram_request: int | None = None
    vram_limit: int | None = None


@dataclass(frozen=True)
class ResizeResult:
    outcome: Resized
    tflops: Fraction  # what the pod holds per GPU now
    vram: int
    message: str
    error: str = ""  # the patch failed: nothing changed
    quota: str = ""  # a scale-up cut by the namespace's GPU quota: what it says


def _grow(old: Fraction | int, new: Fraction | int | None) -> Any:
    return None if new is None else max(old, new)


class Resizer:
    def __init__(self, state: ResizeState, api: PodApi, events: EventSink,
                 quota: Callable[[], QuotaRoom | None] | None = None) -> None:
        self.state = state
        self.api = api
        self.events = events
        self.quota = quota  # the namespaces' GPU quotas, when enforced

    async def resize(self, pod: dict[str, Any], target: Target) -> ResizeResult:
        uid, key = pod_uid(pod), pod_key(pod)
        ns, _, name = key.partition("/")
        before = self.state.bound_allocation(uid)
        if before is None:
            message = "the pod holds no counted GPU allocation"
            return ResizeResult(Resized.REFUSED, Fraction(0), 0, message)
        old_t = before.request.tflops_request or Fraction(0)
        old_v = before.request.vram_request
        # the grown part first: a scale-up takes its room now, under the ledger's single-threaded verbs
        want_t, want_v = _grow(old_t, target.tflops_request), _grow(old_v, target.vram_request)
        quota = self.quota() if self.quota is not None else None
        cut = ""
        if quota is not None:
            want_t, want_v, cut = quota.resize_room(pod, before, want_t, want_v)
        grown = self.state.resize(uid, want_t, want_v)
        if cut:
            grown = replace(grown, message=f"{cut}; {grown.message}" if grown.message else cut)
        granted_t = (grown.after.request.tflops_request or Fraction(0)) if grown.after else old_t
        granted_v = grown.after.request.vram_request if grown.after else old_v
        final_t = granted_t if target.tflops_request is None or target.tflops_request > old_t \
            else target.tflops_request
        final_v = granted_v if target.vram_request is None or target.vram_request > old_v \
            else target.vram_request
        limited = bool(cut) or grown.outcome is Resized.CLAMPED or (
            grown.outcome is Resized.REFUSED and grown.message.startswith("its GPUs have no room"))
        if final_t == old_t and final_v == old_v:
            if limited:
                self.events.record(pod, RESIZE_LIMITED, f"not resized: {grown.message}", "Warning")
            return ResizeResult(Resized.REFUSED, old_t, old_v, grown.message, quota=cut)
        annotations = {ALLOCATED: format_allocated(before.request.model_copy(
            update={"tflops_request": final_t, "vram_request": final_v}))}
        if final_t != old_t:
            annotations[TFLOPS_REQUEST] = format_tflops(final_t)
            annotations[TFLOPS_LIMIT] = format_tflops(max(target.tflops_limit or final_t, final_t))
        if final_v != old_v:
            annotations[VRAM_REQUEST] = format_bytes(final_v)
            annotations[VRAM_LIMIT] = format_bytes(max(target.vram_limit or final_v, final_v))
        try:
            await self.api.merge_patch(ns, name, {"metadata": {"uid": uid, "annotations": annotations}})
        except Exception as exc:
            self.state.resize(uid, old_t, old_v)  # give the room back: the pod still holds what it held
            error = f"cannot patch pod {key}: {error_message(exc)}"
            log.warning("resize not applied", extra={"pod": key, "error": error})
            return ResizeResult(Resized.REFUSED, old_t, old_v, error, error)
        done = self.state.resize(uid, final_t, final_v)  # the shrunk part, now that the pod says so
        after = done.after if done.outcome is not Resized.REFUSED else grown.after
        message = (f"{format_tflops(old_t)} -> {format_tflops(final_t)} TFLOPS, "
                   f"{format_bytes(old_v)} -> {format_bytes(final_v)} VRAM per GPU on GPUs "
                   f"{','.join(before.gpu_ids)}")
        up = final_t > old_t or final_v > old_v
        self.events.record(pod, SCALED_UP if up else SCALED_DOWN, message)
        if limited:
            self.events.record(pod, RESIZE_LIMITED, grown.message, "Warning")
        log.info("resized", extra={"pod": key, "change": message, "limited": limited})
        held_t = (after.request.tflops_request or Fraction(0)) if after else final_t
        held_v = after.request.vram_request if after else final_v
        outcome = Resized.CLAMPED if limited else Resized.RESIZED
        return ResizeResult(outcome, held_t, held_v, message, quota=cut)
