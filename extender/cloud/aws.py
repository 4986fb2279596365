"""AWS EC2 through aiobotocore (botocore on aiohttp, the project's HTTP stack; no thread pool).

``create`` sends everything the GPUNodeClass says: the image (by id, or the newest by name or tags), the
instance type, the subnet of the offering's zone (by id or tags), the security groups (by id, name or
tags), the user data with the claim's name put in, the instance profile, the metadata options, the block
devices, the zone, ``InstanceMarketOptions`` for spot, and tags on the instance and its volumes (the
class's own plus cluster, pool, claim and TensorFusion's ``managed-by``/``node-name``/``node-class``). Its
``ClientToken`` is the claim's name, and an instance already tagged with the claim is returned instead of
a new one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from extender.cloud.nodeclass import SelectorTerm, volume_gib
from extender.cloud.provider import (
    AuthFailure,
    CapacityUnavailable,
    CloudError,
    Instance,
    InvalidRequest,
    LaunchRequest,
    newest_image,
    resolve_terms,
    security_groups,
    subnet_of_zone,
)
from extender.cloud.tags import TAG_CLAIM, TAG_CLUSTER, instance_tags
from extender.cloud.vendor import KeyFiles, VendorConfig

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "InsufficientFreeAddressesInSubnet",
        "Unsupported",
        "UnfulfillableCapacity",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "OptInRequired",
        "Blocked",
        "AccessDenied",
        "ExpiredToken",
        "RequestExpired",
    }
)
NOT_FOUND = "InvalidInstanceID.NotFound"
# Instances per DescribeInstances page when listing by tag: aiobotocore parses each answer on the event loop
# in one go, 0.34 ms per instance as measured (bench/cloud_clients.py), so a page of 50 holds the loop about
# 17 ms however many instances the cluster has.
PAGE = 50
LIVE_STATES = ["pending", "running", "stopping", "stopped"]


def classify(exc: Exception) -> CloudError:
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        code, message = str(error.get("Code") or ""), str(error.get("Message") or exc)
        if code in CAPACITY_CODES:
            return CapacityUnavailable(code, message)
        if code in AUTH_CODES:
            return AuthFailure(code, message)
        if code.startswith(("Invalid", "Missing")) or code in ("MalformedQueryString", "NoSuchEntity"):
            return InvalidRequest(code, message)
        return CloudError(code, message)
    if isinstance(exc, BotoCoreError):  # no credentials, endpoint unreachable, ...
        name = type(exc).__name__
        return AuthFailure(name, str(exc)) if "Credential" in name else CloudError(name, str(exc))
    return CloudError(type(exc).__name__, str(exc))


def _tags(raw: Any) -> dict[str, str]:
    return {str(t.get("Key")): str(t.get("Value") or "") for t in raw or [] if t.get("Key")}


def _instance(raw: Mapping[str, Any]) -> Instance:
    tags = _tags(raw.get("Tags"))
    launched = raw.get("LaunchTime")
    return Instance(
        id=str(raw.get("InstanceId") or ""),
        state=str((raw.get("State") or {}).get("Name") or ""),
        claim=tags.get(TAG_CLAIM, ""),
        zone=str((raw.get("Placement") or {}).get("AvailabilityZone") or ""),
        launched=launched if isinstance(launched, dt.datetime) else None,
        tags=tags,
    )


def _filters(term: SelectorTerm, name_filter: str) -> list[dict[str, Any]]:
    out = [{"Name": f"tag:{k}", "Values": [v]} for k, v in sorted(term.tags.items())]
    if term.name:
        out.append({"Name": name_filter, "Values": [term.name]})
    return out


class AWSProvider:
    vendor = "aws"

    def __init__(self, config: VendorConfig) -> None:
        self.config = config
        self._keys = KeyFiles(config.access_key_path, config.secret_key_path) if config.uses_keys else None
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None

    async def _ec2(self) -> Any:
        if self._client is not None and (self._keys is None or not self._keys.changed()):
            return self._client
        await self.close()
        kwargs: dict[str, Any] = {"region_name": self.config.region}
        if self.config.endpoint:
            kwargs["endpoint_url"] = self.config.endpoint
        if self._keys is not None:
            kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = self._keys.read()
        config = AioConfig(
            connect_timeout=10, read_timeout=30, retries={"max_attempts": 3, "mode": "standard"}
        )
        stack = contextlib.AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(
                get_session().create_client("ec2", config=config, **kwargs)
            )
        except Exception as exc:
            await stack.aclose()
            raise classify(exc) from exc
        self._stack = stack
        return self._client

    async def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        client = await self._ec2()
        try:
            result: dict[str, Any] = await getattr(client, operation)(**params)
        except Exception as exc:
            raise classify(exc) from exc
        return result

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def test_connection(self) -> None:
        await self._call("describe_instances", MaxResults=5)

    # -- look-ups ---------------------------------------------------------------------------------------

    async def _images_of(self, term: SelectorTerm) -> list[tuple[str, str]]:
        if term.id:
            try:
                found = (await self._call("describe_images", ImageIds=[term.id]))["Images"]
            except InvalidRequest:  # EC2 answers an unknown id with InvalidAMIID.*
                found = []
        else:
            found = (await self._call("describe_images", Filters=_filters(term, "name")))["Images"]
        return [(str(i.get("CreationDate") or ""), str(i["ImageId"])) for i in found]

    async def _image(self, request: LaunchRequest) -> str:
        return await newest_image(request, self._images_of, "InvalidAMIID.NotFound")

    async def _subnet(self, request: LaunchRequest) -> str:
        subnets: list[dict[str, Any]] = []
        for term in request.node_class.subnets:
            params: dict[str, Any] = (
                {"SubnetIds": [term.id]} if term.id else {"Filters": _filters(term, "tag:Name")}
            )
            subnets += (await self._call("describe_subnets", **params))["Subnets"]
        return subnet_of_zone(subnets, request, what="subnet", id_key="SubnetId", zone_key="AvailabilityZone",
                              missing_code="InvalidSubnetID.NotFound")

    async def _groups_named(self, term: SelectorTerm) -> list[str]:
        answer = await self._call("describe_security_groups", Filters=_filters(term, "group-name"))
        return [str(g["GroupId"]) for g in answer["SecurityGroups"]]

    async def _groups(self, request: LaunchRequest) -> list[str]:
        return await security_groups(request, self._groups_named, "InvalidGroup.NotFound")

    async def resolve(self, request: LaunchRequest) -> dict[str, Any]:
        return await resolve_terms(request, image=self._image, subnet=self._subnet, subnet_key="SubnetId",
                                   groups=self._groups)

    # -- the request ------------------------------------------------------------------------------------

    def request_of(self, request: LaunchRequest, resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
        node_class = request.node_class
        resolved = resolved or {}
        params: dict[str, Any] = {
            "InstanceType": request.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": request.claim,
        }
        image = resolved.get("ImageId") or next((t.id for t in node_class.images if t.id), "")
        if image:
            params["ImageId"] = image
        template = node_class.launch_template
        if template is not None:
            params["LaunchTemplate"] = (
                {"LaunchTemplateId": template.id} if template.id else {"LaunchTemplateName": template.name}
            )
        if resolved.get("SubnetId"):
            params["SubnetId"] = resolved["SubnetId"]
        elif any(t.id for t in node_class.subnets) and not request.zone:
            params["SubnetId"] = next(t.id for t in node_class.subnets if t.id)
        groups = resolved.get("SecurityGroupIds") or sorted(
            {t.id for t in node_class.security_groups if t.id}
        )
        if groups:
            params["SecurityGroupIds"] = list(groups)
        if node_class.user_data:
            params["UserData"] = node_class.user_data_for(request.claim)  # botocore base64-encodes it
        if node_class.instance_profile:
            profile = node_class.instance_profile
            params["IamInstanceProfile"] = (
                {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
            )
        if node_class.metadata_options is not None:
            md = node_class.metadata_options
            params["MetadataOptions"] = {
                "HttpEndpoint": "enabled" if md.http_endpoint else "disabled",
                "HttpProtocolIpv6": "enabled" if md.http_protocol_ipv6 else "disabled",
                "HttpPutResponseHopLimit": md.http_put_response_hop_limit,
                "HttpTokens": md.http_tokens,
            }
        if node_class.block_devices:
            params["BlockDeviceMappings"] = [
                {
                    "DeviceName": d.device_name,
                    "Ebs": {
                        k: v
                        for k, v in (
                            ("VolumeSize", volume_gib(d.volume_size) if d.volume_size else None),
                            ("VolumeType", d.volume_type or "gp3"),
                            ("DeleteOnTermination", d.delete_on_termination),
                            ("Encrypted", d.encrypted),
                        )
                        if v is not None
                    },
                }
                for d in node_class.block_devices
            ]
        if request.zone:
            params["Placement"] = {"AvailabilityZone": request.zone}
        if request.capacity_type == "spot":
            spot: dict[str, Any] = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if request.extra.get("spotPriceLimit"):
                spot["MaxPrice"] = request.extra["spotPriceLimit"]
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        tags = [{"Key": k, "Value": v} for k, v in sorted(instance_tags(request).items())]
        params["TagSpecifications"] = [
            {"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")
        ]
        return params

    # -- lifecycle --------------------------------------------------------------------------------------

    async def create(self, request: LaunchRequest) -> Instance:
        existing = await self.find(request.claim)
        if existing is not None:
            return existing
        params = self.request_of(request, await self.resolve(request))
        reservation = await self._call("run_instances", **params)
        instances = reservation.get("Instances") or []
        if not instances:
            raise CloudError("NoInstance", "RunInstances answered no instance")
        return _instance(instances[0])

    async def _describe(self, **params: Any) -> list[Instance]:
        out: list[Instance] = []
        while True:
            page = await self._call("describe_instances", **params)
            out += [_instance(i) for r in page.get("Reservations") or [] for i in r.get("Instances") or []]
            token = page.get("NextToken")
            if not token:
                return out
            params["NextToken"] = token

    async def find(self, claim: str) -> Instance | None:
        found = await self._describe(
            MaxResults=PAGE,
            Filters=[
                {"Name": f"tag:{TAG_CLAIM}", "Values": [claim]},
                {"Name": "instance-state-name", "Values": LIVE_STATES},
            ]
        )
        return found[0] if found else None

    async def describe(self, instance_id: str) -> Instance | None:
        try:
            found = await self._describe(InstanceIds=[instance_id])
        except CloudError as exc:
            if exc.code == NOT_FOUND:
                return None
            raise
        return found[0] if found else None

    async def list_managed(self, cluster: str) -> list[Instance]:
        return await self._describe(
            MaxResults=PAGE,
            Filters=[
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]},
                {"Name": "instance-state-name", "Values": LIVE_STATES},
            ]
        )

    async def terminate(self, instance_id: str) -> None:
        try:
            await self._call("terminate_instances", InstanceIds=[instance_id])
        except CloudError as exc:
            if exc.code != NOT_FOUND:
                raise
