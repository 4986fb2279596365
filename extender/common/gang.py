"""The gang contract (TensorFusion's keys): which pods form a gang, how many must run together, how long they
wait. Pure: the webhook stamps what it resolves here, the extender reads the stamps back.

A user opts in with ``tensor-fusion.ai/gang-enabled: "true"`` (or a WorkloadProfile with
``spec.gangScheduling``), optionally ``gang-min-members`` (an integer >= 2; absent or 0: every replica) and
``gang-timeout`` (a Go duration; absent, ``0`` or ``0s``: wait indefinitely). The webhook resolves the desired
size (``enabled-replicas``, then the profile's ``replicas``, then the owner's ``replicas``, ``parallelism`` or
``completions``) and stamps ``gang-desired-members``, ``gang-required-members`` (min-members when >= 2, else
desired) and ``gang-group-key`` (``<namespace>/<workload>``).

Kubernetes' own API is honoured too: a pod with ``spec.schedulingGroup.podGroupName`` belongs to that
``PodGroup`` (``scheduling.k8s.io/v1alpha2``), whose ``spec.schedulingPolicy.gang.minCount`` is the quorum.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.common.contract import ContractError
from extender.common.labels import key as _key
from extender.common.timefmt import parse_duration

GANG_ENABLED = _key("gang-enabled")
GANG_MIN_MEMBERS = _key("gang-min-members")
GANG_TIMEOUT = _key("gang-timeout")
GANG_DESIRED_MEMBERS = _key("gang-desired-members")
GANG_REQUIRED_MEMBERS = _key("gang-required-members")
GANG_GROUP_KEY = _key("gang-group-key")
ENABLED_REPLICAS = _key("enabled-replicas")
GANG_KEYS = (GANG_ENABLED, GANG_MIN_MEMBERS, GANG_TIMEOUT)
GANG_STAMPS = (GANG_DESIRED_MEMBERS, GANG_REQUIRED_MEMBERS, GANG_GROUP_KEY)

PROFILE_FIELD = "spec.gangScheduling"
NATIVE_GROUP_PREFIX = "podgroup:"  # group keys of native PodGroups: "<namespace>/podgroup:<name>"
MAX_MEMBERS = 10_000


@dataclass(frozen=True)
class GangSettings:
    """What the user asked for: ``min_members`` 0 means every desired replica; ``timeout`` None: forever."""

    min_members: int = 0
    timeout: dt.timedelta | None = None


@dataclass(frozen=True)
class Membership:
    """A pod's place in a gang, as the extender reads it."""

    group_key: str
    desired: int
    required: int
    timeout: dt.timedelta | None = None
    native: bool = False  # a PodGroup's member: ``required`` comes from the PodGroup


def parse_timeout(value: object, key: str = GANG_TIMEOUT) -> dt.timedelta | None:
    text = str(value).strip()
    if text in ("", "0", "0s"):
        return None
    try:
        timeout = parse_duration(text)
    except ValueError as exc:
        raise ContractError(key, value, "not a duration like 90s, 5m or 1h30m (0 or absent: wait forever)") \
            from exc
    return timeout if timeout > dt.timedelta(0) else None


def _count(value: object, key: str, source: str | None = None) -> int:
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError as exc:
        raise ContractError(key, value, "not an integer", source) from exc
    if number < 0 or number > MAX_MEMBERS:
        raise ContractError(key, value, f"must be between 0 and {MAX_MEMBERS}", source)
    return number


def gang_settings(annotations: Mapping[str, Any], profile_spec: Mapping[str, Any] | None = None,
                  profile_source: str | None = None) -> GangSettings | None:
    """The pod's gang settings (the profile's ``spec.gangScheduling``, overridden by the pod's annotations),
    None when the pod is not in a gang. ``ContractError`` names the key and value at fault."""
    profile = (profile_spec or {}).get("gangScheduling")
    enabled = str(annotations.get(GANG_ENABLED, "")).strip().lower()
    if enabled not in ("", "true", "false"):
        raise ContractError(GANG_ENABLED, annotations[GANG_ENABLED], 'must be "true" or "false"')
    if enabled == "false" or (enabled != "true" and not isinstance(profile, Mapping)):
        return None
    min_members, timeout = 0, None
    if isinstance(profile, Mapping):
        where = f"{PROFILE_FIELD} of {profile_source}" if profile_source else PROFILE_FIELD
        if profile.get("minMembers") is not None:
            min_members = _count(profile["minMembers"], GANG_MIN_MEMBERS, where)
        if profile.get("timeout") is not None:
            timeout = parse_timeout(profile["timeout"])
    if str(annotations.get(GANG_MIN_MEMBERS, "")).strip():
        min_members = _count(annotations[GANG_MIN_MEMBERS], GANG_MIN_MEMBERS)
    if GANG_TIMEOUT in annotations:
        timeout = parse_timeout(annotations[GANG_TIMEOUT])
    if min_members == 1:
        raise ContractError(GANG_MIN_MEMBERS, annotations.get(GANG_MIN_MEMBERS, 1),
                            "a gang needs at least 2 members (0 or absent: every replica)")
    return GangSettings(min_members, timeout)


def desired_members(annotations: Mapping[str, Any], profile_spec: Mapping[str, Any] | None,
                    owner: Mapping[str, Any] | None) -> int | None:
    """The workload's replica count: ``enabled-replicas``, then the profile's ``replicas``, then the owner's
    ``spec.replicas``, ``parallelism`` or ``completions``; None when none is known."""
    raw = annotations.get(ENABLED_REPLICAS)
    if raw is not None and str(raw).strip():
        return _count(raw, ENABLED_REPLICAS)
    replicas = (profile_spec or {}).get("replicas")
    if isinstance(replicas, int) and not isinstance(replicas, bool):
        return max(replicas, 0)
    spec = (owner or {}).get("spec") or {}
    for field in ("replicas", "parallelism", "completions"):
        value = spec.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value, 0)
    return None


def stamps(settings: GangSettings, desired: int | None, group_key: str) -> dict[str, str]:
    """The annotations the webhook stamps, or ``ContractError`` for a gang that cannot be scheduled."""
    minimum = settings.min_members
    if desired is None and minimum >= 2:
        desired = minimum  # size unknown but the user named the quorum: gang semantics on that
    if desired is None:
        raise ContractError(GANG_ENABLED, "true", f"cannot tell the gang's size: set {GANG_MIN_MEMBERS}, "
                            f"{ENABLED_REPLICAS} or replicas on the workload (Deployment, Job, profile)")
    if desired < 2:
        raise ContractError(GANG_ENABLED, "true",
                            f"a gang needs at least 2 replicas; the workload has {desired}")
    if minimum > desired:
        raise ContractError(GANG_MIN_MEMBERS, minimum, f"exceeds the workload's {desired} replicas")
    required = minimum if minimum >= 2 else desired
    out = {GANG_DESIRED_MEMBERS: str(desired), GANG_REQUIRED_MEMBERS: str(required),
           GANG_GROUP_KEY: group_key}
    if settings.timeout is not None:
        out[GANG_TIMEOUT] = format_timeout(settings.timeout)
    return out


def format_timeout(timeout: dt.timedelta) -> str:
    seconds = timeout.total_seconds()
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{seconds}s"


def scheduling_group(pod: Mapping[str, Any]) -> str | None:
    """The name of the native ``PodGroup`` the pod joins (``spec.schedulingGroup.podGroupName``)."""
    group = (pod.get("spec") or {}).get("schedulingGroup")
    name = group.get("podGroupName") if isinstance(group, Mapping) else None
    return str(name) if name else None


def pod_group_min_count(pod_group: Mapping[str, Any]) -> int | None:
    """A ``PodGroup``'s gang quorum (``spec.schedulingPolicy.gang.minCount``); None: no gang policy."""
    gang = (((pod_group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang"))
    if not isinstance(gang, Mapping):
        return None
    count = gang.get("minCount")
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 1 else None


def native_group_key(namespace: str, name: str) -> str:
    return f"{namespace}/{NATIVE_GROUP_PREFIX}{name}"


def membership(pod: Mapping[str, Any]) -> Membership | None:
    """The pod's gang as stamped by the webhook, or its native PodGroup (``required`` 0 until the PodGroup is
    read); None for a pod in no gang or with stamps that do not read (the webhook never writes those)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    group = scheduling_group(pod)
    if group is not None:
        return Membership(native_group_key(str(metadata.get("namespace") or "default"), group), 0, 0,
                          None, native=True)
    key = annotations.get(GANG_GROUP_KEY)
    if not key:
        return None
    try:
        desired = _count(annotations.get(GANG_DESIRED_MEMBERS, ""), GANG_DESIRED_MEMBERS)
        required = _count(annotations.get(GANG_REQUIRED_MEMBERS, ""), GANG_REQUIRED_MEMBERS)
        timeout = parse_timeout(annotations.get(GANG_TIMEOUT, ""))
    except ContractError:
        return None
    if required < 2:
        return None
    return Membership(str(key), max(desired, required), required, timeout)
