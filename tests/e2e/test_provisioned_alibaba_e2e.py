"""Provisioned mode through Alibaba Cloud ECS: the extender buys VMs with the official SDK.

The real kube-apiserver, kube-scheduler, kwok, tf-webhook and tf-extender run as in every module. The cloud
is the local stand-in of ECS's RPC API (tests/harness/ecs.py), standing in for Alibaba Cloud's endpoint, as
no emulator of it exists: it checks the SDK's ACS3-HMAC-SHA256 signature, answers in ECS's shapes, replays
ClientTokens and refuses chosen (type, zone) pairs with ``OperationDenied.NoStock``.

``CloudInit`` (tests/harness/provisioned.py) stands in for what a real VM does at boot: for every running
instance tagged for this cluster it reads the user data through DescribeUserData and creates the kwok Node
its ``--node-labels`` ask for, with GPU discovery labels. The instance catalog lists an ECS GPU type (the
built-in one is AWS's).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness import ecs
from tests.harness.provisioned import (
    Booting,
    CloudInit,
    GPUs,
    bound_claims,
    claims_of,
    provisioned_pool_body,
    provisioner_condition,
    release_pool,
)

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-alibaba"
POOL_LABEL = "tensor-fusion.ai/gpupool"
PROVISIONER = "tensor-fusion.ai/node-provisioner"
CLAIM_TAG = "tensor-fusion.ai/node-name"
CLUSTER_TAG = "tensor-fusion.ai/cluster"
ORPHAN_GRACE = 6
GPU_TYPE = "ecs.gn7i-c8g1.2xlarge"  # one A10, 24 GiB
# What GPU Feature Discovery would label a node of this type with.
GFD = {GPU_TYPE: GPUs("A10", 1, 24576)}
CATALOG = {
    "instanceTypes": [
        {
            "name": GPU_TYPE,
            "arch": "amd64",
            "gpuModel": "A10",
            "gpuCount": 1,
            "vramPerGPU": "24Gi",
            "prices": {"on-demand": 1.2},
            "zones": list(ecs.ZONES),
        },
    ]
}
USER_DATA = (
    "#!/bin/bash\n/usr/local/bin/ack-join --kubelet-extra-args "
    "'--node-labels=tensor-fusion.ai/node-provisioner=__GPU_NODE_RESOURCE_NAME__,team=ml'\n"
)


def ecs_cloud_init(api_client: Any, standin: ecs.ECSStandIn) -> CloudInit:
    """CloudInit over the stand-in, through the SDK: the running instances tagged for this cluster, their
    user data by DescribeUserData, Nodes named as ACK names them (region.instance id)."""

    def running() -> list[Booting]:
        listed = ecs.sdk_call(
            standin.url,
            "DescribeInstances",
            {
                "RegionId": ecs.REGION,
                "Status": "Running",
                "MaxResults": 100,
                "Tag": [{"Key": CLUSTER_TAG, "Value": CLUSTER}],
            },
        )
        return [
            Booting(i["InstanceId"], i["InstanceType"], i["ZoneId"]) for i in listed["Instances"]["Instance"]
        ]

    def user_data(instance_id: str) -> str:
        data = ecs.sdk_call(
            standin.url, "DescribeUserData", {"RegionId": ecs.REGION, "InstanceId": instance_id}
        )
        return base64.b64decode(data.get("UserData") or "").decode()

    return CloudInit(
        api_client,
        running=running,
        user_data=user_data,
        gpus=GFD,
        node_name=lambda iid: f"{ecs.REGION}.{iid}",
        provider_id=lambda iid, zone: f"{ecs.REGION}.{iid}",
    )


@pytest.fixture(scope="module")
def standin() -> Iterator[tuple[ecs.ECSStandIn, ecs.ECSWorld]]:
    with ecs.serve() as server:
        yield server, server.seed()


@pytest.fixture(scope="module")
def files(standin: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    server, _ = standin
    folder = tmp_path_factory.mktemp("alibaba")
    (folder / "ak").write_text(ecs.ACCESS_KEY)
    (folder / "sk").write_text(ecs.SECRET_KEY)
    vendor = {
        "type": "alibaba",
        "authType": "accessKey",
        "params": {
            "defaultRegion": ecs.REGION,
            "accessKeyPath": str(folder / "ak"),
            "secretKeyPath": str(folder / "sk"),
            "extraParams": {"endpoint": server.url},
        },
    }
    (folder / "computing-vendor.yaml").write_text(yaml.safe_dump(vendor))
    (folder / "catalog.yaml").write_text(yaml.safe_dump(CATALOG))
    return {
        "vendor": str(folder / "computing-vendor.yaml"),
        "catalog": str(folder / "catalog.yaml"),
        "ak": str(folder / "ak"),
    }


@pytest.fixture
def provisioned(
    cluster: Any,
    webhook: Any,
    extender_runner: cpl.ExtenderRunner,
    files: dict[str, str],
    api_client: Any,
    standin: Any,
) -> Iterator[CloudInit]:
    extender_runner.ensure(
        capacity_interval=1,
        node_protection_time=5,
        computing_vendor=files["vendor"],
        catalog=files["catalog"],
        cluster_name=CLUSTER,
        orphan_grace=ORPHAN_GRACE,
        capacity_error_backoff=120,
    )
    boot = ecs_cloud_init(api_client, standin[0])
    yield boot
    boot.stop()


@pytest.fixture
def pool(api_client: Any, webhook: Any, standin: Any) -> Iterator[str]:
    """A Provisioned GPUPool of one TFLOPS minimum over both zones, with its GPUNodeClass; at teardown the
    pool, its claims (whose finalizers delete the VMs) and nodes go."""
    _, world = standin
    name = f"ali-{uuid.uuid4().hex[:6]}"
    cpl.create_cluster_object(
        api_client,
        "gpunodeclasses",
        {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}",
            "kind": "GPUNodeClass",
            "metadata": {"name": name},
            "spec": {
                "osImageSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
                "subnetSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
                "securityGroupSelectorTerms": [{"id": world.security_group}],
                "instanceProfile": "TFGpuNodeRole",
                "tags": {"team": "ml"},
                "userData": USER_DATA,
            },
        },
    )
    requirements = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [GPU_TYPE]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": list(ecs.ZONES)},
    ]
    cpl.create_cluster_object(api_client, "gpupools", provisioned_pool_body(name, requirements))
    cpl.wait_for_webhook_pool(api_client, name)
    yield name
    release_pool(api_client, name)


def listed(server: ecs.ECSStandIn, **tags: str) -> list[dict[str, Any]]:
    """DescribeInstances through the SDK, by tags: what ECS still lists."""
    answer = ecs.sdk_call(
        server.url,
        "DescribeInstances",
        {"RegionId": ecs.REGION, "MaxResults": 100, "Tag": [{"Key": k, "Value": v} for k, v in tags.items()]},
    )
    return answer["Instances"]["Instance"]  # type: ignore[no-any-return]


def test_min_capacity_is_bought_through_ecs_in_the_zone_with_stock_then_bound_and_released(
    provisioned: CloudInit, pool: str, api_client: Any, standin: Any
) -> None:
    server, world = standin
    # the pool's first zone is sold out; the next offering, the other zone, gets the VM
    server.refuse.add((GPU_TYPE, ecs.ZONES[0]))
    try:
        bound = cpl.wait_until(
            lambda: bound_claims(api_client, pool), 90, interval=1, what="a Bound GPUNodeClaim"
        )
        refused = cpl.wait_until(
            lambda: cpl.object_events(api_client, "GPUPool", pool, "InsufficientCapacity"), 30)
        assert refused
    finally:
        server.refuse.clear()
    claim = bound[0]
    name, instance_id = claim["metadata"]["name"], claim["status"]["instanceID"]
    mine = listed(server, **{CLAIM_TAG: name})
    assert [i["InstanceId"] for i in mine] == [instance_id], "one VM per claim"
    raw = mine[0]
    assert (raw["ZoneId"], raw["VpcAttributes"]["VSwitchId"]) == (ecs.ZONES[1], world.vswitches[ecs.ZONES[1]])
    assert (raw["ImageId"], raw["InstanceType"], raw["InstanceName"]) == (world.image, GPU_TYPE, name)
    assert raw["SecurityGroupIds"]["SecurityGroupId"] == [world.security_group]
    tags = {t["TagKey"]: t["TagValue"] for t in raw["Tags"]["Tag"]}
    assert tags[CLUSTER_TAG] == CLUSTER and tags[POOL_LABEL] == pool and tags["team"] == "ml"
    sent = [
        p
        for action, p in server.requests
        if action == "RunInstances" and {"Key": POOL_LABEL, "Value": pool} in p.get("Tag", [])
    ]
    assert [p["ZoneId"] for p in sent] == [ecs.ZONES[0], ecs.ZONES[1]], "the sold-out zone, then the next"
    assert sent[-1]["ClientToken"] == name and all(p["RamRoleName"] == "TFGpuNodeRole" for p in sent)
    node = client.CoreV1Api(api_client).read_node(claim["spec"]["nodeName"])
    assert node.metadata.labels[POOL_LABEL] == pool and node.metadata.labels[PROVISIONER] == name

    # the pool no longer needs the node: the claim goes, its finalizer deletes the VM (Force) and the Node
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", pool, {"spec": {"capacityConfig": {"minResources": None}}}
    )
    cpl.wait_until(lambda: not claims_of(api_client, pool), 90, interval=1, what="the claim released")
    assert not listed(server, **{CLAIM_TAG: name}), "ECS no longer lists the VM"
    deletes = [
        p for action, p in server.requests if action == "DeleteInstances" and instance_id in p["InstanceId"]
    ]
    assert deletes and str(deletes[0]["Force"]).lower() == "true"
    with pytest.raises(ApiException):
        client.CoreV1Api(api_client).read_node(claim["spec"]["nodeName"])


def test_an_ecs_instance_tagged_for_the_cluster_that_no_claim_owns_is_deleted_after_the_grace(
    provisioned: CloudInit, api_client: Any, standin: Any
) -> None:
    server, world = standin

    def run(tags: dict[str, str]) -> str:
        answer = ecs.sdk_call(
            server.url,
            "RunInstances",
            {
                "RegionId": ecs.REGION,
                "ZoneId": ecs.ZONES[0],
                "InstanceType": GPU_TYPE,
                "ImageId": world.image,
                "Tag": [{"Key": k, "Value": v} for k, v in tags.items()],
            },
        )
        return str(answer["InstanceIdSets"]["InstanceIdSet"][0])

    ghost = run({CLUSTER_TAG: CLUSTER, CLAIM_TAG: "ghost-000000"})
    other = run({CLUSTER_TAG: "another-cluster"})
    cpl.wait_until(
        lambda: not listed(server, **{CLAIM_TAG: "ghost-000000"}),
        ORPHAN_GRACE + 90,
        interval=1,
        what="the orphan deleted",
    )
    assert listed(server, **{CLUSTER_TAG: "another-cluster"}), "a VM of another cluster is never touched"
    assert ghost != other


def test_a_secret_without_its_access_key_gives_a_condition_naming_the_field_and_no_vm(
    provisioned: CloudInit,
    api_client: Any,
    standin: Any,
    files: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    """The key file goes, as when the Secret is mounted without its ``ak`` key: no launch, the pool's
    condition names ``params.accessKeyPath``; with the file back the pool is served again."""
    server, _ = standin
    key = Path(files["ak"])
    kept = key.read_text()
    key.unlink()
    try:
        pool = request.getfixturevalue("pool")
        cond = cpl.wait_until(
            lambda: (c := provisioner_condition(api_client, pool)) and c["status"] == "False" and c,
            60,
            interval=1,
            what="NodeProvisionerReady False",
        )
        assert "params.accessKeyPath" in cond["message"] and files["ak"] in cond["message"], cond
        assert not listed(server, **{POOL_LABEL: pool}), "no VM without credentials"
        assert not [
            p
            for action, p in server.requests
            if action == "RunInstances" and {"Key": POOL_LABEL, "Value": pool} in p.get("Tag", [])
        ]
    finally:
        key.write_text(kept)
    cpl.wait_until(
        lambda: bound_claims(api_client, pool), 120, interval=1, what="the pool served once the key is back"
    )
