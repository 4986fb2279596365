"""Defragmentation settings of a GPUPool: defaults, and a clear message for every unusable value."""

from __future__ import annotations

import datetime as dt

import pytest

from extender.common.timefmt import parse_duration
from extender.controllers.defrag.config import DefragConfigError, parse_config


def pool(**defrag: object) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"nodeManagerConfig": {"nodeCompaction": {"defrag": defrag}}}}


def test_defaults():
    for obj in ({"metadata": {"name": "p"}}, {"spec": {"nodeManagerConfig": {}}}, pool()):
        config = parse_config(obj)
        assert config.enabled is False
        assert config.schedule.text == "0 3 * * *"
        assert config.timezone is None
        assert config.max_duration == dt.timedelta(hours=2)
        assert config.threshold_percent == 40
        assert config.scheduled is False


def test_every_field():
    config = parse_config(pool(enabled=True, schedule="*/15 1-5 * * MON-FRI", timezone="Asia/Shanghai",
                               maxDuration="1h30m", utilizationThresholdPercent=25))
    assert config.scheduled
    assert str(config.timezone) == "Asia/Shanghai"
    assert config.max_duration == dt.timedelta(minutes=90)
    assert config.threshold_percent == 25
    assert config.schedule.minutes == frozenset({0, 15, 30, 45})


@pytest.mark.parametrize(("defrag", "words"), [
    ({"enabled": True}, ["timezone is required when defrag is enabled"]),
    ({"enabled": True, "timezone": "Mars/Olympus"}, ["'Mars/Olympus' is not a known IANA time zone"]),
    ({"enabled": "yes", "timezone": "UTC"}, ["enabled must be true or false", "'yes'"]),
    ({"schedule": "TZ=UTC 0 3 * * *"}, ["must not carry a TZ= prefix", "timezone"]),
    ({"schedule": "0 3 * *"}, ["need five fields", "got 4"]),
    ({"schedule": "61 3 * * *"}, ["minute field", "61 is outside 0-59"]),
    ({"schedule": "0 3 * * FUN"}, ["day of week field", "'FUN'"]),
    ({"schedule": "*/0 * * * *"}, ["step '0' must be a positive number"]),
    ({"schedule": "0 5-3 * * *"}, ["range '5-3' runs backwards"]),
    ({"maxDuration": "two hours"}, ["maxDuration", "two hours"]),
    ({"maxDuration": "0s"}, ["maxDuration must be positive"]),
    ({"utilizationThresholdPercent": 101},
     ["utilizationThresholdPercent must be an integer from 0 to 100", "101"]),
    ({"utilizationThresholdPercent": "40"}, ["utilizationThresholdPercent", "'40'"]),
    ({"utilizationThresholdPercent": True}, ["utilizationThresholdPercent"]),
])
def test_bad_settings_are_refused_with_the_field_and_value(defrag, words):
    with pytest.raises(DefragConfigError) as caught:
        parse_config(pool(**defrag))
    assert "spec.nodeManagerConfig.nodeCompaction.defrag" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


def test_timezone_is_optional_while_disabled():
    assert parse_config(pool(enabled=False)).timezone is None


@pytest.mark.parametrize(("text", "seconds"), [
    ("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("1.5h", 5400), ("45s", 45), ("500ms", 0.5),
    ("1h0m10s", 3610),
])
def test_go_durations(text, seconds):
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "2", "h", "2 h", "-1h", "2d", "1h 30m"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_every_field_of_the_wrong_type_is_a_named_error_never_another_exception():
    from tests.unit.fixtures.sweep import sweep

    valid = {"metadata": {"name": "p"}, "spec": {"nodeManagerConfig": {"nodeCompaction": {"defrag": {
        "enabled": True, "schedule": "0 3 * * *", "timezone": "UTC", "maxDuration": "2h",
        "utilizationThresholdPercent": 40}}}}}

    def parse(obj: object) -> list[str]:
        try:
            parse_config(obj)  # type: ignore[arg-type]
        except DefragConfigError as exc:  # the named refusal; anything else escapes the sweep
            return [str(exc)]
        return []

    failures = sweep(valid, parse, named=lambda path: None if path[0] == "metadata" else str(path[-1]))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("max_duration", ["99999999999999h", "9" * 400 + "h", "200000h"])
def test_a_max_duration_that_overflows_is_named(max_duration: str):
    with pytest.raises(DefragConfigError, match="maxDuration"):
        parse_config(pool(maxDuration=max_duration))
