"""What every cloud provider offers the Provisioned-mode lifecycle, and the errors it raises.

A provider is async and idempotent by claim name: ``create`` sends the claim's name as the cloud's client
token and first looks for an instance tagged with it, so a retry (or a restarted extender) never buys a
second VM for one GPUNodeClaim. ``terminate`` of an instance that no longer exists is done, not an error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.cloud.nodeclass import NodeClass, SelectorTerm

# The states in which an instance will never become (or stay) a node.
GONE_STATES = frozenset({"shutting-down", "terminated", "Stopping", "Stopped", "Deleted"})


@dataclass(frozen=True)
class LaunchRequest:
    """One VM for one GPUNodeClaim."""

    claim: str
    pool: str
    cluster: str
    instance_type: str
    capacity_type: str  # on-demand | spot | reserved
    zone: str  # "" when the offering leaves it open
    region: str
    node_class: NodeClass
    extra: Mapping[str, str] = field(default_factory=dict)  # GPUNodeClaim.spec.extraParams


@dataclass(frozen=True)
class Instance:
    id: str
    state: str
    claim: str = ""  # from its tag; "" when untagged
    zone: str = ""
    launched: dt.datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def gone(self) -> bool:
        return self.state in GONE_STATES


class CloudError(Exception):
    """An error the cloud answered, with its own code and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message


class CapacityUnavailable(CloudError):
    """The offering (type, capacity type, zone) cannot be had now: insufficient capacity, no spot, a
    quota. The lifecycle moves on to the next offering."""


class InvalidRequest(CloudError):
    """The request is wrong (an image, subnet or group that does not exist, a bad value): retrying the
    same GPUNodeClass will not help, so the pool's condition says so and nothing is launched."""


class AuthFailure(CloudError):
    """The credentials are missing, wrong or not allowed: no launches until they change."""


def subnet_of_zone(
    found: Sequence[Mapping[str, Any]],
    request: LaunchRequest,
    *,
    what: str,
    id_key: str,
    zone_key: str,
    missing_code: str,
) -> str:
    """The subnet (EC2) or vSwitch (ECS) a launch goes into, among those the class's
    ``subnetSelectorTerms`` found: one in the offering's zone, the one with the most free addresses (then
    by id). None found is an invalid class; none in the zone is a capacity error, so the next offering's
    zone is tried."""
    name = request.node_class.name
    if not found:
        raise InvalidRequest(missing_code, f"GPUNodeClass {name}: no {what} matches spec.subnetSelectorTerms")
    if request.zone:
        found = [s for s in found if s.get(zone_key) == request.zone]
        if not found:
            raise CapacityUnavailable(
                f"No{what[0].upper()}{what[1:]}InZone",
                f"GPUNodeClass {name}: no {what} of spec.subnetSelectorTerms is in zone {request.zone}",
            )
    best = max(found, key=lambda s: (int(s.get("AvailableIpAddressCount") or 0), str(s[id_key])))
    return str(best[id_key])


async def newest_image(
    request: LaunchRequest,
    lookup: Callable[[SelectorTerm], Awaitable[list[tuple[str, str]]]],
    missing_code: str,
) -> str:
    """The image of ``spec.osImageSelectorTerms``: the first term that finds any wins, and of what it finds
    (``lookup``: (creation time, id) pairs) the newest; none found makes the class invalid, naming the
    terms."""
    for term in request.node_class.images:
        found = await lookup(term)
        if found:
            return max(found)[1]
    raise InvalidRequest(
        missing_code,
        f"GPUNodeClass {request.node_class.name}: no image matches spec.osImageSelectorTerms "
        f"{[t.id or t.name or dict(t.tags) for t in request.node_class.images]}",
    )


async def security_groups(
    request: LaunchRequest, lookup: Callable[[SelectorTerm], Awaitable[list[str]]], missing_code: str
) -> list[str]:
    """The ids of ``spec.securityGroupSelectorTerms``: a term's id as it is, else the groups ``lookup`` finds
    by its name or tags; a term that finds none makes the class invalid."""
    ids: list[str] = []
    for term in request.node_class.security_groups:
        found = [term.id] if term.id else await lookup(term)
        if not found:
            raise InvalidRequest(
                missing_code,
                f"GPUNodeClass {request.node_class.name}: no security group "
                "matches spec.securityGroupSelectorTerms",
            )
        ids += found
    return sorted(set(ids))


async def resolve_terms(
    request: LaunchRequest,
    *,
    image: Callable[[LaunchRequest], Awaitable[str]],
    subnet: Callable[[LaunchRequest], Awaitable[str]],
    subnet_key: str,
    groups: Callable[[LaunchRequest], Awaitable[list[str]]],
) -> dict[str, Any]:
    """What a launch looks up before its create request: the image (unless a launch template gives it),
    the subnet or vSwitch (``subnet_key``) and the security groups, each only when the class names some."""
    node_class = request.node_class
    resolved: dict[str, Any] = {}
    if node_class.launch_template is None or node_class.images:
        resolved["ImageId"] = await image(request)
    if node_class.subnets:
        resolved[subnet_key] = await subnet(request)
    if node_class.security_groups:
        resolved["SecurityGroupIds"] = await groups(request)
    return resolved


class Provider(Protocol):
    vendor: str

    async def test_connection(self) -> None:
        """Raise ``CloudError`` when the API cannot be called with these credentials."""

    def request_of(self, request: LaunchRequest, resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The exact create request the cloud is sent (``resolved``: ids looked up by tag)."""

    async def resolve(self, request: LaunchRequest) -> dict[str, Any]:
        """Look up what the GPUNodeClass names by tag or name (image, subnet, security groups)."""

    async def create(self, request: LaunchRequest) -> Instance:
        """The claim's instance: the one tagged with its name, else a new one (client token = claim)."""

    async def find(self, claim: str) -> Instance | None:
        """The live instance tagged with the claim's name."""

    async def describe(self, instance_id: str) -> Instance | None:
        """None when the cloud no longer knows it."""

    async def list_managed(self, cluster: str) -> list[Instance]:
        """Every live instance tagged for this cluster (the orphan sweep's input)."""

    async def terminate(self, instance_id: str) -> None:
        """Terminate; an instance that does not exist is done."""

    async def close(self) -> None: ...
