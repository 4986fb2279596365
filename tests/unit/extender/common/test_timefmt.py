"""One Go-duration parser and one RFC 3339 parser, on exactly the inputs their former copies disagreed on.

Durations had two copies: the pool settings' (planning/pool.py: h, m, s, ms; digits.digits; float seconds)
and defrag's (controllers/defrag/config.py: Go's units and number forms; a timedelta). Timestamps had
three: planning/pool.py's and kube/lease.py's (None when unreadable, naive read as UTC; only the first
ignored surrounding spaces) and server/stranded.py's (any object through str(), a naive time kept naive, so
comparing it with an aware "now" raised TypeError).
"""

from __future__ import annotations

import datetime as dt

import pytest

from extender.common.timefmt import DurationOverflowError, format_age, parse_duration, parse_time

UTC = dt.UTC


@pytest.mark.parametrize(("text", "seconds", "pool_said", "defrag_said"), [
    (".5h", 1800, "error", "1800 s"),
    ("1.h", 3600, "error", "3600 s"),
    ("1500us", 0.0015, "error", "0.0015 s"),
    ("1500µs", 0.0015, "error", "0.0015 s"),
    ("3000000ns", 0.003, "error", "0.003 s"),
])
def test_go_number_forms_and_units_are_durations(text: str, seconds: float, pool_said: str,
                                                 defrag_said: str) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "both_said"), [
    ("0", "error"),  # Go reads a bare 0; every duration here needs its unit
    ("-1h", "error"),
    ("+1h", "error"),
    ("   ", "error"),
])
def test_a_duration_without_a_unit_or_with_a_sign_is_an_error(text: str, both_said: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_zero_with_a_unit_is_a_duration() -> None:
    assert parse_duration("0s") == dt.timedelta(0)


@pytest.mark.parametrize(("value", "expected", "copies_said"), [
    (" 2026-01-01T00:00:00Z ", dt.datetime(2026, 1, 1, tzinfo=UTC), "pool: this time; lease, stranded: None"),
    ("2026-01-01T00:00:00", dt.datetime(2026, 1, 1, tzinfo=UTC), "stranded: a naive time (TypeError later)"),
    (20260101, None, "stranded: str() of it, read as a naive 2026-01-01; pool and lease: None"),
    ("", None, "stranded: None through ValueError; the others: None"),
    ("yesterday", None, "all: None"),
])
def test_rfc3339_times(value: object, expected: dt.datetime | None, copies_said: str) -> None:
    assert parse_time(value) == expected


def test_an_offset_is_kept_and_compares_with_utc() -> None:
    parsed = parse_time("2026-01-01T02:00:00+02:00")
    assert parsed == dt.datetime(2026, 1, 1, tzinfo=UTC)
    assert parsed is not None and parsed.utcoffset() == dt.timedelta(hours=2)


# --- the forms every duration takes ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("1h30m", 5400), ("90s", 90), ("250ms", 0.25)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "5", "m5", "5 m", "5d"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)



@pytest.mark.parametrize(("seconds", "age"), [
    (-3, "0s"), (0, "0s"), (45, "45s"), (119, "119s"), (330, "5m30s"), (300, "5m"), (1500, "25m"),
    (12000, "3h20m"), (72000, "20h"), (273600, "3d4h"), (29056997, "336d"), (8 * 86400 + 5, "8d"),
])
def test_ages_read_as_kubectl_prints_them(seconds: float, age: str) -> None:
    assert format_age(seconds) == age
@pytest.mark.parametrize("text", ["99999999999999h", "9" * 400 + "s", "1" * 5000 + "h"])
def test_a_duration_that_overflows_is_a_named_value_error(text: str) -> None:
    """Longer than a timedelta holds: the ValueError every caller already names the setting for, not an
    OverflowError that escapes them (serve --bind-deadline, plan --protection-time, every CRD duration)."""
    with pytest.raises(DurationOverflowError, match="is longer than any duration can be") as exc:
        parse_duration(text)
    assert isinstance(exc.value, ValueError) and len(str(exc.value)) < 200


@pytest.mark.parametrize("value", [None, 5, 1.5, ["5m"], {"m": 5}, True])
def test_a_duration_that_is_not_text_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(value)  # type: ignore[arg-type]
