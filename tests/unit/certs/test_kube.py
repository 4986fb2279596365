"""The TLS Secret and the webhook caBundle: pure request bodies, and the requests the official client sends
(checked against a small fake API server; the real kube-apiserver run is in the e2e suite)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from kubernetes import client

from certs import authority, files, kube
from certs.authority import CertificateError
from certs.cli import main

WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@pytest.fixture(scope="module")
def ca() -> authority.Authority:
    return authority.generate_ca()


@pytest.fixture(scope="module")
def bundle(ca: authority.Authority) -> files.ServingBundle:
    pair = authority.issue_serving_cert(ca, dns_names=["tf-webhook.tf.svc"])
    return files.ServingBundle(ca_cert=ca.cert_pem, cert=pair.cert, key=pair.key)


def _webhook_configuration(*bundles: str | None) -> dict[str, Any]:
    hooks = []
    for index, value in enumerate(bundles):
        config: dict[str, Any] = {"service": {"namespace": "tf", "name": "tf-webhook", "path": "/mutate"}}
        if value is not None:
            config["caBundle"] = value
        hooks.append(
            {
                "name": f"hook{index}.tensor-fusion.ai",
                "clientConfig": config,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
            }
        )
    return {"metadata": {"name": "tensor-fusion"}, "webhooks": hooks}


# --- pure request bodies ---------------------------------------------------------------------------------


def test_tls_secret_manifest(bundle: files.ServingBundle) -> None:
    manifest = kube.tls_secret_manifest("tf", "tf-webhook-tls", bundle)
    assert manifest["type"] == "kubernetes.io/tls"
    assert manifest["metadata"]["name"] == "tf-webhook-tls"
    assert manifest["metadata"]["namespace"] == "tf"
    decoded = {key: base64.b64decode(value) for key, value in manifest["data"].items()}
    assert decoded == {"tls.crt": bundle.cert, "tls.key": bundle.key, "ca.crt": bundle.ca_cert}


def test_ca_bundle_patch_sets_every_webhook_guarded_by_name(ca: authority.Authority) -> None:
    value = base64.b64encode(ca.cert_pem).decode()
    patch = kube.ca_bundle_patch(_webhook_configuration(None, "b2xk"), ca.cert_pem)
    assert patch == [
        {"op": "test", "path": "/webhooks/0/name", "value": "hook0.tensor-fusion.ai"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": value},
        {"op": "test", "path": "/webhooks/1/name", "value": "hook1.tensor-fusion.ai"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": value},
    ]


def test_ca_bundle_patch_skips_webhooks_already_up_to_date(ca: authority.Authority) -> None:
    value = base64.b64encode(ca.cert_pem).decode()
    assert kube.ca_bundle_patch(_webhook_configuration(value, value), ca.cert_pem) == []
    patch = kube.ca_bundle_patch(_webhook_configuration(value, None), ca.cert_pem)
    assert [op["path"] for op in patch] == ["/webhooks/1/name", "/webhooks/1/clientConfig/caBundle"]


def test_ca_bundle_patch_refuses_bad_input(ca: authority.Authority) -> None:
    with pytest.raises(CertificateError, match="tensor-fusion has no webhooks"):
        kube.ca_bundle_patch({"metadata": {"name": "tensor-fusion"}, "webhooks": []}, ca.cert_pem)
    with pytest.raises(CertificateError, match="not PEM certificates"):
        kube.ca_bundle_patch(_webhook_configuration(None), b"not pem")


# --- requests through the official client, against a fake API server -------------------------------------


@dataclass
class FakeApi:
    url: str = ""
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    webhook_configuration: dict[str, Any] = field(default_factory=dict)
    requests: list[tuple[str, str, str, Any]] = field(default_factory=list)
    forbid: bool = False


@pytest_asyncio.fixture
async def fake_api() -> AsyncIterator[FakeApi]:
    state = FakeApi()

    async def record(request: web.Request) -> Any:
        body = json.loads(await request.text()) if request.can_read_body else None
        state.requests.append((request.method, request.path, request.content_type, body))
        return body

    async def create_secret(request: web.Request) -> web.Response:
        body = await record(request)
        if state.forbid:
            return _status(403, "secrets is forbidden: User cannot create")
        name = body["metadata"]["name"]
        if name in state.secrets:
            return _status(409, f'secrets "{name}" already exists')
        state.secrets[name] = body
        return web.json_response(body, status=201)

    async def replace_secret(request: web.Request) -> web.Response:
        body = await record(request)
        state.secrets[request.match_info["name"]] = body
        return web.json_response(body)

    async def read_webhooks(request: web.Request) -> web.Response:
        await record(request)
        if not state.webhook_configuration:
            name = request.match_info["name"]
            return _status(
                404, f'mutatingwebhookconfigurations.admissionregistration.k8s.io "{name}" not found'
            )
        return web.json_response(state.webhook_configuration)

    async def patch_webhooks(request: web.Request) -> web.Response:
        for op in await record(request):
            if op["op"] == "add":
                _, _, index, _, key = op["path"].split("/")
                state.webhook_configuration["webhooks"][int(index)]["clientConfig"][key] = op["value"]
        return web.json_response(state.webhook_configuration)

    app = web.Application()
    app.router.add_post("/api/v1/namespaces/{ns}/secrets", create_secret)
    app.router.add_put("/api/v1/namespaces/{ns}/secrets/{name}", replace_secret)
    app.router.add_get(WEBHOOKS + "/{name}", read_webhooks)
    app.router.add_patch(WEBHOOKS + "/{name}", patch_webhooks)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


def _status(code: int, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
    return web.json_response(body, status=code)


def _kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _api(url: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


@pytest.mark.asyncio
async def test_secret_is_created_then_replaced(fake_api: FakeApi, bundle: files.ServingBundle) -> None:
    api = _api(fake_api.url)
    first = await asyncio.to_thread(kube.apply_tls_secret, api, "tf", "tf-webhook-tls", bundle)
    second = await asyncio.to_thread(kube.apply_tls_secret, api, "tf", "tf-webhook-tls", bundle)
    assert (first, second) == ("created", "replaced")
    methods = [(method, path) for method, path, _, _ in fake_api.requests]
    assert methods == [
        ("POST", "/api/v1/namespaces/tf/secrets"),
        ("POST", "/api/v1/namespaces/tf/secrets"),
        ("PUT", "/api/v1/namespaces/tf/secrets/tf-webhook-tls"),
    ]
    stored = fake_api.secrets["tf-webhook-tls"]
    assert stored == kube.tls_secret_manifest("tf", "tf-webhook-tls", bundle)


@pytest.mark.asyncio
async def test_secret_error_names_the_object_and_reason(
    fake_api: FakeApi, bundle: files.ServingBundle
) -> None:
    fake_api.forbid = True
    with pytest.raises(kube.KubeError, match=r"creating Secret tf/s: HTTP 403: secrets is forbidden"):
        await asyncio.to_thread(kube.apply_tls_secret, _api(fake_api.url), "tf", "s", bundle)


@pytest.mark.asyncio
async def test_ca_bundle_is_sent_as_a_json_patch(fake_api: FakeApi, ca: authority.Authority) -> None:
    fake_api.webhook_configuration = _webhook_configuration(None, None)
    api = _api(fake_api.url)
    assert await asyncio.to_thread(kube.patch_webhook_ca_bundle, api, "tensor-fusion", ca.cert_pem) == 2
    method, path, content_type, body = fake_api.requests[-1]
    assert (method, path, content_type) == (
        "PATCH",
        WEBHOOKS + "/tensor-fusion",
        "application/json-patch+json",
    )
    assert body == kube.ca_bundle_patch(_webhook_configuration(None, None), ca.cert_pem)
    # Already up to date: read, no write.
    assert await asyncio.to_thread(kube.patch_webhook_ca_bundle, api, "tensor-fusion", ca.cert_pem) == 0
    assert fake_api.requests[-1][0] == "GET"


@pytest.mark.asyncio
async def test_missing_webhook_configuration_is_reported(fake_api: FakeApi, ca: authority.Authority) -> None:
    with pytest.raises(
        kube.KubeError, match=r"reading MutatingWebhookConfiguration nope: HTTP 404: .* not found"
    ):
        await asyncio.to_thread(kube.patch_webhook_ca_bundle, _api(fake_api.url), "nope", ca.cert_pem)


@pytest.mark.asyncio
async def test_cli_secret_and_patch_webhook_with_kubeconfig(
    fake_api: FakeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(_kubeconfig(tmp_path, fake_api.url))
    cert_dir = tmp_path / "certs"
    assert main(["generate", "--out-dir", str(cert_dir), "--dns", "tf-webhook.tf.svc"]) == 0
    fake_api.webhook_configuration = _webhook_configuration(None)

    secret = ["secret", "--namespace", "tf", "--name", "tls", "--cert-dir", str(cert_dir)]
    assert await asyncio.to_thread(main, [*secret, "--kubeconfig", kubeconfig]) == 0
    patch = ["patch-webhook", "--name", "tensor-fusion", "--ca-file", str(cert_dir / "ca.crt")]
    assert await asyncio.to_thread(main, [*patch, "--kubeconfig", kubeconfig]) == 0

    out = capsys.readouterr().out
    assert "created Secret tf/tls" in out
    assert "set caBundle on 1 webhook(s)" in out
    expected = base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode()
    assert fake_api.webhook_configuration["webhooks"][0]["clientConfig"]["caBundle"] == expected


def test_cli_reports_a_bad_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out-dir", str(tmp_path), "--dns", "svc"]) == 0
    (tmp_path / "kubeconfig").write_text("not: [a kubeconfig")
    argv = ["secret", "--namespace", "n", "--name", "s", "--cert-dir", str(tmp_path)]
    assert main([*argv, "--kubeconfig", str(tmp_path / "kubeconfig")]) == 1
    assert "cannot load Kubernetes configuration" in capsys.readouterr().err
