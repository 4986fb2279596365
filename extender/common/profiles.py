"""A WorkloadProfile's ``spec`` as the pod annotations it provides defaults for (the webhook overlays the
pod's own annotations on them). Total: a field of the wrong type is a ``ProfileError`` naming the field and
the value, which the webhook turns into a denial naming the profile."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.common.contract import (
    AUTOSCALE,
    AUTOSCALE_TARGET,
    GPU_COUNT,
    GPU_INDICES,
    GPU_MODEL,
    GPU_POOL,
    ISOLATION,
    PERCENT_LIMIT,
    PERCENT_REQUEST,
    QOS,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VENDOR,
    VRAM_LIMIT,
    VRAM_REQUEST,
)
from extender.common.numbers import shown


def profile_annotations(spec: Mapping[str, Any]) -> dict[str, str]:
    """Translate a WorkloadProfile ``spec`` into the annotation keys it provides defaults for.
    A field of the wrong type is a ``ProfileError`` naming the profile's field and value (the webhook denies
    the pod that names the profile with it), never another exception."""
    out: dict[str, str] = {}
    if not isinstance(spec, Mapping):
        raise ProfileError(f"spec={shown(spec)}: expected an object")
    resources = _profile_map(spec, "resources", "spec.resources")
    for section, fields in (("requests", (TFLOPS_REQUEST, VRAM_REQUEST, PERCENT_REQUEST)),
                            ("limits", (TFLOPS_LIMIT, VRAM_LIMIT, PERCENT_LIMIT))):
        amounts = _profile_map(resources, section, f"spec.resources.{section}")
        for name, key in zip(("tflops", "vram", "compute"), fields, strict=True):
            if amounts.get(name) is not None:
                out[key] = _profile_scalar(amounts[name], f"spec.resources.{section}.{name}")
    scalar_fields = {
        "gpuCount": GPU_COUNT, "gpuModel": GPU_MODEL, "vendor": VENDOR, "isolation": ISOLATION,
        "qos": QOS, "poolName": GPU_POOL,
    }
    for name, key in scalar_fields.items():
        if spec.get(name) not in (None, ""):
            out[key] = _profile_scalar(spec[name], f"spec.{name}")
    indices = spec.get("gpuIndices")
    if indices:
        if not isinstance(indices, list):
            raise ProfileError(f"spec.gpuIndices={shown(indices)}: expected a list")
        out[GPU_INDICES] = ",".join(_profile_scalar(i, "spec.gpuIndices[]") for i in indices)
    auto = _profile_map(_profile_map(spec, "autoScalingConfig", "spec.autoScalingConfig"), "autoSetResources",
                        "spec.autoScalingConfig.autoSetResources")
    if auto.get("enable") is not None:
        if not isinstance(auto["enable"], bool):
            raise ProfileError(f"spec.autoScalingConfig.autoSetResources.enable={shown(auto['enable'])}: "
                               "expected true or false")
        out[AUTOSCALE] = "true" if auto["enable"] else "false"
        if auto.get("targetResource") not in (None, ""):
            out[AUTOSCALE_TARGET] = _profile_scalar(auto["targetResource"],
                                                    "spec.autoScalingConfig.autoSetResources.targetResource")
    return out


class ProfileError(ValueError):
    """A WorkloadProfile field of the wrong type; the message names the field and the value."""



def _profile_map(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    raw = parent.get(key)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{path}={shown(raw)}: expected an object")
    return raw


def _profile_scalar(raw: object, path: str) -> str:
    """A profile value as the annotation text it stands for: a string, a number or a boolean (YAML's)."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, str) or (isinstance(raw, int | float) and raw == raw and abs(raw) != float("inf")):
        return str(raw)
    raise ProfileError(f"{path}={shown(raw)}: expected a string or a number")
