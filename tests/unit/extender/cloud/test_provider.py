"""The provider contract, one suite run against every provider:

- AWS EC2 through aiobotocore against moto's EC2 emulator in server mode (tests/harness/cloud.py: real
  HTTP, signed requests, EC2's XML), behind a proxy that refuses chosen instance types for lack of capacity;
- Alibaba Cloud ECS through the official SDK against a local stand-in of the ECS RPC API
  (tests/harness/ecs.py), which stands in for Alibaba Cloud's endpoint: no emulator of it exists. It checks
  the SDK's ACS3-HMAC-SHA256 signature, answers in ECS's documented shapes and replays a ClientToken.

Each test reads what the cloud holds afterwards with the cloud's own API (DescribeInstances, the user
data, the disks), not what the provider says it sent. The tests after the shared ones pin what only one
cloud has: EC2's block devices and instance profile, ECS's disks, bandwidth and spot strategy.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from extender.cloud.alibaba import AlibabaProvider
from extender.cloud.aws import AWSProvider
from extender.cloud.factory import make_provider
from extender.cloud.nodeclass import parse_node_class
from extender.cloud.provider import (
    AuthFailure,
    CapacityUnavailable,
    CloudError,
    InvalidRequest,
    LaunchRequest,
    Provider,
)
from extender.cloud.vendor import VendorConfig, parse_vendor
from tests.harness import cloud, ecs

CLUSTER = "contract"
USER_DATA = (
    "#!/bin/bash\nkubelet --node-labels=tensor-fusion.ai/node-provisioner=__GPU_NODE_RESOURCE_NAME__\n"
)


@dataclass(frozen=True)
class Seen:
    """An instance as the cloud's own API describes it."""

    image: str
    instance_type: str
    subnet: str
    zone: str
    groups: list[str]
    tags: dict[str, str]
    user_data: str
    spot: bool


@dataclass
class Cloud:
    """One provider under the contract, with what it launches into and a reader of the cloud's state."""

    vendor: str
    region: str
    zones: tuple[str, str]
    missing_zone: str  # a zone with no subnet / vSwitch of the class
    gpu_type: str
    other_type: str  # the type the capacity tests refuse
    image: str
    subnets: dict[str, str]
    security_group: str
    missing_image: str
    capacity_code: str
    refuse: set[tuple[str, str]]
    endpoint: str
    read: Callable[[str], Seen]
    keys: tuple[str, str] = ("", "")
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self, access_key_path: str, secret_key_path: str) -> VendorConfig:
        config = parse_vendor(
            {
                "type": self.vendor,
                "authType": "accessKey",
                "params": {
                    "defaultRegion": self.region,
                    "accessKeyPath": access_key_path,
                    "secretKeyPath": secret_key_path,
                    "extraParams": {"endpoint": self.endpoint},
                },
            }
        )
        assert not config.problems, config.problems
        return config


# -- the clouds ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ec2() -> Iterator[tuple[cloud.CapacityProxy, cloud.EC2World]]:
    with cloud.ec2_cloud() as (_, proxy):
        yield proxy, cloud.seed(proxy.url)


@pytest.fixture(scope="module")
def standin() -> Iterator[tuple[ecs.ECSStandIn, ecs.ECSWorld]]:
    with ecs.serve() as server:
        yield server, server.seed()


def _aws(request: pytest.FixtureRequest) -> Cloud:
    proxy, world = request.getfixturevalue("ec2")

    def read(instance_id: str) -> Seen:
        client = cloud.boto_client(proxy.url)
        raw = client.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
        data = client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return Seen(
            image=raw["ImageId"],
            instance_type=raw["InstanceType"],
            subnet=raw["SubnetId"],
            zone=raw["Placement"]["AvailabilityZone"],
            groups=[g["GroupId"] for g in raw["SecurityGroups"]],
            tags={t["Key"]: t["Value"] for t in raw["Tags"]},
            user_data=base64.b64decode(data["UserData"]["Value"]).decode(),
            spot=raw.get("InstanceLifecycle") == "spot",
        )

    return Cloud(
        vendor="aws",
        region=cloud.REGION,
        zones=("us-east-1a", "us-east-1b"),
        missing_zone="us-east-1c",
        gpu_type="g5.xlarge",
        other_type="g6.xlarge",
        image=world.image,
        subnets=world.subnets,
        security_group=world.security_group,
        missing_image="ami-00000000000000000",
        capacity_code="InsufficientInstanceCapacity",
        refuse=proxy.refuse,
        endpoint=proxy.url,
        read=read,
        keys=(cloud.ACCESS_KEY, cloud.SECRET_KEY),
        extra={"proxy": proxy},
    )


def _alibaba(request: pytest.FixtureRequest) -> Cloud:
    server, world = request.getfixturevalue("standin")

    def read(instance_id: str) -> Seen:
        listed = ecs.sdk_call(
            server.url,
            "DescribeInstances",
            {"RegionId": ecs.REGION, "InstanceIds": json.dumps([instance_id])},
        )
        raw = listed["Instances"]["Instance"][0]
        data = ecs.sdk_call(
            server.url, "DescribeUserData", {"RegionId": ecs.REGION, "InstanceId": instance_id}
        )
        return Seen(
            image=raw["ImageId"],
            instance_type=raw["InstanceType"],
            subnet=raw["VpcAttributes"]["VSwitchId"],
            zone=raw["ZoneId"],
            groups=raw["SecurityGroupIds"]["SecurityGroupId"],
            tags={t["TagKey"]: t["TagValue"] for t in raw["Tags"]["Tag"]},
            user_data=base64.b64decode(data["UserData"]).decode(),
            spot=raw["SpotStrategy"] != "NoSpot",
        )

    return Cloud(
        vendor="alibaba",
        region=ecs.REGION,
        zones=ecs.ZONES,
        missing_zone=ecs.MISSING_ZONE,
        gpu_type="ecs.gn7i-c8g1.2xlarge",
        other_type="ecs.gn7i-c16g1.4xlarge",
        image=world.image,
        subnets=world.vswitches,
        security_group=world.security_group,
        missing_image="m-doesnotexist0000",
        capacity_code="OperationDenied.NoStock",
        refuse=server.refuse,
        endpoint=server.url,
        read=read,
        keys=(ecs.ACCESS_KEY, ecs.SECRET_KEY),
        extra={"standin": server},
    )


@pytest.fixture(params=["aws", "alibaba"])
def clouds(request: pytest.FixtureRequest) -> Cloud:
    return {"aws": _aws, "alibaba": _alibaba}[request.param](request)


@pytest.fixture
def key_files(tmp_path: Path) -> Callable[[tuple[str, str]], tuple[str, str]]:
    def write(keys: tuple[str, str]) -> tuple[str, str]:
        (tmp_path / "ak").write_text(keys[0] + "\n")
        (tmp_path / "sk").write_text(keys[1])
        return str(tmp_path / "ak"), str(tmp_path / "sk")

    return write


@pytest.fixture
async def provider(clouds: Cloud, key_files: Any) -> AsyncIterator[Provider]:
    p = make_provider(clouds.config(*key_files(clouds.keys)))
    yield p
    await p.close()


def node_class(c: Cloud, **spec: Any) -> Any:
    base: dict[str, Any] = {
        "osImageSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "subnetSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "securityGroupSelectorTerms": [{"id": c.security_group}],
        "instanceProfile": "tf-gpu-node",
        "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2},
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvdb",
                "ebs": {"volumeSize": "200Gi", "volumeType": "gp3" if c.vendor == "aws" else "cloud_essd"},
            }
        ],
        "tags": {"team": "ml"},
        "userData": USER_DATA,
    }
    base.update(spec)
    parsed = parse_node_class({"metadata": {"name": "gpu"}, "spec": base})
    assert not parsed.problems, parsed.problems
    return parsed


def request(c: Cloud, claim: str, **kw: Any) -> LaunchRequest:
    fields: dict[str, Any] = {
        "claim": claim,
        "pool": "pool-a",
        "cluster": CLUSTER,
        "instance_type": c.gpu_type,
        "capacity_type": "on-demand",
        "zone": c.zones[1],
        "region": c.region,
        "node_class": node_class(c),
    }
    fields.update(kw)
    return LaunchRequest(**fields)


# -- the contract ------------------------------------------------------------------------------------------


async def test_the_connection_test_passes_with_good_keys_and_names_the_cloud_error_otherwise(
    clouds: Cloud, provider: Provider, key_files: Any, tmp_path: Path
) -> None:
    await provider.test_connection()
    missing = make_provider(
        replace(clouds.config(*key_files(clouds.keys)), access_key_path=str(tmp_path / "gone"))
    )
    with pytest.raises(AuthFailure, match="gone"):
        await missing.test_connection()
    await missing.close()
    if clouds.vendor == "alibaba":  # moto accepts any key; the stand-in checks the signature as ECS does
        wrong = make_provider(clouds.config(*key_files((clouds.keys[0], "not-the-secret"))))
        with pytest.raises(AuthFailure, match=r"SignatureDoesNotMatch: Specified signature does not match"):
            await wrong.test_connection()
        unknown = make_provider(clouds.config(*key_files(("LTAI5tNOSUCHKEY", clouds.keys[1]))))
        with pytest.raises(AuthFailure, match=r"InvalidAccessKeyId.NotFound"):
            await unknown.test_connection()


async def test_create_sends_the_node_class_and_is_idempotent_by_claim(
    clouds: Cloud, provider: Provider
) -> None:
    first = await provider.create(request(clouds, "pool-a-000001"))
    again = await provider.create(request(clouds, "pool-a-000001"))
    assert again.id == first.id, "a second create of one claim must find the first VM, not buy another"
    seen = clouds.read(first.id)
    assert (seen.image, seen.instance_type) == (clouds.image, clouds.gpu_type), (
        "the newest image the tags select"
    )
    assert (seen.subnet, seen.zone) == (clouds.subnets[clouds.zones[1]], clouds.zones[1]), (
        "the offering's zone"
    )
    assert seen.groups == [clouds.security_group]
    assert seen.tags == {
        "team": "ml",
        "managed-by": "tensor-fusion.ai",
        "tensor-fusion.ai/node-name": "pool-a-000001",
        "tensor-fusion.ai/node-class": "gpu",
        "tensor-fusion.ai/cluster": CLUSTER,
        "tensor-fusion.ai/gpupool": "pool-a",
    }
    assert "tensor-fusion.ai/node-provisioner=pool-a-000001" in seen.user_data
    assert "__GPU_NODE_RESOURCE_NAME__" not in seen.user_data
    assert not seen.spot
    params = provider.request_of(request(clouds, "pool-a-000001"))
    assert params["ClientToken"] == "pool-a-000001"


async def test_a_spot_offering_launches_a_spot_instance(clouds: Cloud, provider: Provider) -> None:
    made = await provider.create(request(clouds, "pool-a-spot01", capacity_type="spot", zone=clouds.zones[0]))
    seen = clouds.read(made.id)
    assert seen.spot
    assert seen.subnet == clouds.subnets[clouds.zones[0]]


async def test_terminate_is_done_for_a_gone_instance_and_describe_says_gone(
    clouds: Cloud, provider: Provider
) -> None:
    made = await provider.create(request(clouds, "pool-a-gone01"))
    assert (await provider.find("pool-a-gone01")) is not None
    await provider.terminate(made.id)
    await provider.terminate(made.id)
    after = await provider.describe(made.id)
    assert after is None or after.gone
    assert await provider.find("pool-a-gone01") is None
    never = "i-0123456789abcdef0" if clouds.vendor == "aws" else "i-standin999999999999"
    assert await provider.describe(never) is None
    await provider.terminate(never)


async def test_list_managed_returns_only_this_clusters_live_instances(
    clouds: Cloud, provider: Provider
) -> None:
    mine = await provider.create(request(clouds, "pool-a-list01"))
    other = await provider.create(request(clouds, "pool-a-list02", cluster="someone-else"))
    ids = {i.id for i in await provider.list_managed(CLUSTER)}
    assert mine.id in ids and other.id not in ids
    assert all(i.claim for i in await provider.list_managed(CLUSTER))


async def test_an_image_that_does_not_exist_is_an_invalid_request_naming_it(
    clouds: Cloud, provider: Provider
) -> None:
    bad = node_class(clouds, osImageSelectorTerms=[{"tags": {"no": "such-image"}}])
    with pytest.raises(InvalidRequest, match="osImageSelectorTerms"):
        await provider.create(request(clouds, "pool-a-bad001", node_class=bad))
    by_id = node_class(clouds, osImageSelectorTerms=[{"id": clouds.missing_image}])
    with pytest.raises(InvalidRequest, match=clouds.missing_image):
        await provider.create(request(clouds, "pool-a-bad002", node_class=by_id))
    assert await provider.find("pool-a-bad001") is None and await provider.find("pool-a-bad002") is None


async def test_a_zone_without_a_subnet_and_a_refused_type_are_capacity_errors(
    clouds: Cloud, provider: Provider
) -> None:
    with pytest.raises(CapacityUnavailable, match=clouds.missing_zone):
        await provider.create(request(clouds, "pool-a-zone01", zone=clouds.missing_zone))
    clouds.refuse.add((clouds.other_type, clouds.zones[0]))
    try:
        with pytest.raises(CapacityUnavailable, match=clouds.capacity_code):
            await provider.create(
                request(clouds, "pool-a-cap001", instance_type=clouds.other_type, zone=clouds.zones[0])
            )
        made = await provider.create(
            request(clouds, "pool-a-cap001", instance_type=clouds.other_type, zone=clouds.zones[1])
        )
        assert clouds.read(made.id).zone == clouds.zones[1]
    finally:
        clouds.refuse.clear()


async def test_a_create_whose_answer_was_lost_buys_nothing_more(clouds: Cloud, provider: Provider) -> None:
    """The create went through but its answer never came back (a timeout, a restart): the retry finds the
    instance by the claim's tag instead of buying a second."""
    want = request(clouds, "pool-a-lost01")
    sent = provider.request_of(want, await provider.resolve(want))
    if clouds.vendor == "aws":
        first = cloud.boto_client(clouds.endpoint).run_instances(**sent)["Instances"][0]["InstanceId"]
    else:
        first = ecs.sdk_call(clouds.endpoint, "RunInstances", sent)["InstanceIdSets"]["InstanceIdSet"][0]
    made = await provider.create(want)
    assert made.id == first
    assert [i.id for i in await provider.list_managed(CLUSTER) if i.claim == "pool-a-lost01"] == [first]


# -- what only one cloud has -------------------------------------------------------------------------------


@pytest.fixture
def aws(request: pytest.FixtureRequest) -> Cloud:
    return _aws(request)


@pytest.fixture
def alibaba(request: pytest.FixtureRequest) -> Cloud:
    return _alibaba(request)


async def test_ec2_gets_the_instance_profile_metadata_options_block_devices_and_volume_tags(
    aws: Cloud, key_files: Any
) -> None:
    provider = AWSProvider(aws.config(*key_files(aws.keys)))
    try:
        made = await provider.create(request(aws, "pool-a-ec2001"))
        raw = cloud.boto_client(aws.endpoint).describe_instances(InstanceIds=[made.id])["Reservations"][0][
            "Instances"
        ][0]
        assert "tf-gpu-node" in raw["IamInstanceProfile"]["Arn"]
        assert raw["MetadataOptions"]["HttpTokens"] == "required"
        assert raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
        params = provider.request_of(request(aws, "pool-a-ec2001"), await provider.resolve(request(aws, "x")))
        assert params["BlockDeviceMappings"] == [
            {
                "DeviceName": "/dev/xvdb",
                "Ebs": {
                    "VolumeSize": 200,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                    "Encrypted": True,
                },
            }
        ]
        assert [s["ResourceType"] for s in params["TagSpecifications"]] == ["instance", "volume"]
    finally:
        await provider.close()


async def test_ecs_gets_tensorfusions_whole_request_and_what_it_leaves_out(
    alibaba: Cloud, key_files: Any
) -> None:
    server: ecs.ECSStandIn = alibaba.extra["standin"]
    provider = AlibabaProvider(alibaba.config(*key_files(alibaba.keys)))
    try:
        made = await provider.create(request(alibaba, "pool-a-ecs001"))
        sent = next(p for action, p in reversed(server.requests) if action == "RunInstances")
        assert {
            k: sent[k]
            for k in (
                "RegionId",
                "ZoneId",
                "InstanceName",
                "ClientToken",
                "Amount",
                "InternetChargeType",
                "InternetMaxBandwidthOut",
                "InstanceChargeType",
                "RamRoleName",
                "HttpTokens",
                "HttpPutResponseHopLimit",
                "Description",
            )
        } == {
            "RegionId": ecs.REGION,
            "ZoneId": alibaba.zones[1],
            "InstanceName": "pool-a-ecs001",
            "ClientToken": "pool-a-ecs001",
            "Amount": "1",
            "InternetChargeType": "PayByTraffic",
            "InternetMaxBandwidthOut": "100",
            "InstanceChargeType": "PostPaid",
            "RamRoleName": "tf-gpu-node",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": "2",
            "Description": "GPU node managed by TensorFusion NodeClass: gpu",
        }
        disks = ecs.sdk_call(server.url, "DescribeDisks", {"RegionId": ecs.REGION, "InstanceId": made.id})
        assert disks["Disks"]["Disk"] == [
            {"Type": "system", "Category": "cloud_essd", "Size": 40, "DeleteWithInstance": True},
            {
                "Type": "data",
                "DiskName": "xvdb",
                "Category": "cloud_essd",
                "Size": 200,
                "PerformanceLevel": "PL0",
                "DeleteWithInstance": True,
                "Encrypted": True,
            },
        ]
        extra = {
            "spotPriceLimit": "1.25",
            "spotDuration": "1",
            "spotInterruptionBehavior": "Stop",
            "keyPairName": "ops",
            "systemDiskSize": "100",
            "dataDiskPerformanceLevel": "PL1",
        }
        spot = await provider.create(request(alibaba, "pool-a-ecs002", capacity_type="spot", extra=extra))
        raw = server.instances[spot.id].fields
        assert (
            raw["SpotStrategy"],
            raw["SpotPriceLimit"],
            raw["SpotDuration"],
            raw["SpotInterruptionBehavior"],
            raw["KeyPairName"],
        ) == ("SpotWithPriceLimit", 1.25, 1, "Stop", "ops")
        assert [(d["Size"], d.get("PerformanceLevel")) for d in server.disks[spot.id]] == [
            (100, None),
            (200, "PL1"),
        ]
        go = await provider.create(request(alibaba, "pool-a-ecs003", capacity_type="spot"))
        assert server.instances[go.id].fields["SpotStrategy"] == "SpotAsPriceGo"
        with pytest.raises(InvalidRequest, match=r"extraParams.spotPriceLimit='cheap'"):
            await provider.create(
                request(alibaba, "pool-a-ecs004", capacity_type="spot", extra={"spotPriceLimit": "cheap"})
            )
        await provider.terminate(made.id)
        assert made.id not in server.instances, "DeleteInstances with Force removes a running instance"
    finally:
        await provider.close()


async def test_ecs_replays_a_client_token_and_refuses_it_with_other_parameters(
    alibaba: Cloud, key_files: Any
) -> None:
    provider = AlibabaProvider(alibaba.config(*key_files(alibaba.keys)))
    want = request(alibaba, "pool-a-token1")
    sent = provider.request_of(want, await provider.resolve(want))
    first = ecs.sdk_call(alibaba.endpoint, "RunInstances", sent)["InstanceIdSets"]
    assert ecs.sdk_call(alibaba.endpoint, "RunInstances", sent)["InstanceIdSets"] == first
    assert len(first["InstanceIdSet"]) == 1
    with pytest.raises(Exception, match="IdempotentParameterMismatch"):
        ecs.sdk_call(alibaba.endpoint, "RunInstances", {**sent, "InstanceType": alibaba.other_type})


def test_vendor_config_problems_name_the_field() -> None:
    assert any(
        "type='gcp'" in p for p in parse_vendor({"type": "gcp", "params": {"defaultRegion": "x"}}).problems
    )
    assert any("defaultRegion" in p for p in parse_vendor({"type": "aws"}).problems)
    assert any(
        "accessKeyPath" in p
        for p in parse_vendor(
            {"type": "alibaba", "authType": "accessKey", "params": {"defaultRegion": "r"}}
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
