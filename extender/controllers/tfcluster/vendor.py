"""``spec.computingVendor``: who launches a cluster's nodes, and whether this process can reach it.

One function per vendor type checks the connection and answers a ``Connection``; ``connection_check``
maps the type to it. ``karpenter`` lists Karpenter's NodeClaims (one item is enough). ``aws`` and
``alibaba`` are TensorFusion's Provisioned-mode providers: ``aws`` runs the provider's own connection
test (extender/cloud: a DescribeInstances with the configured credentials) and reports the cloud's message;
``alibaba`` is not supported yet and says so rather than failing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from extender.kube.client import error_message, error_status
from extender.kube.resources import NODECLAIMS, collection_path

CONDITION = "CloudVendorConnectionReady"  # TensorFusion: ConditionStatusTypeCloudVendorConnection


@dataclass(frozen=True)
class Connection:
    ok: bool
    reason: str  # CloudVendorConnectionOK, CloudVendorConnectionFailed, NotYetSupported, UnsupportedVendor
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


def _not_yet(vendor_type: str) -> Check:
    async def check(vendor: Mapping[str, Any], reader: Reader) -> Connection:
        return Connection(False, "NotYetSupported",
                          f"computingVendor.type {vendor_type}: Provisioned mode through {vendor_type} "
                          "is not yet supported by tensor-fusion-extender; use type karpenter")
    return check


async def check_cloud(vendor: Mapping[str, Any], reader: Reader) -> Connection:
    """A Provisioned-mode vendor: the computingVendor parsed, then the provider's connection test."""
    from extender.cloud.factory import make_provider
    from extender.cloud.provider import CloudError
    from extender.cloud.vendor import parse_vendor

    config = parse_vendor(vendor)
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


CHECKS: dict[str, Check] = {
    "karpenter": check_karpenter,
    "aws": check_cloud,
    "alibaba": _not_yet("alibaba"),
}


def connection_check(vendor_type: str) -> Check:
    """The check for a vendor type; an unknown type is answered with a condition, never an error."""
    found = CHECKS.get(vendor_type)
    if found is not None:
        return found

    async def unsupported(vendor: Mapping[str, Any], reader: Reader) -> Connection:
        return Connection(False, "UnsupportedVendor",
                          f"computingVendor.type {vendor_type!r}: not supported; supported: "
                          + ", ".join(sorted(CHECKS)))
    return unsupported
