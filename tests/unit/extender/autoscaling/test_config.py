"""autoScalingConfig as TensorFusion reads it: its defaults, bad fields named and replaced by the default, the
target resource, cron time zones."""

from __future__ import annotations

import pytest

from extender.autoscaling.config import go_duration_ns, go_float, parse_config

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
    ("marginFraction", " 0.2", "marginFraction: ' 0.2' is not a number"),  # Go's ParseFloat refuses spaces
    ("marginFraction", "0x1p-1 ", "marginFraction: '0x1p-1 ' is not a number"),
    ("updateThreshold", "1e400", "updateThreshold: '1e400' is not a number"),
    ("historyDataPeriod", "0s", "historyDataPeriod: '0s' must be positive"),
    ("interval", "-1m", "interval: '-1m' must be positive"),
    ("initialDelayPeriod", "5 m", "initialDelayPeriod: '5 m' is not a duration"),
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


# TensorFusion reads initialDelayPeriod with Go's time.ParseDuration and uses whatever it reads
# (internal/autoscaler/recommender/percentile_recommender.go, internal/autoscaler/workload_metrics_loader.go,
# internal/autoscaler/recommender/external_recommender.go): 0s is no delay, a negative one too.
@pytest.mark.parametrize(("value", "delay_ns"), [
    ("0s", 0), ("0", 0), ("-5m", -300 * 10**9), ("1h30m", 5400 * 10**9), ("1.5h", 5400 * 10**9),
    ("300ms", 3 * 10**8), ("", 1800 * 10**9), ("+2m", 120 * 10**9),
])
def test_initial_delay_is_read_as_tensorfusion_reads_it(value: str, delay_ns: int) -> None:
    c = parse_config({"autoSetResources": {"enable": True, "initialDelayPeriod": value},
                      "externalScaler": {"enable": True, "url": "http://x", "initialDelayPeriod": value}})
    assert not c.problems
    assert c.auto_set is not None and c.auto_set.initial_delay_ns == delay_ns
    assert c.external is not None and c.external.initial_delay_ns == delay_ns


# internal/autoscaler/workload/workload.go (updateHistoryPeriod: half-life = period / 2, uncapped) and
# internal/autoscaler/workload_metrics_loader.go (maxHistoryDataPeriod: only the history read is capped)
@pytest.mark.parametrize(("value", "period_h", "read_h"), [
    ("2h", 2, 2), ("720h", 720, 720), ("1000h", 1000, 720), ("2160h", 2160, 720),
])
def test_a_history_over_30_days_caps_only_the_read(value: str, period_h: int, read_h: int) -> None:
    c = parse_config({"autoSetResources": {"enable": True, "historyDataPeriod": value}})
    assert not c.problems and c.auto_set is not None
    assert c.auto_set.history_period_ns == period_h * HOUR
    assert c.auto_set.read_history_ns == read_h * HOUR


@pytest.mark.parametrize(("text", "ns"), [
    ("0", 0), ("-0", 0), ("1h", 3600 * 10**9), ("1.5s", 1_500_000_000), (".5s", 500_000_000),
    ("1h1m1s1ms1us1ns", 3661001001001), ("2\u00b5s", 2000), ("2\u03bcs", 2000), ("5.s", 5 * 10**9),
])
def test_go_durations(text: str, ns: int) -> None:
    assert go_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "5", " 5s", "5s ", "1d", ".s", "1h-1m", "--1s", "s", "9999999999h"])
def test_go_refuses_these_durations(text: str) -> None:
    with pytest.raises(ValueError):
        go_duration_ns(text)


@pytest.mark.parametrize(("text", "value"), [
    ("0.5", 0.5), ("5e-1", 0.5), ("+.5", 0.5), ("0x1p-1", 0.5), ("1.", 1.0), ("Inf", float("inf")),
])
def test_go_floats(text: str, value: float) -> None:
    assert go_float(text) == value


@pytest.mark.parametrize("text", ["", " 1", "1_0", "0x10", "1e400", "+nan", "one", "1,5"])
def test_go_refuses_these_floats(text: str) -> None:
    with pytest.raises(ValueError):
        go_float(text)
