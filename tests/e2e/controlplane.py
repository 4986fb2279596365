"""A real, local Kubernetes control plane for the end-to-end tests.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager and kwok are built from the Go module proxy by
``tests/e2e/build-control-plane.sh`` (cached outside the repo) and run here on loopback, each in its own
process group, with stdout/stderr in ``<workdir>/logs/<name>.log``.

There are no kubelets: kwok plays the kubelet for Nodes annotated ``kwok.x-k8s.io/node=fake``
(``KWOK_NODE_ANNOTATION``): it keeps them Ready, marks pods bound to them Running (with a pod IP) and
finishes the deletion of their terminating pods. Nodes without the annotation are left alone.

Everything here is plain I/O plumbing; the fixtures in conftest.py wire it together.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.upstream import karpenter_crds_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
CRDS_DIR = MANIFESTS / "crds"
SCHEDULER_CONFIG = MANIFESTS / "scheduler" / "kube-scheduler-config.yaml"
BUILD_SCRIPT = Path(__file__).resolve().parent / "build-control-plane.sh"

GPU_SCHEDULER_NAME = "tensor-fusion-scheduler"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
INDEX_RESOURCES = [f"tensor-fusion.ai/index_{k:x}" for k in range(16)]
# see manifests/optional/karpenter-nodeoverlay.yaml for why 1024
DEFAULT_INDEX_CAPACITY = "1024"
TF_GROUP, TF_VERSION = "tensor-fusion.ai", "v1"


# --------------------------------------------------------------------------------------------- build


def build_binaries(components: Iterable[str] = (), timeout: float = 3 * 3600) -> dict[str, Path]:
    """Run the build script (a no-op when cached) and return {component: binary path}."""
    env = dict(os.environ)
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *components],
        stdout=subprocess.PIPE,
        stderr=None,  # progress goes to the terminal / pytest's captured stderr
        text=True,
        env=env,
        timeout=timeout,
        check=True,
    )
    out: dict[str, Path] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export TF_BIN_"):
            key, _, value = line[len("export TF_BIN_") :].partition("=")
            out[key.lower().replace("_", "-")] = Path(value)
    return out


# ------------------------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every wait in the suite is a poll for an outcome; its bound only matters when the outcome never comes.
# On a busy machine (CI shares 2 cores) things take longer, so bounds are stretched rather than trusted.
TIMEOUT_SCALE = float(os.environ.get("TF_E2E_TIMEOUT_SCALE", "3"))


def wait_until(
    pred: Callable[[], Any], timeout: float, interval: float = 0.2, what: str = "condition"
) -> Any:
    timeout *= TIMEOUT_SCALE
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout}s waiting for {what}" + (f": {last_exc!r}" if last_exc else "")
            )
        time.sleep(interval)


def tail(path: Path, lines: int = 60) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data[-lines:])


class ManagedProcess:
    """A child process in its own process group, logging to a file; stop() kills the whole group."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,  # own process group: Ctrl-C in the terminal does not hit it, stop() does
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise RuntimeError(
                f"{self.name} exited with {self.proc.returncode}; log tail:\n{tail(self.log_path)}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        with contextlib.suppress(OSError):
            self._log.close()


class ProcessRegistry:
    """Every process the harness starts; stop_all() runs at session end and at interpreter exit."""

    def __init__(self) -> None:
        self._procs: list[ManagedProcess] = []
        self._lock = threading.Lock()

    def start(self, name: str, argv: list[str], log_dir: Path, **kw: Any) -> ManagedProcess:
        p = ManagedProcess(name, argv, log_dir, **kw)
        with self._lock:
            self._procs.append(p)
        return p

    def forget(self, p: ManagedProcess) -> None:
        with self._lock:
            if p in self._procs:
                self._procs.remove(p)

    def all(self) -> list[ManagedProcess]:
        with self._lock:
            return list(self._procs)

    def stop_all(self) -> None:
        with self._lock:
            procs, self._procs = list(reversed(self._procs)), []
        for p in procs:
            with contextlib.suppress(Exception):  # best effort at shutdown
                p.stop()


PROCESSES = ProcessRegistry()


# ----------------------------------------------------------------------------------------------- PKI


@dataclass
class CertPair:
    cert: Path
    key: Path


def _pki():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, rsa, ExtendedKeyUsageOID, NameOID


def _write_key(key, path: Path) -> None:
    _, _, serialization, *_ = _pki()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str, common_name: str) -> tuple[CertPair, Any, Any]:
    x509, hashes, serialization, ec, _, _, NameOID = _pki()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _dt.datetime.now(_dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair, cert, key


def make_leaf(
    directory: Path,
    name: str,
    ca_cert,
    ca_key,
    common_name: str,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    server: bool = False,
    client: bool = False,
) -> CertPair:
    x509, hashes, serialization, ec, _, EKU, NameOID = _pki()
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    # RFC 5280 caps a CN at 64 characters, but ServiceAccount user names are longer (system:serviceaccount:
    # tensor-fusion-system:tensor-fusion-scheduler has 66) and kube-apiserver takes the CN as it is.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name, _validate=len(common_name) <= 64))
    now = _dt.datetime.now(_dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
    )
    usages = ([EKU.SERVER_AUTH] if server else []) + ([EKU.CLIENT_AUTH] if client else [])
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    sans = [x509.DNSName(d) for d in dns_names] + [
        x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses
    ]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def make_service_account_key(directory: Path) -> tuple[Path, Path]:
    _, _, serialization, _, rsa, _, _ = _pki()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = directory / "sa.key", directory / "sa.pub"
    _write_key(key, priv)
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return priv, pub


# ------------------------------------------------------------------------------------ control plane


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback. ``start()`` blocks until /readyz is ok."""

    workdir: Path
    binaries: dict[str, Path]
    registry: ProcessRegistry = field(default_factory=lambda: PROCESSES)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        for d in (self.pki_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.etcd: ManagedProcess | None = None
        self.apiserver: ManagedProcess | None = None
        self.apiserver_port = 0
        self.etcd_url = ""

    # -- certificates -------------------------------------------------------------------------------
    def _make_pki(self) -> None:
        d = self.pki_dir
        self.server_ca, ca_cert, ca_key = make_ca(d, "server-ca", "tensor-fusion-e2e-server-ca")
        self.serving = make_leaf(
            d,
            "apiserver",
            ca_cert,
            ca_key,
            "kube-apiserver",
            dns_names=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            ip_addresses=["127.0.0.1", "10.0.0.1"],
            server=True,
        )
        self.client_ca, cca_cert, cca_key = make_ca(d, "client-ca", "tensor-fusion-e2e-client-ca")
        self._client_ca_objs = (cca_cert, cca_key)
        self.admin = make_leaf(
            d, "admin", cca_cert, cca_key, "e2e-admin", organizations=["system:masters"], client=True
        )
        self.sa_key, self.sa_pub = make_service_account_key(d)

    def client_cert(self, name: str, user: str, groups: Iterable[str] = ()) -> CertPair:
        """A client certificate for ``user`` in ``groups`` (for RBAC tests of the shipped roles)."""
        cca_cert, cca_key = self._client_ca_objs
        return make_leaf(self.pki_dir, name, cca_cert, cca_key, user, organizations=list(groups), client=True)

    # -- processes ----------------------------------------------------------------------------------
    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        data = self.workdir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)  # a reused TF_E2E_WORKDIR starts from an empty cluster
        self.etcd = self.registry.start(
            "etcd",
            [
                self.binaries["etcd"],
                "--name=e2e",
                f"--data-dir={data}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
                # the test apiserver only needs the last few revisions
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=1000",
            ],
            self.log_dir,
        )

        def healthy() -> bool:
            self.etcd.check_alive()
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                return json.load(r).get("health") == "true"

        wait_until(healthy, 60, what="etcd /health")

    def _start_apiserver(self) -> None:
        self.apiserver_port = free_port()
        self.apiserver = self.registry.start(
            "kube-apiserver",
            [
                self.binaries["kube-apiserver"],
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.pki_dir}",
                f"--tls-cert-file={self.serving.cert}",
                f"--tls-private-key-file={self.serving.key}",
                f"--client-ca-file={self.client_ca.cert}",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                # ServiceAccount: pods need no token; TaintNodesByCondition: it taints every new Node
                # node.kubernetes.io/not-ready, and without kube-controller-manager nothing removes it
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # the advertise address is loopback, which the kubernetes Endpoints object may not hold
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
            self.log_dir,
        )
        wait_until(
            lambda: self._get("/readyz", check_alive=True) == "ok",
            120,
            interval=0.5,
            what="kube-apiserver /readyz",
        )

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.server_ca.cert))
        ctx.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        return ctx

    def _get(self, path: str, check_alive: bool = False) -> str:
        if check_alive and self.apiserver is not None:
            self.apiserver.check_alive()
        with urllib.request.urlopen(f"{self.server}{path}", timeout=5, context=self._ssl_context()) as r:
            return r.read().decode()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def write_kubeconfig(self, path: Path, user: str = "admin", cert: CertPair | None = None) -> Path:
        cert = cert or self.admin
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": self.server, "certificate-authority": str(self.server_ca.cert)},
                }
            ],
            "users": [
                {"name": user, "user": {"client-certificate": str(cert.cert), "client-key": str(cert.key)}}
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

    def kubeconfig_for(self, user: str, groups: Iterable[str] = (), name: str | None = None) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` by client certificate (no RBAC bypass)."""
        name = name or "user-" + "".join(c if c.isalnum() else "-" for c in user)
        cert = self.client_cert(name, user, groups)
        return self.write_kubeconfig(self.workdir / f"{name}.kubeconfig", user=user, cert=cert)

    def kubeconfig_for_service_account(self, namespace: str, name: str) -> Path:
        """A kubeconfig that the API server authenticates as ServiceAccount namespace/name, so RBAC
        bindings to that ServiceAccount (e.g. manifests/rbac.yaml) apply."""
        return self.kubeconfig_for(
            f"system:serviceaccount:{namespace}:{name}",
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            name=f"sa-{namespace}-{name}",
        )

    def start(self) -> ControlPlane:
        self._make_pki()
        self._start_etcd()
        self._start_apiserver()
        self.kubeconfig = self.write_kubeconfig(self.workdir / "admin.kubeconfig")
        # The extender authenticates as its ServiceAccount (the identity manifests/admission-policy.yaml
        # trusts to write allocations), in system:masters as well so that the tests of other features do
        # not depend on the shipped RBAC; test_manifests checks that RBAC with SubjectAccessReviews.
        groups = ["system:masters", "system:serviceaccounts", f"system:serviceaccounts:{PROJECT_NAMESPACE}"]
        self.extender_kubeconfig = self.kubeconfig_for(EXTENDER_USER, groups, name="tf-extender")
        _EXTENDER_KUBECONFIGS[self.server] = self.extender_kubeconfig
        return self

    def api_client(self, kubeconfig: Path | None = None):
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def processes(self) -> list[ManagedProcess]:
        return [p for p in self.registry.all()]

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for log in sorted(self.log_dir.glob("*.log")):
            parts.append(f"----- {log.name} (last {lines} lines) -----\n{tail(log, lines)}")
        return "\n".join(parts)

    def stop(self) -> None:
        for p in (self.apiserver, self.etcd):
            if p is not None:
                p.stop()


# ---------------------------------------------------------------------------------- CRDs, manifests


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_crds(api_client, paths: Iterable[Path], timeout: float = 60) -> list[str]:
    """Create (or replace) CRDs and wait until each is Established. Returns the CRD names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for path in paths:
        for doc in load_yaml_docs(Path(path)):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            names.append(name)
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                cur = ext.read_custom_resource_definition(name)
                doc["metadata"]["resourceVersion"] = cur.metadata.resource_version
                ext.replace_custom_resource_definition(name, doc)

    def established(name: str) -> bool:
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    for name in names:
        wait_until(lambda name=name: established(name), timeout, what=f"CRD {name} Established")
    # discovery can lag Established by a moment
    custom = client.CustomObjectsApi(api_client)
    for path in paths:
        for doc in load_yaml_docs(Path(path)):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served", True))
            group, plural = spec["group"], spec["names"]["plural"]

            def served(group=group, version=version, plural=plural, cluster=spec["scope"] == "Cluster"):
                if cluster:
                    return custom.list_cluster_custom_object(group, version, plural, limit=1)
                return custom.list_custom_object_for_all_namespaces(group, version, plural, limit=1)

            wait_until(served, timeout, what=f"{spec['names']['plural']}.{spec['group']} served")
    return names


def project_crd_files() -> list[Path]:
    return sorted(CRDS_DIR.glob("*.yaml"))


def karpenter_crd_files() -> list[Path]:
    """Karpenter's CRDs from the Karpenter module the suite builds (see tests/upstream.py)."""
    return sorted(karpenter_crds_dir().glob("*.yaml"))


def render_kustomization(directory: Path) -> list[dict]:
    """Render a kustomization the way ``kustomize build`` does for the features manifests/ uses:
    ``resources`` (files and nested kustomization directories) and ``configMapGenerator`` with ``files``
    (``key=path`` or ``path``), ``literals``, ``namespace``, ``options.labels/annotations`` and
    ``disableNameSuffixHash: true``, and ``images`` (name, newName, newTag). Anything else raises, so the
    renderer never silently diverges."""
    directory = Path(directory)
    kfile = next(
        (
            directory / n
            for n in ("kustomization.yaml", "kustomization.yml", "Kustomization")
            if (directory / n).exists()
        ),
        None,
    )
    if kfile is None:
        raise FileNotFoundError(f"no kustomization in {directory}")
    k = yaml.safe_load(kfile.read_text()) or {}
    supported = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "images"}
    unsupported = set(k) - supported
    if unsupported:
        raise NotImplementedError(f"{kfile}: unsupported kustomization fields {sorted(unsupported)}")
    out: list[dict] = []
    for res in k.get("resources", []):
        p = directory / res
        out.extend(render_kustomization(p) if p.is_dir() else load_yaml_docs(p))
    global_opts = k.get("generatorOptions") or {}
    for gen in k.get("configMapGenerator", []):
        opts = {**global_opts, **(gen.get("options") or {})}
        if not opts.get("disableNameSuffixHash"):
            raise NotImplementedError(
                f"{kfile}: configMapGenerator {gen['name']} needs disableNameSuffixHash: true"
            )
        data: dict[str, str] = {}
        for f in gen.get("files", []):
            key, _, rel = f.partition("=") if "=" in f else (Path(f).name, "", f)
            data[key] = (directory / rel).read_text()
        for lit in gen.get("literals", []):
            key, _, value = lit.partition("=")
            data[key] = value
        meta: dict[str, Any] = {"name": gen["name"]}
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        if opts.get("annotations"):
            meta["annotations"] = dict(opts["annotations"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for image in k.get("images", []):  # name -> newName/newTag, on every container of every pod template
        for obj in out:
            pod_spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in [*pod_spec.get("containers", []), *pod_spec.get("initContainers", [])]:
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return out


# ------------------------------------------------------------------------------ scheduler and kwok


def scheduler_config(
    kubeconfig: Path, extender_url: str, source: Path = SCHEDULER_CONFIG, leader_elect: bool = False
) -> dict:
    """The shipped KubeSchedulerConfiguration pointed at the test cluster and a loopback extender."""
    cfg = yaml.safe_load(Path(source).read_text())
    cfg.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    cfg.setdefault("leaderElection", {})["leaderElect"] = leader_elect
    for ext in cfg.get("extenders", []):
        ext["urlPrefix"] = extender_url
    return cfg


def _wait_serving(proc: ManagedProcess, port: int, path: str, timeout: float) -> ManagedProcess:
    """Until a component's self-signed HTTPS endpoint answers "ok"; records the port on the process."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def ready() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx) as r:
            return r.read().decode() == "ok"

    wait_until(ready, timeout, interval=0.5, what=f"{proc.name} {path}")
    proc.port = port  # type: ignore[attr-defined]
    return proc


def start_scheduler(
    cp: ControlPlane,
    binary: Path,
    extender_url: str,
    name: str = "kube-scheduler",
    config: dict | None = None,
    timeout: float = 60,
) -> ManagedProcess:
    cfg = config or scheduler_config(cp.kubeconfig, extender_url)
    cfg_path = cp.workdir / f"{name}-config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--config={cfg_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={cp.kubeconfig}",
            f"--authorization-kubeconfig={cp.kubeconfig}",
            # no front proxy here: do not look up the requestheader CA in kube-system (log noise)
            "--authentication-skip-lookup=true",
            f"--client-ca-file={cp.client_ca.cert}",
            f"--cert-dir={cp.workdir / (name + '-certs')}",
            "--v=2",
        ],
        cp.log_dir,
    )
    return _wait_serving(proc, port, "/readyz", timeout)


# The controllers the suite needs: owners recreate evicted pods (ReplicaSet, Deployment, Job), PDB status
# (disruption) lets the Eviction API allow evictions, deleted owners take their pods along (garbage
# collector), deleted namespaces are emptied (namespace). Everything else (node lifecycle, service accounts,
# CSRs ...) stays off: there are no kubelets and pods need no tokens.
CONTROLLERS = ("replicaset-controller", "deployment-controller", "job-controller", "disruption-controller",
               "garbage-collector-controller", "namespace-controller")


def start_controller_manager(cp: ControlPlane, binary: Path, controllers: Iterable[str] = CONTROLLERS,
                             name: str = "kube-controller-manager", timeout: float = 90) -> ManagedProcess:
    """kube-controller-manager running ``controllers``, with a client certificate of its own
    (system:kube-controller-manager in system:masters: one identity for every controller)."""
    kubeconfig = cp.kubeconfig_for("system:kube-controller-manager", ["system:masters"],
                                   name="kube-controller-manager")
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            f"--client-ca-file={cp.client_ca.cert}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={cp.workdir / (name + '-certs')}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            # recreate and re-count quickly on a small test cluster
            "--concurrent-replicaset-syncs=5",
            "--concurrent-deployment-syncs=5",
            "--v=2",
        ],
        cp.log_dir,
    )
    return _wait_serving(proc, port, "/healthz", timeout)


def start_kwok(cp: ControlPlane, binary: Path, stages: Path, name: str = "kwok") -> ManagedProcess:
    """kwok managing the Nodes annotated kwok.x-k8s.io/node=fake, with the stages the build script wrote
    (node-initialize, node-heartbeat, pod-ready, pod-delete)."""
    key, value = KWOK_NODE_ANNOTATION
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--kubeconfig={cp.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.1.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{port}",  # plain http (no --tls-cert-file): /healthz
        ],
        cp.log_dir,
        env={"HOME": str(cp.workdir)},  # keep kwok from reading ~/.kwok
    )

    def ready() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200

    wait_until(ready, 60, interval=0.5, what="kwok /healthz")
    proc.port = port  # type: ignore[attr-defined]
    return proc


# ----------------------------------------------------------------------------- object helpers


def node_body(
    name: str,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: str = "110",
    index_capacity: str = DEFAULT_INDEX_CAPACITY,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    taints: list[dict] | None = None,
    extra_allocatable: dict[str, str] | None = None,
    kwok: bool = True,
) -> dict:
    """A Node object with allocatable cpu, memory, pods and every tensor-fusion.ai/index_* resource.
    kwok=True adds the annotation that makes kwok manage it (Ready, pods Running)."""
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    alloc.update({r: index_capacity for r in INDEX_RESOURCES})
    alloc.update(extra_allocatable or {})
    ann = dict(annotations or {})
    if kwok:
        ann[KWOK_NODE_ANNOTATION[0]] = KWOK_NODE_ANNOTATION[1]
    lbl = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    lbl.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lbl, "annotations": ann},
        "spec": {"taints": taints or []},
        "status": {
            "phase": "Running",  # kwok's node-heartbeat stage selects Running + Ready nodes
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "e2e"}],
            "addresses": [
                {"type": "InternalIP", "address": "10.1.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "containerRuntimeVersion": "fake",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def create_node(api_client, name: str, **kw: Any):
    """Create a Node and write its status (allocatable, Ready) through the status subresource."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    body = node_body(name, **kw)
    status = body.pop("status")
    core.create_node(body)
    return core.patch_node_status(name, {"status": status})


def gpu_body(
    name: str,
    node: str,
    pool: str | None = None,
    model: str = "A100",
    vendor: str = "NVIDIA",
    tflops: str | int = "312",
    vram: str = "80Gi",
    index: int = 0,
    phase: str = "Running",
    used_by: str | None = "tensor-fusion",
    isolation_mode: str | None = None,
    labels: dict[str, str] | None = None,
) -> tuple[dict, dict]:
    lbl = dict(labels or {})
    if pool:
        lbl["tensor-fusion.ai/gpupool"] = pool
    status: dict[str, Any] = {
        "capacity": {"tflops": str(tflops), "vram": str(vram)},
        "available": {"tflops": str(tflops), "vram": str(vram)},
        "gpuModel": model,
        "vendor": vendor,
        "index": index,
        "phase": phase,
        "uuid": f"GPU-{name}",
        "message": "",
        "nodeSelector": {"kubernetes.io/hostname": node},
    }
    if used_by:
        status["usedBy"] = used_by
    if isolation_mode:
        status["isolationMode"] = isolation_mode
    return (
        {"apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPU", "metadata": {"name": name, "labels": lbl}},
        status,
    )


def create_gpu(api_client, name: str, node: str, **kw: Any) -> dict:
    """Create a TensorFusion GPU object and set its status through the status subresource."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    body, status = gpu_body(name, node, **kw)
    custom.create_cluster_custom_object(TF_GROUP, TF_VERSION, "gpus", body)
    return custom.patch_cluster_custom_object_status(TF_GROUP, TF_VERSION, "gpus", name, {"status": status})


def create_cluster_object(api_client, plural: str, body: dict) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(api_client).create_cluster_custom_object(
        TF_GROUP, TF_VERSION, plural, body
    )


def _pod(api_client, namespace: str, name: str):
    from kubernetes import client

    return client.CoreV1Api(api_client).read_namespaced_pod(name, namespace)


def wait_for_pod_bound(api_client, namespace: str, name: str, timeout: float = 60) -> Any:
    """Wait until spec.nodeName is set; returns the pod."""

    def bound():
        p = _pod(api_client, namespace, name)
        return p if p.spec.node_name else None

    return wait_until(bound, timeout, what=f"pod {namespace}/{name} bound")


def wait_for_pod_running(api_client, namespace: str, name: str, timeout: float = 60) -> Any:
    def running():
        p = _pod(api_client, namespace, name)
        return p if p.status and p.status.phase == "Running" else None

    return wait_until(running, timeout, what=f"pod {namespace}/{name} Running")


def wait_for_pod_gone(api_client, namespace: str, name: str, timeout: float = 60) -> None:
    from kubernetes.client.rest import ApiException

    def gone():
        try:
            _pod(api_client, namespace, name)
            return False
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise

    wait_until(gone, timeout, what=f"pod {namespace}/{name} gone")


def scheduling_failure(api_client, namespace: str, name: str) -> str | None:
    """The message of the pod's PodScheduled=False condition, if any."""
    p = _pod(api_client, namespace, name)
    for c in (p.status.conditions or []) if p.status else []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message or c.reason or ""
    return None


def pod_events(api_client, namespace: str, name: str, reason: str | None = None) -> list:
    from kubernetes import client

    evs = (
        client.CoreV1Api(api_client)
        .list_namespaced_event(
            namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
        )
        .items
    )
    return [e for e in evs if reason is None or e.reason == reason]


def bind_pod(api_client, namespace: str, name: str, node: str) -> None:
    """Post a Binding by hand (what a scheduler does)."""
    from kubernetes import client

    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # the generated client fails to deserialize the Status answer of a Binding; skip deserialization
    client.CoreV1Api(api_client).create_namespaced_binding(namespace, body, _preload_content=False)


def b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def which(name: str) -> str | None:
    return shutil.which(name)


# ------------------------------------------------------------------- webhook, extender, GPU pods

ENABLED_LABEL = "tensor-fusion.ai/enabled"
WEBHOOK_CONFIG_NAME = "tensor-fusion-webhook"
PROJECT_NAMESPACE = "tensor-fusion-system"
DEFAULT_POOL_ANNOTATION = "tensor-fusion.ai/is-default-pool"
GPU_IDS_ANNOTATION = "tensor-fusion.ai/gpu-ids"
EXTENDER_USER = f"system:serviceaccount:{PROJECT_NAMESPACE}:tensor-fusion-scheduler"
ADMISSION_POLICY = MANIFESTS / "admission-policy.yaml"
_EXTENDER_KUBECONFIGS: dict[str, Path] = {}  # API server URL -> kubeconfig of the extender's identity
_EXTENDER_CLIENTS: dict[str, Any] = {}


def as_extender(api_client: Any) -> Any:
    """An API client of the same API server authenticating as the extender (see ControlPlane.start): what
    a test that plays the extender's bind by hand writes with, since only the extender may write
    allocations (manifests/admission-policy.yaml)."""
    from kubernetes import config

    host = api_client.configuration.host
    if host not in _EXTENDER_CLIENTS:
        _EXTENDER_CLIENTS[host] = config.new_client_from_config(config_file=str(_EXTENDER_KUBECONFIGS[host]))
    return _EXTENDER_CLIENTS[host]


def install_admission_policies(api_client: Any, timeout: float = 60) -> None:
    """The shipped ValidatingAdmissionPolicies and their bindings, in force when this returns (a pod forging
    an allocation is refused by a server-side dry run)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admission = client.AdmissionregistrationV1Api(api_client)
    for doc in load_yaml_docs(ADMISSION_POLICY):
        if doc["kind"] == "ValidatingAdmissionPolicy":
            _create_or_replace(admission.create_validating_admission_policy,
                               admission.read_validating_admission_policy,
                               admission.replace_validating_admission_policy, doc)
        else:
            _create_or_replace(admission.create_validating_admission_policy_binding,
                               admission.read_validating_admission_policy_binding,
                               admission.replace_validating_admission_policy_binding, doc)
    probe = placed_pod_body("policy-probe", "probe", ["probe-gpu"], "1", "1Gi")

    def refused() -> bool:
        try:
            client.CoreV1Api(api_client).create_namespaced_pod("default", probe, dry_run="All")
        except ApiException as exc:
            return exc.status in (400, 403, 422) and GPU_IDS_ANNOTATION in (exc.body or "")
        return False

    wait_until(refused, timeout, interval=0.3, what="the ValidatingAdmissionPolicies to be in force")


def console_script(name: str) -> Path:
    """A console script of the installed project: next to the running interpreter (the venv), else PATH."""
    import sys

    here = Path(sys.executable).parent / name
    if here.exists():
        return here
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"console script {name} is not installed (pip install -e .)")
    return Path(found)


def run_console_script(name: str, *args: str | Path, timeout: float = 60) -> str:
    """Run one of the project's console scripts to completion; raise with its output when it fails."""
    argv = [str(console_script(name)), *(str(a) for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def webhook_configuration(url: str, source: Path = MANIFESTS / "webhook.yaml") -> dict:
    """The shipped MutatingWebhookConfiguration with clientConfig pointed at ``url`` instead of the Service
    (rules, selectors, failurePolicy ... unchanged). The caBundle is left to ``tf-certs patch-webhook``."""
    docs = [d for d in load_yaml_docs(source) if d.get("kind") == "MutatingWebhookConfiguration"]
    if len(docs) != 1:
        raise ValueError(f"{source}: expected one MutatingWebhookConfiguration, found {len(docs)}")
    cfg = docs[0]
    for hook in cfg["webhooks"]:
        hook["clientConfig"] = {"url": url}
    return cfg


def https_ready(url: str, ca_file: Path, proc: ManagedProcess | None = None) -> bool:
    if proc is not None:
        proc.check_alive()
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
        return r.status == 200


def http_ready(url: str, proc: ManagedProcess | None = None) -> bool:
    if proc is not None:
        proc.check_alive()
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.status == 200


def gpu_pod_body(
    name: str,
    pool: str | None = None,
    tflops: str | None = None,
    vram: str | None = None,
    gpu_count: int | None = None,
    model: str | None = None,
    vendor: str | None = None,
    isolation: str | None = None,
    qos: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    priority_class: str | None = None,
) -> dict:
    """A pod as a user writes it: opted in with tensor-fusion.ai/enabled=true and GPU annotations (request =
    limit), no schedulerName: the webhook makes it canonical and hands it to the GPU scheduler."""
    ann: dict[str, str] = {}
    prefix = "tensor-fusion.ai/"
    for key, value in (
        ("gpupool", pool), ("tflops-request", tflops), ("tflops-limit", tflops), ("vram-request", vram),
        ("vram-limit", vram), ("gpu-count", gpu_count), ("gpu-model", model), ("vendor", vendor),
        ("isolation", isolation), ("qos", qos),
    ):
        if value is not None:
            ann[prefix + key] = str(value)
    ann.update(annotations or {})
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {ENABLED_LABEL: "true", **(labels or {})}, "annotations": ann},
        "spec": spec,
    }


def placed_pod_body(
    name: str, pool: str, gpu_ids: Iterable[str], tflops: str, vram: str, priority_class: str | None = None
) -> dict:
    """A GPU pod that already holds GPUs (canonical annotations with gpu-ids, as the extender's bind leaves
    them) and that no scheduler serves: the caller binds it by hand with bind_pod. It skips the webhook (not
    opted in) but carries the worker label, so the extender counts it."""
    ids = list(gpu_ids)
    p = "tensor-fusion.ai/"
    spec: dict[str, Any] = {
        "schedulerName": "e2e-manual",
        "containers": [{"name": "main", "image": "busybox"}],
        "terminationGracePeriodSeconds": 0,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {p + "component": "worker", p + "gpupool": pool},
            "annotations": {
                p + "gpupool": pool, p + "tflops-request": tflops, p + "tflops-limit": tflops,
                p + "vram-request": vram, p + "vram-limit": vram, p + "gpu-count": str(len(ids)),
                p + "isolation": "soft", p + "qos": "medium", GPU_IDS_ANNOTATION: ",".join(ids),
            },
        },
        "spec": spec,
    }


def wait_for_webhook_pool(api_client, pool: str, timeout: float = 30) -> None:
    """Until the webhook admits a pod of ``pool`` (its pool cache has caught up): a dry-run create."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    body = gpu_pod_body("pool-probe", pool=pool, tflops="1", vram="1Gi")
    wait_until(
        lambda: core.create_namespaced_pod("default", body, dry_run="All"),
        timeout,
        interval=0.1,
        what=f"the webhook to know GPUPool {pool}",
    )


def gpu_ids_of(pod: Any) -> list[str]:
    """The GPUs the extender committed into a pod (V1Pod or dict)."""
    ann = pod.metadata.annotations if hasattr(pod, "metadata") else pod["metadata"].get("annotations")
    raw = (ann or {}).get(GPU_IDS_ANNOTATION) or ""
    return [g for g in raw.split(",") if g]


def create_pod(api_client, namespace: str, body: dict) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)


def placement(api_client, namespace: str, name: str, timeout: float = 60) -> tuple[str, list[str]]:
    """Wait until the pod is bound; returns (node, GPUs from its gpu-ids annotation)."""
    pod = wait_for_pod_bound(api_client, namespace, name, timeout)
    return pod.spec.node_name, gpu_ids_of(pod)


def place_by_hand(
    api_client, namespace: str, name: str, pool: str, node: str, gpus: Iterable[str], tflops: str, vram: str,
    priority_class: str | None = None,
) -> None:
    """Pre-existing load: a pod holding ``tflops``/``vram`` on each of ``gpus``, bound to ``node`` by hand."""
    writer = as_extender(api_client)  # only the extender may write allocations
    create_pod(writer, namespace, placed_pod_body(name, pool, gpus, tflops, vram, priority_class))
    bind_pod(writer, namespace, name, node)


# ------------------------------------------------------------------------------ webhook and extender


class WebhookServer:
    """``tf-webhook serve`` as a user runs it, registered with the API server."""

    def __init__(self, proc: ManagedProcess, port: int, cert_dir: Path, default_pool: str) -> None:
        self.proc = proc
        self.port = port
        self.cert_dir = cert_dir
        self.ca_file = cert_dir / "ca.crt"
        self.default_pool = default_pool

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def _create_or_replace(create, read, replace, body: dict) -> None:
    from kubernetes.client.rest import ApiException

    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = read(body["metadata"]["name"]).metadata.resource_version
        replace(body["metadata"]["name"], body)


def start_webhook(control_plane: ControlPlane, api_client: Any,
                  default_pool: str | None = "e2e-default-pool") -> WebhookServer:
    """``tf-webhook serve`` as a user runs it (certificates from ``tf-certs``), registered with the API
    server through the shipped MutatingWebhookConfiguration, plus the PriorityClasses it assigns and a
    default GPUPool (none when ``default_pool`` is None)."""
    from kubernetes import client

    cert_dir = control_plane.workdir / "webhook-certs"
    run_console_script(
        "tf-certs", "generate", "--out-dir", cert_dir, "--dns", "localhost", "--ip", "127.0.0.1"
    )
    port = free_port()
    proc = control_plane.registry.start(
        "tf-webhook",
        [console_script("tf-webhook"), "serve", "--port", str(port), "--bind-address", "127.0.0.1",
         "--cert-dir", str(cert_dir), "--kubeconfig", str(control_plane.kubeconfig)],
        control_plane.log_dir,
    )
    wait_until(
        lambda: https_ready(f"https://127.0.0.1:{port}/readyz", cert_dir / "ca.crt", proc),
        60, interval=0.3, what="tf-webhook /readyz",
    )
    core = client.CoreV1Api(api_client)
    with contextlib.suppress(client.ApiException):  # 409: already there
        core.create_namespace({"metadata": {"name": PROJECT_NAMESPACE}})
    scheduling = client.SchedulingV1Api(api_client)
    for doc in load_yaml_docs(MANIFESTS / "priorityclasses.yaml"):
        with contextlib.suppress(client.ApiException):  # 409: already there (value is immutable)
            scheduling.create_priority_class(doc)
    admission = client.AdmissionregistrationV1Api(api_client)
    _create_or_replace(
        admission.create_mutating_webhook_configuration,
        admission.read_mutating_webhook_configuration,
        admission.replace_mutating_webhook_configuration,
        webhook_configuration(f"https://127.0.0.1:{port}/mutate"),
    )
    run_console_script(
        "tf-certs", "patch-webhook", "--name", WEBHOOK_CONFIG_NAME, "--ca-file", cert_dir / "ca.crt",
        "--kubeconfig", control_plane.kubeconfig,
    )
    install_admission_policies(api_client)
    if default_pool is not None:
        with contextlib.suppress(client.ApiException):  # 409: already there
            create_cluster_object(api_client, "gpupools", {
                "apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPUPool",
                "metadata": {"name": default_pool, "annotations": {DEFAULT_POOL_ANNOTATION: "true"}},
                "spec": {},
            })
        wait_for_webhook_pool(api_client, default_pool)
    return WebhookServer(proc, port, cert_dir, default_pool)


def stop_webhook(control_plane: ControlPlane, api_client: Any, server: WebhookServer) -> None:
    """Unregister (so later pods are not refused by a webhook that is gone) and stop."""
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(api_client)
    with contextlib.suppress(Exception):
        admission.delete_mutating_webhook_configuration(WEBHOOK_CONFIG_NAME)
    server.proc.stop()
    control_plane.registry.forget(server.proc)


class ExtenderRunner:
    """The one ``tf-extender serve`` on the session's extender port (the port kube-scheduler calls).

    ``ensure(**flags)`` starts it, or restarts it when it runs with other flags; a flag ``expansion_delay=1``
    becomes ``--expansion-delay 1``, ``True`` a bare flag. Tests that need particular flags ask for them;
    the next test that wants the defaults gets a restart. ``kill()`` simulates a crash (SIGKILL),
    ``restart()`` starts it again with the same flags."""

    DEFAULT_FLAGS: dict[str, Any] = {"log_level": "debug"}

    def __init__(self, cp: ControlPlane, port: int) -> None:
        self.cp = cp
        self.port = port
        self.proc: ManagedProcess | None = None
        self.flags: dict[str, Any] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, flags: dict[str, Any]) -> list[str]:
        argv = [str(console_script("tf-extender")), "serve", "--kubeconfig", str(self.cp.extender_kubeconfig),
                "--port", str(self.port)]
        for key, value in flags.items():
            if value is False or value is None:
                continue
            argv.append("--" + key.replace("_", "-"))
            if value is not True:
                argv.append(str(value))
        return argv

    def ensure(self, **flags: Any) -> ManagedProcess:
        wanted = {**self.DEFAULT_FLAGS, **flags}
        if self.proc is not None and self.proc.alive() and wanted == self.flags:
            return self.proc
        self.stop()
        return self._start(wanted)

    def _start(self, flags: dict[str, Any], timeout: float = 60) -> ManagedProcess:
        self.starts += 1
        proc = self.cp.registry.start("tf-extender", self.argv(flags), self.cp.log_dir)
        self.proc, self.flags = proc, flags
        wait_until(lambda: http_ready(f"{self.url}/readyz", proc), timeout, interval=0.2,
                       what="tf-extender /readyz")
        return proc

    def kill(self) -> None:
        """SIGKILL, no shutdown: what a crash or an OOM kill looks like to the scheduler."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.proc.wait(10)
        proc.stop()  # closes the log
        self.cp.registry.forget(proc)

    def restart(self, timeout: float = 60) -> ManagedProcess:
        flags = dict(self.flags or self.DEFAULT_FLAGS)
        self.stop()
        return self._start(flags, timeout)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.cp.registry.forget(self.proc)
        self.proc = None

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample on the extender's /metrics page, or None when absent."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            page = r.read().decode()
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def wait_node_allocated(self, node: str, vram_percent: float, timeout: float = 30) -> None:
        """Until the extender's picture of ``node`` is its GPUs with ``vram_percent`` of their VRAM allocated:
        the GPU objects and the pods holding them have reached its caches."""
        wait_until(
            lambda: self.metric("tf_extender_node_allocated_percent", node=node, resource="vram") is not None
            and abs(self.metric("tf_extender_node_allocated_percent", node=node, resource="vram")
                    - vram_percent) < 1e-6,
            timeout, what=f"the extender to see {node} at {vram_percent}% VRAM allocated",
        )
