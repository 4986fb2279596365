"""Alibaba Cloud ECS through the official SDK (``alibabacloud-ecs20140526``, whose async calls run on aiohttp
like the rest of the project).

``create`` sends TensorFusion's whole RunInstances request (launch template, image, type, name, region,
vSwitch, security group, data disks with their performance level, the system disk, public bandwidth and
its charge type, description, user data with the claim's name put in, spot strategy, price limit, duration
and interruption behaviour, key pair, tags) and what TensorFusion leaves out: the offering's zone, the
vSwitch of that zone, every security group, the RAM role (``spec.instanceProfile``), the metadata options
and ``ClientToken`` = the claim's name. An instance already tagged with the claim is returned instead of a
new one. ``DeleteInstances`` is sent with ``Force``.

ECS has no vSwitch look-up of its own since the VPC API took it over: vSwitches are described through
the VPC API (``DescribeVSwitches``, 2016-04-28) with the SDK's generic caller and the same credentials.

The SDK's own retries sleep without yielding the event loop (``time.sleep`` between attempts), so they
are off: the lifecycle controller retries on its next reconcile.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import importlib
import json
import posixpath
import urllib.parse
from collections.abc import Mapping
from typing import Any

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

VPC_VERSION = "2016-04-28"
CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS = 10_000, 30_000
CAPACITY_CODES = frozenset(
    {
        "OperationDenied.NoStock",
        "OperationDenied.NoSpotStock",
        "Zone.NotOnSale",
        "InvalidResourceType.NotSupported",
        "InvalidInstanceType.ZoneNotOnSale",
        "InvalidInstanceType.NotSupported",
        "InvalidVSwitchId.IpNotEnough",
        "QuotaExceed.ElasticQuota",
        "QuotaExceed.PostPaidDisk",
        "QuotaExceed.SpotInstance",
        "OperationDenied.SpotPriceLimitLow",
    }
)
AUTH_CODES = frozenset(
    {
        "InvalidAccessKeyId.NotFound",
        "InvalidAccessKeyId.Inactive",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "Forbidden",
        "Forbidden.RAM",
        "Forbidden.AccessKeyDisabled",
        "Forbidden.SubUser",
        "NoPermission",
        "InvalidSecurityToken.Expired",
        "InvalidSecurityToken.Malformed",
        "InvalidSecurityToken.MismatchWithAccessKey",
        "SignatureNonceUsed",
        "InvalidTimeStamp.Expired",
    }
)
NOT_FOUND = "InvalidInstanceId.NotFound"
LIVE_STATES = frozenset({"Pending", "Starting", "Running", "Stopping", "Stopped"})
DEFAULT_SYSTEM_DISK = {"Category": "cloud_essd", "Size": "40"}  # TensorFusion's defaults
PAGE = 50  # instances per DescribeInstances page: the SDK builds its models on the event loop


def classify(exc: Exception) -> CloudError:
    """The cloud's error, as the lifecycle acts on it, keeping the cloud's code and message."""
    if isinstance(exc, CloudError):
        return exc
    code = str(getattr(exc, "code", "") or "")
    data = getattr(exc, "data", None)
    message = str(getattr(exc, "message", "") or exc)
    if isinstance(data, Mapping) and data.get("Message"):  # the cloud's own words, without the SDK's frame
        message = f"{data['Message']} (RequestId {data.get('RequestId') or '?'})"
    status = getattr(exc, "status_code", None)
    if not code:  # no answer from the cloud: the endpoint unreachable, a timeout, no credentials
        name = type(exc).__name__
        return (AuthFailure if "Credential" in name or "credential" in message else CloudError)(name, message)
    if code in CAPACITY_CODES or code.startswith("QuotaExceed"):
        return CapacityUnavailable(code, message)
    if code in AUTH_CODES or code.startswith("Forbidden") or status in (401, 403):
        return AuthFailure(code, message)
    if code.startswith(("Invalid", "Missing")) or status == 400:
        return InvalidRequest(code, message)
    return CloudError(code, message)


def _tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    tags = (raw.get("Tags") or {}).get("Tag") or []
    return {
        str(t.get("TagKey") or t.get("Key")): str(t.get("TagValue") or t.get("Value") or "")
        for t in tags
        if t.get("TagKey") or t.get("Key")
    }


def _time(raw: Any) -> dt.datetime | None:
    """ECS's CreationTime, ``2026-12-02T10:04Z`` (minutes) or with seconds."""
    text = str(raw or "")
    for shape in ("%Y-%m-%dT%H:%MZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return dt.datetime.strptime(text, shape).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    return None


def _instance(raw: Mapping[str, Any]) -> Instance:
    tags = _tags_of(raw)
    return Instance(
        id=str(raw.get("InstanceId") or ""),
        state=str(raw.get("Status") or ""),
        claim=tags.get(TAG_CLAIM, ""),
        zone=str(raw.get("ZoneId") or ""),
        launched=_time(raw.get("CreationTime")),
        tags=tags,
    )


def _tag_filter(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(tags.items())]


def _number(extra: Mapping[str, str], key: str, kind: type[int] | type[float], default: float) -> Any:
    text = extra.get(key)
    if not text:
        return kind(default)
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidRequest(
            "InvalidParameter", f"GPUNodeClaim spec.extraParams.{key}={text!r} is not {what}"
        ) from None


def _endpoint(url: str) -> tuple[str, str]:
    """(host[:port], protocol) of ``extraParams.endpoint``: a URL, or a bare host (HTTPS)."""
    if "://" not in url:
        return url, "https"
    parsed = urllib.parse.urlsplit(url)
    return parsed.netloc, parsed.scheme


SDK_MODULES = (
    "alibabacloud_ecs20140526.client",
    "alibabacloud_ecs20140526.models",
    "alibabacloud_tea_openapi.client",
    "alibabacloud_credentials.client",
    "darabonba.runtime",
)


async def _load_sdk() -> None:
    """Import the SDK off the event loop: its ECS client and models take over a second to import, and the
    extender's loop serves kube-scheduler meanwhile."""
    try:
        await asyncio.to_thread(lambda: [importlib.import_module(name) for name in SDK_MODULES])
    except ImportError as exc:  # installed without the [alibaba] extra
        from extender.cloud.factory import missing_extra

        raise missing_extra("alibaba", exc) from None


class AlibabaProvider:
    vendor = "alibaba"

    def __init__(self, config: VendorConfig) -> None:
        self.config = config
        self._keys = KeyFiles(config.access_key_path, config.secret_key_path) if config.uses_keys else None
        self._clients: tuple[Any, Any] | None = None  # (ECS client, VPC client)

    async def _make_clients(self) -> tuple[Any, Any]:
        if self._clients is not None and (self._keys is None or not self._keys.changed()):
            return self._clients
        await _load_sdk()
        from alibabacloud_ecs20140526.client import Client as ECSClient
        from alibabacloud_tea_openapi.client import Client as OpenApiClient
        from alibabacloud_tea_openapi.utils_models import Config

        region = self.config.region
        settings: dict[str, Any] = {"region_id": region, "connect_timeout": CONNECT_TIMEOUT_MS,
                                    "read_timeout": READ_TIMEOUT_MS}
        try:
            if self._keys is not None:
                settings["access_key_id"], settings["access_key_secret"] = self._keys.read()
            else:  # serviceAccountRole: the default chain (RRSA web identity, ECS RAM role, environment)
                from alibabacloud_credentials.client import Client as CredentialClient

                settings["credential"] = CredentialClient()
        except CloudError:
            raise
        except Exception as exc:
            raise AuthFailure(type(exc).__name__, str(exc)) from exc
        ecs_host, ecs_protocol = _endpoint(self.config.endpoint or f"ecs.{region}.aliyuncs.com")
        vpc_url = self.config.extra.get("vpcEndpoint") or self.config.endpoint or f"vpc.{region}.aliyuncs.com"
        vpc_host, vpc_protocol = _endpoint(vpc_url)
        ecs = ECSClient(Config(endpoint=ecs_host, protocol=ecs_protocol, **settings))
        vpc = OpenApiClient(Config(endpoint=vpc_host, protocol=vpc_protocol, **settings))
        self._clients = (ecs, vpc)
        return self._clients

    @staticmethod
    def _runtime() -> Any:
        from darabonba.runtime import RuntimeOptions

        return RuntimeOptions(autoretry=False)  # the timeouts are the clients' own (Config)

    async def _ecs(self, action: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One ECS call: ``params`` in the API's own names; the answer's body as the API spells it."""
        import alibabacloud_ecs20140526.models as models

        ecs, _ = await self._make_clients()
        snake = "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")
        request = getattr(models, f"{action}Request")().from_map(dict(params))
        call = getattr(ecs, f"{snake}_with_options_async")
        try:
            response = await call(request, self._runtime())
        except Exception as exc:
            raise classify(exc) from exc
        body: dict[str, Any] = response.body.to_map() if response.body is not None else {}
        return body

    async def _vpc(self, action: str, query: Mapping[str, Any]) -> dict[str, Any]:
        from alibabacloud_tea_openapi.utils import Utils
        from alibabacloud_tea_openapi.utils_models import OpenApiRequest, Params

        _, vpc = await self._make_clients()
        params = Params(
            action=action,
            version=VPC_VERSION,
            protocol="HTTPS",
            pathname="/",
            method="POST",
            auth_type="AK",
            style="RPC",
            req_body_type="formData",
            body_type="json",
        )
        try:
            answer = await vpc.call_api_async(
                params, OpenApiRequest(query=Utils.query(dict(query))), self._runtime()
            )
        except Exception as exc:
            raise classify(exc) from exc
        body: dict[str, Any] = (answer or {}).get("body") or {}
        return body

    async def close(self) -> None:
        self._clients = None  # the SDK opens an HTTP session per call and closes it after

    async def test_connection(self) -> None:
        await self._ecs("DescribeRegions", {"AcceptLanguage": "en-US"})

    # -- look-ups ---------------------------------------------------------------------------------------

    def _region(self, request: LaunchRequest) -> str:
        return request.region or self.config.region

    async def _images_of(self, term: SelectorTerm, region: str) -> list[tuple[str, str]]:
        query: dict[str, Any] = {"RegionId": region, "PageSize": PAGE}
        if term.id:
            query["ImageId"] = term.id
        if term.name:
            query["ImageName"] = term.name
        if term.tags:
            query["Tag"] = _tag_filter(term.tags)
        found = ((await self._ecs("DescribeImages", query)).get("Images") or {}).get("Image") or []
        return [(str(i.get("CreationTime") or ""), str(i["ImageId"])) for i in found]

    async def _image(self, request: LaunchRequest) -> str:
        region = self._region(request)
        return await newest_image(request, lambda term: self._images_of(term, region),
                                  "InvalidImageId.NotFound")

    async def _vswitch(self, request: LaunchRequest) -> str:
        switches: list[dict[str, Any]] = []
        for term in request.node_class.subnets:
            query: dict[str, Any] = {"RegionId": self._region(request), "PageSize": 50}
            if term.id:
                query["VSwitchId"] = term.id
            if term.name:
                query["VSwitchName"] = term.name
            if term.tags:
                query["Tag"] = _tag_filter(term.tags)
            answer = await self._vpc("DescribeVSwitches", query)
            switches += (answer.get("VSwitches") or {}).get("VSwitch") or []
        return subnet_of_zone(switches, request, what="vSwitch", id_key="VSwitchId", zone_key="ZoneId",
                              missing_code="InvalidVSwitchId.NotFound")

    async def _groups_named(self, term: SelectorTerm, region: str) -> list[str]:
        query: dict[str, Any] = {"RegionId": region, "MaxResults": PAGE}
        if term.name:
            query["SecurityGroupName"] = term.name
        if term.tags:
            query["Tag"] = _tag_filter(term.tags)
        answer = await self._ecs("DescribeSecurityGroups", query)
        groups = (answer.get("SecurityGroups") or {}).get("SecurityGroup") or []
        return [str(g["SecurityGroupId"]) for g in groups]

    async def _groups(self, request: LaunchRequest) -> list[str]:
        region = self._region(request)
        return await security_groups(request, lambda term: self._groups_named(term, region),
                                     "InvalidSecurityGroupId.NotFound")

    async def resolve(self, request: LaunchRequest) -> dict[str, Any]:
        return await resolve_terms(request, image=self._image, subnet=self._vswitch, subnet_key="VSwitchId",
                                   groups=self._groups)

    # -- the request ------------------------------------------------------------------------------------

    def request_of(self, request: LaunchRequest, resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
        node_class, extra = request.node_class, request.extra
        resolved = resolved or {}
        params: dict[str, Any] = {
            "RegionId": self._region(request),
            "InstanceType": request.instance_type,
            "InstanceName": request.claim,
            "Amount": 1,
            "ClientToken": request.claim,
            "InstanceChargeType": "PostPaid",
            "InternetChargeType": "PayByTraffic",
            "InternetMaxBandwidthOut": _number(extra, "internetMaxBandwidthOut", int, 100),
            "Description": f"GPU node managed by TensorFusion NodeClass: {node_class.name}",
            "SystemDisk": {
                "Category": extra.get("systemDiskCategory") or DEFAULT_SYSTEM_DISK["Category"],
                "Size": str(extra.get("systemDiskSize") or DEFAULT_SYSTEM_DISK["Size"]),
            },
        }
        image = resolved.get("ImageId") or next((t.id for t in node_class.images if t.id), "")
        if image:
            params["ImageId"] = image
        template = node_class.launch_template
        if template is not None:
            params["LaunchTemplateId" if template.id else "LaunchTemplateName"] = template.id or template.name
        if request.zone:
            params["ZoneId"] = request.zone
        switch = resolved.get("VSwitchId") or (
            next((t.id for t in node_class.subnets if t.id), "") if not request.zone else ""
        )
        if switch:
            params["VSwitchId"] = switch
        groups = resolved.get("SecurityGroupIds") or sorted(
            {t.id for t in node_class.security_groups if t.id}
        )
        if groups:
            params["SecurityGroupIds"] = list(groups)
        if node_class.user_data:
            params["UserData"] = base64.b64encode(node_class.user_data_for(request.claim).encode()).decode()
        if node_class.instance_profile:  # a RAM role name (an ARN's last part)
            params["RamRoleName"] = node_class.instance_profile.rsplit("/", 1)[-1]
        if node_class.metadata_options is not None:
            md = node_class.metadata_options
            params["HttpEndpoint"] = "enabled" if md.http_endpoint else "disabled"
            params["HttpTokens"] = md.http_tokens
            params["HttpPutResponseHopLimit"] = md.http_put_response_hop_limit
        if node_class.block_devices:
            level = extra.get("dataDiskPerformanceLevel") or "PL0"
            params["DataDisk"] = [
                {
                    k: v
                    for k, v in (
                        ("DiskName", posixpath.basename(d.device_name) or None),
                        ("Size", volume_gib(d.volume_size) if d.volume_size else None),
                        ("Category", d.volume_type or "cloud_essd"),
                        ("PerformanceLevel", level),
                        ("DeleteWithInstance", d.delete_on_termination),
                        ("Encrypted", "true" if d.encrypted else "false"),
                    )
                    if v is not None
                }
                for d in node_class.block_devices
            ]
        if request.capacity_type == "spot":
            if extra.get("spotPriceLimit"):
                params["SpotStrategy"] = "SpotWithPriceLimit"
                params["SpotPriceLimit"] = _number(extra, "spotPriceLimit", float, 0)
            else:
                params["SpotStrategy"] = "SpotAsPriceGo"
            params["SpotDuration"] = _number(extra, "spotDuration", int, 0)
            if extra.get("spotInterruptionBehavior"):
                params["SpotInterruptionBehavior"] = extra["spotInterruptionBehavior"]
        if extra.get("keyPairName"):
            params["KeyPairName"] = extra["keyPairName"]
        params["Tag"] = _tag_filter(instance_tags(request))
        return params

    # -- lifecycle --------------------------------------------------------------------------------------

    async def create(self, request: LaunchRequest) -> Instance:
        existing = await self.find(request.claim)
        if existing is not None:
            return existing
        params = self.request_of(request, await self.resolve(request))
        answer = await self._ecs("RunInstances", params)
        ids = (answer.get("InstanceIdSets") or {}).get("InstanceIdSet") or []
        if not ids:
            raise CloudError(
                "NoInstance", f"RunInstances answered no instance (RequestId {answer.get('RequestId')})"
            )
        made = await self.describe(str(ids[0]))
        return made or Instance(id=str(ids[0]), state="Pending", claim=request.claim, zone=request.zone)

    async def _describe(self, query: dict[str, Any]) -> list[Instance]:
        out: list[Instance] = []
        query = {"RegionId": self.config.region, "MaxResults": PAGE, **query}
        while True:
            page = await self._ecs("DescribeInstances", query)
            out += [_instance(i) for i in (page.get("Instances") or {}).get("Instance") or []]
            token = page.get("NextToken")
            if not token:
                return out
            query["NextToken"] = token

    async def find(self, claim: str) -> Instance | None:
        found = [
            i
            for i in await self._describe({"Tag": _tag_filter({TAG_CLAIM: claim})})
            if i.state in LIVE_STATES
        ]
        return found[0] if found else None

    async def describe(self, instance_id: str) -> Instance | None:
        found = await self._describe({"InstanceIds": json.dumps([instance_id])})
        return found[0] if found else None  # ECS forgets a deleted instance: it is simply not listed

    async def list_managed(self, cluster: str) -> list[Instance]:
        return [
            i
            for i in await self._describe({"Tag": _tag_filter({TAG_CLUSTER: cluster})})
            if i.state in LIVE_STATES
        ]

    async def terminate(self, instance_id: str) -> None:
        try:
            await self._ecs(
                "DeleteInstances",
                {"RegionId": self.config.region, "InstanceId": [instance_id], "Force": True},
            )
        except CloudError as exc:
            if exc.code != NOT_FOUND:
                raise
