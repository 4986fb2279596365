"""The Kubernetes side of certificates: the TLS Secret and the webhook ``caBundle``.

Request bodies are built by pure functions (``tls_secret_manifest``, ``ca_bundle_patch``); the functions
taking an ``ApiClient`` only send them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

import yaml
from cryptography import x509
from kubernetes import client, config

from certs.authority import CertificateError
from certs.files import CA_CERT, TLS_CERT, TLS_KEY, ServingBundle

TLS_SECRET_TYPE = "kubernetes.io/tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tf-certs"}


class KubeError(RuntimeError):
    """An API request failed; the message names the object and the server's reason."""


def tls_secret_manifest(namespace: str, name: str, bundle: ServingBundle) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret carrying ``tls.crt``, ``tls.key`` and ``ca.crt``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "type": TLS_SECRET_TYPE,
        "data": {
            TLS_CERT: _b64(bundle.cert),
            TLS_KEY: _b64(bundle.key),
            CA_CERT: _b64(bundle.ca_cert),
        },
    }


def ca_bundle_value(ca_pem: bytes) -> str:
    """The base64 text of a PEM CA bundle, after checking that it holds at least one certificate."""
    try:
        certificates = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise CertificateError(f"CA bundle is not PEM certificates: {exc}") from exc
    if not certificates:
        raise CertificateError("CA bundle holds no certificate")
    return _b64(ca_pem)


def ca_bundle_patch(webhook_configuration: Mapping[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """An RFC 6902 patch setting ``clientConfig.caBundle`` of every webhook of the configuration.

    ``webhook_configuration`` is the object as read (JSON form). Each change is guarded by a ``test`` of the
    webhook's name, so the patch fails instead of touching the wrong entry if the list changed meanwhile.
    Returns an empty list when every webhook already carries the bundle.
    """
    name = webhook_configuration.get("metadata", {}).get("name", "<unnamed>")
    webhooks = webhook_configuration.get("webhooks") or []
    if not webhooks:
        raise CertificateError(f"MutatingWebhookConfiguration {name} has no webhooks to patch")
    value = ca_bundle_value(ca_pem)
    patch: list[dict[str, Any]] = []
    for index, webhook in enumerate(webhooks):
        if (webhook.get("clientConfig") or {}).get("caBundle") == value:
            continue
        patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
        if webhook.get("clientConfig") is None:
            patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": {}})
        patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": value})
    return patch


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``, else the in-cluster service account, else the default kubeconfig.
    ``context`` picks a kubeconfig context other than the current one (and always means a kubeconfig)."""
    try:
        if kubeconfig or context:
            return cast(client.ApiClient, _call(config.new_client_from_config, config_file=kubeconfig,
                                                context=context))
        try:
            configuration = client.Configuration()
            _call(config.load_incluster_config, client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            return cast(client.ApiClient, _call(config.new_client_from_config))
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        source = kubeconfig or ("default kubeconfig" if context
                                else "in-cluster config or default kubeconfig")
        if context:
            source += f", context {context!r}"
        raise KubeError(f"cannot load Kubernetes configuration ({source}): {exc}") from exc


def apply_tls_secret(api: client.ApiClient, namespace: str, name: str, bundle: ServingBundle) -> str:
    """Create the TLS Secret, or replace it when it exists. Returns ``"created"`` or ``"replaced"``."""
    manifest = tls_secret_manifest(namespace, name, bundle)
    body = client.V1Secret(
        api_version=manifest["apiVersion"],
        kind=manifest["kind"],
        metadata=client.V1ObjectMeta(**manifest["metadata"]),
        type=manifest["type"],
        data=manifest["data"],
    )
    return apply_secret(api, namespace, name, body)


def apply_secret(api: client.ApiClient, namespace: str, name: str, body: client.V1Secret) -> str:
    """Create the Secret, or replace it when it exists. Returns ``"created"`` or ``"replaced"``."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_secret(namespace, body)
        return "created"
    except client.ApiException as exc:
        if exc.status != 409:
            raise KubeError(f"creating Secret {namespace}/{name}: {_reason(exc)}") from exc
    try:
        core.replace_namespaced_secret(name, namespace, body)
    except client.ApiException as exc:
        raise KubeError(f"replacing Secret {namespace}/{name}: {_reason(exc)}") from exc
    return "replaced"


def patch_webhook_ca_bundle(api: client.ApiClient, config_name: str, ca_pem: bytes) -> int:
    """Set the ``caBundle`` of every webhook in a MutatingWebhookConfiguration.

    Returns how many webhooks changed (0 when all already carried the bundle).
    """
    admission = client.AdmissionregistrationV1Api(api)
    try:
        # Read the raw JSON: the patch paths must use the API's field names, not the client's.
        response = _call(admission.read_mutating_webhook_configuration, config_name, _preload_content=False)
        current = json.loads(response.data)
    except client.ApiException as exc:
        raise KubeError(f"reading MutatingWebhookConfiguration {config_name}: {_reason(exc)}") from exc
    patch = ca_bundle_patch(current, ca_pem)
    if not patch:
        return 0
    try:
        # The answer is not needed; skipping its deserialisation keeps newer server fields harmless.
        _call(admission.patch_mutating_webhook_configuration, config_name, patch, _preload_content=False)
    except client.ApiException as exc:
        raise KubeError(f"patching MutatingWebhookConfiguration {config_name}: {_reason(exc)}") from exc
    return sum(1 for op in patch if op["path"].endswith("/caBundle"))


def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a function of the client that has no type annotations (they vary across client versions)."""
    return function(*args, **kwargs)


def _reason(exc: client.ApiException) -> str:
    try:
        message = json.loads(exc.body or "")["message"]
    except (ValueError, KeyError, TypeError):
        message = exc.reason
    return f"HTTP {exc.status}: {message}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
