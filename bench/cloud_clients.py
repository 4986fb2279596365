"""Which EC2 client Provisioned mode uses: aiobotocore on the event loop, or boto3 in a thread pool.

Both talk to moto's EC2 server, run as its own process on loopback (so the server does not share this
process's GIL). Each client sends DescribeInstances, the call the lifecycle makes, in two shapes: one
instance by id (each Bound claim's VM once a minute) and every instance of the cluster (the orphan sweep,
``--instances`` of them). In the same run:

- **sequential**: one call at a time, median latency;
- **concurrent**: 16 calls in flight, calls per second;
- **event-loop lag** during the concurrent phase: how late a 5 ms ticker on the same loop fires (p99, max),
  which is what the extender's HTTP handlers for kube-scheduler would feel;
- **import**: a fresh interpreter importing the client and creating it.

- **parse**: botocore's parse of the answer, per instance: what aiobotocore runs on the loop in one step.

The floor is a bare aiohttp POST of the same DescribeInstances form (unsigned: moto does not check
signatures), on the same loop: the cheapest way to get the answer's bytes. Ratios are to the floor.

    python -m bench.cloud_clients [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from tests.harness.processes import free_port

REGION = "us-east-1"
KEYS = {"aws_access_key_id": "AKIDBENCH", "aws_secret_access_key": "bench-secret"}
IN_FLIGHT = 16


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto server did not start")


def seed(url: str, instances: int) -> str:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url, **KEYS)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "tensor-fusion.ai/cluster", "Value": "bench"}]}]
    made = ec2.run_instances(ImageId=image, MinCount=instances, MaxCount=instances, InstanceType="g5.xlarge",
                             TagSpecifications=tags)
    return str(made["Instances"][0]["InstanceId"])


def form_of(params: dict[str, Any]) -> str:
    """DescribeInstances's query form for the two shapes measured."""
    fields = [("Action", "DescribeInstances"), ("Version", "2016-11-15")]
    fields += [(f"InstanceId.{n}", i) for n, i in enumerate(params.get("InstanceIds", []), 1)]
    if "MaxResults" in params:
        fields.append(("MaxResults", str(params["MaxResults"])))
    return "&".join(f"{k}={v}" for k, v in fields)


async def lag_while(work: Awaitable[Any]) -> tuple[Any, list[float]]:
    """Run ``work`` while a 5 ms ticker measures how late the loop lets it fire (ms)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append((time.perf_counter() - start - 0.005) * 1000)

    tick = asyncio.create_task(ticker())
    try:
        result = await work
    finally:
        done.set()
        await tick
    return result, lags


async def measure(call: Callable[[], Awaitable[Any]], calls: int) -> dict[str, float]:
    await call()  # warm: connection, credentials, models
    sequential = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        sequential.append((time.perf_counter() - start) * 1000)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with gate:
            await call()

    start = time.perf_counter()
    _, lags = await lag_while(asyncio.gather(*(one() for _ in range(calls))))
    wall = time.perf_counter() - start
    lags.sort()
    return {"median_ms": statistics.median(sequential), "calls_per_s": calls / wall,
            "lag_p99_ms": lags[int(len(lags) * 0.99) - 1] if lags else 0.0,
            "lag_max_ms": lags[-1] if lags else 0.0}


def signed_request(url: str, params: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The bytes and headers botocore would send for DescribeInstances, signed once (moto does not check
    the signature's age), so the floor puts the same request on the wire without building it each time."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    body = form_of(params)
    request = AWSRequest(method="POST", url=url + "/", data=body,
                         headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    SigV4Auth(Credentials(KEYS["aws_access_key_id"], KEYS["aws_secret_access_key"]), "ec2", REGION).add_auth(
        request)
    return body.encode(), {k: str(v) for k, v in request.headers.items()}


async def run_floor(url: str, calls: int, params: dict[str, Any]) -> dict[str, float]:
    import aiohttp

    body, headers = signed_request(url, params)
    async with aiohttp.ClientSession() as session:
        async def call() -> None:
            async with session.post(url + "/", data=body, headers=headers) as answer:
                text = await answer.read()
                if answer.status != 200 or b"<reservationSet>" not in text:
                    raise RuntimeError(f"floor: HTTP {answer.status}: {text[:200]!r}")

        return await measure(call, calls)


async def run_aiobotocore(url: str, calls: int, params: dict[str, Any]) -> dict[str, float]:
    from aiobotocore.session import get_session

    async with get_session().create_client("ec2", region_name=REGION, endpoint_url=url, **KEYS) as ec2:
        async def call() -> None:
            await ec2.describe_instances(**params)

        return await measure(call, calls)


def parse_ms_per_instance(url: str, instances: int) -> float:
    """botocore's parse of a DescribeInstances answer (what aiobotocore runs on the loop), per instance.
    moto answers every instance in one page whatever MaxResults says, so the stall of one page of
    extender/cloud/aws.py's PAGE on EC2 is this times PAGE."""
    import urllib.request

    import botocore.parsers
    from botocore.session import get_session

    body, headers = signed_request(url, {"MaxResults": 1000})
    raw = urllib.request.urlopen(urllib.request.Request(url + "/", data=body, headers=headers)).read()
    shape = get_session().get_service_model("ec2").operation_model("DescribeInstances").output_shape
    parser = botocore.parsers.create_parser("ec2")
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        parser.parse({"body": raw, "headers": {}, "status_code": 200}, shape)
        best = min(best, time.perf_counter() - start)
    return best * 1000 / instances


async def run_boto3_thread(url: str, calls: int, params: dict[str, Any]) -> dict[str, float]:
    import boto3
    from botocore.config import Config

    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url,
                       config=Config(max_pool_connections=IN_FLIGHT), **KEYS)

    async def call() -> None:
        await asyncio.to_thread(ec2.describe_instances, **params)

    return await measure(call, calls)


def import_seconds(code: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        best = min(best, time.perf_counter() - start)
    return best


IMPORTS = {
    "aiohttp POST (floor)": "import aiohttp",
    "aiobotocore": "import asyncio; from aiobotocore.session import get_session\n"
                   "async def make():\n"
                   "    async with get_session().create_client('ec2', region_name='us-east-1', "
                   "aws_access_key_id='a', aws_secret_access_key='b'):\n        pass\n"
                   "asyncio.run(make())",
    "boto3 in a thread": "import boto3; boto3.client('ec2', region_name='us-east-1', aws_access_key_id='a', "
                         "aws_secret_access_key='b')",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cloud_clients")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--instances", type=int, default=40)
    args = parser.parse_args(argv)
    proc, url = start_moto()
    runners = (("aiohttp POST (floor)", run_floor), ("aiobotocore", run_aiobotocore),
               ("boto3 in a thread", run_boto3_thread))
    shapes: dict[str, tuple[dict[str, Any], int]] = {}
    try:
        first = seed(url, args.instances)
        shapes = {"one instance by id": ({"InstanceIds": [first]}, args.calls),
                  f"all {args.instances} instances": ({"MaxResults": 1000}, max(10, args.calls // 10))}
        rows = {(shape, name): asyncio.run(runner(url, calls, params))
                for shape, (params, calls) in shapes.items() for name, runner in runners}
        per_instance = parse_ms_per_instance(url, args.instances)
    finally:
        proc.kill()
        proc.wait()
    print(f"DescribeInstances against moto, {IN_FLIGHT} in flight in the concurrent phase\n")
    print("| shape | client | median ms (x floor) | calls/s in flight (x floor) | loop lag p99 / max ms |")
    print("|---|---|---|---|---|")
    for shape in shapes:
        floor = rows[(shape, "aiohttp POST (floor)")]
        for name, _ in runners:
            row = rows[(shape, name)]
            median = f"{row['median_ms']:.1f} ({row['median_ms'] / floor['median_ms']:.2f})"
            print(f"| {shape} | {name} | {median} | "
                  f"{row['calls_per_s']:.0f} ({row['calls_per_s'] / floor['calls_per_s']:.2f}) | "
                  f"{row['lag_p99_ms']:.1f} / {row['lag_max_ms']:.1f} |")
    from extender.cloud.aws import PAGE

    print(f"\nbotocore's parse on the loop: {per_instance:.2f} ms per instance; a page of {PAGE} (the "
          f"provider's MaxResults when listing) holds the loop {per_instance * PAGE:.0f} ms")
    print("\n| client | import and create, s |\n|---|---|")
    for name, code in IMPORTS.items():
        print(f"| {name} | {import_seconds(code):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
