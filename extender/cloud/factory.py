"""The provider of a ``computingVendor``."""

from __future__ import annotations

from extender.cloud.provider import CloudError, Provider
from extender.cloud.vendor import VendorConfig

# Each vendor's SDK is an extra of the project (pyproject.toml), installed in the image: (extra, module the
# provider imports first, what it is).
EXTRAS = {
    "aws": ("aws", "aiobotocore", "the AWS SDK (aiobotocore)"),
    "alibaba": ("alibaba", "alibabacloud_ecs20140526", "Alibaba Cloud's ECS SDK (alibabacloud-ecs20140526)"),
}


def missing_extra(vendor_type: str, exc: ImportError) -> CloudError:
    """The answer when a vendor's SDK is not installed: which extra brings it, never a traceback."""
    extra, _, what = EXTRAS[vendor_type]
    return CloudError(
        "MissingCloudSDK",
        f"computingVendor.type {vendor_type} needs {what}, which is not installed ({exc}): install "
        f"tensor-fusion-extender with its [{extra}] extra (pip install '.[{extra}]' in a checkout), or run "
        "the project's image, which has both",
    )


def make_provider(config: VendorConfig) -> Provider:
    if config.problems:
        raise CloudError("InvalidVendorConfig", "; ".join(config.problems))
    try:
        if config.type == "aws":
            from extender.cloud.aws import AWSProvider

            return AWSProvider(config)
        if config.type == "alibaba":
            from extender.cloud.alibaba import AlibabaProvider

            return AlibabaProvider(config)
    except ImportError as exc:
        if config.type in EXTRAS and exc.name and exc.name.split(".")[0] != "extender":
            raise missing_extra(config.type, exc) from None
        raise
    raise CloudError("UnsupportedVendor", f"computingVendor.type={config.type!r}")
