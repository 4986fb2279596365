"""Keeping Karpenter from consolidating nodes under fractional GPU pods.

Karpenter's consolidation is GPU-blind: where nodes advertise ``tensor-fusion.ai/index_*`` it believes a
fractional GPU pod "fits elsewhere" by CPU and memory, deletes its node, and the evicted pod then finds no
GPU share free. A pod annotated ``karpenter.sh/do-not-disrupt: "true"`` blocks voluntary disruption of its
node, so the webhook can put that annotation on every pod it mutates.

``--karpenter-do-not-disrupt``: ``true`` always, ``false`` never, ``auto`` (default) while the API server
serves Karpenter's NodeClaims (``karpenter.sh/v1``), checked at start and every ``interval`` seconds, so
installing Karpenter later needs no webhook restart. A pod that already carries the annotation keeps its
own value.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from extender.common.labels import DO_NOT_DISRUPT, KARPENTER_GROUP
from extender.common.tasks import cancel_and_wait

KARPENTER_API = f"/apis/{KARPENTER_GROUP}/v1"
DEFAULT_INTERVAL_SECONDS = 30.0

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[bool | None]]


class Mode(StrEnum):
    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


def add_do_not_disrupt(annotations: dict[str, Any]) -> None:
    """Set the annotation unless the pod chose a value itself."""
    annotations.setdefault(DO_NOT_DISRUPT, "true")


def serves_nodeclaims(discovery: Any) -> bool:
    """Whether an APIResourceList (``GET /apis/karpenter.sh/v1``) lists nodeclaims."""
    resources = discovery.get("resources") if isinstance(discovery, dict) else None
    return any(isinstance(r, dict) and r.get("name") == "nodeclaims" for r in resources or ())


class DoNotDisruptSwitch:
    """Whether mutated pods get the annotation now. ``probe`` answers True/False, or None when it cannot
    tell (the last answer stays)."""

    def __init__(self, mode: Mode, probe: Probe | None = None,
                 interval: float = DEFAULT_INTERVAL_SECONDS) -> None:
        if mode is Mode.AUTO and probe is None:
            raise ValueError("auto mode needs a probe")
        self.mode = mode
        self._probe = probe
        self.interval = interval
        self._detected = False

    @property
    def enabled(self) -> bool:
        if self.mode is Mode.AUTO:
            return self._detected
        return self.mode is Mode.TRUE

    async def refresh(self) -> None:
        if self._probe is None:
            return
        try:
            found = await self._probe()
        except Exception as exc:  # keep the last answer; the next round tries again
            log.warning("cannot tell whether Karpenter is installed", extra={"error": repr(exc)})
            return
        if found is not None and found != self._detected:
            log.info("karpenter do-not-disrupt", extra={"karpenter_crds": found, "enabled": found})
            self._detected = found

    async def run(self) -> None:
        """Probe until cancelled (auto mode only)."""
        if self.mode is not Mode.AUTO:
            return
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)


def api_probe(api_client: Any) -> Probe:
    """A probe asking the API server's discovery (readable by every authenticated user)."""
    from extender.kube.client import get_or_none

    async def probe() -> bool | None:
        return serves_nodeclaims(await get_or_none(api_client, KARPENTER_API))  # 404: Karpenter is not there

    return probe


@contextlib.asynccontextmanager
async def running(switch: DoNotDisruptSwitch) -> Any:
    """The switch's first answer before serving, then its refresh loop in the background."""
    if switch.mode is Mode.AUTO:
        await switch.refresh()
    task = asyncio.create_task(switch.run(), name="karpenter-do-not-disrupt")
    try:
        yield switch
    finally:
        await cancel_and_wait([task])
