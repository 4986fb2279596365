"""The background loops of ``tf-extender serve``.

Each loop is a ``Controller``: a name and a run loop that returns only when cancelled. ``ExtenderService``
builds the flat list, ``start`` spawns one named task per entry and ``stop`` cancels them all and waits,
so every loop of the process is started and stopped in one place (Karpenter's ``NewControllers``, kopf's
named tasks). A loop that crashes ends its own task and nothing else, as each loop did before the list.

The controllers that act on the cluster as a whole (node expansion, the capacity controllers,
defragmentation) act only while this process is the leader: ``leadership.Leadership`` holds one Lease
for the process and hands every such controller a ``Leader`` (see docs/design.md, "Leader election").
``leader_gated_loop`` is the reconcile loop they share.

This module imports no Kubernetes client: the controllers' option declarations import it, and so does
every ``tf-extender`` command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# The process's Lease. Its name is the one the expander held alone before the controllers shared one
# leader, so RBAC (resourceNames), dashboards and alerts keep working.
LEADER_LEASE = "tensor-fusion-expander"
# The Leases the capacity controllers and defragmentation held on their own before. A new process takes
# them too, after LEADER_LEASE, and leads only once it holds all of them: an old replica in the same
# rolling update (which knows only its own per-controller Leases) then never acts beside a new one.
LEGACY_LEASES = ("tensor-fusion-capacity", "tensor-fusion-defrag")
# client-go's defaults (LeaseDuration, RenewDeadline, RetryPeriod): a leader that has not renewed for the
# deadline stops acting, and the deadline is shorter than the duration another replica waits before it
# takes the Lease, so the two never act at once (docs/design.md, "Leader election").
LEASE_DURATION_SECONDS = 15.0
LEASE_RENEW_DEADLINE_SECONDS = 10.0
LEASE_RENEW_SECONDS = 2.0
SETTLE_SECONDS = 0.5  # after a wake-up, let a burst of watch events settle before reconciling


class Controller(Protocol):
    """A background loop of the process: ``run`` returns only when cancelled."""

    @property
    def name(self) -> str: ...

    def run(self) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Loop:
    """A controller made of a name and a coroutine function (most loops are a method of an object that
    has more to do than run, e.g. answer the filter hook)."""

    name: str
    loop: Callable[[], Awaitable[None]]

    def run(self) -> Awaitable[None]:
        return self.loop()


def start(controllers: Iterable[Controller]) -> list[asyncio.Task[None]]:
    """One task per controller, named after it."""
    return [asyncio.create_task(_awaited(c.run()), name=c.name) for c in controllers]


async def stop(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Cancel every controller, then wait for each to end, whatever it ends with."""
    await cancel_and_wait(tasks)


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


class Leader(Protocol):
    """Whether this process may act on the cluster now."""

    @property
    def is_leader(self) -> bool: ...


async def leader_gated_loop(name: str, leader: Leader, reconcile: Callable[[dt.datetime], Awaitable[Any]],
                            interval: float, wake: asyncio.Event | None = None,
                            settle: float = SETTLE_SECONDS) -> None:
    """Reconcile while leader, every ``interval`` seconds, or sooner when ``wake`` is set (then after
    ``settle`` seconds more). A failed reconcile is logged and retried on the next round."""
    while True:
        if leader.is_leader:
            try:
                await reconcile(dt.datetime.now(dt.UTC))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                from extender.kube.client import error_message

                log.exception("%s reconcile failed", name, extra={"error": error_message(exc)})
        if wake is None:
            await asyncio.sleep(interval)
            continue
        # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (shutdown hangs)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await wake.wait()
        wake.clear()
        await asyncio.sleep(settle)
