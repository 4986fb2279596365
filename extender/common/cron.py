"""Five-field cron schedules (``minute hour day-of-month month day-of-week``), evaluated in a time zone.

Fields take ``*``, numbers, ranges ``a-b``, steps ``*/n`` and ``a-b/n`` (``a/n`` runs to the field's end),
and comma lists; months ``JAN``-``DEC`` and weekdays ``SUN``-``SAT`` by name, weekday 7 is Sunday. As in
Vixie cron, when both day fields are restricted a day matches either. ``@hourly``, ``@daily``
(``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly`` (``@annually``) are accepted.

A schedule fires at a local wall-clock minute: ``fire_between`` walks the UTC minutes of an interval and
reads each on the zone's clock, so a minute that daylight saving skips never fires and one it repeats
fires once (the first time).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from extender.common.numbers import MAX_DIGITS, parse_int, shown

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
# name, lowest, highest, names for lowest.. (or None)
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
MAX_CATCH_UP = dt.timedelta(hours=1)


class CronError(ValueError):
    """The expression is not a five-field cron schedule; the message says which field."""


@dataclass(frozen=True)
class CronSchedule:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, text: str) -> CronSchedule:
        expression = _MACROS.get(text.strip().lower(), text)
        parts = expression.split()
        if len(parts) != 5:
            raise CronError("need five fields (minute hour day-of-month month day-of-week), "
                            f"got {len(parts)}")
        sets = [_field(part, *spec) for part, spec in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(text, sets[0], sets[1], sets[2], sets[3], weekdays,
                   not parts[2].startswith("*"), not parts[4].startswith("*"))

    def matches(self, local: dt.datetime) -> bool:
        """Whether the schedule fires at this wall-clock minute (seconds ignored)."""
        return (local.minute in self.minutes and local.hour in self.hours and local.month in self.months
                and self._day_matches(local))

    def fire_between(self, after: dt.datetime, until: dt.datetime, zone: ZoneInfo) -> dt.datetime | None:
        """The last minute in (``after``, ``until``] (aware datetimes) at which the schedule fires on the
        zone's clock, as an aware UTC minute; None when none does. Looks back at most ``MAX_CATCH_UP``."""
        start = max(after, until - MAX_CATCH_UP)
        minute = until.astimezone(dt.UTC).replace(second=0, microsecond=0)
        while minute > start:
            if self.matches(minute.astimezone(zone).replace(tzinfo=None)) and not _repeated(minute, zone):
                return minute
            minute -= dt.timedelta(minutes=1)
        return None

    def next_fire(self, after: dt.datetime, zone: ZoneInfo,
                  horizon_days: int = 366 * 5) -> dt.datetime | None:
        """The first UTC minute strictly after ``after`` at which the schedule fires (None when none does
        within the horizon: e.g. ``0 0 30 2 *``)."""
        minute = after.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        end = minute + dt.timedelta(days=horizon_days)
        while minute < end:
            local = minute.astimezone(zone).replace(tzinfo=None)
            if local.month in self.months and self._day_matches(local) and local.hour in self.hours:
                if local.minute in self.minutes and not _repeated(minute, zone):
                    return minute
                minute += dt.timedelta(minutes=1)
            else:  # the day or hour does not match: on to the next hour of the local clock
                minute += dt.timedelta(minutes=60 - local.minute)
        return None

    def _day_matches(self, local: dt.datetime) -> bool:
        day_ok = local.day in self.days
        weekday_ok = (local.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return day_ok or weekday_ok
        return day_ok and weekday_ok


def _repeated(minute: dt.datetime, zone: ZoneInfo) -> bool:
    """Whether this UTC minute shows a local time the zone's clock already showed (a fall-back hour)."""
    local = minute.astimezone(zone).replace(tzinfo=None)
    for back in (30, 60, 120):  # the clock changes of every zone in use are among these
        earlier = (minute - dt.timedelta(minutes=back)).astimezone(zone).replace(tzinfo=None)
        if earlier == local:
            return True
    return False


def _value(token: str, low: int, high: int, names: tuple[str, ...] | None, field: str) -> int:
    upper = token.upper()
    if names is not None and upper in names:
        return low + names.index(upper)
    if not token.isdigit() or len(token) > MAX_DIGITS:
        raise CronError(f"{field} field: {shown(token)} is not a number")
    number = parse_int(token)
    if not low <= number <= high:
        raise CronError(f"{field} field: {number} is outside {low}-{high}")
    return number


def _field(part: str, field: str, low: int, high: int, names: tuple[str, ...] | None) -> frozenset[int]:
    values: set[int] = set()
    for item in part.split(","):
        if not item:
            raise CronError(f"{field} field: empty list item in {shown(part)}")
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or len(step_text) > MAX_DIGITS or parse_int(step_text) == 0:
                raise CronError(f"{field} field: step {shown(step_text)} must be a positive number")
            step = parse_int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _value(a, low, high, names, field), _value(b, low, high, names, field)
            if first > last:
                raise CronError(f"{field} field: range {shown(base)} runs backwards")
        else:
            first = _value(base, low, high, names, field)
            last = high if step_text else first
        values.update(range(first, last + 1, step))
    return frozenset(values)
