"""A workload's name as a label value: valid whatever the owner's name."""

from __future__ import annotations

import pytest

from webhook.workload import label_value


@pytest.mark.parametrize(("text", "value"), [("web", "web"), ("a" * 70, "a" * 63), ("-x y.", "x-y"),
                                             ("a" * 62 + "-b", "a" * 62)])
def test_label_values_are_valid(text: str, value: str) -> None:
    assert label_value(text) == value

