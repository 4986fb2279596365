"""The two time formats of Kubernetes objects: Go durations and RFC 3339 timestamps.

One rule for bad input each: :func:`parse_duration` raises ``ValueError`` (a setting that cannot be read is
the user's to fix, and the caller says which setting); :func:`parse_time` answers None (a timestamp that
cannot be read counts as absent, as an unset one does).
"""

from __future__ import annotations

import datetime as dt
import re

from extender.common.numbers import shown

# Go's time.ParseDuration units, and its number forms: "1", "1.5", "1." and ".5".
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}


class DurationOverflowError(ValueError):
    """A duration longer than a ``timedelta`` holds (``99999999999999h``): a ``ValueError`` like any other
    bad duration, so every caller that names a bad setting names this one too."""


MAX_DURATION_DAYS = dt.timedelta.max.days


def parse_duration(text: str) -> dt.timedelta:
    """A Go duration (``5m``, ``1h30m``, ``1.5h``, ``250ms``); surrounding spaces are ignored.

    Every part needs a unit, so a bare number (``5``, even ``0``) is refused; so is a sign: nothing here
    takes a negative duration. ``ValueError`` for anything else that is not a duration.
    """
    if not isinstance(text, str):
        raise ValueError(f"{shown(text)} is not a duration like 90s, 5m or 1h30m")
    raw = text.strip()
    position, seconds = 0, 0.0
    for match in _DURATION_PART.finditer(raw):
        if match.start() != position:
            break
        seconds += float(match[1]) * _UNIT_SECONDS[match[2]]
        position = match.end()
    if not raw or position != len(raw):
        raise ValueError(f"{shown(text)} is not a duration like 90s, 5m or 1h30m")
    try:
        return dt.timedelta(seconds=seconds)
    except OverflowError:
        raise DurationOverflowError(f"{shown(text)} is longer than any duration can be "
                                    f"(at most {MAX_DURATION_DAYS:,} days)") from None


def parse_time(value: object) -> dt.datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset; surrounding spaces ignored) as an aware datetime.

    One without an offset is taken as UTC. None for anything else: not a string, blank, or unreadable.
    """
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_duration(seconds: float) -> str:
    """``seconds`` as the shortest Go duration that reads back the same: 900 as ``15m``, 55 as ``55s``,
    5400 as ``1h30m``, 0.25 as ``250ms``, 0 as ``0s``."""
    if seconds < 0:
        raise ValueError(f"{seconds} is negative")
    if seconds == 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole, fraction = divmod(seconds, 1)
    hours, rest = divmod(int(whole), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if secs or fraction:
        parts.append(f"{secs + fraction:g}s")
    return "".join(parts)


def format_age(seconds: float) -> str:
    """An age as ``kubectl get`` prints one: ``45s``, ``5m30s``, ``25m``, ``3h20m``, ``20h``, ``3d4h``, ``8d``
    (the precision fading with the age; negative ages read as ``0s``)."""
    s = max(int(seconds), 0)
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"
