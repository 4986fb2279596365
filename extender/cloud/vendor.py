"""The TensorFusionCluster's ``spec.computingVendor``: which cloud, which region, which credentials.

``authType: accessKey`` reads the key pair from files (``params.accessKeyPath`` / ``secretKeyPath``, a
mounted Secret); the files are read again whenever they change, so a rotated Secret needs no restart.
``authType: serviceAccountRole`` (and no authType with no key paths) uses the cloud's default credential
chain (instance role, IRSA / RRSA web identity, environment). ``params.extraParams.endpoint`` points the
client at another endpoint (a VPC endpoint, or a local emulator).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.cloud.provider import AuthFailure
from extender.common.fields import get_map, get_str
from extender.common.numbers import shown

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
    if raw is None:
        return VendorConfig("", problems=(f"{where}: missing",))
    if not isinstance(raw, Mapping):
        return VendorConfig("", problems=(f"{where}={shown(raw)}: expected an object",))
    problems: list[str] = []
    params = get_map(raw, "params", f"{where}.params", problems)
    vendor = get_str(raw, "type", f"{where}.type", problems)
    if vendor not in VENDORS:
        problems.append(
            f"{where}.type={shown(vendor)}: the extender launches VMs on {' or '.join(VENDORS)} "
            "(karpenter: use provisioningMode Karpenter)"
        )
    auth = get_str(raw, "authType", f"{where}.authType", problems)
    if auth not in ("", ACCESS_KEY, SERVICE_ACCOUNT_ROLE):
        problems.append(f"{where}.authType={shown(auth)}: expected {ACCESS_KEY} or {SERVICE_ACCOUNT_ROLE}")
    extra = get_map(params, "extraParams", f"{where}.params.extraParams", problems)
    for key, value in extra.items():
        if not isinstance(value, str):
            problems.append(f"{where}.params.extraParams.{key}={shown(value)}: expected a string")
    enable = raw.get("enable")
    if enable is not None and not isinstance(enable, bool):
        problems.append(f"{where}.enable={shown(enable)}: expected true or false")
    config = VendorConfig(
        type=vendor,
        auth_type=auth,
        region=get_str(params, "defaultRegion", f"{where}.params.defaultRegion", problems),
        access_key_path=get_str(params, "accessKeyPath", f"{where}.params.accessKeyPath", problems),
        secret_key_path=get_str(params, "secretKeyPath", f"{where}.params.secretKeyPath", problems),
        extra={str(k): v for k, v in extra.items() if isinstance(v, str)},
        enabled=enable is not False,
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

    from extender.common.yamlio import read_text_file

    raw = yaml.safe_load(read_text_file(path))
    if isinstance(raw, Mapping) and "computingVendor" in raw:
        raw = raw["computingVendor"]
    return parse_vendor(raw, "computingVendor")


DEFAULT_KEY_DIR = "/tmp"  # TensorFusion's chart mounts its Secret at /tmp/secret
# Every install has that Secret, its keys empty until they are set (the chart; manifests/)
NOT_CONFIGURED = "set ak and sk in the Secret tf-cloud-vendor-credentials, or the Secret mounted at that path"


ENDPOINT_KEYS = ("endpoint", "vpcEndpoint")  # the extraParams that point a cloud client at a host
ENDPOINT_FLAG = "--cloud-endpoint-allow"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int | None


def parse_endpoint(text: str) -> Endpoint:
    """``https://host[:port][/path]``, ``http://...`` or a bare ``host[:port]`` (HTTPS, as the clients take
    it); ``ValueError`` for anything else (user info, another scheme, no host, a bad port)."""
    raw = text.strip()
    if "://" not in raw:
        raw = "https://" + raw
    try:
        parts = urllib.parse.urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{text!r} is not an endpoint URL: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname or "@" in parts.netloc:
        raise ValueError(f"{text!r} is not an https:// endpoint of a host")
    return Endpoint(parts.scheme, parts.hostname.lower(), port)


def parse_endpoint_allow(text: str) -> tuple[Endpoint, ...]:
    """The ``--cloud-endpoint-allow`` list: comma-separated ``host[:port]`` or ``https://host[:port]`` (no
    port: any port of the host). ``http://`` only for a loopback host (a local emulator); ``ValueError``."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        endpoint = parse_endpoint(item)
        if endpoint.scheme != "https" and endpoint.host not in _LOOPBACK:
            raise ValueError(f"{item!r}: only https:// endpoints may be allowed (http:// only on a "
                             "loopback host, for a local emulator)")
        out.append(endpoint)
    return tuple(out)


def endpoint_problem(url: str, allowed: Sequence[Endpoint]) -> str | None:
    """Why a computingVendor from a cluster object may not point the cloud client at ``url``, or None."""
    try:
        wanted = parse_endpoint(url)
    except ValueError as exc:
        return str(exc)
    for entry in allowed:
        if (entry.scheme, entry.host) == (wanted.scheme, wanted.host) and entry.port in (None, wanted.port):
            return None
    if not allowed:
        return f"endpoints from cluster objects are not used unless {ENDPOINT_FLAG} lists them"
    return f"not listed in {ENDPOINT_FLAG} (https only)"


def confined(config: VendorConfig, key_dir: str, where: str,
             endpoints: Sequence[Endpoint] | None = None) -> VendorConfig:
    """A computingVendor from a cluster object (or a claim's recorded one) may name key files only under
    ``key_dir`` (symlinks resolved, as kubelet's Secret mounts use them), and point the client only at an
    endpoint in ``endpoints`` (``--cloud-endpoint-allow``; None: not checked, for the offline tools, which
    call no cloud). Otherwise whoever may write a TensorFusionCluster or patch a GPUNodeClaim could name any
    file the extender can read, the ServiceAccount token included, and an endpoint of theirs, and receive
    the file's contents as the access key id in every signed request."""
    problems = []
    if key_dir:
        root = os.path.realpath(key_dir)
        for path, what in ((config.access_key_path, "accessKeyPath"),
                           (config.secret_key_path, "secretKeyPath")):
            if path and os.path.commonpath([root, os.path.realpath(path)]) != root:
                problems.append(f"{where}.params.{what}={path!r}: key files are read only under "
                                f"--cloud-key-dir {key_dir}")
    if endpoints is not None:
        for key in ENDPOINT_KEYS:
            url = config.extra.get(key)
            problem = endpoint_problem(url, endpoints) if url else None
            if problem is not None:
                problems.append(f"{where}.params.extraParams.{key}={shown(url)}: {problem}")
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
