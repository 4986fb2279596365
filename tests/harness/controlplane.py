"""etcd and kube-apiserver on loopback, with their PKI and kubeconfigs for the identities tests act as.

``ControlPlane(workdir, binaries).start()`` blocks until kube-apiserver's /readyz is ok. The other
components (scheduler, controller-manager, kwok, the project's services) start against it from
``components``.
"""

from __future__ import annotations

import json
import shutil
import ssl
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .pki import CertPair, make_ca, make_leaf, make_service_account_key
from .processes import PROCESSES, ManagedProcess, ProcessRegistry, free_port, tail, wait_until

PROJECT_NAMESPACE = "tensor-fusion-sys"
EXTENDER_USER = f"system:serviceaccount:{PROJECT_NAMESPACE}:tensor-fusion-scheduler"
_EXTENDER_KUBECONFIGS: dict[str, Path] = {}  # API server URL -> kubeconfig of the extender's identity
_EXTENDER_CLIENTS: dict[str, Any] = {}


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on loopback. ``start()`` blocks until /readyz is ok."""

    workdir: Path
    binaries: dict[str, Path]
    registry: ProcessRegistry = field(default_factory=lambda: PROCESSES)
    # more kube-apiserver flags, e.g. --admission-control-config-file for a managed cluster's admission rules
    apiserver_args: list[str] = field(default_factory=list)

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
                *self.apiserver_args,
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


def as_extender(api_client: Any) -> Any:
    """An API client of the same API server authenticating as the extender (see ControlPlane.start): what
    a test that plays the extender's bind by hand writes with, since only the extender may write
    allocations (manifests/admission-policy.yaml)."""
    from kubernetes import config

    host = api_client.configuration.host
    if host not in _EXTENDER_CLIENTS:
        _EXTENDER_CLIENTS[host] = config.new_client_from_config(config_file=str(_EXTENDER_KUBECONFIGS[host]))
    return _EXTENDER_CLIENTS[host]
