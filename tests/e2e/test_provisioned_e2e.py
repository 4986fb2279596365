"""Provisioned mode against a real EC2 emulator: the extender buys VMs through the EC2 API itself.

The real kube-apiserver, kube-scheduler, kwok, tf-webhook and tf-extender run as in every module; the cloud
is moto's EC2 server on loopback (tests/harness/cloud.py) behind a proxy that answers chosen RunInstances
with ``InsufficientInstanceCapacity``. The extender's client is aiobotocore speaking signed HTTP to it.

``CloudInit`` (tests/harness/provisioned.py) stands in for what a real VM does at boot, since moto's
instances run nothing: for every running instance tagged for this cluster it reads the user data through
DescribeInstanceAttribute and creates the kwok Node its ``--node-labels`` ask for, with GPU discovery labels.
"""

from __future__ import annotations

import base64
import contextlib
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness import cloud
from tests.harness.provisioned import (
    CloudInit,
    bound_claims,
    claims_of,
    provisioned_pool_body,
    provisioner_condition,
    release_pool,
)

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-provisioned"
POOL_LABEL = "tensor-fusion.ai/gpupool"
PROVISIONER = "tensor-fusion.ai/node-provisioner"
CLAIM_TAG, CLUSTER_TAG = cloud.CLAIM_TAG, cloud.CLUSTER_TAG
JOIN_TIMEOUT = 25
ORPHAN_GRACE = 6
PROTECTION = 5
NO_LABEL_USER_DATA = "#!/bin/bash\n/etc/eks/bootstrap.sh e2e\n"


@pytest.fixture(scope="module")
def ec2() -> Iterator[tuple[cloud.MotoServer, cloud.CapacityProxy, cloud.EC2World]]:
    with cloud.ec2_cloud() as (moto, proxy):
        yield moto, proxy, cloud.seed(proxy.url)


@pytest.fixture(scope="module")
def vendor_file(ec2: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(cloud.vendor_file(ec2[1].url, tmp_path_factory.mktemp("cloud-credentials")))


@pytest.fixture
def provisioned(
    cluster: Any,
    webhook: Any,
    extender_runner: cpl.ExtenderRunner,
    vendor_file: str,
    api_client: Any,
    ec2: Any,
) -> Iterator[CloudInit]:
    extender_runner.ensure(
        capacity_interval=1,
        node_protection_time=PROTECTION,
        computing_vendor=vendor_file,
        cluster_name=CLUSTER,
        node_join_timeout=JOIN_TIMEOUT,
        orphan_grace=ORPHAN_GRACE,
        capacity_error_backoff=120,
    )
    boot = cloud.ec2_cloud_init(api_client, ec2[1].url, CLUSTER)
    yield boot
    boot.stop()


@pytest.fixture
def make_pool(api_client: Any, webhook: Any, ec2: Any) -> Iterator[Callable[..., str]]:
    """make_pool(min_tflops, types=, zones=, node_class=) -> a Provisioned GPUPool with its own GPUNodeClass;
    at teardown the pool goes, then its claims (whose finalizers terminate the VMs) and nodes."""
    made: list[str] = []

    def factory(
        min_tflops: int = 1,
        *,
        types: tuple[str, ...] = ("g5.xlarge",),
        zones: tuple[str, ...] = ("us-east-1a",),
        node_class: dict[str, Any] | None = None,
        create_class: bool = True,
    ) -> str:
        name = f"prov-{uuid.uuid4().hex[:6]}"
        if create_class:
            body = node_class if node_class is not None else cloud.node_class_body(name, ec2[2])
            body["metadata"]["name"] = name  # each pool its own class, named after it
            cpl.create_cluster_object(api_client, "gpunodeclasses", body)
        requirements = [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(types)},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": list(zones)},
        ]
        cpl.create_cluster_object(
            api_client, "gpupools", provisioned_pool_body(name, requirements, min_tflops=min_tflops)
        )
        made.append(name)
        cpl.wait_for_webhook_pool(api_client, name)
        return name

    yield factory
    for name in made:
        release_pool(api_client, name)


def instances(proxy: cloud.CapacityProxy, **tags: str) -> list[dict[str, Any]]:
    return cloud.instances(proxy.url, **tags)


def live(proxy: cloud.CapacityProxy, **tags: str) -> list[dict[str, Any]]:
    return cloud.live(proxy.url, **tags)


def test_min_capacity_is_bought_through_ec2_skipping_a_refused_offering_then_bound_and_compacted(
    provisioned: CloudInit, make_pool: Callable[..., str], api_client: Any, ec2: Any
) -> None:
    _, proxy, world = ec2
    proxy.refuse.add(("g6.xlarge", "us-east-1a"))  # the cheapest offering: no capacity
    try:
        pool = make_pool(1, types=("g5.xlarge", "g6.xlarge"), zones=("us-east-1a",))
        bound = cpl.wait_until(
            lambda: bound_claims(api_client, pool),
            90,
            interval=1,
            what="a Bound GPUNodeClaim",
        )
    finally:
        proxy.refuse.clear()
    assert ("g6.xlarge", "us-east-1a") in proxy.refused
    assert cpl.wait_until(lambda: cpl.object_events(api_client, "GPUPool", pool, "InsufficientCapacity"), 30)
    claim = bound[0]
    name, instance_id = claim["metadata"]["name"], claim["status"]["instanceID"]
    assert (
        claim["spec"]["instanceType"] == "g5.xlarge"
        and claim["spec"]["nodeClassRef"]["kind"] == "GPUNodeClass"
    )
    assert "tensor-fusion.ai/provisioned-node" in claim["metadata"]["finalizers"]
    mine = live(proxy, **{CLAIM_TAG: name})
    assert [i["InstanceId"] for i in mine] == [instance_id], "one VM per claim"
    raw = mine[0]
    assert raw["ImageId"] == world.image and raw["InstanceType"] == "g5.xlarge"
    assert (
        raw["SubnetId"] == world.subnets["us-east-1a"]
        and raw["Placement"]["AvailabilityZone"] == "us-east-1a"
    )
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [world.security_group]
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags[CLUSTER_TAG] == CLUSTER and tags[POOL_LABEL] == pool and tags["team"] == "ml"
    user_data = cloud.boto_client(proxy.url).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData"
    )
    assert f"{PROVISIONER}={name}," in base64.b64decode(user_data["UserData"]["Value"]).decode()
    node = client.CoreV1Api(api_client).read_node(claim["spec"]["nodeName"])
    assert node.metadata.labels[POOL_LABEL] == pool, "the extender labels the joined node with its pool"
    cond = cpl.wait_until(
        lambda: (c := provisioner_condition(api_client, pool)) and c["status"] == "True" and c, 30
    )
    assert "connected" in cond["message"]

    # compaction: the pool no longer needs the node; the claim goes, its finalizer terminates the VM and
    # deletes the Node
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool, {"spec": {"capacityConfig": {"minResources": None}}}
    )
    cpl.wait_until(lambda: not claims_of(api_client, pool), 90, interval=1, what="the claim released")
    assert not live(proxy, **{CLAIM_TAG: name}), "the VM is terminated"
    with pytest.raises(ApiException):
        client.CoreV1Api(api_client).read_node(claim["spec"]["nodeName"])


def test_a_claim_left_pending_by_a_killed_extender_adopts_its_vm_instead_of_buying_another(
    provisioned: CloudInit,
    make_pool: Callable[..., str],
    api_client: Any,
    ec2: Any,
    extender_runner: cpl.ExtenderRunner,
) -> None:
    """What an extender killed between RunInstances and the status write leaves: a Pending GPUNodeClaim
    without an instance id, and a VM tagged with the claim's name. The restarted extender finds the VM by
    its tag and records it; no second VM is bought."""
    _, proxy, world = ec2
    pool = make_pool(1)
    first = cpl.wait_until(
        lambda: bound_claims(api_client, pool),
        90,
        interval=1,
    )
    claim = first[0]
    name = claim["metadata"]["name"]
    before = {i["InstanceId"] for i in live(proxy, **{CLUSTER_TAG: CLUSTER, POOL_LABEL: pool})}
    # the extender dies; its last write (Creating, the instance id) never happened
    extender_runner.kill()
    client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        cpl.TF_GROUP,
        cpl.TF_VERSION,
        "gpunodeclaims",
        name,
        {"status": {"phase": "Pending", "instanceID": None}},
    )
    extender_runner.restart()
    cpl.wait_until(
        lambda: (
            (c := next((x for x in claims_of(api_client, pool) if x["metadata"]["name"] == name), None))
            and (c.get("status") or {}).get("instanceID") in before
            and c["status"]["phase"] == "Bound"
        ),
        60,
        interval=1,
        what="the claim adopted its VM",
    )
    after = {i["InstanceId"] for i in live(proxy, **{CLUSTER_TAG: CLUSTER, POOL_LABEL: pool})}
    assert after == before, f"no second VM: {before} -> {after}"
    assert len(claims_of(api_client, pool)) == 1, (
        "pending capacity recovered from the claims: nothing more bought"
    )
    assert world.image


def test_a_vm_whose_node_never_joins_is_terminated_after_the_join_timeout(
    provisioned: CloudInit, make_pool: Callable[..., str], api_client: Any, ec2: Any
) -> None:
    _, proxy, world = ec2
    pool = make_pool(1, node_class=cloud.node_class_body("", world, userData=NO_LABEL_USER_DATA))
    first = cpl.wait_until(
        lambda: [c for c in claims_of(api_client, pool) if (c.get("status") or {}).get("instanceID")] or None,
        60,
        interval=1,
    )
    claim_name, instance_id = first[0]["metadata"]["name"], first[0]["status"]["instanceID"]
    cpl.wait_until(
        lambda: cpl.object_events(api_client, "GPUNodeClaim", claim_name, "NodeNotJoined"),
        JOIN_TIMEOUT + 60,
        interval=1,
        what="NodeNotJoined",
    )
    cpl.wait_until(
        lambda: claim_name not in {c["metadata"]["name"] for c in claims_of(api_client, pool)},
        60,
        interval=1,
        what="the claim deleted",
    )
    state = [i["State"]["Name"] for i in instances(proxy, **{CLAIM_TAG: claim_name})]
    assert instance_id and state and all(s in ("shutting-down", "terminated") for s in state), state


def test_a_vm_tagged_for_the_cluster_that_no_claim_owns_is_terminated_after_the_grace(
    provisioned: CloudInit, api_client: Any, ec2: Any
) -> None:
    _, proxy, world = ec2
    ec2_client = cloud.boto_client(proxy.url)
    ghost = ec2_client.run_instances(
        ImageId=world.image,
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": CLUSTER_TAG, "Value": CLUSTER}, {"Key": CLAIM_TAG, "Value": "ghost-000000"}],
            }
        ],
    )["Instances"][0]
    other = ec2_client.run_instances(
        ImageId=world.image,
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": CLUSTER_TAG, "Value": "another-cluster"}]}
        ],
    )["Instances"][0]
    cpl.wait_until(
        lambda: not live(proxy, **{CLAIM_TAG: "ghost-000000"}),
        ORPHAN_GRACE + 90,
        interval=1,
        what="the orphan terminated",
    )
    assert live(proxy, **{CLUSTER_TAG: "another-cluster"}), "a VM of another cluster is never touched"
    assert ghost["InstanceId"] != other["InstanceId"]


@pytest.mark.parametrize(
    ("spec", "reason", "field"),
    [
        ({"osImageSelectorTerms": None}, "InvalidNodeClass", "spec.osImageSelectorTerms"),
        (
            {"osImageSelectorTerms": [{"id": "ami-0000000000000dead"}]},
            "LaunchFailed",
            "ami-0000000000000dead",
        ),
    ],
)
def test_a_bad_node_class_gives_a_condition_naming_the_field_and_no_vm(
    provisioned: CloudInit,
    make_pool: Callable[..., str],
    api_client: Any,
    ec2: Any,
    spec: dict[str, Any],
    reason: str,
    field: str,
) -> None:
    _, proxy, world = ec2
    body = cloud.node_class_body("", world, **spec)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    pool = make_pool(1, node_class=body)
    cond = cpl.wait_until(
        lambda: (
            (c := provisioner_condition(api_client, pool))
            and c["status"] == "False"
            and c["reason"] == reason
            and c
        ),
        60,
        interval=1,
        what=f"condition {reason}",
    )
    assert field in cond["message"]
    assert not live(proxy, **{POOL_LABEL: pool}), "no VM for a bad class"


def test_a_pool_whose_node_class_does_not_exist_says_so(
    provisioned: CloudInit, make_pool: Callable[..., str], api_client: Any
) -> None:
    pool = make_pool(1, create_class=False)
    cond = cpl.wait_until(
        lambda: (c := provisioner_condition(api_client, pool)) and c["status"] == "False" and c,
        60,
        interval=1,
    )
    assert cond["reason"] == "NodeClassNotFound" and pool in cond["message"]
    assert not claims_of(api_client, pool)


def test_a_pool_whose_every_offering_is_out_of_capacity_says_so_once_not_that_its_requirements_match_nothing(
    provisioned: CloudInit, make_pool: Callable[..., str], api_client: Any, ec2: Any
) -> None:
    """Its one offering refused (g6.xlarge in us-east-1b, which no other test of the module asks for): one
    CapacityBackoff event with the cloud's words and the next try, the condition CapacityAvailable False,
    and never NoEligibleInstanceType, while passes go on every few seconds."""
    from kubernetes import client

    _, proxy, _world = ec2
    proxy.refuse.add(("g6.xlarge", "us-east-1b"))
    try:
        pool = make_pool(1, types=("g6.xlarge",), zones=("us-east-1b",))
        (event,) = cpl.wait_until(
            lambda: cpl.object_events(api_client, "GPUPool", pool, "CapacityBackoff"), 60, interval=1,
            what="a CapacityBackoff event")
        assert "g6.xlarge (on-demand in us-east-1b)" in event.message and "next try at" in event.message
        time.sleep(10 * cpl.TIMEOUT_SCALE)  # passes go on: the same back-off is news once
        events = cpl.object_events(api_client, "GPUPool", pool, "CapacityBackoff")
        assert len(events) == 1 and (events[0].count or 1) == 1, [(e.message, e.count) for e in events]
        assert not cpl.object_events(api_client, "GPUPool", pool, "NoEligibleInstanceType")
        obj = client.CustomObjectsApi(api_client).get_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION,
                                                                            "gpupools", pool)
        (available,) = [c for c in obj["status"]["conditions"] if c["type"] == "CapacityAvailable"]
        assert (available["status"], available["reason"]) == ("False", "CapacityBackoff")
        assert available["message"] == event.message
    finally:
        proxy.refuse.clear()


# Last in the module: the only test without --computing-vendor (the extender restarts once for it).
def test_a_pool_derived_from_a_tensorfusioncluster_buys_through_its_computing_vendor_and_cleans_up_after_it(
    cluster: Any,
    webhook: Any,
    extender_runner: cpl.ExtenderRunner,
    api_client: Any,
    ec2: Any,
    vendor_file: str,
) -> None:
    """No --computing-vendor: the pool's VMs go through its TensorFusionCluster's spec.computingVendor. When
    the cluster is deleted, the garbage collector takes its pool and the pool its claim, and the claim's
    finalizer still terminates the VM, through the vendor the claim recorded."""
    _, proxy, world = ec2
    extender_runner.ensure(
        capacity_interval=1,
        node_protection_time=PROTECTION,
        cluster_name=CLUSTER,
        node_join_timeout=JOIN_TIMEOUT,
        orphan_grace=ORPHAN_GRACE,
        capacity_error_backoff=120,
        tensorfusion_cluster_interval=1,
        cloud_key_dir=tempfile.gettempdir(),  # where the module's key files are (TMPDIR may not be /tmp)
        cloud_endpoint_allow="http://127.0.0.1",  # the cluster's endpoint is the local EC2 emulator's
    )
    custom = client.CustomObjectsApi(api_client)
    name = f"tfc-{uuid.uuid4().hex[:6]}"
    pool = f"{name}-gpu"
    cpl.create_cluster_object(api_client, "gpunodeclasses", cloud.node_class_body(pool, world))
    with open(vendor_file, encoding="utf-8") as handle:
        vendor = yaml.safe_load(handle)
    template = {
        "capacityConfig": {"minResources": {"tflops": "1"}},
        "nodeManagerConfig": {
            "provisioningMode": "Provisioned",
            "nodeProvisioner": {
                "nodeClass": pool,
                "gpuRequirements": [
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["g5.xlarge"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
                ],
            },
        },
    }
    cpl.create_cluster_object(
        api_client,
        "tensorfusionclusters",
        {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}",
            "kind": "TensorFusionCluster",
            "metadata": {"name": name},
            "spec": {"computingVendor": vendor, "gpuPools": [{"name": "gpu", "specTemplate": template}]},
        },
    )
    boot = cloud.ec2_cloud_init(api_client, proxy.url, CLUSTER)
    claim_name = ""
    try:
        bound = cpl.wait_until(
            lambda: bound_claims(api_client, pool),
            90,
            interval=1,
            what="a Bound GPUNodeClaim of the derived pool",
        )
        claim = bound[0]
        claim_name = claim["metadata"]["name"]
        mine = [i["InstanceId"] for i in live(proxy, **{CLAIM_TAG: claim_name})]
        assert mine == [claim["status"]["instanceID"]]
        text = claim["metadata"]["annotations"]["tensor-fusion.ai/computing-vendor"]
        assert yaml.safe_load(text)["params"]["extraParams"]["endpoint"] == proxy.url
        assert cloud.SECRET_KEY not in text and cloud.ACCESS_KEY not in text, "paths are recorded, not keys"
        cond = cpl.wait_until(
            lambda: (c := provisioner_condition(api_client, pool)) and c["status"] == "True" and c, 30
        )
        assert f"TensorFusionCluster {name} spec.computingVendor" in cond["message"]

        # the cluster goes: its pool, then the claim, follow (garbage collector); the VM is terminated
        custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "tensorfusionclusters", name)
        cpl.wait_until(lambda: not claims_of(api_client, pool), 90, interval=1, what="the claim released")
        assert not live(proxy, **{CLAIM_TAG: claim_name}), "the VM is terminated"
    finally:
        boot.stop()
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "tensorfusionclusters", name)
        release_pool(api_client, pool)
