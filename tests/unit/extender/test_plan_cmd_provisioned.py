"""Provisioned mode offline: the pool setting, ``tf-extender plan``'s exact cloud request for each launch,
and compaction releasing a VM's claim (its finalizer then terminates the VM)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.cloud.nodeclass import parse_node_class
from extender.plan_cmd import DEFAULT_PLANNERS, snapshot_inputs
from extender.planning.action import plan
from extender.planning.pool import pool_config
from tests.unit.fixtures.plan import gpu_node, run_plan

USER_DATA = (
    "#!/bin/bash\nkubelet --node-labels=tensor-fusion.ai/node-provisioner=__GPU_NODE_RESOURCE_NAME__\n"
)
NODE_CLASS = {
    "apiVersion": "tensor-fusion.ai/v1",
    "kind": "GPUNodeClass",
    "metadata": {"name": "gpu"},
    "spec": {
        "osImageSelectorTerms": [{"id": "ami-0abc"}],
        "subnetSelectorTerms": [{"tags": {"k": "v"}}],
        "securityGroupSelectorTerms": [{"id": "sg-1"}],
        "instanceProfile": "tf-node",
        "userData": USER_DATA,
    },
}
VENDOR = {"type": "aws", "authType": "serviceAccountRole", "params": {"defaultRegion": "us-east-1"}}


def provisioned_pool(name: str, node_class: Any = "gpu", **capacity: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "capacityConfig": capacity,
            "nodeManagerConfig": {
                "provisioningMode": "Provisioned",
                "nodeProvisioner": {"nodeClass": node_class},
            },
        },
    }


def test_a_provisioned_pool_names_its_node_class_and_without_one_is_left_to_the_user() -> None:
    assert pool_config(provisioned_pool("p")).launches_vms
    assert not pool_config(provisioned_pool("p", node_class=None)).launches_vms
    bad = pool_config(provisioned_pool("p", node_class=["gpu"]))
    assert not bad.launches_vms and "nodeProvisioner.nodeClass=['gpu']" in bad.problems[0]


def test_plan_prints_the_exact_ec2_request_with_a_user_data_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vendor = tmp_path / "vendor.yaml"
    vendor.write_text(yaml.safe_dump(VENDOR))
    lines = run_plan(
        tmp_path,
        [NODE_CLASS, provisioned_pool("p", minResources={"tflops": "150"})],
        "--computing-vendor",
        str(vendor),
        "--cluster-name",
        "prod",
        capsys=capsys,
    )
    launch = next(line for line in lines if line["action"] == "launch")
    request = launch["cloudRequest"]
    assert request["vendor"] == "aws" and request["operation"] == "RunInstances"
    params = request["parameters"]
    assert params["ImageId"] == "ami-0abc" and params["InstanceType"] == launch["instanceType"]
    assert params["SecurityGroupIds"] == ["sg-1"] and params["IamInstanceProfile"] == {"Name": "tf-node"}
    assert params["UserData"] == parse_node_class(NODE_CLASS).user_data_digest("__GPU_NODE_RESOURCE_NAME__")
    tags = {t["Key"]: t["Value"] for t in params["TagSpecifications"][0]["Tags"]}
    assert tags["tensor-fusion.ai/cluster"] == "prod" and tags["tensor-fusion.ai/gpupool"] == "p"
    assert request["resolvedAtLaunch"] == {"subnetSelectorTerms": [{"k": "v"}]}


def test_plan_prints_the_exact_ecs_request_for_an_alibaba_vendor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vendor = tmp_path / "vendor.yaml"
    vendor.write_text(yaml.safe_dump({"type": "alibaba", "authType": "serviceAccountRole",
                                      "params": {"defaultRegion": "cn-hangzhou"}}))
    lines = run_plan(
        tmp_path,
        [NODE_CLASS, provisioned_pool("p", minResources={"tflops": "150"})],
        "--computing-vendor", str(vendor), "--cluster-name", "prod",
        capsys=capsys,
    )
    launch = next(line for line in lines if line["action"] == "launch")
    request = launch["cloudRequest"]
    assert request["vendor"] == "alibaba" and request["operation"] == "RunInstances"
    params = request["parameters"]
    assert params["ImageId"] == "ami-0abc" and params["InstanceType"] == launch["instanceType"]
    assert params["SecurityGroupIds"] == ["sg-1"] and params["RamRoleName"] == "tf-node"
    assert params["ClientToken"] == params["InstanceName"] == "__GPU_NODE_RESOURCE_NAME__"
    assert params["UserData"] == parse_node_class(NODE_CLASS).user_data_digest("__GPU_NODE_RESOURCE_NAME__")
    tags = {t["Key"]: t["Value"] for t in params["Tag"]}
    assert tags["tensor-fusion.ai/cluster"] == "prod" and tags["tensor-fusion.ai/gpupool"] == "p"
    assert request["resolvedAtLaunch"] == {"subnetSelectorTerms": [{"k": "v"}]}


def test_plan_without_a_vendor_says_why_there_is_no_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run_plan(
        tmp_path, [NODE_CLASS, provisioned_pool("p", minResources={"tflops": "150"})], capsys=capsys
    )
    launch = next(line for line in lines if line["action"] == "launch")
    assert "computingVendor" in launch["cloudRequest"]["error"]


def test_plan_takes_a_derived_pools_vendor_from_its_cluster_and_the_file_for_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vendor = tmp_path / "vendor.yaml"
    vendor.write_text(yaml.safe_dump({"computingVendor": VENDOR}))
    derived = provisioned_pool("c-p", minResources={"tflops": "150"})
    derived["metadata"]["ownerReferences"] = [
        {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionCluster", "name": "c", "uid": "u"}]
    cluster = {"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionCluster", "metadata": {"name": "c"},
               "spec": {"computingVendor": {"type": "aws", "params": {}}}}  # no region: an error naming it
    lines = run_plan(
        tmp_path,
        [NODE_CLASS, cluster, derived, provisioned_pool("mine", minResources={"tflops": "150"})],
        "--computing-vendor",
        str(vendor),
        capsys=capsys,
    )
    launches = {line["pool"]: line for line in lines if line["action"] == "launch"}
    assert "TensorFusionCluster c spec.computingVendor.params.defaultRegion: required" in launches["c-p"][
        "cloudRequest"]["error"]
    assert launches["mine"]["cloudRequest"]["operation"] == "RunInstances"


def test_compaction_releases_an_empty_vm_by_deleting_its_claim() -> None:
    claim = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUNodeClaim",
        "metadata": {"name": "p-1", "labels": {"tensor-fusion.ai/gpupool": "p"}},
        "spec": {
            "tflopsOffered": "70",
            "vramOffered": "24Gi",
            "gpuDeviceOffered": 1,
            "nodeClassRef": {
                "group": "tensor-fusion.ai",
                "kind": "GPUNodeClass",
                "version": "v1",
                "name": "gpu",
            },
        },
        "status": {"phase": "Bound", "instanceID": "i-1"},
    }
    objects = [
        NODE_CLASS,
        provisioned_pool("p"),
        claim,
        gpu_node("n1", "p", labels={"tensor-fusion.ai/node-provisioner": "p-1"}),
        gpu_node("n2", "p"),
    ]
    inputs = snapshot_inputs(objects, now=dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC))
    actions = [a.as_json() for a in plan(inputs, DEFAULT_PLANNERS)]
    # n2 joined no claim of ours: it is the user's, never released
    assert actions == [
        {
            "action": "release",
            "pool": "p",
            "node": "n1",
            "gpuNodeClaim": "p-1",
            "reason": actions[0]["reason"],
        }
    ]
