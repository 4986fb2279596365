"""What a Provisioned pool says when the cloud is out of every offering its gpuRequirements allow.

Each capacity error puts its offering aside for ``--capacity-backoff`` (``launch.create_instance``). When all
of a pool's offerings are aside the planner skips it with ``CapacityBackoff`` (its requirements do match);
this module turns that into one Warning event per change of the set of offerings and their errors (not one
per pass: a pass runs every few seconds), with the cloud's error for each and when the next try is, and
into the pool's ``CapacityAvailable`` condition, True again once an offering can be tried. Beside it, the
pool's ``provisioningPhase`` as TensorFusion writes it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extender.common.conditions import timestamp
from extender.common.contract import POOL_LABEL
from extender.common.timefmt import format_duration
from extender.controllers.capacity.gpunodeclaim import BOUND
from extender.controllers.capacity.launch_plan import offering_text

CONDITION = "CapacityAvailable"
EVENT = "CapacityBackoff"
Offering = tuple[str, str, str]  # (instance type, capacity type, zone)


def backoff_message(offerings: Sequence[Offering], errors: Mapping[Offering, str],
                    until: Mapping[Offering, float], monotonic_now: float, now: dt.datetime) -> str:
    """Every offering with the cloud's error, then the next try (the earliest end of a back-off)."""
    parts = [f"{offering_text(o)}: {errors.get(o) or 'no capacity'}" for o in offerings]
    ends = [until[o] for o in offerings if o in until]
    wait = max(min(ends) - monotonic_now, 0.0) if ends else 0.0
    at = timestamp(now + dt.timedelta(seconds=wait))
    return (f"the cloud is out of every offering the pool's gpuRequirements allow: {'; '.join(parts)}; "
            f"next try at {at} (in {format_duration(round(wait))})")


def provisioning_phase(pool: str, claims: Sequence[Mapping[str, Any]]) -> str | None:
    """TensorFusion's ``status.provisioningPhase`` of a Provisioned pool: ``Provisioning`` while a
    GPUNodeClaim of the pool is not Bound yet, ``Completed`` once all are; None (left as it is, the CRD's
    default ``None``) before the pool ever had one."""
    mine = [c for c in claims if ((c.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL) == pool
            and not (c.get("metadata") or {}).get("deletionTimestamp")]
    if not mine:
        return None
    bound = all((c.get("status") or {}).get("phase") == BOUND for c in mine)
    return "Completed" if bound else "Provisioning"


class BackoffReport:
    """Says once per change that a pool's offerings are all in back-off, and when that ends. The message is
    made when the news is, so the condition that carries it is written once too (a countdown in it would
    rewrite the pool's status every pass)."""

    def __init__(self) -> None:
        self._said: dict[str, tuple[tuple[tuple[Offering, str], ...], str]] = {}

    def news(self, pool: str, offerings: Sequence[Offering], errors: Mapping[Offering, str],
             make: Callable[[], str]) -> tuple[str, bool]:
        """The message for ``pool`` (``make()`` when this set of offerings and errors is new, else the one
        said before) and whether it is news."""
        key = tuple(sorted((o, errors.get(o, "")) for o in offerings))
        said = self._said.get(pool)
        if said is not None and said[0] == key:
            return said[1], False
        message = make()
        self._said[pool] = (key, message)
        return message, True

    def clear(self, pool: str) -> None:
        """The pool can try an offering again: a later back-off is news."""
        self._said.pop(pool, None)

    @staticmethod
    def condition(message: str | None) -> dict[str, Any]:
        if message is None:
            return {"type": CONDITION, "status": "True", "reason": "OfferingsAvailable",
                    "message": "at least one offering the pool's gpuRequirements allow can be launched"}
        return {"type": CONDITION, "status": "False", "reason": EVENT, "message": message}
