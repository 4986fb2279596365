"""The provider of a ``computingVendor``."""

from __future__ import annotations

from extender.cloud.provider import CloudError, Provider
from extender.cloud.vendor import VendorConfig


def make_provider(config: VendorConfig) -> Provider:
    if config.problems:
        raise CloudError("InvalidVendorConfig", "; ".join(config.problems))
    if config.type == "aws":
        from extender.cloud.aws import AWSProvider

        return AWSProvider(config)
    if config.type == "alibaba":
        from extender.cloud.alibaba import AlibabaProvider

        return AlibabaProvider(config)
    raise CloudError("UnsupportedVendor", f"computingVendor.type={config.type!r}")
