"""``spec.computingVendor``: who launches a cluster's nodes, and whether this process can reach it.

One function per vendor type checks the connection and answers a ``Connection``; ``connection_check``
maps the type to it. ``karpenter`` lists Karpenter's NodeClaims (one item is enough). ``aws`` and
``alibaba`` are TensorFusion's Provisioned-mode providers: each runs the provider's own connection test
(extender/cloud: EC2's DescribeInstances, ECS's DescribeRegions, with the configured credentials) and
reports the cloud's message.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from extender.kube.client import error_message, error_status
from extender.kube.resources import NODECLAIMS, collection_path

if TYPE_CHECKING:
    from extender.cloud.vendor import Endpoint

CONDITION = "CloudVendorConnectionReady"  # TensorFusion: ConditionStatusTypeCloudVendorConnection


@dataclass(frozen=True)
class Connection:
    ok: bool
    reason: str  # CloudVendorConnectionOK, CloudVendorConnectionFailed, UnsupportedVendor
    message: str

    def condition(self) -> dict[str, Any]:
        return {"type": CONDITION, "status": "True" if self.ok else "False", "reason": self.reason,
                "message": self.message}


class Reader(Protocol):
    async def list_one(self, path: str) -> Any:
        """GET ``path`` with ``limit=1``; raises the API error."""
        ...


Check = Callable[[Mapping[str, Any], Reader], Awaitable[Connection]]


async def check_karpenter(vendor: Mapping[str, Any], reader: Reader) -> Connection:
    path = collection_path(NODECLAIMS)
    try:
        await reader.list_one(path)
    except Exception as exc:
        status = error_status(exc)
        if status == 404:
            message = ("computingVendor.type karpenter: Karpenter's NodeClaim API "
                       f"({NODECLAIMS.api_version}) is not served; install Karpenter")
        elif status in (401, 403):
            message = (f"computingVendor.type karpenter: may not list NodeClaims ({error_message(exc)}); "
                       "grant the extender's ServiceAccount list on nodeclaims.karpenter.sh")
        else:
            message = f"computingVendor.type karpenter: listing NodeClaims failed: {error_message(exc)}"
        return Connection(False, "CloudVendorConnectionFailed", message)
    return Connection(True, "CloudVendorConnectionOK", "Karpenter's NodeClaims can be listed")


async def check_cloud(vendor: Mapping[str, Any], reader: Reader, key_dir: str = "",
                      endpoints: Sequence[Endpoint] = ()) -> Connection:
    """A Provisioned-mode vendor: the computingVendor parsed (its key files only under ``key_dir``), then
    the provider's connection test."""
    from extender.cloud.factory import make_provider
    from extender.cloud.provider import CloudError
    from extender.cloud.vendor import confined, parse_vendor

    config = confined(parse_vendor(vendor), key_dir, "spec.computingVendor", endpoints)
    if config.problems:
        return Connection(False, "CloudVendorConnectionFailed", "; ".join(config.problems))
    try:
        provider = make_provider(config)
    except CloudError as exc:
        return Connection(False, "CloudVendorConnectionFailed", f"computingVendor.type {config.type}: {exc}")
    try:
        await provider.test_connection()
    except CloudError as exc:
        return Connection(False, "CloudVendorConnectionFailed", f"computingVendor.type {config.type}: {exc}")
    finally:
        await provider.close()
    return Connection(True, "CloudVendorConnectionOK",
                      f"computingVendor.type {config.type}: the compute API of {config.region} answered")


def key_files_stamp(vendor: Mapping[str, Any]) -> list[str]:
    """(path, mtime, size) of ``params.accessKeyPath`` / ``secretKeyPath``: what changes when the mounted
    Secret is rotated (kubelet swaps the files)."""
    params = vendor.get("params")
    out: list[str] = []
    for key in ("accessKeyPath", "secretKeyPath"):
        path = str(params.get(key) or "") if isinstance(params, Mapping) else ""
        if path:
            try:
                st = os.stat(path)
                out.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
            except OSError as exc:
                out.append(f"{path}:{exc.errno}")
    return out


CHECKS: dict[str, Check] = {
    "karpenter": check_karpenter,
    "aws": check_cloud,
    "alibaba": check_cloud,
}


def connection_check(vendor_type: str, key_dir: str = "", endpoints: Sequence[Endpoint] = ()) -> Check:
    """The check for a vendor type; an unknown type is answered with a condition, never an error. A cloud
    vendor's key files are read only under ``key_dir`` (the serve flag --cloud-key-dir), its endpoint only
    one of ``endpoints`` (--cloud-endpoint-allow)."""
    found = CHECKS.get(vendor_type)
    if found is check_cloud:
        return functools.partial(check_cloud, key_dir=key_dir, endpoints=endpoints)
    if found is not None:
        return found

    async def unsupported(vendor: Mapping[str, Any], reader: Reader) -> Connection:
        return Connection(False, "UnsupportedVendor",
                          f"computingVendor.type {vendor_type!r}: not supported; supported: "
                          + ", ".join(sorted(CHECKS)))
    return unsupported
