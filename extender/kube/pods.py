"""The pod writes of the extender (annotate, bind, delete), async and as raw JSON.

Kept behind a small protocol so the binder and the preemptor can be tested with a fake.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from kubernetes import client

from extender.kube.client import api_call, request_json
from extender.kube.resources import PODS, object_path

# Each call must end well inside the scheduler's 5 s extender timeout.
WRITE_TIMEOUT = (1.0, 2.0)


class PodApi(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def merge_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]: ...

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    async def delete(self, namespace: str, name: str, uid: str) -> None: ...


class KubePodApi:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call("GET", object_path(PODS, name, namespace)))

    async def merge_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call("PATCH", object_path(PODS, name, namespace), patch,
                                                     "application/merge-patch+json"))

    async def json_patch(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call("PATCH", object_path(PODS, name, namespace), ops,
                                                     "application/json-patch+json"))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1", "kind": "Binding",
            # The uid makes the API server refuse a pod of the same name created meanwhile.
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", object_path(PODS, name, namespace, "binding"), body)

    async def delete(self, namespace: str, name: str, uid: str) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call("DELETE", object_path(PODS, name, namespace), body)

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> Any:
        return await api_call(request_json, self.api_client, method, path, body=body,
                              content_type=content_type, timeout=WRITE_TIMEOUT)
