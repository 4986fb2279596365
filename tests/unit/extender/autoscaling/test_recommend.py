"""The pure recommender: percentiles with margin and floors, the QoS, cron floors in a time zone, the external
scaler's answer and the merge. The histogram, usage windows and config have modules of their own; agreement
with TensorFusion's Go code on seeded streams is test_recommend_differential.py."""

from __future__ import annotations

import datetime as dt
from fractions import Fraction
from zoneinfo import ZoneInfo

import pytest

from extender.autoscaling.config import Resources, parse_config
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
from extender.autoscaling.usage import WorkerUsage, WorkloadUsage

GI = 2**30
HOUR = 3600 * 10**9
T0 = 1_790_000_000 * 10**9
UTC = ZoneInfo("UTC")


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


# TensorFusion's test (getActiveCronScalingRule in internal/autoscaler/recommender/cron_recommender.go) with
# robfig's Next (spec.go), whose zero time for a schedule that never fires is earlier than any time
@pytest.mark.parametrize(("start", "end", "at", "active"), [
    ("0 9 * * *", "0 17 * * *", "2026-03-23T10:00", True),
    ("0 9 * * *", "0 17 * * *", "2026-03-23T17:00", False),  # the end's minute: its next end is tomorrow
    ("0 9 */2 * 1", "0 17 */2 * 1", "2026-03-24T10:00", False),  # 24th: even, a Tuesday
    ("0 9 */2 * 1", "0 17 */2 * 1", "2026-03-25T10:00", True),  # 25th: odd
    ("0 9 */2 * 1", "0 17 */2 * 1", "2026-03-30T10:00", True),  # 30th: even, a Monday
    ("CRON_TZ=America/New_York 30 1 * * *", "CRON_TZ=America/New_York 50 1 * * *", "2026-11-01T06:40", True),
    ("0 0 30 2 *", "0 17 * * *", "2026-03-23T10:00", True),  # the start never fires
    ("0 9 * * *", "0 0 30 2 *", "2026-03-23T10:00", False),  # the end never fires
    ("0 0 30 2 *", "0 0 31 2 *", "2026-03-23T10:00", True),  # neither does
])
def test_which_rule_is_active_is_tensorfusions(start: str, end: str, at: str, active: bool) -> None:
    c = parse_config(_rules(start, end))
    assert not c.problems
    now = dt.datetime.fromisoformat(at).replace(tzinfo=dt.UTC)
    assert (active_rule(c.cron_rules, now, UTC)[0] is not None) is active


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


# the LowConfidence message prints initialDelayPeriod with Go's %v of a time.Duration
# (internal/autoscaler/recommender/percentile_recommender.go); these are Go's own answers
@pytest.mark.parametrize(("ns", "go"), [
    (0, "0s"), (1, "1ns"), (999, "999ns"), (1500, "1.5\u00b5s"), (1500000, "1.5ms"), (1500000000, "1.5s"),
    (1800000000000, "30m0s"), (5400500000000, "1h30m0.5s"), (3600000000000000, "1000h0m0s"),
    (61000000000, "1m1s"), (-300000000000, "-5m0s"), (7200000000003, "2h0m0.000000003s"),
])
def test_durations_print_as_go_prints_them(ns: int, go: str) -> None:
    from extender.autoscaling.recommend import _go_duration
    assert _go_duration(ns) == go


def test_rule_names_are_quoted_as_go_quotes_them() -> None:
    from extender.autoscaling.recommend import go_quote
    assert go_quote("office") == '"office"'
    assert go_quote('a"b\\c\n\x01') == '"a\\"b\\\\c\\n\\x01"'
