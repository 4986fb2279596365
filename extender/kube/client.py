"""Loading the API client, and raw JSON requests run off the event loop.

Objects are kept as plain API JSON (camelCase dicts) rather than the client's model classes: one
uniform shape for core objects and custom resources, and no costly model deserialisation.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes import client, config

ApiException = client.ApiException
T = TypeVar("T")

# Bounded so a burst of API calls cannot exhaust threads; long-lived watches use their own threads.
# Sized for a burst of binds (two API calls each) beside the long-lived watches; the connection pool
# matches, so a busy extender does not discard connections and reopen them over TLS.
_EXECUTOR = ThreadPoolExecutor(max_workers=32, thread_name_prefix="kube-api")
CONNECTION_POOL_SIZE = 64

DEFAULT_TIMEOUT = (5.0, 30.0)  # connect, read


class KubeConfigError(RuntimeError):
    """No usable Kubernetes configuration."""


def load_api_client(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """A client from ``kubeconfig``; when None, the in-cluster service account inside a pod, else the
    default kubeconfig ($KUBECONFIG or ~/.kube/config). ``context`` picks a kubeconfig context other than
    its current one (and always means a kubeconfig, never the in-cluster account)."""
    configuration = client.Configuration()
    try:
        if kubeconfig or context:
            _untyped(config.load_kube_config, config_file=kubeconfig, context=context,
                     client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            _untyped(config.load_incluster_config, client_configuration=configuration)
        else:
            _untyped(config.load_kube_config, client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as exc:
        source = kubeconfig or ("default kubeconfig" if context else
                                "in-cluster config or default kubeconfig")
        if context:
            source += f", context {context!r}"
        raise KubeConfigError(f"cannot load Kubernetes configuration ({source}): {exc}") from exc
    configuration.connection_pool_maxsize = CONNECTION_POOL_SIZE
    return client.ApiClient(configuration)


async def api_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking client call on the dedicated thread pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs))


def open_request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str | int | bool] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
) -> Any:
    """Send a request and return the unread urllib3 response (for streaming). Blocking.

    Raises ``ApiException`` for a non-2xx answer.
    """
    params = [(k, _query_value(v)) for k, v in (query or {}).items()]
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    # The REST layer JSON-encodes a dict body for every application/*json content type.
    serialized = api.param_serialize(
        method=method, resource_path=path, query_params=params, header_params=headers,
        body=body, auth_settings=["BearerToken"],
    )
    response: Any = api.call_api(*serialized, _request_timeout=timeout)
    if not 200 <= response.status <= 299:
        response.read()
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return response.response


def request_json(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str | int | bool] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
) -> Any:
    """Send a request and decode the JSON answer. Blocking; wrap in ``api_call``."""
    response = open_request(api, method, path, query=query, body=body, content_type=content_type,
                            timeout=timeout)
    try:
        data = response.data
    finally:
        response.release_conn()
    return json.loads(data) if data else None


def error_status(exc: BaseException) -> int | None:
    """The HTTP status of an API error, None for other errors."""
    return exc.status if isinstance(exc, ApiException) else None


def not_found(exc: BaseException) -> bool:
    """Whether an API call failed because the object, or its resource type, does not exist (404)."""
    return error_status(exc) == 404


async def get_or_none(api: client.ApiClient, path: str) -> dict[str, Any] | None:
    """GET one object's JSON; None when the API server answers 404 (any other error is raised)."""
    try:
        found = await api_call(request_json, api, "GET", path)
    except Exception as exc:
        if not_found(exc):
            return None
        raise
    return found if isinstance(found, dict) else None


def error_message(exc: BaseException) -> str:
    """A short, human message for any error raised by an API call."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "")["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        return f"HTTP {exc.status}: {message}"
    return f"{type(exc).__name__}: {exc}"


def cli_error(exc: BaseException, what: str = "") -> str:
    """One line for a command line user: the API server that cannot be reached, or the resource (``what``,
    such as ``gpupools.tensor-fusion.ai``) and the server's answer, or the file at fault."""
    from extender.common.cli import describe

    if isinstance(exc, ApiException):
        answer = error_message(exc)
        if exc.status == 404 and what:
            return f"the API server has no {what} ({answer}): is its CRD installed?"
        return f"{what}: {answer}" if what else f"the API server answered {answer}"
    return describe(exc)


def _query_value(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _untyped(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)
