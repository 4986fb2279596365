"""The cloud vendor checks of a TensorFusionCluster: Karpenter's NodeClaims listable, a cloud's required
parameters, key files only under the key directory."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.client import ApiException

from extender.controllers.tfcluster import vendor


class _Reader:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.paths: list[str] = []

    async def list_one(self, path: str) -> Any:
        self.paths.append(path)
        if self.error is not None:
            raise self.error
        return {"items": []}


@pytest.mark.parametrize(
    ("vendor_type", "error", "ok", "reason", "message"),
    [
        ("karpenter", None, True, "CloudVendorConnectionOK", "can be listed"),
        ("karpenter", ApiException(status=404), False, "CloudVendorConnectionFailed", "install Karpenter"),
        (
            "karpenter",
            ApiException(status=403),
            False,
            "CloudVendorConnectionFailed",
            "may not list NodeClaims",
        ),
        (
            "karpenter",
            ApiException(status=500),
            False,
            "CloudVendorConnectionFailed",
            "listing NodeClaims failed",
        ),
        ("aws", None, False, "CloudVendorConnectionFailed", "computingVendor.params.defaultRegion: required"),
        ("alibaba", None, False, "CloudVendorConnectionFailed", "computingVendor.params.defaultRegion"),
        ("gcp", None, False, "UnsupportedVendor", "'gcp': not supported; supported: alibaba, aws, karpenter"),
    ],
)
def test_vendor_checks(
    vendor_type: str, error: Exception | None, ok: bool, reason: str, message: str
) -> None:
    reader = _Reader(error)
    connection = asyncio.run(vendor.connection_check(vendor_type)({"type": vendor_type}, reader))
    assert (connection.ok, connection.reason) == (ok, reason)
    assert message in connection.message
    assert reader.paths == (["/apis/karpenter.sh/v1/nodeclaims"] if vendor_type == "karpenter" else [])


def test_the_connection_check_reads_key_files_only_under_the_key_dir(tmp_path: Any) -> None:
    raw = {"type": "alibaba", "authType": "accessKey",
           "params": {"defaultRegion": "cn-hangzhou", "accessKeyPath": "/etc/hostname",
                      "secretKeyPath": str(tmp_path / "sk")}}
    connection = asyncio.run(vendor.connection_check("alibaba", str(tmp_path))(raw, _Reader(None)))
    assert (connection.ok, connection.reason) == (False, "CloudVendorConnectionFailed")
    assert "spec.computingVendor.params.accessKeyPath='/etc/hostname'" in connection.message
    assert "--cloud-key-dir" in connection.message

