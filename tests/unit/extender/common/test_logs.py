"""The process's log lines: JSON with the extra fields, and the timestamp format they share."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.common.logs import Timestamps


@given(st.floats(min_value=0, max_value=4_102_444_800))  # 1970 to 2100
def test_timestamps_read_as_datetime_writes_them(now: float) -> None:
    expected = dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds")
    assert Timestamps()(now) == expected


@given(st.floats(min_value=0, max_value=4_102_444_800), st.floats(min_value=-1.5, max_value=1.5))
def test_timestamps_from_the_second_formatted_last_read_as_datetime_writes_them(now: float,
                                                                                step: float) -> None:
    stamps = Timestamps()
    for t in (now, max(0.0, now + step), now):
        assert stamps(t) == dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


def test_logs_are_json_lines_with_extra_fields(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    from extender.common.logs import setup_logging

    setup_logging("info")
    logging.getLogger("extender.test").info("bound", extra={"pod": "ml/a", "node": "n1"})
    logging.getLogger("extender.test").debug("hidden")
    # only this logger's lines: a client thread left by an earlier test may log too
    lines = [json.loads(x) for x in capsys.readouterr().err.strip().splitlines()]
    ours = [x for x in lines if x["logger"] == "extender.test"]
    assert len(ours) == 1
    line = ours[0]
    assert (line["level"], line["msg"], line["pod"], line["node"]) == ("info", "bound", "ml/a", "n1")
    with pytest.raises(ValueError):
        setup_logging("loud")

