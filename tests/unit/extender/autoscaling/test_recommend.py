"""The pure recommender: the VPA histogram, usage windows, config defaults and problems, cron floors in a
time zone, the external scaler's answer and the merge. Agreement with TensorFusion's Go code on seeded
streams is test_recommend_differential.py."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest

from extender.autoscaling.config import Resources, parse_config, split_zone
from extender.autoscaling.histogram import DecayingHistogram, ExponentialOptions
from extender.autoscaling.recommend import (
    CronState,
    Result,
    active_rule,
    cron,
    external,
    merge,
    percentile,
    recommend,
)
from extender.autoscaling.usage import (
    TFLOPS_OPTIONS,
    VRAM_OPTIONS,
    VramPeakWeight,
    WorkerUsage,
    WorkloadUsage,
)

GI = 2**30
HOUR = 3600 * 10**9
T0 = 1_790_000_000 * 10**9
UTC = ZoneInfo("UTC")


def test_the_buckets_are_the_vpas() -> None:
    # VPA's own numbers: 0.1 TFLOPS first bucket, 5 % growth up to 10,000 -> 176 buckets
    assert TFLOPS_OPTIONS.num_buckets == 176
    assert VRAM_OPTIONS.num_buckets == 176
    assert TFLOPS_OPTIONS.bucket_start(0) == 0.0
    assert TFLOPS_OPTIONS.bucket_start(1) == pytest.approx(0.1)
    assert TFLOPS_OPTIONS.find_bucket(0.05) == 0
    assert TFLOPS_OPTIONS.find_bucket(1e9) == 175
    with pytest.raises(ValueError, match="ratio"):
        ExponentialOptions(10.0, 1.0, 1.0, 0.1)


def test_a_percentile_answers_the_end_of_the_bucket_that_reaches_it() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    assert h.is_empty() and h.percentile(0.5) == 0.0
    for value in (1.0, 2.0, 3.0, 4.0):
        h.add_sample(value, 1.0, T0)
    b = TFLOPS_OPTIONS.find_bucket(2.0)
    assert h.percentile(0.5) == TFLOPS_OPTIONS.bucket_start(b + 1)
    assert h.percentile(1.0) == TFLOPS_OPTIONS.bucket_start(TFLOPS_OPTIONS.find_bucket(4.0) + 1)


def test_a_sample_one_half_life_later_weighs_twice_as_much() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    h.add_sample(1.0, 1.0, T0)
    h.add_sample(100.0, 1.0, T0 + HOUR)
    # weights 1 and 2: the median is the newer, larger value
    assert h.percentile(0.4) > 50
    assert h.total == pytest.approx(3.0 * h.weights[TFLOPS_OPTIONS.find_bucket(1.0)])


def test_the_reference_moves_after_a_hundred_half_lives_without_losing_the_ratio() -> None:
    h = DecayingHistogram(TFLOPS_OPTIONS, HOUR)
    h.add_sample(1.0, 1.0, T0)
    first_reference = h.reference_ns
    h.add_sample(100.0, 1.0, T0 + 150 * HOUR)
    assert h.reference_ns > first_reference
    assert h.percentile(0.99) > 50  # the old sample weighs 2**-150 of the new one


def test_subtracting_clamps_at_zero_and_empties() -> None:
    h = DecayingHistogram(VRAM_OPTIONS, HOUR)
    h.add_sample(5e9, 1.0, T0)
    h.subtract_sample(5e9, 2.0, T0)
    assert h.is_empty() and h.total == 0.0


def test_tflops_samples_weigh_a_tenth_and_out_of_order_ones_are_dropped() -> None:
    u = WorkloadUsage(HOUR)
    u.add(WorkerUsage("a", 5.0, GI, T0))
    u.add(WorkerUsage("a", 9.0, GI, T0 - 1))
    assert u.samples == 1
    assert u.tflops.total == pytest.approx(0.1 * u.tflops.weights[TFLOPS_OPTIONS.find_bucket(5.0)] / 0.1)


def test_a_higher_peak_in_the_window_replaces_the_old_one_and_keeps_other_workers() -> None:
    ours = WorkloadUsage(HOUR, VramPeakWeight.ADDED)
    theirs = WorkloadUsage(HOUR, VramPeakWeight.WINDOW_END)
    for u in (ours, theirs):
        u.add(WorkerUsage("a", 1.0, 20 * GI, T0))
        u.add(WorkerUsage("b", 1.0, 4 * GI, T0))
        u.add(WorkerUsage("b", 1.0, 6 * GI, T0 + HOUR))  # replaces b's 4 GiB peak
    # ours: a's 20 GiB and b's 6 GiB remain; the top percentile is a's peak
    assert ours.vram.percentile(0.99) >= 20 * GI
    assert ours.latest_vram_peak() == 20 * GI
    # TensorFusion's: subtracting b's old peak with the window end's (larger) weight drains the total, so a's
    # 20 GiB no longer counts for the 99th percentile
    assert theirs.vram.percentile(0.99) < 20 * GI


def test_a_new_window_starts_every_24_hours() -> None:
    u = WorkloadUsage(HOUR)
    u.add(WorkerUsage("a", 1.0, 8 * GI, T0))
    u.add(WorkerUsage("a", 1.0, 2 * GI, T0 + 25 * HOUR))
    assert u.samplers["a"].peak == 2 * GI
    assert u.samplers["a"].window_end_ns == T0 + 48 * HOUR
    u.forget_workers([])
    assert u.samplers == {}


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


def _usage(tflops: list[float], vram: int, workers: int = 1) -> WorkloadUsage:
    u = WorkloadUsage(HOUR)
    for i, t in enumerate(tflops):
        for w in range(workers):
            u.add(WorkerUsage(f"w{w}", t, vram, T0 + i * 30 * 10**9))
    return u


ORIGINAL = Resources(Fraction(10), Fraction(8 * GI), Fraction(10), Fraction(8 * GI))


def test_nothing_is_recommended_before_the_initial_delay() -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all"}})
    out = percentile(c.auto_set, _usage([30.0] * 20, 4 * GI), ORIGINAL, ORIGINAL, "medium", HOUR // 4)
    assert out.reason == "LowConfidence" and out.result is not None and out.result.applied
    assert merge([out.result], ORIGINAL) is None


@pytest.mark.parametrize(("qos", "request_from"), [("low", "lower"), ("medium", "lower"), ("", "lower"),
                                                   ("high", "target"), ("critical", "upper")])
def test_the_request_follows_the_qos(qos: str, request_from: str) -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all"}})
    assert c.auto_set is not None
    usage = _usage([float(v) for v in range(10, 60)], 4 * GI)
    out = percentile(c.auto_set, usage, ORIGINAL, ORIGINAL, qos, 10 * HOUR)
    assert out.result is not None and out.reason == "Updated"
    p = c.auto_set.percentiles
    expected = {"lower": p.lower_tflops, "target": p.target_tflops, "upper": p.upper_tflops}[request_from]
    assert out.result.resources.req_tflops == int(usage.tflops.percentile(expected) * 1.15)
    assert out.result.resources.lim_tflops == int(usage.tflops.percentile(p.upper_tflops) * 1.15)


def test_floors_clamps_and_the_compute_limit_never_below_the_original() -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all"}})
    assert c.auto_set is not None
    idle = percentile(c.auto_set, _usage([0.01] * 30, 10**8), ORIGINAL, ORIGINAL, "medium", 10 * HOUR)
    assert idle.result is not None
    r = idle.result.resources
    assert r.req_tflops == 1  # the 1 TFLOPS floor (0.1 x 10 is below it)
    assert r.lim_tflops == 10  # never below the original limit
    assert r.req_vram == int(8 * GI * 0.2) and r.lim_vram == int(8 * GI * 0.2)  # 0.2 x the original
    busy = percentile(c.auto_set, _usage([5000.0] * 30, 900 * GI), ORIGINAL, ORIGINAL, "medium", 10 * HOUR)
    assert busy.result is not None
    assert busy.result.resources.req_tflops == 100 and busy.result.resources.req_vram == 40 * GI


def test_a_change_inside_the_threshold_is_not_recommended() -> None:
    c = parse_config({"autoSetResources": {"enable": True, "targetResource": "all",
                                           "updateThreshold": "0.5"}})
    usage = _usage([7.5] * 30, 7 * GI)
    out = percentile(c.auto_set, usage, ORIGINAL, ORIGINAL, "medium", 10 * HOUR)
    assert out.reason == "InsideUpdateThreshold"
    assert "Compute change" in out.message and "VRAM change" in out.message
    assert merge([out.result], ORIGINAL) is None


# -- cron ----------------------------------------------------------------------------------------------------

def _rules(start: str, end: str, tflops: str = "40") -> dict[str, object]:
    return {"cronScalingRules": [{"enable": True, "name": "office", "start": start, "end": end,
                                  "desiredResources": {"requests": {"tflops": tflops, "vram": "8Gi"},
                                                       "limits": {"tflops": tflops, "vram": "8Gi"}}}]}


def test_a_cron_rule_is_active_between_its_start_and_end_in_its_zone() -> None:
    c = parse_config(_rules("CRON_TZ=Europe/Berlin 0 9 * * 1-5", "CRON_TZ=Europe/Berlin 0 18 * * 1-5"))
    assert not c.problems
    berlin = ZoneInfo("Europe/Berlin")
    monday_10 = dt.datetime(2026, 3, 23, 10, 0, tzinfo=berlin)
    assert active_rule(c.cron_rules, monday_10, UTC)[0] is not None
    assert active_rule(c.cron_rules, monday_10.replace(hour=8, minute=59), UTC)[0] is None
    assert active_rule(c.cron_rules, monday_10.replace(hour=18, minute=1), UTC)[0] is None


def test_cron_windows_follow_the_wall_clock_across_a_dst_change() -> None:
    # Berlin springs forward on 2026-03-29 (02:00 -> 03:00): 09:00 local is 08:00 UTC before, 07:00 after
    c = parse_config(_rules("0 9 * * *", "0 10 * * *"))
    berlin = ZoneInfo("Europe/Berlin")
    before = dt.datetime(2026, 3, 28, 8, 30, tzinfo=dt.UTC)
    after = dt.datetime(2026, 3, 30, 7, 30, tzinfo=dt.UTC)
    assert active_rule(c.cron_rules, before, berlin)[0] is not None
    assert active_rule(c.cron_rules, after, berlin)[0] is not None
    assert active_rule(c.cron_rules, after.replace(hour=8), berlin)[0] is None
    # the same rules read in UTC (no zone) are active an hour or two later
    assert active_rule(c.cron_rules, after, UTC)[0] is None


def test_a_cron_rule_floors_lower_recommendations_and_reverts_when_it_ends() -> None:
    c = parse_config(_rules("0 9 * * *", "0 18 * * *"))
    noon = dt.datetime(2026, 3, 23, 12, 0, tzinfo=dt.UTC)
    first, state, error = cron(c.cron_rules, None, ORIGINAL, noon, UTC)
    assert not error and first.reason == "RuleActive" and state is not None
    assert first.result is not None and not first.result.applied
    assert merge([first.result], ORIGINAL) == c.cron_rules[0].desired
    held, state2, _ = cron(c.cron_rules, state, ORIGINAL, noon, UTC)
    assert held.result is not None and held.result.applied and held.result.scale_down_locking
    lower = Result(Resources(Fraction(20), Fraction(4 * GI), Fraction(20), Fraction(4 * GI)), applied=False)
    assert merge([lower, held.result], ORIGINAL) is None  # below the floor: nothing
    higher = Result(Resources(Fraction(60), Fraction(16 * GI), Fraction(60), Fraction(16 * GI)),
                    applied=False)
    assert merge([higher, held.result], ORIGINAL) == higher.resources
    evening = noon.replace(hour=19)
    ended, state3, _ = cron(c.cron_rules, state2, ORIGINAL, evening, UTC)
    assert ended.reason == "RuleInactive" and state3 is None
    assert merge([ended.result], ORIGINAL) == ORIGINAL


@pytest.mark.parametrize(("start", "end", "says"), [
    ("0 9 * * *", "0 9 * * *", "start and end are the same"),
    ("0 25 * * *", "0 18 * * *", "cronScalingRules[0].start: '0 25 * * *': hour field: 25 is outside 0-23"),
    ("CRON_TZ=Mars/Olympus 0 9 * * *", "0 18 * * *", "'Mars/Olympus' is not an IANA time zone"),
])
def test_a_bad_cron_rule_is_named_and_ignored(start: str, end: str, says: str) -> None:
    c = parse_config(_rules(start, end))
    assert c.cron_rules == () and len(c.problems) == 1 and says in c.problems[0]


def test_two_active_rules_are_an_error_and_neither_applies() -> None:
    rules = _rules("0 9 * * *", "0 18 * * *")["cronScalingRules"]
    assert isinstance(rules, list)
    both = parse_config({"cronScalingRules": [rules[0], {**rules[0], "name": "second"}]})
    noon = dt.datetime(2026, 3, 23, 12, 0, tzinfo=dt.UTC)
    out, _, error = cron(both.cron_rules, None, ORIGINAL, noon, UTC)
    assert out.result is None and "only one active cron scaling rule" in error


def test_split_zone_reads_robfig_prefixes() -> None:
    assert split_zone("TZ=Asia/Tokyo 0 9 * * *") == ("Asia/Tokyo", "0 9 * * *")
    assert split_zone(" 0 9 * * *") == (None, "0 9 * * *")


# -- external and the whole tick -----------------------------------------------------------------------------

def test_the_external_answer_is_a_recommendation_only_when_it_asks_to_scale() -> None:
    out, problems = external({"needScaleUp": False, "reason": "fine"}, ORIGINAL)
    assert out.reason == "NoScalingNeeded" and out.result is not None and out.result.applied
    rec = {"requests": {"tflops": "20", "vram": "8Gi"}, "limits": {"tflops": "20", "vram": "8Gi"}}
    up, problems = external({"needScaleUp": True, "reason": "queue", "recommendedResources": rec}, ORIGINAL)
    assert up.reason == "queue" and up.result is not None and up.result.resources.req_tflops == 20
    bad, problems = external({"needScaleUp": True, "recommendedResources": {"requests": {"tflops": "lots"}}},
                             ORIGINAL)
    assert bad.result is None
    assert problems == ["recommendedResources.requests.tflops: 'lots' is not a quantity"]


def test_a_tick_merges_percentile_cron_and_external_and_keeps_config_problems() -> None:
    config = parse_config({"autoSetResources": {"enable": True, "targetResource": "all",
                                                "marginFraction": "x"},
                           **_rules("0 9 * * *", "0 18 * * *", tflops="30"),
                           "externalScaler": {"enable": True, "url": "http://scaler"}})
    assert config.configured() and len(config.problems) == 1
    usage = _usage([3.0] * 40, 2 * GI)
    noon = dt.datetime(2026, 3, 23, 12, 0, tzinfo=dt.UTC)
    state = CronState("office", config.cron_rules[0].desired)
    low_vram = {"requests": {"tflops": "50", "vram": "4Gi"}, "limits": {"tflops": "50", "vram": "4Gi"}}
    tick = recommend(config, usage, ORIGINAL, ORIGINAL, "medium", 10 * HOUR, noon, UTC, state,
                     {"needScaleUp": True, "recommendedResources": low_vram})
    # the external scaler's 50 TFLOPS is the largest request, but its 4Gi is below the cron rule's 8Gi
    # floor: TensorFusion then drops the whole recommendation
    assert tick.recommendation is None
    rec = {"requests": {"tflops": "50", "vram": "16Gi"}, "limits": {"tflops": "50", "vram": "16Gi"}}
    tick = recommend(config, usage, ORIGINAL, ORIGINAL, "medium", 10 * HOUR, noon, UTC, state,
                     {"needScaleUp": True, "recommendedResources": rec})
    assert tick.recommendation is not None
    assert (tick.recommendation.req_tflops, tick.recommendation.req_vram) == (50, 16 * GI)
    assert tick.problems == ["spec.autoScalingConfig.autoSetResources.marginFraction: 'x' is not a number; "
                             "using the default 0.15"]
