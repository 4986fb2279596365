"""The external scaler of ``spec.autoScalingConfig.externalScaler``: one POST per evaluation, as
TensorFusion makes it.

The body is ``{"workloadName", "namespace", "currentResources"}``; the answer TensorFusion's
``ExternalScalerResponse`` (``needScaleUp``, ``needScaleDown``, ``reason``, ``recommendedResources``). With
``apiKeySecretRef`` the request carries ``Authorization: Bearer <key>``, the key read from the Secret's
``apiKey``, ``token`` or ``key`` entry. The Secret must be in the workload's namespace (another namespace is
refused, so a workload cannot borrow another namespace's credentials), and reading it needs a Role granting
the extender ``get`` on it there (not in the default RBAC). Any failure is an error string for the
workload's condition, never a resize.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from extender.autoscaling.config import ExternalScaler
from extender.kube.client import error_message

TIMEOUT_SECONDS = 10.0  # TensorFusion's
KEY_FIELDS = ("apiKey", "token", "key")

SecretReader = Callable[[str, str], Awaitable[dict[str, Any] | None]]


async def ask(scaler: ExternalScaler, namespace: str, workload: str, current: dict[str, Any],
              read_secret: SecretReader) -> tuple[dict[str, Any] | None, str]:
    """The scaler's answer, or None and why not."""
    headers = {"Content-Type": "application/json"}
    if scaler.secret_name:
        if scaler.secret_namespace and scaler.secret_namespace != namespace:
            return None, (f"apiKeySecretRef: the Secret must be in the workload's namespace {namespace!r}, "
                          f"not {scaler.secret_namespace!r}")
        try:
            secret = await read_secret(namespace, scaler.secret_name)
        except Exception as exc:
            return None, f"apiKeySecretRef: cannot read Secret {namespace}/{scaler.secret_name}: " \
                         f"{error_message(exc)}"
        if secret is None:
            return None, f"apiKeySecretRef: Secret {namespace}/{scaler.secret_name} not found"
        data = secret.get("data") or {}
        field = next((f for f in KEY_FIELDS if f in data), None)
        if field is None:
            return None, (f"apiKeySecretRef: Secret {namespace}/{scaler.secret_name} has none of "
                          f"{', '.join(KEY_FIELDS)}")
        try:
            key = base64.b64decode(str(data[field]), validate=True).decode()
        except (ValueError, UnicodeDecodeError):
            return None, f"apiKeySecretRef: Secret {namespace}/{scaler.secret_name}: {field} is not base64"
        headers["Authorization"] = f"Bearer {key}"
    body = {"workloadName": workload, "namespace": namespace, "currentResources": current}
    try:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session, \
                session.post(scaler.url, data=json.dumps(body), headers=headers) as answer:
            text = await answer.text()
            if answer.status != 200:
                return None, f"url: {scaler.url} answered {answer.status}: {text[:200]}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        return None, f"url: {scaler.url}: {type(exc).__name__}: {exc}"
    try:
        parsed = json.loads(text)
    except ValueError:
        return None, f"url: {scaler.url} answered something other than JSON"
    if not isinstance(parsed, dict):
        return None, f"url: {scaler.url} answered JSON that is not an object"
    return parsed, ""


