"""What the Provisioned-mode end-to-end modules share, whichever cloud they launch on: a stand-in for what a
VM does at boot, a Provisioned GPUPool and its teardown, and reads of claims and events.

``CloudInit`` stands in for cloud-init on a real VM, since the emulated clouds' instances run nothing: for
every running instance the cloud lists it reads the user data through the cloud's own API, and when the
script passes ``--node-labels`` to the kubelet it creates the kwok Node with those labels plus the GPU
discovery labels GPU Feature Discovery would write for the instance type. A user data without the
node-provisioner label gives a VM whose Node never joins, as on a real cloud.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from .objects import TF_GROUP, TF_VERSION, node_body
from .processes import wait_until

POOL_LABEL = "tensor-fusion.ai/gpupool"


@dataclass(frozen=True)
class Booting:
    """A running instance as the cloud lists it."""

    id: str
    instance_type: str
    zone: str


@dataclass(frozen=True)
class GPUs:
    """What GPU Feature Discovery would label a node of an instance type with."""

    model: str
    count: int
    memory_mib: int


class CloudInit:
    """Boots each instance ``running()`` lists once: ``user_data(id)`` is the decoded script; the Node is
    named ``node_name(id)`` with ``provider_id(id, zone)``. ``booted`` maps instance ids to Node names ("" for
    a script that joins no Node)."""

    def __init__(
        self,
        api_client: Any,
        *,
        running: Callable[[], Iterable[Booting]],
        user_data: Callable[[str], str],
        gpus: Mapping[str, GPUs],
        node_name: Callable[[str], str],
        provider_id: Callable[[str, str], str],
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.running, self.user_data, self.gpus = running, user_data, gpus
        self.node_name, self.provider_id = node_name, provider_id
        self.booted: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                self._boot_new()

    def _boot_new(self) -> None:
        for instance in self.running():
            if instance.id in self.booted:
                continue
            match = re.search(r"--node-labels=([^'\s]+)", self.user_data(instance.id))
            if not match:
                self.booted[instance.id] = ""
                continue
            labels = dict(item.split("=", 1) for item in match.group(1).split(","))
            gpus = self.gpus[instance.instance_type]
            labels.update(
                {
                    "nvidia.com/gpu.product": gpus.model,
                    "nvidia.com/gpu.count": str(gpus.count),
                    "nvidia.com/gpu.memory": str(gpus.memory_mib),
                    "topology.kubernetes.io/zone": instance.zone,
                    "node.kubernetes.io/instance-type": instance.instance_type,
                }
            )
            name = self.node_name(instance.id)
            body = node_body(name, labels=labels)
            body["spec"] = {
                **body.get("spec", {}),
                "providerID": self.provider_id(instance.id, instance.zone),
            }
            self.core.create_node(body)
            self.booted[instance.id] = name

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def provisioned_pool_body(
    name: str, requirements: list[dict[str, Any]], *, min_tflops: int = 1, node_class: str | None = None
) -> dict[str, Any]:
    """A Provisioned GPUPool of ``min_tflops`` minimum over ``requirements``, with compaction every 5 s and
    the GPUNodeClass ``node_class`` (default: the pool's name)."""
    return {
        "apiVersion": f"{TF_GROUP}/{TF_VERSION}",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "capacityConfig": {"minResources": {"tflops": str(min_tflops)}},
            "nodeManagerConfig": {
                "provisioningMode": "Provisioned",
                "nodeCompaction": {"period": "5s"},
                "nodeProvisioner": {
                    "nodeClass": node_class or name,
                    "gpuRequirements": requirements,
                    "gpuNodeLabels": {"team": "ml"},
                },
            },
        },
    }


def claims_of(api_client: Any, pool: str) -> list[dict[str, Any]]:
    return client.CustomObjectsApi(api_client).list_cluster_custom_object(  # type: ignore[no-any-return]
        TF_GROUP, TF_VERSION, "gpunodeclaims", label_selector=f"{POOL_LABEL}={pool}"
    )["items"]


def bound_claims(api_client: Any, pool: str) -> list[dict[str, Any]] | None:
    """The pool's Bound GPUNodeClaims, or None (for ``wait_until``)."""
    return [c for c in claims_of(api_client, pool) if (c.get("status") or {}).get("phase") == "Bound"] or None


def provisioner_condition(api_client: Any, pool: str) -> dict[str, Any] | None:
    """The pool's ``NodeProvisionerReady`` condition, or None."""
    obj = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        TF_GROUP, TF_VERSION, "gpupools", pool
    )
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "NodeProvisionerReady"), None)


def release_pool(api_client: Any, name: str, *, node_class: str | None = None) -> None:
    """A test's pool goes, then its claims (whose finalizers terminate the VMs) and Nodes; finalizers are
    stripped only if the extender could not finish within a minute."""
    custom = client.CustomObjectsApi(api_client)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(TF_GROUP, TF_VERSION, "gpupools", name)
    for claim in claims_of(api_client, name):
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(
                TF_GROUP, TF_VERSION, "gpunodeclaims", claim["metadata"]["name"]
            )
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: not claims_of(api_client, name),
            60,
            interval=1,
            what=f"the claims of {name} gone (their VMs terminated)",
        )
    for claim in claims_of(api_client, name):
        with contextlib.suppress(ApiException):
            custom.patch_cluster_custom_object(
                TF_GROUP,
                TF_VERSION,
                "gpunodeclaims",
                claim["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )
    core = client.CoreV1Api(api_client)
    for node in core.list_node(label_selector=f"{POOL_LABEL}={name}").items:
        with contextlib.suppress(ApiException):
            core.delete_node(node.metadata.name)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(TF_GROUP, TF_VERSION, "gpunodeclasses", node_class or name)
