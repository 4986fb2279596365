"""The shape check at the request edge: text where Kubernetes has text, bounded depth, the field named."""

from __future__ import annotations

import time
from typing import Any

import pytest

from extender.common.shape import MAX_DEPTH, depth_problem, object_problem


def _nested(depth: int, leaf: Any = "1") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u", "resourceVersion": "7",
                         "labels": {"app": "a"}, "annotations": {"tensor-fusion.ai/tflops-request": "10"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "k", "operator": "In", "values": ["a"]}]}]}}}},
            "status": {"phase": "Pending"}}


def test_a_real_pod_passes() -> None:
    assert object_problem(_pod(), "Pod") is None
    assert object_problem({}, "Pod") is None


@pytest.mark.parametrize(("section", "field"), [("metadata", "resourceVersion"), ("metadata", "name"),
                                                ("spec", "nodeName"), ("status", "phase")])
def test_a_text_field_holding_a_deep_list_is_named(section: str, field: str) -> None:
    pod = _pod()
    pod[section][field] = _nested(1000)
    problem = object_problem(pod, "Pod")
    assert problem is not None and problem.startswith(f"Pod.{section}.{field}"), problem


def test_a_text_field_of_another_type_is_named() -> None:
    pod = _pod()
    pod["metadata"]["uid"] = 5
    assert object_problem(pod, "Pod") == "Pod.metadata.uid: expected a string, got a number"
    pod = _pod()
    pod["metadata"]["labels"]["app"] = ["x"]
    assert object_problem(pod, "Pod") == "Pod.metadata.labels[app]: expected a string, got a list"
    assert object_problem({"spec": "x"}, "Pod") == "Pod.spec: expected an object, got a string"
    assert object_problem([], "Pod") == "Pod: expected an object, got a list"


def test_depth_is_bounded_anywhere_and_the_path_is_given() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["env"] = _nested(MAX_DEPTH + 10)
    problem = object_problem(pod, "Pod")
    assert problem == f"Pod.spec.containers[0].env[0][0]...: nested more than {MAX_DEPTH} levels deep"
    # exactly at the bound is fine: the object holds lists down to MAX_DEPTH levels below it
    assert depth_problem(_nested(MAX_DEPTH), "x") is None
    assert depth_problem(_nested(MAX_DEPTH + 1), "x") is not None
    assert depth_problem({"a": {"b": _nested(MAX_DEPTH)}}, "x") == (
        f"x.a.b[0][0][0][0]...: nested more than {MAX_DEPTH} levels deep")


def test_the_check_never_recurses_and_is_quick_on_hostile_depth() -> None:
    deep = _nested(200_000)
    started = time.process_time()
    assert object_problem({"metadata": {"annotations": {"k": deep}}}, "Pod") is not None
    assert time.process_time() - started < 2.0


def test_long_keys_are_cut_in_the_message() -> None:
    pod = _pod()
    pod["metadata"]["labels"] = {"k" * 10_000: 1}
    problem = object_problem(pod, "Pod")
    assert problem is not None and len(problem) < 200
