"""A GPUNodeClass (TensorFusion's schema, cluster scoped) read once: what a Provisioned pool's VMs are made
of. Problems are collected with the field at fault, never raised, so a bad class gives a condition and no
VM. Fields this reader does not know are left alone on the object (the CRD keeps them)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
                str((item or {}).get("id") or ""),
                str((item or {}).get("name") or ""),
                _strings((item or {}).get("tags")),
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
    value = int(text)
    if value <= 0:
        raise ValueError(size)
    return value


def _bool(raw: Any, default: bool) -> bool:
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    return str(raw).strip().lower() == "true"


def parse_node_class(obj: Mapping[str, Any]) -> NodeClass:
    name = str((obj.get("metadata") or {}).get("name") or "")
    spec = obj.get("spec") or {}
    problems: list[str] = []
    template = None
    raw_template = spec.get("launchTemplate")
    if isinstance(raw_template, Mapping) and (raw_template.get("id") or raw_template.get("name")):
        template = SelectorTerm(str(raw_template.get("id") or ""), str(raw_template.get("name") or ""))
    images = _terms(spec.get("osImageSelectorTerms"), "spec.osImageSelectorTerms", problems)
    if not images and template is None and not any("osImageSelectorTerms" in p for p in problems):
        problems.append(
            "spec.osImageSelectorTerms: needs at least one image (id, name or tags) "
            "unless spec.launchTemplate names one"
        )
    metadata = None
    raw_md = spec.get("metadataOptions")
    if isinstance(raw_md, Mapping):
        hop = raw_md.get("httpPutResponseHopLimit", 1)
        try:
            hop_limit = int(hop)
            if not 1 <= hop_limit <= 64:
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"spec.metadataOptions.httpPutResponseHopLimit={hop!r}: expected 1 to 64")
            hop_limit = 1
        tokens = str(raw_md.get("httpTokens") or "required")
        if tokens not in ("required", "optional"):
            problems.append(f"spec.metadataOptions.httpTokens={tokens!r}: expected required or optional")
        metadata = MetadataOptions(
            _bool(raw_md.get("httpEndpoint"), True),
            _bool(raw_md.get("httpProtocolIPv6"), False),
            hop_limit,
            tokens,
        )
    devices = []
    for i, item in enumerate(spec.get("blockDeviceMappings") or []):
        if not isinstance(item, Mapping) or not item.get("deviceName"):
            problems.append(f"spec.blockDeviceMappings[{i}].deviceName: required")
            continue
        ebs = item.get("ebs") or {}
        size = str(ebs.get("volumeSize") or "")
        if size:
            try:
                volume_gib(size)
            except ValueError:
                problems.append(
                    f"spec.blockDeviceMappings[{i}].ebs.volumeSize={size!r}: expected a size "
                    "in GiB such as 100Gi"
                )
        devices.append(
            BlockDevice(
                str(item["deviceName"]),
                size,
                str(ebs.get("volumeType") or ""),
                _bool(ebs.get("deleteOnTermination"), True),
                _bool(ebs.get("encrypted"), True),
            )
        )
    return NodeClass(
        name=name,
        launch_template=template,
        os_image_type=str(spec.get("osImageType") or "Private"),
        images=images,
        instance_profile=str(spec.get("instanceProfile") or ""),
        metadata_options=metadata,
        security_groups=_terms(
            spec.get("securityGroupSelectorTerms"), "spec.securityGroupSelectorTerms", problems
        ),
        subnets=_terms(spec.get("subnetSelectorTerms"), "spec.subnetSelectorTerms", problems),
        block_devices=tuple(devices),
        tags=_strings(spec.get("tags")),
        user_data=str(spec.get("userData") or ""),
        problems=tuple(problems),
    )
