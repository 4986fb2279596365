"""Cron schedules exactly as TensorFusion reads them: robfig/cron v3.0.1 with TensorFusion's parser options
(``Minute | Hour | Dom | Month | Dow``, in ``internal/autoscaler/recommender/cron_recommender.go`` and
``internal/controller/gpupool_compaction_controller.go``), its grammar from robfig's ``parser.go`` and its
``Next`` from ``spec.go``.

Grammar (``CronSchedule.parse``):

- an optional ``CRON_TZ=<zone> `` or ``TZ=<zone> `` prefix at the very start (the zone runs to the first
  space; an empty zone is UTC, ``Local`` the caller's default zone);
- then exactly five fields separated by white space: minute (0-59), hour (0-23), day of month (1-31),
  month (1-12 or ``jan``-``dec``), day of week (0-6 or ``sun``-``sat``; 7 is refused); names in any case;
- a field is a comma list (empty items are skipped) of ``*`` or ``?`` (every value), ``n``, ``a-b``, each
  optionally followed by ``/step``; ``n/step`` runs from n to the field's end; numbers as Go's ``Atoi``
  reads them (``+5`` and ``05`` are 5);
- descriptors (``@daily``, ``@every 1h``...) are refused: TensorFusion's parser is built without them.

Days: a day matches when both day fields match, unless neither field holds a plain ``*``/``?`` (``*/1``
counts as one, ``*/2`` does not), then when either does.

``next`` is robfig's ``SpecSchedule.Next`` step by step: it walks months and days on the zone's calendar
and hours and minutes in absolute time, so a local hour that daylight saving repeats fires again in its
second pass and a skipped one never fires. No firing within five years is ``None`` (robfig's zero time).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MONTH_NAMES = {n: i + 1 for i, n in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
DAY_NAMES = {n: i for i, n in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
STAR_BIT = 1 << 63
# name, lowest, highest, names
_FIELDS: tuple[tuple[str, int, int, dict[str, int] | None], ...] = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, MONTH_NAMES),
    ("day of week", 0, 6, DAY_NAMES),
)
ZONE_PREFIXES = ("TZ=", "CRON_TZ=")
LOCAL = "Local"
MAX_CATCH_UP = dt.timedelta(hours=1)
_GO_SPACE = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_ATOI = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


class CronError(ValueError):
    """The expression is not one TensorFusion's parser accepts; the message says which part."""


@dataclass(frozen=True)
class CronSchedule:
    text: str
    minute: int  # bit sets, as robfig's SpecSchedule (STAR_BIT: the field had a plain * or ?)
    hour: int
    dom: int
    month: int
    dow: int  # bit 0 = Sunday
    zone: str | None = None  # from a CRON_TZ=/TZ= prefix ("UTC" for an empty one); None: the caller's zone

    @classmethod
    def parse(cls, text: str) -> CronSchedule:
        """robfig's ``Parser.Parse`` with TensorFusion's options; raises ``CronError``."""
        spec = text
        if not spec:
            raise CronError("empty schedule")
        zone: str | None = None
        if spec.startswith(ZONE_PREFIXES):
            space = spec.find(" ")
            if space < 0:  # robfig slices to -1 here and panics; say what is missing instead
                raise CronError(f"{spec!r}: a space must separate the {spec.partition('=')[0]}= zone "
                                "from the five fields")
            name = spec[spec.find("=") + 1:space]
            zone = _zone_name(name)
            spec = _go_trim(spec[space:])
        if spec.startswith("@"):
            raise CronError(f"descriptors such as {spec.split()[0]!r} are not accepted (TensorFusion's "
                            "parser reads five fields only); write them out, e.g. '0 0 * * *' for @daily")
        parts = [p for p in _GO_SPACE.split(spec) if p]
        if len(parts) != 5:
            raise CronError("need five fields (minute hour day-of-month month day-of-week), "
                            f"got {len(parts)}")
        bits = [_field(part, *spec_) for part, spec_ in zip(parts, _FIELDS, strict=True)]
        minute, hour, dom, month, dow = bits
        return cls(text, minute, hour, dom, month, dow, zone)

    # the values each field holds, as sets
    @property
    def minutes(self) -> frozenset[int]:
        return _values(self.minute, 0, 59)

    @property
    def hours(self) -> frozenset[int]:
        return _values(self.hour, 0, 23)

    @property
    def days(self) -> frozenset[int]:
        return _values(self.dom, 1, 31)

    @property
    def months(self) -> frozenset[int]:
        return _values(self.month, 1, 12)

    @property
    def weekdays(self) -> frozenset[int]:
        return _values(self.dow, 0, 6)

    def resolve_zone(self, default: ZoneInfo) -> ZoneInfo:
        """The zone the schedule runs in: its prefix's, else ``default`` (robfig's process-local zone)."""
        if self.zone is None or self.zone == LOCAL:
            return default
        return ZoneInfo(self.zone)

    def matches(self, local: dt.datetime) -> bool:
        """Whether the schedule fires at this wall-clock minute (seconds ignored)."""
        return bool(self.minute >> local.minute & 1 and self.hour >> local.hour & 1
                    and self.month >> local.month & 1 and self._day_matches(local))

    def _day_matches(self, local: dt.datetime) -> bool:
        dom_match = bool(self.dom >> local.day & 1)
        dow_match = bool(self.dow >> (local.isoweekday() % 7) & 1)
        if self.dom & STAR_BIT or self.dow & STAR_BIT:
            return dom_match and dow_match
        return dom_match or dow_match

    def next(self, after: dt.datetime, zone: ZoneInfo) -> dt.datetime | None:
        """robfig's ``Next``: the first firing strictly after ``after`` (aware), as an aware UTC datetime,
        on the clock of ``zone``; None when none comes within five years."""
        whole = after.astimezone(dt.UTC)
        t = int((whole - _EPOCH) // dt.timedelta(seconds=1)) + 1  # the upcoming second
        found = self._next(t, zone)
        return None if found is None else _EPOCH + dt.timedelta(seconds=found)

    def _next(self, t: int, zone: ZoneInfo) -> int | None:
        added = False
        year_limit = _local(t, zone).year + 5
        while True:  # robfig's WRAP label
            if _local(t, zone).year > year_limit:
                return None
            wrapped = False
            while not self.month >> _local(t, zone).month & 1:
                if not added:
                    added = True
                    lt = _local(t, zone)
                    t = _go_date(lt.year, lt.month, 1, 0, 0, 0, zone)
                t = _add_date(t, zone, months=1)
                if _local(t, zone).month == 1:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not self._day_matches(_local(t, zone)):
                if not added:
                    added = True
                    lt = _local(t, zone)
                    t = _go_date(lt.year, lt.month, lt.day, 0, 0, 0, zone)
                t = _add_date(t, zone, days=1)
                hour = _local(t, zone).hour
                if hour != 0:  # midnight skipped or repeated by daylight saving
                    t += (24 - hour) * 3600 if hour > 12 else -hour * 3600
                if _local(t, zone).day == 1:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not self.hour >> _local(t, zone).hour & 1:
                if not added:
                    added = True
                    lt = _local(t, zone)
                    t = _go_date(lt.year, lt.month, lt.day, lt.hour, 0, 0, zone)
                t += 3600
                if _local(t, zone).hour == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            while not self.minute >> _local(t, zone).minute & 1:
                if not added:
                    added = True
                    t -= t % 60
                t += 60
                if _local(t, zone).minute == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            while _local(t, zone).second != 0:  # the seconds field is always 0
                if not added:
                    added = True
                t += 1
                if _local(t, zone).second == 0:
                    wrapped = True
                    break
            if wrapped:
                continue
            return t

    def fire_between(self, after: dt.datetime, until: dt.datetime, zone: ZoneInfo) -> dt.datetime | None:
        """The last firing in (``after``, ``until``] (aware datetimes) as an aware UTC datetime, following
        ``next`` from ``after``; None when none does. Looks back at most ``MAX_CATCH_UP``."""
        fired = None
        at = self.next(max(after, until - MAX_CATCH_UP), zone)
        while at is not None and at <= until:
            fired = at
            at = self.next(at, zone)
        return fired


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _zone_name(name: str) -> str:
    """A prefix's zone as Go's ``time.LoadLocation`` reads it: "" and "UTC" are UTC, "Local" the caller's."""
    if name in ("", "UTC"):
        return "UTC"
    if name == LOCAL:
        return LOCAL
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise CronError(f"{name!r} is not an IANA time zone") from exc
    return name


def _go_trim(text: str) -> str:
    """Go's ``strings.TrimSpace`` (Python's ``strip`` also drops a few control characters Go keeps)."""
    return re.sub(f"^{_GO_SPACE.pattern}|{_GO_SPACE.pattern}$", "", text)


def _local(t: int, zone: ZoneInfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, zone)


def _offset(t: int, zone: ZoneInfo) -> int:
    offset = _local(t, zone).utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


def _go_date(year: int, month: int, day: int, hour: int, minute: int, second: int, zone: ZoneInfo) -> int:
    """Go's ``time.Date`` in ``zone``, as Unix seconds: overflowing fields roll over, and a wall time that
    daylight saving skips or repeats is resolved as Go resolves it (the offset in force at the wall time
    read as UTC, corrected once)."""
    year += (month - 1) // 12
    month = (month - 1) % 12 + 1
    days = (dt.date(year, month, 1) - dt.date(1970, 1, 1)).days + day - 1
    unix = days * 86400 + hour * 3600 + minute * 60 + second
    offset = _offset(unix, zone)
    if offset != 0:
        offset = _offset(unix - offset, zone)
    return unix - offset


def _add_date(t: int, zone: ZoneInfo, months: int = 0, days: int = 0) -> int:
    """Go's ``Time.AddDate(0, months, days)`` in ``zone``."""
    lt = _local(t, zone)
    return _go_date(lt.year, lt.month + months, lt.day + days, lt.hour, lt.minute, lt.second, zone)


def _values(bits: int, low: int, high: int) -> frozenset[int]:
    return frozenset(v for v in range(low, high + 1) if bits >> v & 1)


def _atoi(token: str, field: str) -> int:
    """Go's ``strconv.Atoi`` then robfig's refusal of negatives."""
    if not _ATOI.fullmatch(token) or abs(int(token)) > _INT64_MAX + (token.startswith("-")):
        raise CronError(f"{field} field: {token!r} is not a number")
    number = int(token)
    if number < 0:
        raise CronError(f"{field} field: negative number {token!r}")
    return number


def _number_or_name(token: str, names: dict[str, int] | None, field: str) -> int:
    if names is not None and token.lower() in names:
        return names[token.lower()]
    return _atoi(token, field)


def _field(part: str, field: str, low: int, high: int, names: dict[str, int] | None) -> int:
    """robfig's ``getField``: the bits of a comma list of ranges (empty items skipped)."""
    bits = 0
    for expr in (e for e in part.split(",") if e):
        bits |= _range(expr, field, low, high, names)
    return bits


def _range(expr: str, field: str, low: int, high: int, names: dict[str, int] | None) -> int:
    """robfig's ``getRange``: ``*``/``?``, ``n`` or ``a-b``, then an optional ``/step``."""
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    extra = 0
    if low_and_high[0] in ("*", "?"):
        start, end, extra = low, high, STAR_BIT
    else:
        start = _number_or_name(low_and_high[0], names, field)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _number_or_name(low_and_high[1], names, field)
        else:
            raise CronError(f"{field} field: too many hyphens in {expr!r}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _atoi(range_and_step[1], field)
        if len(low_and_high) == 1:  # n/step runs to the field's end
            end = high
        if step > 1:
            extra = 0
    else:
        raise CronError(f"{field} field: too many slashes in {expr!r}")
    for value in (start, end):
        if not low <= value <= high:
            raise CronError(f"{field} field: {value} is outside {low}-{high} in {expr!r}")
    if start > end:
        raise CronError(f"{field} field: range {expr!r} runs backwards")
    if step == 0:
        raise CronError(f"{field} field: step {range_and_step[1]!r} must be a positive number")
    bits = 0
    for value in range(start, end + 1, step):
        bits |= 1 << value
    return bits | extra
