"""The provider contract, run against every provider: AWS EC2 through aiobotocore against moto's EC2
emulator in server mode (tests/harness/cloud.py: real HTTP, signed requests, EC2's XML), with a proxy in
front of it that refuses chosen instance types for lack of capacity.

Each test reads what the cloud holds afterwards with the cloud's own API (DescribeInstances,
DescribeInstanceAttribute), not what the provider says it sent.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from extender.cloud.aws import AWSProvider
from extender.cloud.nodeclass import parse_node_class
from extender.cloud.provider import (
    AuthFailure,
    CapacityUnavailable,
    CloudError,
    InvalidRequest,
    LaunchRequest,
)
from extender.cloud.vendor import parse_vendor
from tests.harness import cloud

CLUSTER = "contract"


@pytest.fixture(scope="module")
def ec2() -> Iterator[tuple[cloud.MotoServer, cloud.CapacityProxy, cloud.EC2World]]:
    with cloud.ec2_cloud() as (moto, proxy):
        yield moto, proxy, cloud.seed(proxy.url)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "ak").write_text(cloud.ACCESS_KEY + "\n")
    (tmp_path / "sk").write_text(cloud.SECRET_KEY)
    return str(tmp_path / "ak"), str(tmp_path / "sk")


@pytest.fixture
async def provider(ec2: Any, keys: tuple[str, str]) -> AsyncIterator[AWSProvider]:
    _, proxy, _ = ec2
    config = parse_vendor(
        {
            "type": "aws",
            "authType": "accessKey",
            "params": {
                "defaultRegion": cloud.REGION,
                "accessKeyPath": keys[0],
                "secretKeyPath": keys[1],
                "extraParams": {"endpoint": proxy.url},
            },
        }
    )
    assert not config.problems
    p = AWSProvider(config)
    yield p
    await p.close()


def node_class(world: cloud.EC2World, **spec: Any) -> Any:
    base: dict[str, Any] = {
        "osImageSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "subnetSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "securityGroupSelectorTerms": [{"id": world.security_group}],
        "instanceProfile": "tf-gpu-node",
        "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2},
        "blockDeviceMappings": [
            {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3"}}
        ],
        "tags": {"team": "ml"},
        "userData": (
            "#!/bin/bash\n"
            "kubelet --node-labels=tensor-fusion.ai/node-provisioner=__GPU_NODE_RESOURCE_NAME__\n"
        ),
    }
    base.update(spec)
    parsed = parse_node_class({"metadata": {"name": "gpu"}, "spec": base})
    assert not parsed.problems, parsed.problems
    return parsed


def request(world: cloud.EC2World, claim: str, **kw: Any) -> LaunchRequest:
    fields: dict[str, Any] = {
        "claim": claim,
        "pool": "pool-a",
        "cluster": CLUSTER,
        "instance_type": "g5.xlarge",
        "capacity_type": "on-demand",
        "zone": "us-east-1b",
        "region": cloud.REGION,
        "node_class": node_class(world),
    }
    fields.update(kw)
    return LaunchRequest(**fields)


def described(proxy: cloud.CapacityProxy, instance_id: str) -> dict[str, Any]:
    answer = cloud.boto_client(proxy.url).describe_instances(InstanceIds=[instance_id])
    return answer["Reservations"][0]["Instances"][0]  # type: ignore[no-any-return]


async def test_the_connection_test_passes_with_good_keys_and_names_the_cloud_error_otherwise(
    provider: AWSProvider, ec2: Any, tmp_path: Path
) -> None:
    await provider.test_connection()
    broken = AWSProvider(replace(provider.config, access_key_path=str(tmp_path / "missing")))
    with pytest.raises(AuthFailure, match="missing"):
        await broken.test_connection()
    await broken.close()


async def test_create_sends_every_field_of_the_node_class_and_is_idempotent_by_claim(
    provider: AWSProvider, ec2: Any
) -> None:
    _, proxy, world = ec2
    first = await provider.create(request(world, "pool-a-000001"))
    again = await provider.create(request(world, "pool-a-000001"))
    assert again.id == first.id, "a second create of one claim must find the first VM, not buy another"
    raw = described(proxy, first.id)
    assert raw["ImageId"] == world.image
    assert raw["InstanceType"] == "g5.xlarge"
    assert raw["SubnetId"] == world.subnets["us-east-1b"], "the subnet of the offering's zone"
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == [world.security_group]
    assert "tf-gpu-node" in raw["IamInstanceProfile"]["Arn"]
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    assert raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags == {
        "team": "ml",
        "managed-by": "tensor-fusion.ai",
        "tensor-fusion.ai/node-name": "pool-a-000001",
        "tensor-fusion.ai/node-class": "gpu",
        "tensor-fusion.ai/cluster": CLUSTER,
        "tensor-fusion.ai/gpupool": "pool-a",
    }
    user_data = cloud.boto_client(proxy.url).describe_instance_attribute(
        InstanceId=first.id, Attribute="userData"
    )
    text = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert (
        "tensor-fusion.ai/node-provisioner=pool-a-000001" in text and "__GPU_NODE_RESOURCE_NAME__" not in text
    )
    assert raw.get("InstanceLifecycle") != "spot"
    params = provider.request_of(request(world, "pool-a-000001"), await provider.resolve(request(world, "x")))
    assert params["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/xvda",
            "Ebs": {"VolumeSize": 200, "VolumeType": "gp3", "DeleteOnTermination": True, "Encrypted": True},
        }
    ]
    assert [s["ResourceType"] for s in params["TagSpecifications"]] == ["instance", "volume"]
    assert params["ClientToken"] == "pool-a-000001"


async def test_a_spot_offering_launches_a_spot_instance(provider: AWSProvider, ec2: Any) -> None:
    _, proxy, world = ec2
    made = await provider.create(request(world, "pool-a-spot01", capacity_type="spot", zone="us-east-1a"))
    raw = described(proxy, made.id)
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["SubnetId"] == world.subnets["us-east-1a"]


async def test_terminate_is_done_for_a_gone_instance_and_describe_says_gone(
    provider: AWSProvider, ec2: Any
) -> None:
    _, _, world = ec2
    made = await provider.create(request(world, "pool-a-gone01"))
    assert (await provider.find("pool-a-gone01")) is not None
    await provider.terminate(made.id)
    await provider.terminate(made.id)
    after = await provider.describe(made.id)
    assert after is None or after.gone
    assert await provider.find("pool-a-gone01") is None
    assert await provider.describe("i-0123456789abcdef0") is None
    await provider.terminate("i-0123456789abcdef0")


async def test_list_managed_returns_only_this_clusters_live_instances(
    provider: AWSProvider, ec2: Any
) -> None:
    _, _, world = ec2
    mine = await provider.create(request(world, "pool-a-list01"))
    other = await provider.create(request(world, "pool-a-list02", cluster="someone-else"))
    ids = {i.id for i in await provider.list_managed(CLUSTER)}
    assert mine.id in ids and other.id not in ids
    assert all(i.claim for i in await provider.list_managed(CLUSTER))


async def test_an_image_that_does_not_exist_is_an_invalid_request_naming_it(
    provider: AWSProvider, ec2: Any
) -> None:
    _, _, world = ec2
    bad = node_class(world, osImageSelectorTerms=[{"tags": {"no": "such-image"}}])
    with pytest.raises(InvalidRequest, match="osImageSelectorTerms"):
        await provider.create(request(world, "pool-a-bad001", node_class=bad))
    by_id = node_class(world, osImageSelectorTerms=[{"id": "ami-00000000000000000"}])
    with pytest.raises(InvalidRequest, match=r"ami-00000000000000000"):
        await provider.create(request(world, "pool-a-bad002", node_class=by_id))


async def test_a_zone_without_a_subnet_and_a_refused_type_are_capacity_errors(
    provider: AWSProvider, ec2: Any
) -> None:
    _, proxy, world = ec2
    with pytest.raises(CapacityUnavailable, match="us-east-1c"):
        await provider.create(request(world, "pool-a-zone01", zone="us-east-1c"))
    proxy.refuse.add(("g6.xlarge", "us-east-1a"))
    try:
        with pytest.raises(CapacityUnavailable, match="InsufficientInstanceCapacity"):
            await provider.create(
                request(world, "pool-a-cap001", instance_type="g6.xlarge", zone="us-east-1a")
            )
        made = await provider.create(
            request(world, "pool-a-cap001", instance_type="g6.xlarge", zone="us-east-1b")
        )
        assert made.id
    finally:
        proxy.refuse.clear()


def test_vendor_config_problems_name_the_field() -> None:
    assert any(
        "type='gcp'" in p for p in parse_vendor({"type": "gcp", "params": {"defaultRegion": "x"}}).problems
    )
    assert any("defaultRegion" in p for p in parse_vendor({"type": "aws"}).problems)
    assert any(
        "accessKeyPath" in p
        for p in parse_vendor(
            {"type": "aws", "authType": "accessKey", "params": {"defaultRegion": "r"}}
        ).problems
    )
    assert not parse_vendor(
        {"type": "aws", "authType": "serviceAccountRole", "params": {"defaultRegion": "r"}}
    ).problems


def test_node_class_problems_name_the_field() -> None:
    missing = parse_node_class({"metadata": {"name": "c"}, "spec": {}})
    assert any("spec.osImageSelectorTerms" in p for p in missing.problems)
    bad = parse_node_class(
        {
            "metadata": {"name": "c"},
            "spec": {
                "osImageSelectorTerms": [{}],
                "blockDeviceMappings": [{"deviceName": "/dev/x", "ebs": {"volumeSize": "big"}}],
                "metadataOptions": {"httpTokens": "sometimes"},
            },
        }
    )
    text = "; ".join(bad.problems)
    assert (
        "osImageSelectorTerms[0]" in text and "volumeSize='big'" in text and "httpTokens='sometimes'" in text
    )


async def test_a_cloud_error_keeps_the_clouds_code_and_message() -> None:
    error = CloudError("InvalidParameterValue", "Value (x) for parameter y is invalid")
    assert str(error) == "InvalidParameterValue: Value (x) for parameter y is invalid"
