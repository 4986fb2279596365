"""TensorFusion's object model on the real control plane: a TensorFusionCluster derives its GPUPools (created,
updated from the template, a hand edit overwritten, deleted with its entry, all gone with the cluster through
kube-controller-manager's garbage collector), its status and ``CloudVendorConnectionReady``; a GPUNode per
GPU node (what ``kubectl get gpunode`` prints, read through the Table API kubectl uses) that follows the
ledger and goes with its Node; and a GPUNodeClaim labelled only with TensorFusion's
``tensor-fusion.ai/managed-by`` counted as capacity in flight and handled like the extender's own.

Karpenter's CRDs are installed (the ``karpenter`` vendor check lists NodeClaims); Karpenter itself does not
run: no node is launched here.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl

pytestmark = pytest.mark.e2e

G, V = cpl.TF_GROUP, cpl.TF_VERSION
_events = cpl.object_events
MANAGED_BY = "tensor-fusion.ai/managed-by"
DEFAULT_POOL = "tensor-fusion.ai/is-default-pool"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
KWOK_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "version": "v1alpha1", "name": "default"}


@pytest.fixture
def tf_extender(
    cluster: Any, webhook: Any, extender_runner: cpl.ExtenderRunner, karpenter_crds: Any
) -> cpl.ExtenderRunner:
    # not through the ``extender`` fixture, which would first start it with the default flags
    extender_runner.ensure(tensorfusion_cluster_interval=5, gpu_node_interval=1, capacity_interval=1)
    return extender_runner


@pytest.fixture
def custom(api_client: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def _get(custom: client.CustomObjectsApi, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return custom.get_cluster_custom_object(G, V, plural, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    return cpl.wait_until(predicate, timeout, interval=0.5, what=what)


def _conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or []}


def _table(api_client: Any, plural: str, name: str) -> dict[str, Any]:
    """What ``kubectl get <plural> <name>`` prints: the server-side Table with the CRD's printer columns."""
    request = api_client.param_serialize(
        method="GET",
        resource_path=f"/apis/{G}/{V}/{plural}/{name}",
        header_params={"Accept": TABLE},
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request)
    response.read()
    data = json.loads(response.data)
    columns = [c["name"] for c in data["columnDefinitions"]]
    return dict(zip(columns, data["rows"][0]["cells"], strict=True))


@pytest.fixture
def make_cluster(custom: client.CustomObjectsApi) -> Iterator[Callable[..., str]]:
    made: list[str] = []

    def factory(pools: list[dict[str, Any]], vendor: str | None = "karpenter") -> str:
        name = f"tfc-{uuid.uuid4().hex[:6]}"
        spec: dict[str, Any] = {"gpuPools": pools}
        if vendor:
            spec["computingVendor"] = {"name": "local", "type": vendor}
        custom.create_cluster_custom_object(
            G,
            V,
            "tensorfusionclusters",
            {
                "apiVersion": f"{G}/{V}",
                "kind": "TensorFusionCluster",
                "metadata": {"name": name},
                "spec": spec,
            },
        )
        made.append(name)
        return name

    yield factory
    for name in made:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(G, V, "tensorfusionclusters", name)


def test_a_tensorfusioncluster_derives_updates_overwrites_and_deletes_its_gpupools(
    api_client, tf_extender, custom, make_cluster
):
    shared = {"schedulingConfigTemplate": "tf-scheduling-config"}
    big = {
        "nodeManagerConfig": {
            "provisioningMode": "Karpenter",
            "nodeProvisioner": {"karpenterNodeClassRef": KWOK_CLASS},
        },
        "capacityConfig": {"maxResources": {"tflops": "1000"}},
    }
    name = make_cluster(
        [{"name": "shared", "isDefault": True, "specTemplate": shared}, {"name": "big", "specTemplate": big}]
    )
    cluster = custom.get_cluster_custom_object(G, V, "tensorfusionclusters", name)

    def both() -> list[dict[str, Any]] | None:
        found = [_get(custom, "gpupools", f"{name}-{entry}") for entry in ("shared", "big")]
        return found if all(found) else None  # type: ignore[return-value]

    pools = _wait(both, "two GPUPools derived")
    by_name = {p["metadata"]["name"]: p for p in pools}
    # the pool's spec is the template as the API server stored it (the same schema, the same defaults)
    stored = {e["name"]: e["specTemplate"] for e in cluster["spec"]["gpuPools"]}
    assert stored["big"]["nodeManagerConfig"]["defaultIsolationMode"] == "soft"  # a default, on both
    for pool, template, default in (
        (f"{name}-shared", stored["shared"], "true"),
        (f"{name}-big", stored["big"], "false"),
    ):
        meta = by_name[pool]["metadata"]
        assert meta["labels"][MANAGED_BY] == name
        assert meta["annotations"][DEFAULT_POOL] == default
        (owner,) = meta["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "TensorFusionCluster",
            name,
            cluster["metadata"]["uid"],
            True,
        )
        assert by_name[pool]["spec"] == template
    ready = _wait(
        lambda: (
            (c := _get(custom, "tensorfusionclusters", name))
            and (c.get("status") or {}).get("phase") == "Running"
            and c
        ),
        "the cluster Running",
    )
    conditions = _conditions(ready)
    assert {t: conditions[t]["status"] for t in ("Ready", "GPUPoolReady", "CloudVendorConnectionReady")} == {
        "Ready": "True",
        "GPUPoolReady": "True",
        "CloudVendorConnectionReady": "True",
    }
    assert ready["status"]["totalPools"] == 2
    assert sorted(ready["status"]["readyGPUPools"]) == sorted(by_name)
    assert (
        len(
            _wait(
                lambda: (
                    len(_events(api_client, "TensorFusionCluster", name, "GPUPoolCreated")) >= 2
                    and _events(api_client, "TensorFusionCluster", name, "GPUPoolCreated")
                ),
                "a GPUPoolCreated event per pool",
            )
        )
        == 2
    )
    row = _table(api_client, "tensorfusionclusters", name)
    assert (row["Phase"], row["Total Pools"]) == ("Running", "2")

    # the template changes: the pool follows
    spec = ready["spec"]
    spec["gpuPools"][0]["specTemplate"] = {"schedulingConfigTemplate": "other"}
    custom.patch_cluster_custom_object(
        G, V, "tensorfusionclusters", name, {"spec": {"gpuPools": spec["gpuPools"]}}
    )
    _wait(
        lambda: (
            (_get(custom, "gpupools", f"{name}-shared") or {}).get("spec", {}).get("schedulingConfigTemplate")
            == "other"
        ),
        "the pool updated from the template",
    )
    _wait(
        lambda: _events(api_client, "TensorFusionCluster", name, "GPUPoolUpdated"), "a GPUPoolUpdated event"
    )

    # a hand edit of the pool: overwritten from the template, with a warning on both objects
    custom.patch_cluster_custom_object(
        G,
        V,
        "gpupools",
        f"{name}-shared",
        {"spec": {"schedulingConfigTemplate": "by-hand", "extra": {"x": 1}}},
    )
    _wait(
        lambda: (
            (_get(custom, "gpupools", f"{name}-shared") or {}).get("spec")
            == {"schedulingConfigTemplate": "other"}
        ),
        "the hand edit overwritten",
    )
    (event,) = _wait(
        lambda: _events(api_client, "GPUPool", f"{name}-shared", "GPUPoolOverwritten"),
        "a GPUPoolOverwritten event on the pool",
    )
    assert event.type == "Warning" and name in event.message
    _wait(lambda: _events(api_client, "TensorFusionCluster", name, "GPUPoolOverwritten"),
          "a GPUPoolOverwritten event on the cluster")

    # the entry goes: so does its pool
    custom.patch_cluster_custom_object(
        G, V, "tensorfusionclusters", name, {"spec": {"gpuPools": spec["gpuPools"][:1]}}
    )
    _wait(lambda: _get(custom, "gpupools", f"{name}-big") is None, "the pool of the removed entry deleted")
    _wait(
        lambda: _events(api_client, "TensorFusionCluster", name, "GPUPoolDeleted"), "a GPUPoolDeleted event"
    )
    assert _get(custom, "gpupools", f"{name}-shared") is not None

    # bad input: an entry that cannot be a pool, a vendor without its region: conditions that say so
    bad = [*spec["gpuPools"][:1], {"name": "Not_Valid", "specTemplate": {}}]
    custom.patch_cluster_custom_object(
        G,
        V,
        "tensorfusionclusters",
        name,
        {"spec": {"gpuPools": bad, "computingVendor": {"name": "cloud", "type": "aws"}}},
    )
    broken = _wait(
        lambda: (
            (c := _get(custom, "tensorfusionclusters", name))
            and _conditions(c).get("CloudVendorConnectionReady", {}).get("reason")
            == "CloudVendorConnectionFailed"
            and _conditions(c).get("GPUPoolReady", {}).get("status") == "False"
            and c
        ),
        "conditions naming the bad entry and the vendor",
    )
    conditions = _conditions(broken)
    assert "spec.gpuPools[1].name 'Not_Valid'" in conditions["GPUPoolReady"]["message"]
    assert "computingVendor.params.defaultRegion" in conditions["CloudVendorConnectionReady"]["message"]
    assert broken["status"]["phase"] == "Updating" and conditions["Ready"]["status"] == "False"
    _wait(
        lambda: _events(api_client, "TensorFusionCluster", name, "InvalidGPUPool"), "an InvalidGPUPool event"
    )

    # the cluster goes: the garbage collector takes its pools
    custom.delete_cluster_custom_object(G, V, "tensorfusionclusters", name)
    _wait(lambda: _get(custom, "gpupools", f"{name}-shared") is None, "the pools gone with the cluster", 90)


def test_a_gpunode_shows_totals_and_availability_and_goes_with_its_node(
    api_client, tf_extender, custom, namespace, make_pool, make_gpu, make_node
):
    pool = make_pool("CompactFirst")
    name = f"gn-{uuid.uuid4().hex[:6]}"
    for i in range(2):
        make_gpu(f"{name}-gpu-{i}", name, pool=pool, index=i, tflops="100", vram="100Gi")
    make_node(name)
    node_uid = client.CoreV1Api(api_client).read_node(name).metadata.uid

    def row(want: dict[str, Any]) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            if _get(custom, "gpunodes", name) is None:
                return None
            got = _table(api_client, "gpunodes", name)
            return got if all(got.get(k) == v for k, v in want.items()) else None

        return check

    empty = _wait(row({"Phase": "Running", "Available TFlops": "200"}), "kubectl get gpunode: the new node")
    assert empty == {
        "Name": name,
        "Phase": "Running",
        "Total TFlops": "200",
        "Total VRAM": "200Gi",
        "Virtual TFlops": "200",
        "Virtual VRAM": "200Gi",
        "Available TFlops": "200",
        "Available VRAM": "200Gi",
        "GPU Count": 2,
    }
    gpunode = custom.get_cluster_custom_object(G, V, "gpunodes", name)
    assert gpunode["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
    ]
    assert gpunode["metadata"]["labels"][MANAGED_BY] == pool
    assert gpunode["metadata"]["labels"][f"tensor-fusion.ai/pool-{pool}"] == "true"

    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("a", pool=pool, tflops="30", vram="20Gi"))
    assert cpl.placement(api_client, namespace, "a")[0] == name
    _wait(row({"Available TFlops": "170", "Available VRAM": "180Gi"}), "availability after a bind")
    assert custom.get_cluster_custom_object(G, V, "gpunodes", name)["status"]["totalGPUPods"] == 1

    client.CoreV1Api(api_client).delete_node(name)
    _wait(lambda: _get(custom, "gpunodes", name) is None, "the GPUNode gone with its Node", 90)


def test_a_claim_labelled_only_managed_by_is_in_flight_and_released_like_ours(
    api_client, tf_extender, custom
):
    pool = f"kp-{uuid.uuid4().hex[:6]}"
    claim = f"{pool}-tf0001"
    karpenter = ("karpenter.sh", "v1")

    def pool_claims() -> list[str]:
        return sorted(
            c["metadata"]["name"]
            for c in custom.list_cluster_custom_object(G, V, "gpunodeclaims")["items"]
            if pool
            in (
                (c["metadata"].get("labels") or {}).get(MANAGED_BY),
                (c["metadata"].get("labels") or {}).get("tensor-fusion.ai/gpupool"),
            )
        )

    # a claim TensorFusion made (only its own label), its NodeClaim on the way (Karpenter is not running:
    # it stays on the way), covering the pool's minimum
    custom.create_cluster_custom_object(
        *karpenter,
        "nodeclaims",
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": claim},
            "spec": {
                "nodeClassRef": {k: KWOK_CLASS[k] for k in ("group", "kind", "name")},
                "requirements": [],
            },
        },
    )
    custom.create_cluster_custom_object(
        G,
        V,
        "gpunodeclaims",
        {
            "apiVersion": f"{G}/{V}",
            "kind": "GPUNodeClaim",
            "metadata": {"name": claim, "labels": {MANAGED_BY: pool}},
            "spec": {
                "instanceType": "g5.xlarge",
                "capacityType": "on-demand",
                "gpuDeviceOffered": 1,
                "tflopsOffered": "400",
                "vramOffered": "80Gi",
                "nodeClassRef": KWOK_CLASS,
            },
        },
    )
    custom.patch_cluster_custom_object_status(G, V, "gpunodeclaims", claim, {"status": {"phase": "Creating"}})
    try:
        cpl.create_cluster_object(
            api_client,
            "gpupools",
            {
                "apiVersion": f"{G}/{V}",
                "kind": "GPUPool",
                "metadata": {"name": pool},
                "spec": {
                    "capacityConfig": {"minResources": {"tflops": "300"}},
                    "nodeManagerConfig": {
                        "provisioningMode": "Karpenter",
                        "nodeProvisioner": {"karpenterNodeClassRef": KWOK_CLASS},
                    },
                },
            },
        )
        # in flight: the capacity controllers reconcile every second and buy nothing more for the pool
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert pool_claims() == [claim], "a second claim was bought: the managed-by claim was not counted"
            time.sleep(0.5)
        assert _get(custom, "gpunodeclaims", claim) is not None
        # released like ours: its NodeClaim goes, so does the GPUNodeClaim, with an event saying why
        custom.delete_cluster_custom_object(*karpenter, "nodeclaims", claim)
        _wait(lambda: _get(custom, "gpunodeclaims", claim) is None, "the managed-by claim released")
        _wait(lambda: _events(api_client, "GPUNodeClaim", claim, "NodeClaimGone"), "a NodeClaimGone event")
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(G, V, "gpupools", pool)
        for name in pool_claims():
            for group in (karpenter, (G, V)):
                with contextlib.suppress(ApiException):
                    custom.delete_cluster_custom_object(
                        *group, "nodeclaims" if group == karpenter else "gpunodeclaims", name
                    )
