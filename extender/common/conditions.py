"""Kubernetes status conditions (``metav1.Condition``): one merge rule for every writer.

A writer owns one condition type and sets it in a list others write to as well: the other types stay as
they are, and ``lastTransitionTime`` moves only when the status does (kubectl and alerts read it as "since
when"). Pure; the callers patch the result.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any


def timestamp(now: dt.datetime | None = None) -> str:
    """RFC 3339 in UTC, to the second, as the API server writes times."""
    return (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == kind), None)


def with_condition(conditions: Iterable[Mapping[str, Any]] | None, wanted: Mapping[str, str],
                   now: str | None = None) -> list[dict[str, Any]]:
    """``conditions`` with the one of ``wanted["type"]`` set to ``wanted`` (type, status, reason,
    message); unchanged, and in place, when it already reads so."""
    listed = [dict(c) for c in conditions or [] if isinstance(c, Mapping)]
    current = find(listed, wanted["type"])
    if current is not None and all(current.get(k) == v for k, v in wanted.items()):
        return listed
    stamp = now or timestamp()
    if current is not None and current.get("status") == wanted["status"] \
            and current.get("lastTransitionTime"):
        stamp = str(current["lastTransitionTime"])
    entry = {**wanted, "lastTransitionTime": stamp}
    if current is None:
        return [*listed, entry]
    return [entry if c.get("type") == wanted["type"] else c for c in listed]
