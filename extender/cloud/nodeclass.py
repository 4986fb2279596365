"""A GPUNodeClass (TensorFusion's schema, cluster scoped) read once: what a Provisioned pool's VMs are made
of. Problems are collected with the field at fault, never raised, so a bad class gives a condition and no
VM. Fields this reader does not know are left alone on the object (the CRD keeps them)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.common.fields import as_object, get_list, get_map, get_str, get_string_map
from extender.common.numbers import parse_int, shown

# Replaced by the GPUNodeClaim's name in spec.userData (TensorFusion: ProvisionerNamePlaceholder); the user
# data must set the Node label tensor-fusion.ai/node-provisioner to it so the Node joins its claim.
CLAIM_PLACEHOLDER = "__GPU_NODE_RESOURCE_NAME__"


@dataclass(frozen=True)
class SelectorTerm:
    id: str = ""
    name: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockDevice:
    device_name: str
    volume_size: str = ""  # "100Gi", "100G" or "100": GiB
    volume_type: str = ""
    delete_on_termination: bool = True
    encrypted: bool = True


@dataclass(frozen=True)
class MetadataOptions:
    http_endpoint: bool = True
    http_protocol_ipv6: bool = False
    http_put_response_hop_limit: int = 1
    http_tokens: str = "required"


@dataclass(frozen=True)
class NodeClass:
    name: str
    launch_template: SelectorTerm | None = None
    os_image_type: str = "Private"
    images: tuple[SelectorTerm, ...] = ()
    instance_profile: str = ""
    metadata_options: MetadataOptions | None = None
    security_groups: tuple[SelectorTerm, ...] = ()
    subnets: tuple[SelectorTerm, ...] = ()
    block_devices: tuple[BlockDevice, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    user_data: str = ""
    problems: tuple[str, ...] = ()

    def user_data_for(self, claim: str) -> str:
        return self.user_data.replace(CLAIM_PLACEHOLDER, claim)

    def user_data_digest(self, claim: str) -> str:
        return "sha256:" + hashlib.sha256(self.user_data_for(claim).encode()).hexdigest()


def _strings(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _terms(raw: Any, where: str, problems: list[str]) -> tuple[SelectorTerm, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        problems.append(f"{where}: expected a list of selector terms")
        return ()
    out = []
    for i, item in enumerate(raw):
        term = (
            SelectorTerm(
                get_str(item, "id", f"{where}[{i}].id", problems),
                get_str(item, "name", f"{where}[{i}].name", problems),
                get_string_map(item, "tags", f"{where}[{i}].tags", problems),
            )
            if isinstance(item, Mapping)
            else None
        )
        if term is None or not (term.id or term.name or term.tags):
            problems.append(f"{where}[{i}]: needs an id, a name or tags")
            continue
        out.append(term)
    return tuple(out)


def volume_gib(size: str) -> int:
    """``100Gi``/``100G``/``100`` -> 100; ValueError otherwise."""
    text = size.strip()
    for suffix in ("Gi", "G"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    return parse_int(text, minimum=1)


def _bool(parent: Mapping[str, Any], key: str, default: bool, where: str, problems: list[str]) -> bool:
    raw = parent.get(key)
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    problems.append(f"{where}.{key}={shown(raw)}: expected true or false")
    return default


def parse_node_class(obj: Mapping[str, Any]) -> NodeClass:
    problems: list[str] = []
    meta = get_map(as_object(obj), "metadata", "metadata", problems)
    name = get_str(meta, "name", "metadata.name", problems)
    spec = get_map(as_object(obj), "spec", "spec", problems)
    template = None
    raw_template = get_map(spec, "launchTemplate", "spec.launchTemplate", problems)
    if raw_template.get("id") or raw_template.get("name"):
        template = SelectorTerm(get_str(raw_template, "id", "spec.launchTemplate.id", problems),
                                get_str(raw_template, "name", "spec.launchTemplate.name", problems))
    images = _terms(spec.get("osImageSelectorTerms"), "spec.osImageSelectorTerms", problems)
    if not images and template is None and not any("osImageSelectorTerms" in p for p in problems):
        problems.append(
            "spec.osImageSelectorTerms: needs at least one image (id, name or tags) "
            "unless spec.launchTemplate names one"
        )
    metadata = None
    raw_md = get_map(spec, "metadataOptions", "spec.metadataOptions", problems)
    if raw_md:
        hop = raw_md.get("httpPutResponseHopLimit", 1)
        try:
            hop_limit = parse_int(hop, minimum=1, maximum=64)
        except ValueError:
            problems.append(f"spec.metadataOptions.httpPutResponseHopLimit={shown(hop)}: expected 1 to 64")
            hop_limit = 1
        tokens = raw_md.get("httpTokens")
        tokens = "required" if tokens is None or tokens == "" else tokens
        if tokens not in ("required", "optional"):
            problems.append(f"spec.metadataOptions.httpTokens={shown(tokens)}: expected required or optional")
            tokens = "required"
        metadata = MetadataOptions(
            _bool(raw_md, "httpEndpoint", True, "spec.metadataOptions", problems),
            _bool(raw_md, "httpProtocolIPv6", False, "spec.metadataOptions", problems),
            hop_limit,
            tokens,
        )
    devices = []
    for i, item in enumerate(get_list(spec, "blockDeviceMappings", "spec.blockDeviceMappings", problems)):
        if not isinstance(item, Mapping) or not isinstance(item.get("deviceName"), str) \
                or not item["deviceName"]:
            problems.append(f"spec.blockDeviceMappings[{i}].deviceName="
                            f"{shown(item.get('deviceName') if isinstance(item, Mapping) else item)}: "
                            "required, a device name")
            continue
        ebs = get_map(item, "ebs", f"spec.blockDeviceMappings[{i}].ebs", problems)
        raw_size = ebs.get("volumeSize")
        size = str(raw_size) if isinstance(raw_size, str | int) and not isinstance(raw_size, bool) else ""
        if raw_size not in (None, "") and not size:
            problems.append(f"spec.blockDeviceMappings[{i}].ebs.volumeSize={shown(raw_size)}: expected a "
                            "size in GiB such as 100Gi")
        if size:
            try:
                volume_gib(size)
            except ValueError:
                problems.append(
                    f"spec.blockDeviceMappings[{i}].ebs.volumeSize={shown(size)}: expected a size "
                    "in GiB such as 100Gi"
                )
        devices.append(
            BlockDevice(
                str(item["deviceName"]),
                size,
                get_str(ebs, "volumeType", f"spec.blockDeviceMappings[{i}].ebs.volumeType", problems),
                _bool(ebs, "deleteOnTermination", True, f"spec.blockDeviceMappings[{i}].ebs", problems),
                _bool(ebs, "encrypted", True, f"spec.blockDeviceMappings[{i}].ebs", problems),
            )
        )
    return NodeClass(
        name=name,
        launch_template=template,
        os_image_type=get_str(spec, "osImageType", "spec.osImageType", problems, "Private"),
        images=images,
        instance_profile=get_str(spec, "instanceProfile", "spec.instanceProfile", problems),
        metadata_options=metadata,
        security_groups=_terms(
            spec.get("securityGroupSelectorTerms"), "spec.securityGroupSelectorTerms", problems
        ),
        subnets=_terms(spec.get("subnetSelectorTerms"), "spec.subnetSelectorTerms", problems),
        block_devices=tuple(devices),
        tags=get_string_map(spec, "tags", "spec.tags", problems),
        user_data=get_str(spec, "userData", "spec.userData", problems),
        problems=tuple(problems),
    )
