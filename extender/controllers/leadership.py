"""One leader election for the whole process (see docs/design.md, "Leader election")."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from extender.controllers import (
    LEADER_LEASE,
    LEASE_DURATION_SECONDS,
    LEASE_RENEW_DEADLINE_SECONDS,
    LEASE_RENEW_SECONDS,
    LEGACY_LEASES,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_NAMESPACE = "tensor-fusion-sys"
ENV_NAMESPACE = "TF_EXPANSION_LEASE_NAMESPACE"
# The namespace a pod runs in, from the downward API; the Lease defaults to it.
ENV_POD_NAMESPACE = "POD_NAMESPACE"


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """The Lease's namespace (the flag keeps the name it had when only the expander was leader-elected)."""
    env = os.environ if environ is None else environ
    group = parser.add_argument_group("leader election")
    group.add_argument(
        "--expansion-lease-namespace", dest="expansion_lease_namespace", metavar="NAMESPACE",
        default=env.get(ENV_NAMESPACE) or env.get(ENV_POD_NAMESPACE) or DEFAULT_NAMESPACE,
        help=f"namespace of the Lease {LEADER_LEASE} that keeps one active set of controllers per cluster "
             f"(env {ENV_NAMESPACE}, else {ENV_POD_NAMESPACE})",
    )


def from_args(args: argparse.Namespace) -> str:
    """The Lease's namespace."""
    return str(args.expansion_lease_namespace)


def new_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class HeldLease(Protocol):
    """One Lease as ``LeaseKeeper`` takes, renews and releases it."""

    name: str
    namespace: str
    identity: str

    @property
    def is_leader(self) -> bool: ...

    async def try_acquire(self) -> bool: ...

    async def observe(self) -> None: ...

    def expires_in(self) -> float | None: ...

    async def release(self) -> None: ...


class Leadership:
    """One leader election for the process: ``LEADER_LEASE``, then each of ``legacy`` in order.

    The Leases are taken in one fixed order and a later one is only taken while the earlier ones are
    held, so two new replicas can never each hold a part and wait for the other. Losing ``LEADER_LEASE``
    to another holder gives up the later ones at once, so the new leader gets them without waiting for
    them to expire.

    Every round still *reads* the Leases it does not get to take, so each one's expiry clock starts at
    the first round: a replica whose predecessor died holding all of them leads one Lease duration after
    it first read them, not one duration per Lease. A standby does the same every round, so a failover
    waits one duration from the last renewal it saw.

    Each round runs every ``renew_seconds``, or sooner when a Lease it waits on expires before then; one
    Lease's read and write get at most ``renew_deadline`` seconds, the time a ``LeaseKeeper`` stays
    leader after its last renewal, so a hung API call ends leadership on time instead of holding up the
    round."""

    def __init__(self, keepers: Sequence[HeldLease], renew_seconds: float = LEASE_RENEW_SECONDS,
                 renew_deadline: float = LEASE_RENEW_DEADLINE_SECONDS) -> None:
        if not keepers:
            raise ValueError("a leadership needs at least one Lease")
        self.keepers = tuple(keepers)
        self.renew_seconds = renew_seconds
        self.renew_deadline = renew_deadline

    @classmethod
    def of(cls, api_client: Any, namespace: str, identity: str | None = None, *,
           names: Sequence[str] = (LEADER_LEASE, *LEGACY_LEASES),
           duration_seconds: float = LEASE_DURATION_SECONDS,
           renew_deadline: float = LEASE_RENEW_DEADLINE_SECONDS,
           renew_seconds: float = LEASE_RENEW_SECONDS) -> Leadership:
        from extender.kube.lease import LeaseKeeper  # here: the option declarations import this module

        who = identity or new_identity()
        return cls([LeaseKeeper(api_client, name, namespace, who, duration_seconds=duration_seconds,
                                renew_deadline_seconds=renew_deadline) for name in names],
                   renew_seconds, renew_deadline)

    @property
    def is_leader(self) -> bool:
        return all(keeper.is_leader for keeper in self.keepers)

    async def step(self) -> bool:
        """Take or renew the Leases in order; True when all are held. The ones after the first not held
        are only read (``observe``), so their expiry clocks run while this replica waits."""
        for position, keeper in enumerate(self.keepers):
            try:
                held = await self._bounded(keeper.try_acquire())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # kept while fresh (LeaseKeeper.is_leader); retried next round
                self._warn(keeper, exc)
                return False
            if not held:
                if position == 0:
                    await self._release(self.keepers[1:])
                await self._observe(self.keepers[position + 1:])
                return False
        return True

    def pause(self) -> float:
        """Seconds until the next round: ``renew_seconds``, or less when a Lease waited on expires sooner."""
        waits = [left for keeper in self.keepers
                 if (left := keeper.expires_in()) is not None and left > 0]
        return min([self.renew_seconds, *waits])

    async def _bounded(self, call: Awaitable[_T]) -> _T:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the call ends as
        # the task is cancelled, swallowing the cancellation, and a stopping replica then renews forever
        # (seen under load in the two-replica e2e)
        async with asyncio.timeout(self.renew_deadline):
            return await call

    async def _observe(self, keepers: Sequence[HeldLease]) -> None:
        for keeper in keepers:
            try:
                await self._bounded(keeper.observe())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # its clock keeps the last record read; read again next round
                self._warn(keeper, exc)
                return

    @staticmethod
    def _warn(keeper: HeldLease, exc: Exception) -> None:
        from extender.kube.client import error_message

        error = "no answer within the renew deadline" if isinstance(exc, TimeoutError) else error_message(exc)
        log.warning("lease not renewed", extra={"lease": keeper.name, "error": error})

    async def run(self) -> None:
        """Renew every ``renew_seconds`` until cancelled; release the Leases on the way out."""
        try:
            while True:
                was_leader = self.is_leader
                await self.step()
                if was_leader != self.is_leader:
                    first = self.keepers[0]
                    log.info("leadership %s", "acquired" if self.is_leader else "lost",
                             extra={"lease": f"{first.namespace}/{first.name}", "identity": first.identity})
                await asyncio.sleep(self.pause())
        finally:
            await asyncio.shield(self._release(self.keepers))

    async def _release(self, keepers: Sequence[HeldLease]) -> None:
        for keeper in reversed(keepers):
            with contextlib.suppress(Exception):
                await keeper.release()
