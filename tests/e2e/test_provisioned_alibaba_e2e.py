"""Provisioned mode through Alibaba Cloud ECS: the extender buys VMs with the official SDK.

The real kube-apiserver, kube-scheduler, kwok, tf-webhook and tf-extender run as in every module. The cloud
is the local stand-in of ECS's RPC API (tests/harness/ecs.py), standing in for Alibaba Cloud's endpoint, as
no emulator of it exists: it checks the SDK's ACS3-HMAC-SHA256 signature, answers in ECS's shapes, replays
ClientTokens and refuses chosen (type, zone) pairs with ``OperationDenied.NoStock``.

``EcsCloudInit`` stands in for what a real VM does at boot: for every running instance tagged for this
cluster it reads the user data through DescribeUserData and, when the script passes ``--node-labels`` to
the kubelet, creates the kwok Node with those labels plus the GPU discovery labels GPU Feature Discovery
would write for the instance type. The instance catalog lists two ECS GPU types (the built-in one is AWS's).
"""

from __future__ import annotations

import base64
import contextlib
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness import ecs

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-alibaba"
POOL_LABEL = "tensor-fusion.ai/gpupool"
PROVISIONER = "tensor-fusion.ai/node-provisioner"
CLAIM_TAG = "tensor-fusion.ai/node-name"
CLUSTER_TAG = "tensor-fusion.ai/cluster"
ORPHAN_GRACE = 6
GPU_TYPE = "ecs.gn7i-c8g1.2xlarge"  # one A10, 24 GiB
# What GPU Feature Discovery would label a node of this type with.
GFD = {GPU_TYPE: ("A10", 1, 24576)}
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


class EcsCloudInit:
    """Plays each ECS instance's boot: its user data's ``--node-labels`` become a kwok Node."""

    def __init__(self, api_client: Any, standin: ecs.ECSStandIn) -> None:
        self.core = client.CoreV1Api(api_client)
        self.standin = standin
        self.booted: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                self._boot_new()

    def _boot_new(self) -> None:
        listed = ecs.sdk_call(
            self.standin.url,
            "DescribeInstances",
            {
                "RegionId": ecs.REGION,
                "Status": "Running",
                "MaxResults": 100,
                "Tag": [{"Key": CLUSTER_TAG, "Value": CLUSTER}],
            },
        )
        for instance in listed["Instances"]["Instance"]:
            iid = instance["InstanceId"]
            if iid in self.booted:
                continue
            data = ecs.sdk_call(
                self.standin.url, "DescribeUserData", {"RegionId": ecs.REGION, "InstanceId": iid}
            )
            script = base64.b64decode(data.get("UserData") or "").decode()
            match = re.search(r"--node-labels=([^'\s]+)", script)
            if not match:
                self.booted[iid] = ""
                continue
            labels = dict(item.split("=", 1) for item in match.group(1).split(","))
            model, count, memory = GFD[instance["InstanceType"]]
            labels.update(
                {
                    "nvidia.com/gpu.product": model,
                    "nvidia.com/gpu.count": str(count),
                    "nvidia.com/gpu.memory": str(memory),
                    "topology.kubernetes.io/zone": instance["ZoneId"],
                    "node.kubernetes.io/instance-type": instance["InstanceType"],
                }
            )
            name = f"{ecs.REGION}.{iid}"
            body = cpl.node_body(name, labels=labels)
            body["spec"] = {**body.get("spec", {}), "providerID": f"{ecs.REGION}.{iid}"}
            self.core.create_node(body)
            self.booted[iid] = name

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


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
    return {"vendor": str(folder / "computing-vendor.yaml"), "catalog": str(folder / "catalog.yaml")}


@pytest.fixture
def provisioned(
    cluster: Any,
    webhook: Any,
    extender_runner: cpl.ExtenderRunner,
    files: dict[str, str],
    api_client: Any,
    standin: Any,
) -> Iterator[EcsCloudInit]:
    extender_runner.ensure(
        capacity_interval=1,
        node_protection_time=5,
        computing_vendor=files["vendor"],
        catalog=files["catalog"],
        cluster_name=CLUSTER,
        orphan_grace=ORPHAN_GRACE,
        capacity_error_backoff=120,
    )
    boot = EcsCloudInit(api_client, standin[0])
    yield boot
    boot.stop()


@pytest.fixture
def pool(api_client: Any, webhook: Any, standin: Any) -> Iterator[str]:
    """A Provisioned GPUPool of one TFLOPS minimum over both zones, with its GPUNodeClass; at teardown the
    pool, its claims (whose finalizers delete the VMs) and nodes go."""
    _, world = standin
    custom = client.CustomObjectsApi(api_client)
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
    cpl.create_cluster_object(
        api_client,
        "gpupools",
        {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}",
            "kind": "GPUPool",
            "metadata": {"name": name},
            "spec": {
                "capacityConfig": {"minResources": {"tflops": "1"}},
                "nodeManagerConfig": {
                    "provisioningMode": "Provisioned",
                    "nodeCompaction": {"period": "5s"},
                    "nodeProvisioner": {
                        "nodeClass": name,
                        "gpuRequirements": requirements,
                        "gpuNodeLabels": {"team": "ml"},
                    },
                },
            },
        },
    )
    cpl.wait_for_webhook_pool(api_client, name)
    yield name
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpupools", name)
    for claim in claims_of(api_client, name):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(
                cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclaims", claim["metadata"]["name"]
            )
    with contextlib.suppress(TimeoutError):
        cpl.wait_until(lambda: not claims_of(api_client, name), 60, interval=1, what="the claims gone")
    for claim in claims_of(api_client, name):
        with contextlib.suppress(ApiException):
            custom.patch_cluster_custom_object(
                cpl.TF_GROUP,
                cpl.TF_VERSION,
                "gpunodeclaims",
                claim["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )
    core = client.CoreV1Api(api_client)
    for node in core.list_node(label_selector=f"{POOL_LABEL}={name}").items:
        with contextlib.suppress(ApiException):
            core.delete_node(node.metadata.name)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclasses", name)


def claims_of(api_client: Any, pool: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(api_client).list_cluster_custom_object(
        cpl.TF_GROUP, cpl.TF_VERSION, "gpunodeclaims", label_selector=f"{POOL_LABEL}={pool}"
    )["items"]


def listed(server: ecs.ECSStandIn, **tags: str) -> list[dict[str, Any]]:
    """DescribeInstances through the SDK, by tags: what ECS still lists."""
    answer = ecs.sdk_call(
        server.url,
        "DescribeInstances",
        {"RegionId": ecs.REGION, "MaxResults": 100, "Tag": [{"Key": k, "Value": v} for k, v in tags.items()]},
    )
    return answer["Instances"]["Instance"]  # type: ignore[no-any-return]


def events(api_client: Any, kind: str, name: str, reason: str) -> list[Any]:
    return [
        e
        for e in client.CoreV1Api(api_client)
        .list_namespaced_event(
            "default", field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
        )
        .items
        if e.reason == reason
    ]


def test_min_capacity_is_bought_through_ecs_in_the_zone_with_stock_then_bound_and_released(
    provisioned: EcsCloudInit, pool: str, api_client: Any, standin: Any
) -> None:
    server, world = standin
    # the pool's first zone is sold out; cheapest first, so the other zone gets the VM
    for zone in ecs.ZONES[:1]:
        server.refuse.add((GPU_TYPE, zone))
    try:
        bound = cpl.wait_until(
            lambda: (
                [c for c in claims_of(api_client, pool) if (c.get("status") or {}).get("phase") == "Bound"]
                or None
            ),
            90,
            interval=1,
            what="a Bound GPUNodeClaim",
        )
        assert cpl.wait_until(lambda: events(api_client, "GPUPool", pool, "InsufficientCapacity"), 30)
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
    sent = [p for action, p in server.requests if action == "RunInstances"
            and {"Key": POOL_LABEL, "Value": pool} in p.get("Tag", [])]
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
    provisioned: EcsCloudInit, api_client: Any, standin: Any
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
