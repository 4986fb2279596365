"""The webhook's latency histogram and decision counter (observed from the event loop without locks) expose
exactly what prometheus_client's Histogram and Counter expose for the same observations."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from webhook.metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
observations = st.lists(st.one_of(st.sampled_from([*BUCKETS, 0.0, math.inf, math.nan]),
                                  st.floats(min_value=0, max_value=20),
                                  st.floats(allow_nan=True, allow_infinity=True)), max_size=40)


def exposition(registry: CollectorRegistry) -> list[str]:
    # the created timestamps are each object's own
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@given(observations)
def test_the_histogram_exposes_what_prometheus_client_exposes(values: list[float]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    name, doc = "tf_webhook_request_duration_seconds", "Time to answer one AdmissionReview."
    fast = LoopHistogram(name, doc, BUCKETS, ours)
    reference = Histogram(name, doc, buckets=BUCKETS, registry=theirs)
    for value in values:
        fast.observe(value)
        reference.observe(value)
    assert exposition(ours) == exposition(theirs)
    assert any(line.startswith(f"{name}_created ") for line in generate_latest(ours).decode().splitlines())


OUTCOMES = ["mutated", "denied", "skipped", "error"]


@given(st.lists(st.sampled_from(OUTCOMES), max_size=40))
def test_the_counter_exposes_what_prometheus_client_exposes(outcomes: list[str]) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    doc = "AdmissionReviews answered, by outcome."
    fast = LoopCounter("tf_webhook_decisions", doc, "outcome", OUTCOMES, ours)
    reference = Counter("tf_webhook_decisions_total", doc, ["outcome"], registry=theirs)
    children = {value: reference.labels(outcome=value) for value in OUTCOMES}
    for outcome in outcomes:
        fast.inc(outcome)
        children[outcome].inc()
    assert exposition(ours) == exposition(theirs)
    created = [line for line in generate_latest(ours).decode().splitlines()
               if line.startswith("tf_webhook_decisions_created{")]
    assert len(created) == 4
