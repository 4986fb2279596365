"""A local stand-in for Alibaba Cloud's ECS RPC API (2014-05-26) and the one VPC call the provider makes
(DescribeVSwitches, 2016-04-28). No emulator of Alibaba Cloud exists; this stands in for the cloud's
endpoint, not for our client: the extender talks to it through the official SDK (alibabacloud-ecs20140526),
over HTTP, with the SDK's own signing.

What it holds to, from Alibaba Cloud's API documentation:

- every request is signed with ACS3-HMAC-SHA256 (the SDK's default): the signature is recomputed from the
  canonical request (method, path, sorted query, the signed headers, the body's SHA-256) and a wrong key,
  a wrong signature, a stale ``x-acs-date`` or a reused ``x-acs-signature-nonce`` is refused with ECS's codes;
- RunInstances / DescribeInstances / DeleteInstances / DescribeImages / DescribeSecurityGroups /
  DescribeRegions / DescribeUserData / DescribeDisks answer in the documented JSON shapes, with the
  documented error body (Code, Message, RequestId) and status;
- ``ClientToken`` replay: the same token with the same parameters answers the first call's instances, with
  other parameters ``IdempotentParameterMismatch``;
- ``DeleteInstances`` of a running instance needs ``Force=true``; a deleted instance is no longer listed;
- booleans are read regardless of case, as the API does (the Python SDK sends ``True``).

``refuse`` holds (instance type, zone) pairs RunInstances answers with ``OperationDenied.NoStock``, as a
sold-out zone does. ``requests`` keeps each verified call's parameters as the server received them.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import http.server
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .processes import free_port

REGION = "cn-hangzhou"
ZONES = ("cn-hangzhou-h", "cn-hangzhou-i")
MISSING_ZONE = "cn-hangzhou-k"
ACCESS_KEY, SECRET_KEY = "LTAI5tTESTTESTTEST", "test-alibaba-secret"
ALGORITHM = "ACS3-HMAC-SHA256"
REQUIRED_SIGNED = (
    "host",
    "x-acs-action",
    "x-acs-content-sha256",
    "x-acs-date",
    "x-acs-signature-nonce",
    "x-acs-version",
)
CLOCK_SKEW = dt.timedelta(minutes=15)
BOOT_SECONDS = 0.5


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _encode(text: str) -> str:
    return urllib.parse.quote(text, safe="~")


def canonical_request(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: Mapping[str, str],
    signed: list[str],
    payload_hash: str,
) -> str:
    canonical_query = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(query))
    canonical_headers = "".join(f"{name}:{headers.get(name, '').strip()}\n" for name in signed)
    return "\n".join(
        [method, path or "/", canonical_query, canonical_headers, ";".join(signed), payload_hash]
    )


def signature(secret: str, canonical: str) -> str:
    to_sign = f"{ALGORITHM}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()


def unflatten(flat: list[tuple[str, str]]) -> dict[str, Any]:
    """RPC's flattened parameters (``Tag.1.Key``, ``SystemDisk.Category``, ``SecurityGroupIds.1``) as the
    nested request they spell; N-indexed levels become lists in index order."""
    root: dict[str, Any] = {}
    for key, value in flat:
        node = root
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value

    def listify(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        if node and all(k.isdigit() for k in node):
            return [listify(node[k]) for k in sorted(node, key=int)]
        return {k: listify(v) for k, v in node.items()}

    return listify(root)  # type: ignore[no-any-return]


@dataclass
class ECSWorld:
    image: str
    vswitches: dict[str, str]  # zone -> vSwitch id
    security_group: str
    vpc: str = "vpc-tfstandin0001"


@dataclass
class Resource:
    fields: dict[str, Any]
    tags: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)


class ECSStandIn:
    """The server's state and its answers; served by ``serve`` on loopback."""

    def __init__(self, keys: Mapping[str, str] | None = None) -> None:
        self.keys = dict(keys or {ACCESS_KEY: SECRET_KEY})
        self.lock = threading.Lock()
        self.images: list[Resource] = []
        self.vswitches: list[Resource] = []
        self.groups: list[Resource] = []
        self.instances: dict[str, Resource] = {}
        self.user_data: dict[str, str] = {}
        self.disks: dict[str, list[dict[str, Any]]] = {}
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        self.nonces: set[str] = set()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.refuse: set[tuple[str, str]] = set()
        self._ids = itertools.count(1)
        self.url = ""

    # -- the world ----------------------------------------------------------------------------------------

    def seed(self) -> ECSWorld:
        role = {"tf-e2e/role": "gpu"}
        image = "m-tfgpunode202612"
        self.images.append(
            Resource(
                {
                    "ImageId": "m-tfgpunode202611",
                    "ImageName": "tf-gpu-node-2026.11",
                    "CreationTime": "2026-11-01T00:00:00Z",
                    "Status": "Available",
                },
                dict(role),
            )
        )
        self.images.append(
            Resource(
                {
                    "ImageId": image,
                    "ImageName": "tf-gpu-node-2026.12",
                    "CreationTime": "2026-12-01T00:00:00Z",
                    "Status": "Available",
                },
                dict(role),
            )
        )
        switches = {}
        for n, zone in enumerate(ZONES, 1):
            switch = f"vsw-tfstandin{n:04d}"
            self.vswitches.append(
                Resource(
                    {
                        "VSwitchId": switch,
                        "ZoneId": zone,
                        "VpcId": "vpc-tfstandin0001",
                        "AvailableIpAddressCount": 250,
                        "Status": "Available",
                    },
                    dict(role),
                )
            )
            switches[zone] = switch
        group = "sg-tfstandin0001"
        self.groups.append(
            Resource(
                {"SecurityGroupId": group, "SecurityGroupName": "tf-gpu-nodes", "VpcId": "vpc-tfstandin0001"},
                dict(role),
            )
        )
        return ECSWorld(image=image, vswitches=switches, security_group=group)

    # -- the protocol -------------------------------------------------------------------------------------

    def verify(
        self, method: str, path: str, query: list[tuple[str, str]], headers: Mapping[str, str], body: bytes
    ) -> None:
        auth = headers.get("authorization", "")
        algorithm, _, rest = auth.partition(" ")
        if algorithm != ALGORITHM:
            raise ApiError(400, "IncompleteSignature", f"the Authorization header is not {ALGORITHM}")
        parts = dict(p.split("=", 1) for p in rest.split(",") if "=" in p)
        key, signed = parts.get("Credential", ""), [h for h in parts.get("SignedHeaders", "").split(";") if h]
        missing = [h for h in REQUIRED_SIGNED if h not in signed]
        if missing:
            raise ApiError(400, "IncompleteSignature", f"the signature does not cover {', '.join(missing)}")
        secret = self.keys.get(key)
        if secret is None:
            raise ApiError(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        payload_hash = hashlib.sha256(body).hexdigest()
        if headers.get("x-acs-content-sha256") != payload_hash:
            raise ApiError(400, "IncompleteSignature", "x-acs-content-sha256 is not the body's SHA-256")
        expected = signature(secret, canonical_request(method, path, query, headers, signed, payload_hash))
        if not hmac.compare_digest(expected, parts.get("Signature", "")):
            raise ApiError(
                400, "SignatureDoesNotMatch", "Specified signature does not match our calculation."
            )
        try:
            sent = dt.datetime.strptime(headers.get("x-acs-date", ""), "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=dt.UTC
            )
        except ValueError as exc:
            raise ApiError(400, "InvalidTimeStamp.Format", "x-acs-date is not ISO 8601") from exc
        if abs(dt.datetime.now(dt.UTC) - sent) > CLOCK_SKEW:
            raise ApiError(400, "InvalidTimeStamp.Expired", "Specified time stamp or date value is expired.")
        nonce = headers.get("x-acs-signature-nonce", "")
        with self.lock:
            if nonce in self.nonces:
                raise ApiError(400, "SignatureNonceUsed", "Specified signature nonce was used already.")
            self.nonces.add(nonce)

    def answer(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Any]:
        split = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
        request_id = f"STANDIN-{next(self._ids):06d}"
        try:
            self.verify(method, split.path, query, headers, body)
            flat = (
                query + urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)
                if headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
                else query
            )
            params = unflatten([(k, v) for k, v in flat if k not in ("Format",)])
            action, version = headers.get("x-acs-action", ""), headers.get("x-acs-version", "")
            handler = getattr(self, f"_{version.replace('-', '_')}_{action}", None)
            if handler is None:
                raise ApiError(404, "InvalidAction.NotFound", f"{action} ({version}) is not served here")
            with self.lock:
                self.requests.append((action, params))
                result = handler(params)
            return 200, {"RequestId": request_id, **result}
        except ApiError as exc:
            return exc.status, {
                "Code": exc.code,
                "Message": exc.message,
                "RequestId": request_id,
                "HostId": urllib.parse.urlsplit(self.url).netloc,
            }

    # -- look-ups -----------------------------------------------------------------------------------------

    @staticmethod
    def _tag_match(resource: Resource, params: Mapping[str, Any]) -> bool:
        wanted = {t.get("Key", ""): t.get("Value", "") for t in params.get("Tag") or []}
        return all(resource.tags.get(k) == v for k, v in wanted.items())

    @staticmethod
    def _tags(resource: Resource) -> dict[str, Any]:
        return {"Tags": {"Tag": [{"TagKey": k, "TagValue": v} for k, v in sorted(resource.tags.items())]}}

    def _2014_05_26_DescribeRegions(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "Regions": {
                "Region": [
                    {
                        "RegionId": REGION,
                        "LocalName": "China (Hangzhou)",
                        "RegionEndpoint": f"ecs.{REGION}.aliyuncs.com",
                    }
                ]
            }
        }

    def _2014_05_26_DescribeImages(self, params: Mapping[str, Any]) -> dict[str, Any]:
        found = [
            r
            for r in self.images
            if self._tag_match(r, params)
            and (not params.get("ImageId") or r.fields["ImageId"] in params["ImageId"].split(","))
            and (not params.get("ImageName") or r.fields["ImageName"] == params["ImageName"])
        ]
        return {"Images": {"Image": [{**r.fields, **self._tags(r)} for r in found]}, "TotalCount": len(found)}

    def _2014_05_26_DescribeSecurityGroups(self, params: Mapping[str, Any]) -> dict[str, Any]:
        ids = json.loads(params["SecurityGroupIds"]) if params.get("SecurityGroupIds") else None
        found = [
            r
            for r in self.groups
            if self._tag_match(r, params)
            and (ids is None or r.fields["SecurityGroupId"] in ids)
            and (
                not params.get("SecurityGroupName")
                or r.fields["SecurityGroupName"] == params["SecurityGroupName"]
            )
        ]
        return {"SecurityGroups": {"SecurityGroup": [{**r.fields, **self._tags(r)} for r in found]}}

    def _2016_04_28_DescribeVSwitches(self, params: Mapping[str, Any]) -> dict[str, Any]:
        found = [
            r
            for r in self.vswitches
            if self._tag_match(r, params)
            and (not params.get("VSwitchId") or r.fields["VSwitchId"] == params["VSwitchId"])
            and (not params.get("ZoneId") or r.fields["ZoneId"] == params["ZoneId"])
        ]
        return {
            "VSwitches": {"VSwitch": [{**r.fields, **self._tags(r)} for r in found]},
            "TotalCount": len(found),
        }

    # -- instances ----------------------------------------------------------------------------------------

    def _2014_05_26_RunInstances(self, params: Mapping[str, Any]) -> dict[str, Any]:
        for name in ("RegionId", "InstanceType"):
            if not params.get(name):
                raise ApiError(400, f"Missing{name}", f"{name} is mandatory for this action.")
        fingerprint = json.dumps({k: v for k, v in params.items() if k != "ClientToken"}, sort_keys=True)
        token = str(params.get("ClientToken") or "")
        if token in self.tokens:
            if self.tokens[token][0] != fingerprint:
                raise ApiError(
                    400,
                    "IdempotentParameterMismatch",
                    "The specified parameters are different from before with the same ClientToken.",
                )
            return {"InstanceIdSets": {"InstanceIdSet": list(self.tokens[token][1])}}
        image = str(params.get("ImageId") or "")
        if not image and not params.get("LaunchTemplateId") and not params.get("LaunchTemplateName"):
            raise ApiError(400, "MissingImageId", "ImageId is mandatory for this action.")
        if image and not any(r.fields["ImageId"] == image for r in self.images):
            raise ApiError(404, "InvalidImageId.NotFound", "The specified ImageId does not exist.")
        switch = next((r for r in self.vswitches if r.fields["VSwitchId"] == params.get("VSwitchId")), None)
        if params.get("VSwitchId") and switch is None:
            raise ApiError(404, "InvalidVSwitchId.NotFound", "The specified VSwitchId does not exist.")
        zone = str(params.get("ZoneId") or (switch.fields["ZoneId"] if switch else ZONES[0]))
        if switch is not None and switch.fields["ZoneId"] != zone:
            raise ApiError(400, "InvalidVSwitchId.NotMatchZone", "The vSwitch is not in the specified zone.")
        groups = list(
            params.get("SecurityGroupIds")
            or ([params["SecurityGroupId"]] if params.get("SecurityGroupId") else [])
        )
        for group in groups:
            if not any(r.fields["SecurityGroupId"] == group for r in self.groups):
                raise ApiError(
                    404,
                    "InvalidSecurityGroupId.NotFound",
                    f"The specified SecurityGroupId {group} does not exist.",
                )
        if (params["InstanceType"], zone) in self.refuse:
            raise ApiError(
                403,
                "OperationDenied.NoStock",
                "The requested resource is sold out in the specified zone; try other types of "
                "resources or other regions and zones.",
            )
        made = []
        for _ in range(int(params.get("Amount") or 1)):
            instance_id = f"i-standin{next(self._ids):012d}"
            tags = {t["Key"]: t.get("Value", "") for t in params.get("Tag") or []}
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
            self.instances[instance_id] = Resource(
                {
                    "InstanceId": instance_id,
                    "InstanceName": params.get("InstanceName", instance_id),
                    "InstanceType": params["InstanceType"],
                    "ImageId": image,
                    "RegionId": params["RegionId"],
                    "ZoneId": zone,
                    "Status": "Pending",
                    "CreationTime": now,
                    "InstanceChargeType": params.get("InstanceChargeType", "PostPaid"),
                    "InternetChargeType": params.get("InternetChargeType", ""),
                    "InternetMaxBandwidthOut": int(params.get("InternetMaxBandwidthOut") or 0),
                    "Description": params.get("Description", ""),
                    "KeyPairName": params.get("KeyPairName", ""),
                    "SpotStrategy": params.get("SpotStrategy", "NoSpot"),
                    "SpotPriceLimit": float(params.get("SpotPriceLimit") or 0),
                    "SpotDuration": int(params.get("SpotDuration") or 0),
                    "SpotInterruptionBehavior": params.get("SpotInterruptionBehavior", "Terminate"),
                    "VpcAttributes": {
                        "VpcId": switch.fields["VpcId"] if switch else "",
                        "VSwitchId": switch.fields["VSwitchId"] if switch else "",
                        "PrivateIpAddress": {"IpAddress": [f"10.0.0.{len(self.instances) + 10}"]},
                    },
                    "SecurityGroupIds": {"SecurityGroupId": groups},
                    "MetadataOptions": {
                        "HttpEndpoint": params.get("HttpEndpoint", "enabled"),
                        "HttpTokens": params.get("HttpTokens", "optional"),
                        "HttpPutResponseHopLimit": int(params.get("HttpPutResponseHopLimit") or 1),
                    },
                },
                tags,
            )
            self.user_data[instance_id] = str(params.get("UserData") or "")
            system = params.get("SystemDisk") or {}
            self.disks[instance_id] = [
                {
                    "Type": "system",
                    "Category": system.get("Category", "cloud_efficiency"),
                    "Size": int(system.get("Size") or 40),
                    "DeleteWithInstance": True,
                }
            ] + [
                {
                    "Type": "data",
                    "DiskName": d.get("DiskName", ""),
                    "Category": d.get("Category", ""),
                    "Size": int(d.get("Size") or 0),
                    "PerformanceLevel": d.get("PerformanceLevel", ""),
                    "DeleteWithInstance": d.get("DeleteWithInstance", "true").lower() == "true",
                    "Encrypted": d.get("Encrypted", "false").lower() == "true",
                }
                for d in params.get("DataDisk") or []
            ]
            made.append(instance_id)
        if token:
            self.tokens[token] = (fingerprint, made)
        return {"InstanceIdSets": {"InstanceIdSet": made}, "TradePrice": 0.0}

    def _2014_05_26_DescribeInstances(self, params: Mapping[str, Any]) -> dict[str, Any]:
        ids = json.loads(params["InstanceIds"]) if params.get("InstanceIds") else None
        self._boot()
        found = []
        for instance_id, r in sorted(self.instances.items()):
            if (
                (ids is None or instance_id in ids)
                and self._tag_match(r, params)
                and (not params.get("Status") or r.fields["Status"] == params["Status"])
            ):
                found.append({**r.fields, **self._tags(r)})
        size = int(params.get("MaxResults") or 10)
        start = int(params.get("NextToken") or 0)
        page = found[start : start + size]
        more = start + size < len(found)
        return {
            "Instances": {"Instance": page},
            "TotalCount": len(found),
            "NextToken": str(start + size) if more else "",
        }

    def _boot(self) -> None:
        """An instance is Pending for its first BOOT_SECONDS, then Running."""
        now = time.monotonic()
        for r in self.instances.values():
            if r.fields["Status"] == "Pending" and now - r.created >= BOOT_SECONDS:
                r.fields["Status"] = "Running"

    def _2014_05_26_DescribeUserData(self, params: Mapping[str, Any]) -> dict[str, Any]:
        instance_id = str(params.get("InstanceId") or "")
        if instance_id not in self.instances:
            raise ApiError(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        return {"InstanceId": instance_id, "RegionId": REGION, "UserData": self.user_data[instance_id]}

    def _2014_05_26_DescribeDisks(self, params: Mapping[str, Any]) -> dict[str, Any]:
        disks = self.disks.get(str(params.get("InstanceId") or ""), [])
        return {"Disks": {"Disk": disks}, "TotalCount": len(disks)}

    def _2014_05_26_DeleteInstances(self, params: Mapping[str, Any]) -> dict[str, Any]:
        ids = list(params.get("InstanceId") or [])
        if not ids:
            raise ApiError(400, "MissingInstanceId", "InstanceId is mandatory for this action.")
        for instance_id in ids:
            if instance_id not in self.instances:
                raise ApiError(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
            if (
                self.instances[instance_id].fields["Status"] != "Stopped"
                and str(params.get("Force")).lower() != "true"
            ):
                raise ApiError(
                    403,
                    "IncorrectInstanceStatus",
                    "The current status of the resource does not support this operation.",
                )
        for instance_id in ids:
            del self.instances[instance_id]
        return {}


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        self._serve()

    def do_GET(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, answer = self.server.standin.answer(self.command, self.path, headers, body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json;charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    standin: ECSStandIn


@contextlib.contextmanager
def serve(standin: ECSStandIn | None = None) -> Iterator[ECSStandIn]:
    """The stand-in on loopback (``standin.url``), in a thread, for the block's duration."""
    standin = standin or ECSStandIn()
    server = _Server(("127.0.0.1", free_port()), _Handler)
    server.standin = standin
    standin.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="ecs-standin", daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()


def sdk_call(url: str, action: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """One call through the official SDK's synchronous client (a test's own reads and writes), signed with
    the stand-in's key; the answer's body as the API spells it. Raises the SDK's exception."""
    import alibabacloud_ecs20140526.models as models
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi.utils_models import Config
    from darabonba.runtime import RuntimeOptions

    host = urllib.parse.urlsplit(url).netloc
    client = Client(
        Config(
            access_key_id=ACCESS_KEY,
            access_key_secret=SECRET_KEY,
            region_id=REGION,
            endpoint=host,
            protocol="http",
        )
    )
    snake = "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")
    request = getattr(models, f"{action}Request")().from_map(dict(params))
    response = getattr(client, f"{snake}_with_options")(request, RuntimeOptions(autoretry=False))
    return response.body.to_map()  # type: ignore[no-any-return]


def user_data_of(standin: ECSStandIn, instance_id: str) -> str:
    """The decoded user data, as cloud-init on the VM would read it."""
    return base64.b64decode(standin.user_data.get(instance_id, "")).decode()
