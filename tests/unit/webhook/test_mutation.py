"""The pure pod mutation: every rule and every denial of the webhook."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.common import contract as c
from extender.common.contract import RequestContext, parse_request
from extender.common.profiles import profile_annotations
from tests.unit.fixtures.webhook import (
    ANNOTATION_MAPS,
    CONTAINER_LISTS,
    GOOD_VALUES,
    LABEL_MAPS,
    NS,
    POOL_A,
    POOL_B,
    SCHEDULER,
    pod,
    tf,
    view,
)
from webhook.mutation import MutationResult, mutate


def run(p: dict[str, Any], index: int = 1, **objects: Any) -> MutationResult:
    return mutate(p, view(*objects.get("objects", ())), scheduler_name=SCHEDULER, index=index)


def ok(p: dict[str, Any], index: int = 1) -> dict[str, Any]:
    result = run(p, index)
    assert result.denial is None, result.denial
    assert jsonpatch.apply_patch(p, result.patch) == result.pod
    return result.pod


def annotations(p: dict[str, Any]) -> dict[str, str]:
    return dict(p["metadata"]["annotations"])


def container(p: dict[str, Any], name: str = "main") -> dict[str, Any]:
    return next(x for x in p["spec"]["containers"] if x["name"] == name)


# --- opt-in -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [{}, {c.ENABLED_LABEL: "false"}, {c.ENABLED_LABEL: "1"}])
def test_pods_without_the_opt_in_label_pass_untouched(labels: dict[str, str]) -> None:
    p = pod(tf(tflops_request="bogus"))
    p["metadata"]["labels"] = labels
    result = run(p)
    assert (result.skipped, result.patch, result.denial, result.pod) == (True, [], None, p)


# --- canonical annotations, labels, scheduler ----------------------------------------------------------


def test_canonical_annotations_are_written() -> None:
    out = ok(pod(tf(tflops_request="1.5", vram_limit="16384Mi", other="kept"), containers=None))
    assert annotations(out) == {
        **tf(other="kept"),
        c.GPU_POOL: "pool-a", c.TFLOPS_REQUEST: "1500m", c.TFLOPS_LIMIT: "1500m", c.VRAM_REQUEST: "16Gi",
        c.VRAM_LIMIT: "16Gi", c.GPU_COUNT: "1", c.ISOLATION: "soft", c.QOS: "high",
        c.AUTOSCALE: "false", c.AUTOSCALE_TARGET: "all",
    }


def test_labels_scheduler_and_toleration() -> None:
    out = ok(pod(tf(tflops_request="1"), labels={"app": "x"}))
    assert out["metadata"]["labels"] == {"tensor-fusion.ai/enabled": "true", "app": "x",
                                         c.COMPONENT_LABEL: "worker", c.POOL_LABEL: "pool-a",
                                         c.WORKLOAD_LABEL: "p"}
    assert out["spec"]["schedulerName"] == SCHEDULER
    assert out["spec"]["tolerations"] == [{"key": "tensor-fusion.ai/used-by", "operator": "Equal",
                                           "value": "tensor-fusion", "effect": "PreferNoSchedule"}]


def test_scheduler_name_comes_from_the_flag() -> None:
    result = mutate(pod(tf(tflops_request="1")), view(), scheduler_name="custom", index=1)
    assert result.pod["spec"]["schedulerName"] == "custom"


def _owned(kind: str, name: str, api_version: str, **labels: str) -> dict[str, Any]:
    p = pod(tf(tflops_request="1"), labels=labels)
    del p["metadata"]["name"]
    p["metadata"]["generateName"] = f"{name}-"
    p["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind, "name": name,
                                         "controller": True, "uid": "u"}]
    return p


@pytest.mark.parametrize(
    ("p", "workload"),
    [
        (_owned("ReplicaSet", "web-7d9f", "apps/v1"), "web"),
        (_owned("ReplicaSet", "bare", "apps/v1"), "bare"),
        (_owned("ReplicaSet", "api-5c6b", "apps/v1", **{"pod-template-hash": "5c6b"}), "api"),
        (_owned("ReplicaSet", "gone-1", "apps/v1"), "gone-1"),
        (_owned("Job", "nightly-2890", "batch/v1"), "nightly"),
        (_owned("Job", "oneoff", "batch/v1"), "oneoff"),
        (_owned("StatefulSet", "db", "apps/v1"), "db"),
        (pod(tf(tflops_request="1")), "p"),
    ],
    ids=["deployment", "replicaset-without-deployment", "replicaset-not-cached-uses-hash",
         "replicaset-not-cached", "cronjob", "job", "other-owner", "bare-pod"],
)
def test_workload_label(p: dict[str, Any], workload: str) -> None:
    assert ok(p)["metadata"]["labels"][c.WORKLOAD_LABEL] == workload


def test_workload_label_of_a_generate_name_pod_and_long_names() -> None:
    p = pod(tf(tflops_request="1"))
    p["metadata"] = {**p["metadata"], "generateName": "trainer-"}
    del p["metadata"]["name"]
    assert ok(p)["metadata"]["labels"][c.WORKLOAD_LABEL] == "trainer"
    p = _owned("StatefulSet", "x" * 80, "apps/v1")
    assert ok(p)["metadata"]["labels"][c.WORKLOAD_LABEL] == "x" * 63


# --- pools and QoS ------------------------------------------------------------------------------------


def test_pool_from_annotation_and_its_default_qos() -> None:
    out = ok(pod(tf(tflops_request="1", tflops_limit="2", gpupool="pool-b")))
    assert annotations(out)[c.QOS] == "low"
    assert out["metadata"]["labels"][c.POOL_LABEL] == "pool-b"


def test_pool_from_label_when_no_annotation() -> None:
    out = ok(pod(tf(tflops_request="1"), labels={c.POOL_LABEL: "pool-b"}))
    assert annotations(out)[c.GPU_POOL] == "pool-b"


def test_several_default_pools_pick_the_first_by_name() -> None:
    z = {**POOL_B, "metadata": {"name": "z", "annotations": {"tensor-fusion.ai/is-default-pool": "true"}}}
    result = mutate(pod(tf(tflops_request="1")), view(z, POOL_A), scheduler_name=SCHEDULER, index=1)
    assert annotations(result.pod)[c.GPU_POOL] == "pool-a"


@pytest.mark.parametrize(
    ("extra", "spec", "priority_class"),
    [
        (tf(qos="high"), {}, "tensor-fusion-high"),
        (tf(qos="critical"), {}, "tensor-fusion-critical"),
        ({}, {}, "tensor-fusion-high"),  # request equals limit: high
        (tf(qos="medium"), {}, None),
        (tf(qos="low"), {}, None),
        (tf(qos="critical"), {"priorityClassName": "mine"}, "mine"),
    ],
)
def test_priority_class_for_high_and_critical_qos(extra: dict[str, str], spec: dict[str, Any],
                                                  priority_class: str | None) -> None:
    out = ok(pod({**tf(tflops_request="1"), **extra}, **spec))
    assert out["spec"].get("priorityClassName") == priority_class


def test_priority_class_drops_a_resolved_default_priority() -> None:
    out = ok(pod(tf(tflops_request="1", qos="critical"), priority=0, preemptionPolicy="PreemptLowerPriority"))
    assert "priority" not in out["spec"] and "preemptionPolicy" not in out["spec"]


# --- GPU containers, index, native limits --------------------------------------------------------------

TWO = [{"name": "main", "image": "cuda"}, {"name": "sidecar", "image": "envoy"}]


def test_index_limit_and_request_on_the_single_container() -> None:
    out = ok(pod(tf(tflops_request="1")), index=12)
    assert container(out)["resources"] == {"limits": {"tensor-fusion.ai/index_1": "4"},
                                           "requests": {"tensor-fusion.ai/index_1": "4"}}


def test_inject_container_chooses_the_gpu_containers() -> None:
    out = ok(pod(tf(tflops_request="1", inject_container="sidecar"), containers=TWO), index=1)
    assert "resources" not in container(out, "main")
    assert container(out, "sidecar")["resources"]["limits"] == {"tensor-fusion.ai/index_0": "1"}


def test_inject_container_accepts_a_list() -> None:
    out = ok(pod(tf(tflops_request="1", inject_container="main, sidecar"), containers=TWO), index=2)
    limits = [x["resources"]["limits"] for x in out["spec"]["containers"]]
    assert limits == [{"tensor-fusion.ai/index_0": "2"}] * 2


def test_native_gpu_limits_choose_the_container_and_migrate_into_gpu_count() -> None:
    gpu = {"name": "main", "image": "cuda",
           "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}, "requests": {"nvidia.com/gpu": "2"}}}
    out = ok(pod({}, containers=[gpu, {"name": "sidecar"}]), index=3)
    assert container(out)["resources"] == {"limits": {"cpu": "1", "tensor-fusion.ai/index_0": "3"},
                                           "requests": {"tensor-fusion.ai/index_0": "3"}}
    assert "resources" not in container(out, "sidecar")
    assert (annotations(out)[c.ISOLATION], annotations(out)[c.GPU_COUNT]) == ("shared", "2")


def test_native_limit_with_fractions_stays_fractional() -> None:
    gpu = {"name": "main", "resources": {"limits": {"amd.com/gpu": 1}}}
    out = ok(pod(tf(compute_percent_request="50"), containers=[gpu]))
    assert (annotations(out)[c.ISOLATION], annotations(out)[c.GPU_COUNT]) == ("soft", "1")
    assert "amd.com/gpu" not in container(out)["resources"]["limits"]


def test_existing_index_is_kept() -> None:
    first = ok(pod(tf(tflops_request="1")), index=100)
    again = run(first, index=5)
    assert again.patch == []
    assert container(again.pod)["resources"]["limits"] == {"tensor-fusion.ai/index_c": "4"}


def test_already_mutated_multi_container_pod_is_recognised_by_its_index() -> None:
    first = ok(pod({}, containers=[{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                                   {"name": "sidecar"}]))
    assert run(first, index=9).patch == []


def test_toleration_is_not_duplicated() -> None:
    existing = {"key": "tensor-fusion.ai/used-by", "operator": "Equal", "value": "tensor-fusion",
                "effect": "PreferNoSchedule"}
    other = {"key": "gpu", "operator": "Exists"}
    out = ok(pod(tf(tflops_request="1"), tolerations=[other, existing]))
    assert out["spec"]["tolerations"] == [other, existing]
    out = ok(pod(tf(tflops_request="1"), tolerations=[other]))
    assert out["spec"]["tolerations"] == [other, existing]


# --- autoscale ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "labels", "autoscale", "target"),
    [
        (tf(autoscale="true", autoscale_target="compute"), {}, "true", "compute"),
        (tf(autoscale="false"), {"tier": "batch"}, "false", "all"),  # pod beats the template
        (tf(workload_profile="small"), {"tier": "batch"}, "true", "compute"),  # profile beats the template
        ({}, {"tier": "batch"}, "true", "vram"),  # first enabled matching rule (the disabled one is skipped)
        ({}, {"env": "prod"}, "true", "compute"),  # In
        ({}, {"env": "dev", "scale": "yes"}, "true", "all"),  # NotIn + Exists + DoesNotExist
        ({}, {"env": "dev", "scale": "yes", "frozen": "1"}, "false", "all"),  # DoesNotExist fails
        ({}, {"env": "prod", "tier": "batch"}, "true", "vram"),  # first match wins
        ({}, {}, "false", "all"),  # no rule matches
        (tf(autoscale_target="compute"), {"tier": "batch"}, "true", "compute"),  # pod's target kept
        (tf(gpupool="pool-b"), {"tier": "batch"}, "false", "all"),  # pool without template
    ],
)
def test_autoscale_sources(extra: dict[str, str], labels: dict[str, str], autoscale: str,
                           target: str) -> None:
    out = ok(pod({**tf(tflops_request="1"), **extra}, labels=labels))
    assert (annotations(out)[c.AUTOSCALE], annotations(out)[c.AUTOSCALE_TARGET]) == (autoscale, target)


def test_workload_profile_supplies_defaults() -> None:
    out = ok(pod(tf(workload_profile="small", tflops_limit="20")))
    got = annotations(out)
    assert (got[c.TFLOPS_REQUEST], got[c.TFLOPS_LIMIT], got[c.VRAM_REQUEST], got[c.QOS]) == ("5", "20", "2Gi",
                                                                                             "critical")
    assert out["spec"]["priorityClassName"] == "tensor-fusion-critical"


# --- patch shape --------------------------------------------------------------------------------------


def test_patch_creates_missing_parents_and_escapes_slashes() -> None:
    bare = pod(None, containers=[{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    result = run(bare)
    ops = {op["path"]: op for op in result.patch}
    assert ops["/metadata/annotations"]["op"] == "add"
    assert ops["/metadata/annotations"]["value"][c.ISOLATION] == "shared"
    assert ops["/spec/containers/0/resources/limits/nvidia.com~1gpu"] == {
        "op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"}
    assert ops["/spec/containers/0/resources/requests"]["op"] == "add"
    assert ops["/metadata/labels/tensor-fusion.ai~1component"]["value"] == "worker"
    assert jsonpatch.apply_patch(bare, result.patch) == result.pod


def test_tilde_in_keys_is_escaped() -> None:
    p = pod(tf(tflops_request="1"), labels={"odd~key/x": "v"})
    p["spec"]["containers"][0]["resources"] = {"limits": {"example.com/a~b": "1"}}
    result = run(p)
    assert jsonpatch.apply_patch(p, result.patch) == result.pod
    assert all("~" not in op["path"].replace("~0", "").replace("~1", "") for op in result.patch)


# --- denials ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "key", "needle"),
    [
        (pod(tf(tflops_request="abc")), c.TFLOPS_REQUEST, 'tflops-request="abc"'),
        (pod(tf(vram_request="-1Gi")), c.VRAM_REQUEST, 'vram-request="-1Gi": must not be negative'),
        (pod(tf(tflops_request="4", tflops_limit="2")), c.TFLOPS_LIMIT, 'tflops-limit="2": limit is below'),
        (pod(tf(vram_request="4Gi", vram_limit="2Gi")), c.VRAM_LIMIT, 'vram-limit="2Gi": limit is below'),
        (pod(tf(compute_percent_request="60", compute_percent_limit="50")), c.PERCENT_LIMIT,
         'compute-percent-limit="50": limit is below'),
        (pod(tf(compute_percent_request="120")), c.PERCENT_REQUEST, 'compute-percent-request="120"'),
        (pod(tf(tflops_request="1", compute_percent_request="5")), c.TFLOPS_REQUEST, "together"),
        (pod(tf(tflops_request="1", gpu_count="0")), c.GPU_COUNT, 'gpu-count="0"'),
        (pod(tf(tflops_request="1", gpu_count="200")), c.GPU_COUNT, 'gpu-count="200"'),
        (pod(tf(tflops_request="1", gpu_indices="a,1")), c.GPU_INDICES, 'gpu-indices="a,1"'),
        # longer than Python converts (4,300 digits): a denial naming the key, not an internal error
        (pod(tf(tflops_request="1", gpu_count="1" * 5000)), c.GPU_COUNT, "must be an integer within 1..128"),
        (pod(tf(tflops_request="1", gpu_indices="0," + "7" * 5000)), c.GPU_INDICES, "at most 40 digits"),
        (pod(tf(tflops_request="1", isolation="full")), c.ISOLATION, 'isolation="full"'),
        (pod(tf(tflops_request="1", qos="max")), c.QOS, 'qos="max"'),
        (pod(tf(tflops_request="1", autoscale_target="disk")), c.AUTOSCALE_TARGET, 'autoscale-target="disk"'),
        (pod(tf(tflops_request="1", gpupool="missing")), c.GPU_POOL, 'gpupool="missing": no such GPUPool'),
        (pod(tf(tflops_request="1", workload_profile="nope")), c.WORKLOAD_PROFILE,
         'workload-profile="nope": no such WorkloadProfile in namespace team'),
        (pod(tf(gpu_count="1")), c.TFLOPS_REQUEST, "no TFLOPS, compute percent or VRAM"),
        (pod(tf(tflops_request="1"), containers=TWO), c.INJECT_CONTAINER,
         "2 containers (main, sidecar) and none has a GPU limit"),
        (pod(tf(tflops_request="1", inject_container="gpu"), containers=TWO), c.INJECT_CONTAINER,
         'inject-container="gpu": no container named gpu'),
        (pod(tf(tflops_request="1"), containers=[{"name": "main", "resources": {"limits": {
            "nvidia.com/gpu": "0.5"}}}]), "nvidia.com/gpu", 'nvidia.com/gpu="0.5"'),
        (pod(tf(tflops_request="1"), labels={"tier": "broken"}), c.AUTOSCALE_TARGET,
         'autoscale-target="gpu" (from SchedulingConfigTemplate tmpl rule bad-target)'),
        ({**pod(), "spec": {"containers": []}}, "pod-shape", "non-empty list"),
    ],
)
def test_denials(p: dict[str, Any], key: str, needle: str) -> None:
    result = run(p)
    assert result.denial is not None and result.patch == []
    assert result.denial.reason == key
    assert needle in result.denial.message


def test_no_default_pool_is_denied() -> None:
    result = mutate(pod(tf(tflops_request="1")), view(POOL_B), scheduler_name=SCHEDULER, index=1)
    assert result.denial is not None
    assert "no GPUPool is annotated as the default pool" in result.denial.message


# --- properties ---------------------------------------------------------------------------------------


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(sorted(GOOD_VALUES)) | st.text(max_size=30), st.text(max_size=30),
                       max_size=10), LABEL_MAPS, CONTAINER_LISTS)
def test_any_annotation_map_gives_a_patch_or_a_denial(annotations_in: dict[str, str], labels: dict[str, str],
                                                      containers: list[dict[str, Any]]) -> None:
    result = run(pod(annotations_in, labels=labels, containers=containers))
    if result.denial is None:
        assert result.patch  # a fresh opted-in pod always gains labels and a scheduler
    else:
        assert result.patch == [] and result.denial.reason and result.denial.message


@settings(max_examples=300)
@given(ANNOTATION_MAPS, LABEL_MAPS, CONTAINER_LISTS,
       st.integers(min_value=1, max_value=128))
def test_accepted_pods_reparse_to_the_same_request_and_mutation_is_idempotent(
        annotations_in: dict[str, str], labels: dict[str, str], containers: list[dict[str, Any]],
        index: int) -> None:
    p = pod(annotations_in, labels=labels, containers=containers)
    original = copy.deepcopy(p)
    result = run(p, index)
    assert p == original  # the input is never modified
    if result.denial is not None:
        assert result.patch == [] and result.denial.message
        return
    assert result.request is not None
    mutated = jsonpatch.apply_patch(p, result.patch)
    assert mutated == result.pod
    # The canonical annotations re-parse to the same request.
    out = mutated["metadata"]["annotations"]
    profile = out.get(c.WORKLOAD_PROFILE)
    context = RequestContext(
        profile_annotations=profile_annotations(view().profile(NS, profile)["spec"]) if profile else {},
        pools={"pool-a": c.PoolDefaults("pool-a"), "pool-b": c.PoolDefaults("pool-b", c.QoS.LOW)},
    )
    assert parse_request(out, context) == result.request
    # Idempotent: mutating the mutated pod changes nothing.
    again = run(mutated, (index % 128) + 1)
    assert again.denial is None and again.patch == []


@pytest.mark.parametrize(("annotations", "spec", "key"), [
    ({"tensor-fusion.ai/gpu-ids": "gpu-on-another-node"}, {}, "tensor-fusion.ai/gpu-ids"),
    ({"tensor-fusion.ai/index": "3"}, {}, "tensor-fusion.ai/index"),
    ({"tensor-fusion.ai/allocated": "tflops=0,vram=0"}, {}, "tensor-fusion.ai/allocated"),
    ({}, {"nodeName": "n1"}, "spec.nodeName"),
])
def test_a_pod_may_not_arrive_with_an_allocation(annotations: dict[str, str], spec: dict[str, Any],
                                                  key: str) -> None:
    result = mutate(pod({**tf(tflops_request="10", vram_request="1Gi"), **annotations}, **spec), view(),
                    scheduler_name=SCHEDULER, index=1)
    assert result.denial is not None and result.denial.reason == key
    assert result.denial.message.startswith(key) and SCHEDULER in result.denial.message


@pytest.mark.parametrize("qos_config", [{"defaultQoS": [1]}, {"defaultQoS": {"a": 1}}, {"defaultQoS": 5},
                                        {"defaultQoS": None}, [1], "critical"])
def test_a_wrong_typed_pool_default_qos_is_no_default_not_an_internal_error(qos_config: object) -> None:
    """The GPUPool CRD keeps unknown shapes; every pod of such a pool was a code-500 denial."""
    bad = {**POOL_A, "spec": {"qosConfig": qos_config}}
    result = mutate(pod(tf(tflops_request="1")), view(bad), scheduler_name=SCHEDULER, index=1)
    assert result.denial is None
    plain = mutate(pod(tf(tflops_request="1")), view(POOL_A), scheduler_name=SCHEDULER, index=1)
    assert result.pod["metadata"]["annotations"][c.QOS] == plain.pod["metadata"]["annotations"][c.QOS]


# --- priority is granted, not taken ---------------------------------------------------------------------

def test_the_high_and_critical_priority_classes_are_granted_only_where_the_administrator_allows() -> None:
    from webhook.priority import PriorityPolicy

    policy = PriorityPolicy.from_lists("tensor-fusion-sys, ml-prod", "pool-a")

    def run_in(namespace: str, policy: PriorityPolicy, **annotations: str) -> MutationResult:
        p = pod(tf(tflops_request="1", tflops_limit="2", **annotations))
        return mutate(p, view(POOL_A, POOL_B), scheduler_name=SCHEDULER, index=1, namespace=namespace,
                      priority=policy)

    denied = run_in("team", policy, qos="critical", gpupool="pool-b")
    assert denied.denial is not None and denied.denial.reason == c.QOS
    assert denied.denial.message.startswith('tensor-fusion.ai/qos="critical": the priority class '
                                            "tensor-fusion-critical is granted only in namespaces ml-prod, "
                                            "tensor-fusion-sys (--qos-priority-namespaces) and pools pool-a")
    for namespace, pool_name in (("ml-prod", "pool-b"), ("team", "pool-a")):
        granted = run_in(namespace, policy, qos="critical", gpupool=pool_name)
        assert granted.denial is None and granted.pod["spec"]["priorityClassName"] == "tensor-fusion-critical"
    # medium and low need no grant; * grants everywhere (the behaviour before the policy)
    assert run_in("team", policy, qos="medium", gpupool="pool-b").denial is None
    anywhere = run_in("team", PriorityPolicy.from_lists("*"), qos="high", gpupool="pool-b")
    assert anywhere.pod["spec"]["priorityClassName"] == "tensor-fusion-high"


def test_a_pod_high_only_by_derivation_keeps_its_qos_but_gets_no_priority_class_outside_the_grant() -> None:
    from webhook.priority import PriorityPolicy

    p = pod(tf(tflops_request="1", gpupool="pool-b"))  # requests equal limits: qos high by derivation
    result = mutate(p, view(POOL_A, POOL_B), scheduler_name=SCHEDULER, index=1, namespace="team",
                    priority=PriorityPolicy.from_lists("tensor-fusion-sys"))
    assert result.denial is None
    assert result.pod["metadata"]["annotations"][c.QOS] == "high"
    assert "priorityClassName" not in result.pod["spec"]
