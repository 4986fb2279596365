"""Cron schedules in a time zone as TensorFusion reads them (robfig/cron v3.0.1, ``parser.go`` and
``spec.go``, with the options of TensorFusion's ``cron_recommender.go``): fields, day semantics, and the
minute a schedule fires (fake clock). test_cron_differential.py checks the same against the Go code."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.cron import CronError, CronSchedule

UTC = dt.UTC


def utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires(expr: str, zone: str, start: str, minutes: int) -> list[str]:
    """Walk a fake clock forward one minute at a time, asking as the live loop does."""
    schedule, tz = CronSchedule.parse(expr), ZoneInfo(zone)
    out = []
    last = utc(start)
    for step in range(1, minutes + 1):
        now = utc(start) + dt.timedelta(minutes=step, seconds=7)
        fired = schedule.fire_between(last, now, tz)
        if fired is not None:
            out.append(fired.strftime("%Y-%m-%dT%H:%M"))
        last = now
    return out


@pytest.mark.parametrize(("expr", "zone", "start", "minutes", "expected"), [
    # 03:00 in Shanghai (UTC+8) is 19:00 UTC the day before
    ("0 3 * * *", "Asia/Shanghai", "2026-03-01T12:00", 24 * 60, ["2026-03-01T19:00"]),
    ("0 3 * * *", "UTC", "2026-03-01T12:00", 24 * 60, ["2026-03-02T03:00"]),
    # India is UTC+5:30: the local hour starts at half past
    ("0 3 * * *", "Asia/Kolkata", "2026-03-01T12:00", 24 * 60, ["2026-03-01T21:30"]),
    ("*/20 9 * * *", "Europe/Berlin", "2026-01-10T07:00", 180, ["2026-01-10T08:00", "2026-01-10T08:20",
                                                               "2026-01-10T08:40"]),
    # New York springs forward at 02:00 on 8 March 2026: 02:30 does not exist that day
    ("30 2 * * *", "America/New_York", "2026-03-07T12:00", 48 * 60, ["2026-03-09T06:30"]),
    # ... and falls back on 1 November: 01:30 happens twice, and robfig steps hours and minutes in absolute
    # time, so the schedule fires in both passes (spec.go)
    ("30 1 * * *", "America/New_York", "2026-11-01T00:00", 24 * 60, ["2026-11-01T05:30", "2026-11-01T06:30"]),
    # Berlin falls back on 25 October 2026 (03:00 CEST -> 02:00 CET): 02:30 twice
    ("30 2 * * *", "Europe/Berlin", "2026-10-24T22:00", 12 * 60, ["2026-10-25T00:30", "2026-10-25T01:30"]),
    # ... and springs forward on 29 March (02:00 CET -> 03:00 CEST): 02:30 never
    ("30 2 * * *", "Europe/Berlin", "2026-03-28T22:00", 12 * 60, []),
    # weekdays only: 2026-03-06 is a Friday, 07 Saturday, 08 Sunday, 09 Monday
    ("0 3 * * MON-FRI", "UTC", "2026-03-06T00:00", 4 * 24 * 60, ["2026-03-06T03:00", "2026-03-09T03:00"]),
])
def test_fires_at_the_right_minute(expr, zone, start, minutes, expected):
    assert fires(expr, zone, start, minutes) == expected


def test_a_late_look_catches_up_once_within_the_hour():
    schedule = CronSchedule.parse("0 3 * * *")
    fired = schedule.fire_between(utc("2026-03-02T02:50"), utc("2026-03-02T03:20"), ZoneInfo("UTC"))
    assert fired == utc("2026-03-02T03:00")
    assert schedule.fire_between(utc("2026-03-02T03:00"), utc("2026-03-02T03:20"), ZoneInfo("UTC")) is None
    # a look more than an hour late does not run a stale schedule
    assert schedule.fire_between(utc("2026-03-02T01:00"), utc("2026-03-02T04:30"), ZoneInfo("UTC")) is None


@pytest.mark.parametrize(("expr", "local", "expected"), [
    ("0 0 1 * *", "2026-03-01T00:00", True),
    ("0 0 1 * MON", "2026-03-02T00:00", True),  # both day fields restricted: either matches (Monday)
    ("0 0 1 * MON", "2026-03-01T00:00", True),  # ... (the 1st, a Sunday)
    ("0 0 1 * MON", "2026-03-03T00:00", False),
    ("0 0 * * 0", "2026-03-01T00:00", True),
    ("0 0 * * ?", "2026-03-01T00:00", True),
    # */k (k > 1) in a day field is not a star (parser.go), so either day field may match: the 3rd, a
    # Tuesday, is an odd day; the 2nd, a Monday, is a Monday; the 4th is neither
    ("0 0 */2 * 1", "2026-03-03T00:00", True),
    ("0 0 */2 * 1", "2026-03-02T00:00", True),
    ("0 0 */2 * 1", "2026-03-04T00:00", False),
    # */1 keeps the star: both must match
    ("0 0 */1 * 1", "2026-03-03T00:00", False),
    ("0 0 1 * */2", "2026-03-01T00:00", True),
    ("0 0 * JAN,MAR *", "2026-03-05T00:00", True),
    ("0 0 * FEB *", "2026-03-05T00:00", False),
    ("5-10/5 * * * *", "2026-03-05T07:10", True),
    ("5-10/5 * * * *", "2026-03-05T07:07", False),
    ("30/15 * * * *", "2026-03-05T07:45", True),
    ("0 0 * * sun-SAT", "2026-03-05T00:00", True),
    ("*-5 * * * *", "2026-03-05T07:33", True),  # robfig ignores what follows a star's hyphen
    ("0 0 1,,15 * *", "2026-03-15T00:00", True),  # empty list items are skipped
])
def test_matches(expr, local, expected):
    assert CronSchedule.parse(expr).matches(dt.datetime.fromisoformat(local)) is expected


def test_next_in_a_zone():
    schedule = CronSchedule.parse("0 3 * * *")
    assert schedule.next(utc("2026-03-01T12:00"), ZoneInfo("Asia/Shanghai")) == utc("2026-03-01T19:00")
    assert schedule.next(utc("2026-03-01T12:00"), ZoneInfo("Asia/Kolkata")) == utc("2026-03-01T21:30")
    # no firing within five years: robfig's zero time
    assert CronSchedule.parse("0 0 30 2 *").next(utc("2026-01-01T00:00"), ZoneInfo("UTC")) is None
    leap = CronSchedule.parse("0 0 29 2 *").next(utc("2026-01-01T00:00"), ZoneInfo("UTC"))
    assert leap == utc("2028-02-29T00:00")


@pytest.mark.parametrize(("expr", "zone"), [
    ("CRON_TZ=Europe/Berlin 0 9 * * 1-5", "Europe/Berlin"), ("TZ=Asia/Tokyo 0 9 * * *", "Asia/Tokyo"),
    ("CRON_TZ= 0 9 * * *", "UTC"), ("CRON_TZ=Local 0 9 * * *", "Local"), ("0 9 * * *", None),
])
def test_a_zone_prefix(expr, zone):
    assert CronSchedule.parse(expr).zone == zone


@pytest.mark.parametrize("expr", [
    "", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 13 *",
    "* * * * 7", "* * * * 0-7", "a-b * * * *", "*/x * * * *", "*/0 * * * *", "1-2-3 * * * *", "1/2/3 * * * *",
    "-1 * * * *", "5-3 * * * *", "0 0 * * monday", "0 0 L * *", "0x1 * * * *",
    # descriptors: TensorFusion's parser is built without robfig's Descriptor option
    "@daily", "@hourly", "@midnight", "@every 1h", "CRON_TZ=UTC @daily",
    # a zone prefix needs a known zone and a space (robfig panics without one)
    "CRON_TZ=Mars/Olympus 0 9 * * *", "CRON_TZ=UTC", " CRON_TZ=UTC 0 9 * * *", "TZ=Europe/Berlin\t0 9 * * *",
])
def test_refused_as_tensorfusion_refuses(expr):
    with pytest.raises(CronError):
        CronSchedule.parse(expr)


@pytest.mark.parametrize("expr", [
    "0 9 ? * *", "? ? ? ? ?", "0 9 1,,15 * *", "0 9 ,1 * *", "*-5 * * * *", "+5 0 * * *", "05 00 * * *",
    "0 0 * jan,DEC *", "0  9\t* *  *", "0 9 * * * ", "*/1 * * * *", "0 0 */31 * *",
])
def test_accepted_as_tensorfusion_accepts(expr):
    CronSchedule.parse(expr)


ZONES = ["UTC", "Asia/Shanghai", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Asia/Kolkata"]


@given(minute=st.integers(0, 59), hour=st.integers(0, 23), zone=st.sampled_from(ZONES),
       start=st.datetimes(min_value=dt.datetime(2026, 1, 1), max_value=dt.datetime(2027, 1, 1)))
def test_next_fire_agrees_with_the_minute_walk(minute, hour, zone, start):
    schedule = CronSchedule.parse(f"{minute} {hour} * * *")
    start = start.replace(tzinfo=UTC, second=0, microsecond=0)
    nxt = schedule.next(start, ZoneInfo(zone))
    assert nxt is not None and nxt - start <= dt.timedelta(days=2)
    # walking the clock from start to nxt, it fires exactly at nxt
    assert schedule.fire_between(nxt - dt.timedelta(minutes=1), nxt, ZoneInfo(zone)) == nxt
    assert schedule.fire_between(start, nxt - dt.timedelta(minutes=1), ZoneInfo(zone)) is None
