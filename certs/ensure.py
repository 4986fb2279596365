"""``tf-certs ensure``: the webhook's certificates kept in the cluster, idempotently (the Helm chart's
hook Jobs run it before and after every install and upgrade).

- The CA lives in an Opaque Secret (``ca.crt``, ``ca.key``; default ``<secret>-ca``). It is reused while it
  has more than ``--renew-before-days`` left, so the webhook's ``caBundle`` does not change on upgrades.
- The serving pair lives in the ``kubernetes.io/tls`` Secret the webhook mounts (``tls.crt``, ``tls.key``,
  ``ca.crt``). It is reissued only when it is missing, not signed by the CA, lacks one of the DNS names,
  or expires within ``--renew-before-days``; the webhook reloads the files without a restart.
- With ``--webhook``, every webhook of that MutatingWebhookConfiguration gets the CA as ``caBundle``; a
  configuration that does not exist yet (the pre-install hook runs before the chart creates it) is
  skipped with a message, and the post-install hook sets it.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from certs import authority
from certs.authority import Authority, CertificateError

CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"


@dataclass(frozen=True)
class Plan:
    new_ca: bool
    new_leaf: bool
    reason: str


def _remaining(certificate: x509.Certificate, now: dt.datetime) -> dt.timedelta:
    return certificate.not_valid_after_utc - now


def leaf_problem(ca: Authority, cert_pem: bytes | None, dns_names: Sequence[str],
                 renew_before: dt.timedelta, now: dt.datetime) -> str | None:
    """Why the stored serving certificate must be reissued, or None when it can stay."""
    if not cert_pem:
        return "no serving certificate yet"
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "the stored serving certificate is not valid PEM"
    try:
        certificate.verify_directly_issued_by(ca.certificate)
    except (ValueError, TypeError, InvalidSignature):
        return "the serving certificate is not signed by the CA"
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        present = set(sans.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        present = set()
    missing = sorted(set(dns_names) - present)
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    if _remaining(certificate, now) < renew_before:
        return f"the serving certificate expires at {certificate.not_valid_after_utc.isoformat()}"
    return None


def load_stored_ca(data: dict[str, bytes], renew_before: dt.timedelta, now: dt.datetime) -> Authority | None:
    """The stored CA when it is usable for longer than ``renew_before``."""
    if CA_CERT_KEY not in data or CA_KEY_KEY not in data:
        return None
    try:
        ca = authority.load_ca(data[CA_CERT_KEY], data[CA_KEY_KEY])
    except CertificateError:
        return None
    return ca if _remaining(ca.certificate, now) >= renew_before else None


# --- I/O ------------------------------------------------------------------------------------------


def _decoded(secret: Any) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in ((secret.data if secret is not None else None) or {}).items()}


def _read_secret(core: Any, namespace: str, name: str) -> Any:
    from kubernetes import client

    try:
        return core.read_namespaced_secret(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _ca_secret(namespace: str, name: str, ca: Authority) -> Any:
    from kubernetes import client

    pem = ca.to_pem()
    return client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace,
                                     labels={"app.kubernetes.io/part-of": "tensor-fusion-extender"}),
        type="Opaque",
        data={CA_CERT_KEY: base64.b64encode(pem.cert).decode(),
              CA_KEY_KEY: base64.b64encode(pem.key).decode()})


def ensure(api: Any, *, namespace: str, secret: str, ca_secret: str, dns_names: Sequence[str],
           webhook: str | None, days: int, renew_before_days: int,
           now: dt.datetime | None = None) -> list[str]:
    """Bring the Secrets (and the webhook's caBundle) in line; returns what was done, one line each."""
    from kubernetes import client

    from certs import kube
    from certs.files import ServingBundle

    now = now or dt.datetime.now(dt.UTC)
    renew_before = dt.timedelta(days=renew_before_days)
    core = client.CoreV1Api(api)
    said: list[str] = []
    ca = load_stored_ca(_decoded(_read_secret(core, namespace, ca_secret)), renew_before, now)
    if ca is None:
        ca = authority.generate_ca()
        kube.apply_secret(api, namespace, ca_secret, _ca_secret(namespace, ca_secret, ca))
        said.append(f"generated a new CA in Secret {namespace}/{ca_secret}")
    else:
        said.append(f"reused the CA in Secret {namespace}/{ca_secret}")
    stored = _decoded(_read_secret(core, namespace, secret))
    problem = leaf_problem(ca, stored.get("tls.crt"), dns_names, renew_before, now)
    if problem is None and stored.get("ca.crt") != ca.cert_pem:
        problem = "the Secret's ca.crt is not the CA"
    if problem is not None:
        pair = authority.issue_serving_cert(ca, dns_names=list(dns_names), days=days)
        bundle = ServingBundle(ca.cert_pem, pair.cert, pair.key)
        outcome = kube.apply_tls_secret(api, namespace, secret, bundle)
        said.append(f"{outcome} Secret {namespace}/{secret} ({problem})")
    else:
        said.append(f"kept Secret {namespace}/{secret}: valid, names every DNS name")
    if webhook:
        admission = client.AdmissionregistrationV1Api(api)
        try:
            admission.read_mutating_webhook_configuration(webhook, _preload_content=False)
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            said.append(f"MutatingWebhookConfiguration {webhook} does not exist yet; caBundle left for later")
            return said
        changed = kube.patch_webhook_ca_bundle(api, webhook, ca.cert_pem)
        said.append(f"set caBundle on {changed} webhook(s) of {webhook}" if changed
                    else f"{webhook} already carries the CA")
    return said
