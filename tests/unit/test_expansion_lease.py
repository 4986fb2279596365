"""One active expander per cluster: when a replica may take the Lease, and the flags."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

import pytest

from extender.controllers.expansion.config import ExpansionConfig, add_arguments, from_args
from extender.kube.lease import LeaseAction, format_time, lease_action, lease_body, released_body

NOW = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


def lease(holder: str | None, renewed_seconds_ago: float | None = 1, duration: int = 15) -> dict[str, Any]:
    spec: dict[str, Any] = {"holderIdentity": holder, "leaseDurationSeconds": duration}
    if renewed_seconds_ago is not None:
        spec["renewTime"] = format_time(NOW - dt.timedelta(seconds=renewed_seconds_ago))
    return {"metadata": {"name": "tensor-fusion-expander", "resourceVersion": "7"}, "spec": spec}


@pytest.mark.parametrize(("case", "current", "expected"), [
    ("no lease yet", None, LeaseAction.CREATE),
    ("held by me", lease("me"), LeaseAction.RENEW),
    ("held by another, fresh", lease("other", 5), LeaseAction.WAIT),
    ("held by another, expired", lease("other", 16), LeaseAction.TAKE),
    ("released", lease(None), LeaseAction.TAKE),
    ("never renewed", lease("other", None), LeaseAction.TAKE),
])
def test_lease_action(case: str, current: dict[str, Any] | None, expected: LeaseAction) -> None:
    assert lease_action(current, "me", NOW) is expected, case


def test_taking_over_counts_a_transition_and_keeps_the_version() -> None:
    body = lease_body("tensor-fusion-expander", "ns", "me", NOW, 15, lease("other", 30), LeaseAction.TAKE)
    assert body["spec"]["holderIdentity"] == "me" and body["spec"]["leaseTransitions"] == 1
    assert body["metadata"]["resourceVersion"] == "7"  # a concurrent writer gets a conflict
    assert lease_action(body, "other", NOW) is LeaseAction.WAIT
    released = released_body(body, NOW)
    assert lease_action(released, "other", NOW) is LeaseAction.TAKE


def test_flags_default_from_the_environment() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, {"TF_MAX_INFLIGHT_NODES": "3", "TF_EXPANSION_ENABLED": "false",
                           "POD_NAMESPACE": "gpu-system"})
    config = from_args(parser.parse_args([]))
    assert config == ExpansionConfig(enabled=False, max_in_flight=3, lease_namespace="gpu-system")
    config = from_args(parser.parse_args([
        "--expansion", "--expansion-delay", "0.5", "--max-inflight-nodes", "7",
        "--expansion-claim-timeout", "60", "--expansion-lease-namespace", "x"]))
    assert (config.enabled, config.delay_seconds, config.max_in_flight, config.claim_timeout_seconds,
            config.lease_namespace) == (True, 0.5, 7, 60.0, "x")


def test_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, {})
    config = from_args(parser.parse_args([]))
    assert (config.enabled, config.delay_seconds, config.max_in_flight) == (True, 10.0, 15)


@pytest.mark.parametrize("kw", [{"max_in_flight": 0}, {"delay_seconds": -1}, {"claim_timeout_seconds": 0}])
def test_bad_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ExpansionConfig(**kw)
