"""A cloud to launch VMs on: moto's EC2 emulator in server mode on loopback, a proxy in front of it that
answers chosen RunInstances with a capacity error (or holds them), and the EC2 world a GPUNodeClass selects
from (a VPC, subnets in two zones, a security group and an image, each tagged); and what the Provisioned-mode
modules on EC2 share: ``CloudInit`` over moto, a ``computingVendor`` file, a GPUNodeClass, instance reads.

moto is a real emulator of the EC2 Query API (requests signed, answered in EC2's XML), not a mock of our
client: the extender's aiobotocore client talks HTTP to it as it would to AWS.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .objects import TF_GROUP, TF_VERSION
from .processes import free_port
from .provisioned import Booting, CloudInit, GPUs

REGION = "us-east-1"
ZONES = ("us-east-1a", "us-east-1b")
ACCESS_KEY, SECRET_KEY = "AKIDTESTTESTTEST", "test-secret-key"
IMAGE_NAME = "tf-gpu-node-2026.12"


@dataclass
class EC2World:
    vpc: str
    subnets: dict[str, str]  # zone -> subnet id
    security_group: str
    image: str
    extra: dict[str, Any] = field(default_factory=dict)


def boto_client(endpoint: str) -> Any:
    """A synchronous botocore EC2 client for the test's own reads and seeding."""
    from botocore.session import get_session

    return get_session().create_client(
        "ec2",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )


INSTANCE_PROFILE = "tf-gpu-node"


def seed(endpoint: str) -> EC2World:
    from botocore.session import get_session

    iam = get_session().create_client(
        "iam",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    iam.create_instance_profile(InstanceProfileName=INSTANCE_PROFILE)
    ec2 = boto_client(endpoint)
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnets = {}
    for i, zone in enumerate(ZONES):
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.40.{i}.0/24", AvailabilityZone=zone)["Subnet"]
        ec2.create_tags(Resources=[subnet["SubnetId"]], Tags=[{"Key": "tf-e2e/role", "Value": "gpu"}])
        subnets[zone] = subnet["SubnetId"]
    group = ec2.create_security_group(GroupName="tf-gpu-nodes", Description="GPU nodes", VpcId=vpc)["GroupId"]
    ec2.create_tags(Resources=[group], Tags=[{"Key": "tf-e2e/role", "Value": "gpu"}])
    base = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    runner = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1, InstanceType="t3.micro")["Instances"][0]
    image = ec2.create_image(InstanceId=runner["InstanceId"], Name=IMAGE_NAME)["ImageId"]
    ec2.create_tags(Resources=[image], Tags=[{"Key": "tf-e2e/role", "Value": "gpu"}])
    ec2.terminate_instances(InstanceIds=[runner["InstanceId"]])
    return EC2World(vpc, subnets, group, image)


class MotoServer:
    """moto's ThreadedMotoServer on a free loopback port, reset on demand."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoServer:
        """Start, empty: moto's backends are this process's globals, so a module that ran an emulator
        before in the same worker would otherwise leave its VPCs, images and instance profile behind."""
        self._server.start()
        self.reset()
        return self

    def stop(self) -> None:
        self._server.stop()

    def reset(self) -> None:
        urllib.request.urlopen(
            urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10
        )


CAPACITY_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}'
    "</Message></Error></Errors><RequestID>tf-e2e-capacity-proxy</RequestID></Response>"
)


class CapacityProxy:
    """Forwards every request to moto, except a RunInstances for an instance type (optionally in a zone) in
    ``refuse``, which it answers as EC2 does when it has no capacity: HTTP 500 with
    ``InsufficientInstanceCapacity``. ``refused`` counts what it answered so.

    ``hold_after(n)``: the RunInstances calls after the next ``n`` wait in the proxy (``holding`` counts
    them) until ``release()``, then go on to moto, whether or not their client is still there: a call in
    flight when its caller died, that the cloud still carries out."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.refuse: set[tuple[str, str]] = set()  # (instance type, zone or "")
        self.refused: list[tuple[str, str]] = []
        self.launches = 0  # RunInstances calls forwarded or held
        self.holding = 0
        self._hold_from: int | None = None
        self._released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                form = urllib.parse.parse_qs(body.decode(errors="replace"))
                if form.get("Action") == ["RunInstances"]:
                    kind = (form.get("InstanceType") or [""])[0]
                    zone = (form.get("Placement.AvailabilityZone") or [""])[0]
                    if (kind, zone) in proxy.refuse or (kind, "") in proxy.refuse:
                        proxy.refused.append((kind, zone))
                        message = f"We currently do not have sufficient {kind} capacity in zone {zone}."
                        self._answer(
                            500,
                            CAPACITY_ERROR.format(
                                code="InsufficientInstanceCapacity", message=message
                            ).encode(),
                            "text/xml",
                        )
                        return
                    proxy.launches += 1
                    if proxy._hold_from is not None and proxy.launches > proxy._hold_from:
                        proxy.holding += 1
                        proxy._released.wait(120)
                self._forward("POST", body)

            def do_GET(self) -> None:
                self._forward("GET", None)

            def _forward(self, method: str, body: bytes | None) -> None:
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, method=method, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        self._answer(answer.status, answer.read(), answer.headers.get("Content-Type", ""))
                except urllib.error.HTTPError as exc:
                    self._answer(exc.code, exc.read(), exc.headers.get("Content-Type", ""))

            def _answer(self, status: int, payload: bytes, content_type: str) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a caller killed meanwhile
                    self.send_response(status)
                    if content_type:
                        self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

        self.port = free_port()
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold_after(self, launches: int) -> None:
        self._released.clear()
        self.holding = 0  # counts this hold's calls (a module's tests share the proxy)
        self._hold_from = self.launches + launches

    def release(self) -> None:
        self._hold_from = None
        self._released.set()

    def start(self) -> CapacityProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._httpd.shutdown()
        self._httpd.server_close()


@contextlib.contextmanager
def ec2_cloud() -> Iterator[tuple[MotoServer, CapacityProxy]]:
    moto = MotoServer().start()
    proxy = CapacityProxy(moto.url).start()
    try:
        yield moto, proxy
    finally:
        proxy.stop()
        moto.stop()


# --- what the Provisioned-mode modules on EC2 share ----------------------------------------------------

CLUSTER_TAG = "tensor-fusion.ai/cluster"
CLAIM_TAG = "tensor-fusion.ai/node-name"
# What GPU Feature Discovery would label a node of these instance types with.
GFD = {"g5.xlarge": GPUs("A10G", 1, 24576), "g6.xlarge": GPUs("L4", 1, 24576)}
USER_DATA = (
    "#!/bin/bash\n/etc/eks/bootstrap.sh e2e --kubelet-extra-args "
    "'--node-labels=tensor-fusion.ai/node-provisioner=__GPU_NODE_RESOURCE_NAME__,team=ml'\n"
)


def ec2_cloud_init(api_client: Any, endpoint: str, cluster: str) -> CloudInit:
    """CloudInit over moto: the running instances tagged for ``cluster``, their user data by
    DescribeInstanceAttribute, Nodes named as EKS names them."""
    ec2 = boto_client(endpoint)

    def running() -> list[Booting]:
        pages = ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]},
                {"Name": "instance-state-name", "Values": ["running"]},
            ]
        )
        return [
            Booting(i["InstanceId"], i["InstanceType"], i["Placement"]["AvailabilityZone"])
            for r in pages["Reservations"]
            for i in r["Instances"]
        ]

    def user_data(instance_id: str) -> str:
        raw = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode((raw.get("UserData") or {}).get("Value") or "").decode()

    return CloudInit(
        api_client,
        running=running,
        user_data=user_data,
        gpus=GFD,
        node_name=lambda iid: f"ip-{iid[2:14]}",
        provider_id=lambda iid, zone: f"aws:///{zone}/{iid}",
    )


def vendor_file(endpoint: str, folder: Path) -> Path:
    """A ``computingVendor`` file for the emulator at ``endpoint``, its keys in files beside it."""
    (folder / "ak").write_text(ACCESS_KEY)
    (folder / "sk").write_text(SECRET_KEY)
    path = folder / "computing-vendor.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "type": "aws",
                "authType": "accessKey",
                "params": {
                    "defaultRegion": REGION,
                    "accessKeyPath": str(folder / "ak"),
                    "secretKeyPath": str(folder / "sk"),
                    "extraParams": {"endpoint": endpoint},
                },
            }
        )
    )
    return path


def node_class_body(name: str, world: EC2World, **spec: Any) -> dict[str, Any]:
    """A GPUNodeClass selecting the seeded world, with ``spec`` overriding its fields."""
    base = {
        "osImageSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "subnetSelectorTerms": [{"tags": {"tf-e2e/role": "gpu"}}],
        "securityGroupSelectorTerms": [{"id": world.security_group}],
        "instanceProfile": INSTANCE_PROFILE,
        "tags": {"team": "ml"},
        "userData": USER_DATA,
    }
    base.update(spec)
    return {
        "apiVersion": f"{TF_GROUP}/{TF_VERSION}",
        "kind": "GPUNodeClass",
        "metadata": {"name": name},
        "spec": base,
    }


def instances(endpoint: str, **tags: str) -> list[dict[str, Any]]:
    """The instances carrying these tags, in any state."""
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
    answer = boto_client(endpoint).describe_instances(Filters=filters)
    return [i for r in answer["Reservations"] for i in r["Instances"]]


def live(endpoint: str, **tags: str) -> list[dict[str, Any]]:
    """The instances carrying these tags that are pending or running."""
    return [i for i in instances(endpoint, **tags) if i["State"]["Name"] in ("pending", "running")]
