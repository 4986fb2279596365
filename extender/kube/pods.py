"""The pod writes of the extender (label, bind, index, delete, evict), async and as raw JSON.

Requests go out on the event loop through ``AsyncKube`` (one keep-alive connection pool), never on a
thread pool. Kept behind a small protocol so the binder and the preemptor can be tested with a fake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

from extender.kube.aio import AsyncKube
from extender.kube.resources import PODS, object_path

# One request's limit once sent (waiting for a connection is not counted). A slow but healthy API server
# answers well inside it; a request that takes longer has an unknown outcome, which the binder resolves by
# asking again (see extender/binder.py), adding load: so not shorter than a busy API server needs.
REQUEST_TIMEOUT = 20.0


class PodApi(Protocol):
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def merge_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]: ...

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str]) -> None: ...

    async def delete(self, namespace: str, name: str, uid: str) -> None: ...

    async def evict(self, namespace: str, name: str, uid: str) -> None: ...


def binding_body(name: str, namespace: str, uid: str, node: str,
                 annotations: Mapping[str, str]) -> dict[str, Any]:
    """A Binding that sets the node and, in the same write, the pod's annotations: kube-apiserver copies
    a Binding's ``metadata.annotations`` onto the pod (pod storage, ``setPodNodeAndMetadata``)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                # the uid makes the API server refuse a pod of the same name created meanwhile
                                "uid": uid}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


class KubePodApi:
    def __init__(self, kube: AsyncKube, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.kube = kube
        self.timeout = timeout

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call("GET", object_path(PODS, name, namespace)))

    async def merge_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], await self._call("PATCH", object_path(PODS, name, namespace), patch,
                                                     "application/merge-patch+json"))

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str]) -> None:
        await self._call("POST", object_path(PODS, name, namespace, "binding"),
                         binding_body(name, namespace, uid, node, annotations))

    async def delete(self, namespace: str, name: str, uid: str) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call("DELETE", object_path(PODS, name, namespace), body)

    async def evict(self, namespace: str, name: str, uid: str) -> None:
        """Through the Eviction API, so that the API server enforces PodDisruptionBudgets (429 when one
        does not allow it); the uid keeps a new pod of the same name from being evicted in its place."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"preconditions": {"uid": uid}}}
        await self._call("POST", object_path(PODS, name, namespace, "eviction"), body)

    async def _call(self, method: str, path: str, body: Any = None,
                    content_type: str = "application/json") -> Any:
        return await self.kube.request(method, path, body=body, content_type=content_type,
                                       timeout=self.timeout)
