"""A committed bind's reservation lives until the pod is confirmed.

After a successful Binding the capacity is held by the bind's in-memory reservation until the pod watch
shows the bound pod (the ledger then counts the pod's own allocation in its place). A watch can stall; a
reservation dropped on a timer before the watch catches up would let the same capacity go twice. So the
reservation is let go only on evidence:

- the watch showed the pod (bound: the ledger replaced the reservation; deleted or finished: it went);
- a read of the pod shows it bound to the node: the pod is counted from that read (``confirm``);
- a read shows the pod gone, replaced (another uid), finished, or not bound to the node (a Binding whose
  outcome was unknown and that never took effect): the reservation is released.

Until then the reservation stays and the pod is read again every ``interval`` seconds (a read that fails
changes nothing).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from extender.kube.client import error_message, not_found

log = logging.getLogger(__name__)

_FINISHED = ("Succeeded", "Failed")


class Held(Protocol):
    @property
    def pod_uid(self) -> str: ...
    @property
    def node(self) -> str: ...


class ConfirmState(Protocol):
    def reservation(self, uid: str) -> Any: ...
    def release(self, reservation: Any) -> None: ...
    def confirm(self, pod: dict[str, Any]) -> None: ...


class PodReader(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...


async def hold_until_confirmed(state: ConfirmState, api: PodReader, reservation: Held, namespace: str,
                               name: str, *, first_check: float, interval: float) -> None:
    """Return once the reservation is no longer needed (see the module)."""
    delay = first_check
    while True:
        await asyncio.sleep(delay)
        delay = interval
        if state.reservation(reservation.pod_uid) != reservation:
            return  # the watch showed the pod, or a newer bind of it holds its own reservation
        try:
            pod = await api.get(namespace, name)
        except Exception as exc:
            if not_found(exc):
                state.release(reservation)
                return
            log.warning("cannot confirm a bound pod yet; keeping its GPUs reserved",
                        extra={"pod": f"{namespace}/{name}", "error": error_message(exc)})
            continue
        metadata = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if str(metadata.get("uid") or "") != reservation.pod_uid or phase in _FINISHED:
            state.release(reservation)
            return
        if (pod.get("spec") or {}).get("nodeName") != reservation.node:
            # unbound after the grace (the Binding never took effect) or bound elsewhere: not ours to hold
            state.release(reservation)
            return
        log.info("bound pod confirmed by a read; the pod watch is behind",
                 extra={"pod": f"{namespace}/{name}", "node": reservation.node})
        state.confirm(pod)
        if state.reservation(reservation.pod_uid) != reservation:
            return
