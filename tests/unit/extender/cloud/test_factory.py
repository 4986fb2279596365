"""A Provisioned pool whose cloud SDK is not installed gets an answer naming the extra that brings it, and
an empty or missing key file reads as a key pair not configured (the Secret every install has)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from extender.cloud import alibaba
from extender.cloud.factory import make_provider
from extender.cloud.provider import AuthFailure, CloudError
from extender.cloud.vendor import KeyFiles, VendorConfig


@pytest.mark.parametrize(("vendor", "modules", "extra"), [
    ("aws", ["aiobotocore", "aiobotocore.config", "aiobotocore.session"], "[aws]"),
])
def test_a_missing_sdk_names_the_extra(monkeypatch, vendor, modules, extra):
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "extender.cloud.aws", raising=False)
    with pytest.raises(CloudError) as caught:
        make_provider(VendorConfig(type=vendor, region="us-east-1"))
    assert caught.value.code == "MissingCloudSDK"
    assert f"computingVendor.type {vendor} needs" in str(caught.value) and extra in str(caught.value)
    assert "Traceback" not in str(caught.value)


def test_alibabas_sdk_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, alibaba.SDK_MODULES[0], None)
    with pytest.raises(CloudError) as caught:
        asyncio.run(alibaba._load_sdk())
    assert caught.value.code == "MissingCloudSDK" and "[alibaba]" in str(caught.value)


@pytest.mark.parametrize(("ak", "sk", "code"), [
    ("", "", "CredentialFileEmpty"),  # the chart's Secret before anyone set the keys
    ("AKIA", "  \n", "CredentialFileEmpty"),
    (None, "secret", "CredentialFileMissing"),  # a Secret without that key
])
def test_keys_not_set_read_as_not_configured(tmp_path: Path, ak, sk, code):
    for name, value in (("ak", ak), ("sk", sk)):
        if value is not None:
            (tmp_path / name).write_text(value)
    with pytest.raises(AuthFailure) as caught:
        KeyFiles(str(tmp_path / "ak"), str(tmp_path / "sk")).read()
    assert caught.value.code == code
    assert "not configured" in str(caught.value) and "tf-cloud-vendor-credentials" in str(caught.value)
