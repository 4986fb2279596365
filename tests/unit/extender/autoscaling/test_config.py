"""autoScalingConfig as TensorFusion reads it: its defaults, bad fields named and replaced by the default, the
target resource, cron time zones."""

from __future__ import annotations

import pytest

from extender.autoscaling.config import parse_config, split_zone

HOUR = 3600 * 10**9


def test_defaults_are_tensorfusions() -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all"}})
    assert c.auto_set is not None and not c.problems
    p = c.auto_set.percentiles
    assert (p.target_tflops, p.lower_tflops, p.upper_tflops) == (0.95, 0.5, 0.99)
    assert (p.target_vram, p.lower_vram, p.upper_vram) == (0.98, 0.5, 0.99)
    assert (p.margin, p.update_threshold) == (0.15, 0.1)
    assert (p.min_compute_ratio, p.max_compute_ratio, p.min_vram_ratio, p.max_vram_ratio) == (0.1, 10, 0.2, 5)
    assert c.auto_set.history_period_ns == 2 * HOUR
    assert c.auto_set.initial_delay_ns == HOUR // 2
    assert c.auto_set.scales("compute") and c.auto_set.scales("vram")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("targetComputePercentile", "ninety", "targetComputePercentile: 'ninety' is not a number"),
    ("lowerBoundComputePercentile", "0_5", "lowerBoundComputePercentile: '0_5' is not a number"),
    ("updateThreshold", "nan", "updateThreshold: 'nan' is outside 0 and up"),
    ("upperBoundVRAMPercentile", "1.5", "upperBoundVRAMPercentile: '1.5' is outside 0-1"),
    ("marginFraction", "-0.1", "marginFraction: '-0.1' is outside 0 and up"),
    ("historyDataPeriod", "2 hours", "historyDataPeriod: '2 hours' is not a duration"),
    ("initialDelayPeriod", "0s", "initialDelayPeriod: '0s' must be positive"),
    ("targetResource", "gpu", "targetResource: 'gpu' is not one of all, compute, vram"),
])
def test_bad_fields_fall_back_to_the_default_and_are_named(field: str, value: str, says: str) -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all", field: value}})
    assert c.auto_set is not None
    assert len(c.problems) == 1 and c.problems[0].startswith("spec.autoScalingConfig.autoSetResources.")
    assert says in c.problems[0]
    defaults = parse_config({"autoSetResources": {"enable": True}}).auto_set
    assert defaults is not None
    assert c.auto_set.percentiles == defaults.percentiles
    assert c.auto_set.history_period_ns == defaults.history_period_ns


def test_a_target_resource_limits_what_a_resize_may_move() -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "compute"}})
    assert c.auto_set is not None and c.auto_set.scales("compute") and not c.auto_set.scales("vram")
    off = parse_config({"autoSetResources": {"enable": False, "targetResource": "all"}})
    assert off.auto_set is not None and not off.auto_set.scales("compute")


def test_split_zone_reads_robfig_prefixes() -> None:
    assert split_zone("TZ=Asia/Tokyo 0 9 * * *") == ("Asia/Tokyo", "0 9 * * *")
    assert split_zone(" 0 9 * * *") == (None, "0 9 * * *")

