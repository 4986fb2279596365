"""The gang contract through the webhook: what it stamps, what it denies (naming the key and value)."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from tests.unit.fixtures.webhook import NS, POOL_A, SCHEDULER, pod, tf, view
from webhook.mutation import mutate

RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {
    "name": "train-5c4f", "namespace": NS,
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "train",
                         "controller": True}]},
    "spec": {"replicas": 4}}
ONE_RS = {**RS, "metadata": {**RS["metadata"], "name": "solo-1"}, "spec": {"replicas": 1}}
JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "mpi", "namespace": NS},
       "spec": {"parallelism": 3, "completions": 6}}
PROFILE = {"apiVersion": "tensor-fusion.ai/v1", "kind": "WorkloadProfile",
           "metadata": {"name": "gang", "namespace": NS},
           "spec": {"replicas": 5, "gangScheduling": {"minMembers": 3, "timeout": "2m", "mode": "Strict"}}}
OBJECTS = (POOL_A, RS, ONE_RS, JOB, PROFILE)


def owned(kind: str, name: str) -> list[dict[str, Any]]:
    api = "apps/v1" if kind == "ReplicaSet" else "batch/v1"
    return [{"apiVersion": api, "kind": kind, "name": name, "controller": True}]


TRAIN = ("ReplicaSet", "train-5c4f")


def gang_pod(annotations: dict[str, str], owner: tuple[str, str] | None = TRAIN) -> Any:
    p = pod({**tf(gpupool="pool-a", tflops_request="10", vram_request="1Gi"), **annotations})
    if owner:
        p["metadata"]["ownerReferences"] = owned(*owner)
    return p


STAMPED = [
    # (case, annotations, owner, desired, required, group key)
    ("replicas of the Deployment's ReplicaSet", tf(gang_enabled="true"), ("ReplicaSet", "train-5c4f"),
     "4", "4", f"{NS}/train"),
    ("min-members below replicas", tf(gang_enabled="true", gang_min_members="2"), TRAIN,
     "4", "2", f"{NS}/train"),
    ("min-members 0 means every replica", tf(gang_enabled="true", gang_min_members="0"),
     ("ReplicaSet", "train-5c4f"), "4", "4", f"{NS}/train"),
    ("a Job's parallelism", tf(gang_enabled="true"), ("Job", "mpi"), "3", "3", f"{NS}/mpi"),
    ("enabled-replicas wins over the owner", tf(gang_enabled="true", enabled_replicas="2"),
     ("ReplicaSet", "train-5c4f"), "2", "2", f"{NS}/train"),
    ("profile replicas and minMembers", tf(workload_profile="gang"), ("ReplicaSet", "train-5c4f"),
     "5", "3", f"{NS}/train"),
    ("size unknown but min-members named", tf(gang_enabled="true", gang_min_members="3"), None,
     "3", "3", f"{NS}/p"),
]


@pytest.mark.parametrize(("case", "annotations", "owner", "desired", "required", "key"), STAMPED,
                         ids=[row[0] for row in STAMPED])
def test_the_webhook_stamps_the_gang(case: str, annotations: dict[str, str], owner: Any, desired: str,
                                     required: str, key: str) -> None:
    p = gang_pod(annotations, owner)
    result = mutate(p, view(*OBJECTS), scheduler_name=SCHEDULER, index=1)
    assert result.denial is None, result.denial
    stamped = result.pod["metadata"]["annotations"]
    got = [stamped[f"tensor-fusion.ai/gang-{k}"] for k in ("desired-members", "required-members",
                                                           "group-key")]
    assert got == [desired, required, key]
    assert jsonpatch.apply_patch(p, result.patch) == result.pod
    again = mutate(result.pod, view(*OBJECTS), scheduler_name=SCHEDULER, index=1)
    assert again.patch == []  # stamping twice changes nothing more


def test_the_profile_timeout_is_stamped_and_the_pods_own_wins() -> None:
    stamped = mutate(gang_pod(tf(workload_profile="gang")), view(*OBJECTS), scheduler_name=SCHEDULER,
                     index=1).pod["metadata"]["annotations"]
    assert stamped["tensor-fusion.ai/gang-timeout"] == "120s"
    own = mutate(gang_pod(tf(workload_profile="gang", gang_timeout="0")), view(*OBJECTS),
                 scheduler_name=SCHEDULER, index=1).pod["metadata"]["annotations"]
    assert own["tensor-fusion.ai/gang-timeout"] == "0"  # the pod's "wait forever" overrides the profile


DENIED = [
    ("one replica", tf(gang_enabled="true"), ("ReplicaSet", "solo-1"),
     'tensor-fusion.ai/gang-enabled="true"', "at least 2 replicas; the workload has 1"),
    ("min above desired", tf(gang_enabled="true", gang_min_members="5"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-min-members="5"', "exceeds the workload's 4 replicas"),
    ("min of one", tf(gang_enabled="true", gang_min_members="1"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-min-members="1"', "at least 2 members"),
    ("negative min", tf(gang_enabled="true", gang_min_members="-2"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-min-members="-2"', "between 0 and"),
    ("min not a number", tf(gang_enabled="true", gang_min_members="four"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-min-members="four"', "not an integer"),
    ("bad timeout", tf(gang_enabled="true", gang_timeout="5 minutes"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-timeout="5 minutes"', "not a duration"),
    ("size unknown", tf(gang_enabled="true"), None,
     'tensor-fusion.ai/gang-enabled="true"', "cannot tell the gang's size"),
    ("enabled not a boolean", tf(gang_enabled="yes"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/gang-enabled="yes"', 'must be "true" or "false"'),
    ("bad enabled-replicas", tf(gang_enabled="true", enabled_replicas="x"), ("ReplicaSet", "train-5c4f"),
     'tensor-fusion.ai/enabled-replicas="x"', "not an integer"),
]


@pytest.mark.parametrize(("case", "annotations", "owner", "named", "why"), DENIED, ids=[r[0] for r in DENIED])
def test_the_webhook_denies_a_gang_that_cannot_run(case: str, annotations: dict[str, str], owner: Any,
                                                   named: str, why: str) -> None:
    result = mutate(gang_pod(annotations, owner), view(*OBJECTS), scheduler_name=SCHEDULER, index=1)
    assert result.denial is not None
    assert named in result.denial.message and why in result.denial.message, result.denial.message


@pytest.mark.parametrize("annotations", [tf(gang_enabled="false"), {}])
def test_pods_not_in_a_gang_get_no_gang_stamps(annotations: dict[str, str]) -> None:
    stamped = mutate(gang_pod(annotations), view(*OBJECTS), scheduler_name=SCHEDULER,
                     index=1).pod["metadata"]["annotations"]
    assert not [k for k in stamped if k.startswith("tensor-fusion.ai/gang-") and not k.endswith("-enabled")]
