"""A namespace's GPUResourceQuota defaults, filled in by the webhook below the profile and the pod."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.fixtures.webhook import NS, OBJECTS, PROFILE, SCHEDULER, pod, tf, view
from webhook.mutation import mutate


def quota(name: str = "q", created: str = "2026-01-01T00:00:00Z", namespace: str = NS,
          **single: Any) -> dict[str, Any]:
    return {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUResourceQuota",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            "spec": {"single": single}}


DEFAULTS = quota(defaultRequests={"tflops": "10", "vram": "4Gi"},
                 defaultLimits={"tflops": "20", "vram": "8Gi"})


def mutated(annotations: dict[str, str] | None, *objects: dict[str, Any], **spec: Any) -> dict[str, Any]:
    result = mutate(pod(annotations, **spec), view(*OBJECTS, *objects), scheduler_name=SCHEDULER, index=1)
    assert result.denial is None, result.denial
    return dict(result.pod["metadata"]["annotations"])


def amounts(ann: dict[str, str]) -> tuple[str | None, ...]:
    keys = ("tflops-request", "tflops-limit", "vram-request", "vram-limit", "compute-percent-request")
    return tuple(ann.get(f"tensor-fusion.ai/{k}") for k in keys)


@pytest.mark.parametrize(("given", "objects", "expected"), [
    # nothing given: the quota's requests and limits
    ({}, [DEFAULTS], ("10", "20", "4Gi", "8Gi", None)),
    # the pod's own figures win, field by field
    (tf(tflops_request="3"), [DEFAULTS], ("3", "20", "4Gi", "8Gi", None)),
    (tf(vram_request="1Gi", vram_limit="1Gi"), [DEFAULTS], ("10", "20", "1Gi", "1Gi", None)),
    # a default limit below the pod's request is left out (the limit is then the request)
    (tf(tflops_request="50"), [DEFAULTS], ("50", "50", "4Gi", "8Gi", None)),
    # a pod that asks for a percent keeps that unit: no TFLOPS default
    (tf(compute_percent_request="30"), [DEFAULTS], (None, None, "4Gi", "8Gi", "30")),
    # a quota of another namespace gives nothing
    (tf(tflops_request="1", vram_request="1Gi"), [quota(namespace="other", defaultRequests={"tflops": "9"})],
     ("1", "1", "1Gi", "1Gi", None)),
    # the oldest quota of the namespace that sets a field gives it
    ({}, [quota("new", "2026-06-01T00:00:00Z", defaultRequests={"tflops": "7", "vram": "1Gi"}),
          quota("old", "2026-01-01T00:00:00Z", defaultRequests={"tflops": "5"})],
     ("5", "5", "1Gi", "1Gi", None)),
])
def test_quota_defaults(given, objects, expected):
    assert amounts(mutated(given, *objects)) == expected


def test_the_profile_is_above_the_quota():
    ann = mutated(tf(workload_profile="small"), DEFAULTS)
    assert amounts(ann) == ("5", "10", "2Gi", "4Gi", None)
    assert PROFILE["metadata"]["namespace"] == NS


def test_whole_gpus_by_a_native_limit_get_no_default():
    containers = [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
    ann = mutated({}, DEFAULTS, containers=containers)
    assert ann["tensor-fusion.ai/isolation"] == "shared" and amounts(ann)[0] is None


def test_a_malformed_default_is_denied_naming_the_quota():
    bad = quota(defaultRequests={"tflops": "lots", "vram": "1Gi"})
    result = mutate(pod({}), view(*OBJECTS, bad), scheduler_name=SCHEDULER, index=1)
    assert result.denial is not None
    assert "tensor-fusion.ai/tflops-request" in result.denial.message
    assert f"GPUResourceQuota {NS}/q" in result.denial.message
