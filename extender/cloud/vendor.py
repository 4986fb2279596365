"""The TensorFusionCluster's ``spec.computingVendor``: which cloud, which region, which credentials.

``authType: accessKey`` reads the key pair from files (``params.accessKeyPath`` / ``secretKeyPath``, a
mounted Secret); the files are read again whenever they change, so a rotated Secret needs no restart.
``authType: serviceAccountRole`` (and no authType with no key paths) uses the cloud's default credential
chain (instance role, IRSA / RRSA web identity, environment). ``params.extraParams.endpoint`` points the
client at another endpoint (a VPC endpoint, or a local emulator).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from extender.cloud.provider import AuthFailure

VENDORS = ("aws", "alibaba")
ACCESS_KEY, SERVICE_ACCOUNT_ROLE = "accessKey", "serviceAccountRole"


@dataclass(frozen=True)
class VendorConfig:
    type: str
    auth_type: str = ""
    region: str = ""
    access_key_path: str = ""
    secret_key_path: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    enabled: bool = True
    problems: tuple[str, ...] = ()

    @property
    def uses_keys(self) -> bool:
        return self.auth_type == ACCESS_KEY or (
            self.auth_type != SERVICE_ACCOUNT_ROLE and bool(self.access_key_path or self.secret_key_path)
        )

    @property
    def endpoint(self) -> str:
        return str(self.extra.get("endpoint") or "")


def parse_vendor(raw: Any, where: str = "spec.computingVendor") -> VendorConfig:
    if not isinstance(raw, Mapping):
        return VendorConfig("", problems=(f"{where}: missing",))
    params = raw.get("params") or {}
    problems: list[str] = []
    vendor = str(raw.get("type") or "")
    if vendor not in VENDORS:
        problems.append(
            f"{where}.type={vendor!r}: the extender launches VMs on {' or '.join(VENDORS)} "
            "(karpenter: use provisioningMode Karpenter)"
        )
    auth = str(raw.get("authType") or "")
    if auth not in ("", ACCESS_KEY, SERVICE_ACCOUNT_ROLE):
        problems.append(f"{where}.authType={auth!r}: expected {ACCESS_KEY} or {SERVICE_ACCOUNT_ROLE}")
    config = VendorConfig(
        type=vendor,
        auth_type=auth,
        region=str(params.get("defaultRegion") or ""),
        access_key_path=str(params.get("accessKeyPath") or ""),
        secret_key_path=str(params.get("secretKeyPath") or ""),
        extra={str(k): str(v) for k, v in (params.get("extraParams") or {}).items()},
        enabled=raw.get("enable") is not False,
    )
    if not config.region:
        problems.append(f"{where}.params.defaultRegion: required")
    if config.uses_keys and not (config.access_key_path and config.secret_key_path):
        problems.append(f"{where}.params: authType {ACCESS_KEY} needs accessKeyPath and secretKeyPath")
    return VendorConfig(**{**config.__dict__, "problems": tuple(problems)})


def read_vendor_file(path: str) -> VendorConfig:
    """The ``--computing-vendor`` file (the block alone, or under a ``computingVendor:`` key), parsed.
    Raises OSError or yaml.YAMLError when it cannot be read."""
    import yaml

    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    if isinstance(raw, Mapping) and "computingVendor" in raw:
        raw = raw["computingVendor"]
    return parse_vendor(raw, "computingVendor")


DEFAULT_KEY_DIR = "/tmp"  # TensorFusion's chart mounts its Secret at /tmp/secret
# Every install has that Secret, its keys empty until they are set (the chart; manifests/)
NOT_CONFIGURED = "set ak and sk in the Secret tf-cloud-vendor-credentials, or the Secret mounted at that path"


def confined(config: VendorConfig, key_dir: str, where: str) -> VendorConfig:
    """A computingVendor from a cluster object may name key files only under ``key_dir`` (symlinks
    resolved, as kubelet's Secret mounts use them). Otherwise whoever may write a TensorFusionCluster
    could name any file the extender can read, the ServiceAccount token included, and an endpoint of
    theirs, and receive the file's contents as the access key id in every signed request."""
    if not key_dir:
        return config
    root = os.path.realpath(key_dir)
    problems = []
    for path, what in ((config.access_key_path, "accessKeyPath"), (config.secret_key_path, "secretKeyPath")):
        if path and os.path.commonpath([root, os.path.realpath(path)]) != root:
            problems.append(f"{where}.params.{what}={path!r}: key files are read only under "
                            f"--cloud-key-dir {key_dir}")
    return replace(config, problems=(*config.problems, *problems)) if problems else config


class KeyFiles:
    """The access key pair from two files, read again when either file changes (mtime or size)."""

    def __init__(self, access_key_path: str, secret_key_path: str) -> None:
        self.paths = (access_key_path, secret_key_path)
        self._stamp: tuple[tuple[float, int], ...] | None = None
        self._keys: tuple[str, str] = ("", "")

    def _stat(self) -> tuple[tuple[float, int], ...]:
        out = []
        for path, what in zip(self.paths, ("accessKeyPath", "secretKeyPath"), strict=True):
            try:
                st = os.stat(path)
            except OSError as exc:  # a Secret mounted without that key, or not mounted
                raise AuthFailure("CredentialFileMissing", f"params.{what} {path}: {exc.strerror}: the key "
                                  f"is not configured ({NOT_CONFIGURED})") from exc
            out.append((st.st_mtime, st.st_size))
        return tuple(out)

    def changed(self) -> bool:
        try:
            return self._stat() != self._stamp
        except AuthFailure:
            return True

    def read(self) -> tuple[str, str]:
        stamp = self._stat()
        if stamp != self._stamp:
            keys = []
            for path, what in zip(self.paths, ("accessKeyPath", "secretKeyPath"), strict=True):
                with open(path, encoding="utf-8") as handle:
                    value = handle.read().strip()
                if not value:
                    raise AuthFailure("CredentialFileEmpty", f"params.{what} {path} is empty: the key is not "
                                      f"configured ({NOT_CONFIGURED})")
                keys.append(value)
            self._keys = (keys[0], keys[1])
            self._stamp = stamp
        return self._keys
