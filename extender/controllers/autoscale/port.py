"""The workload autoscaler's Kubernetes side: TensorFusionWorkloads and WorkloadProfiles through the
extender's async client. Without the TensorFusionWorkload CRD the autoscaler still runs, keeping the workload
in memory only (said once in the log)."""

from __future__ import annotations

import logging
from typing import Any

from extender.kube import resources
from extender.kube.aio import AsyncKube
from extender.kube.client import not_found

log = logging.getLogger(__name__)
MERGE = "application/merge-patch+json"
SECRETS = resources.Resource("", "v1", "secrets", "Secret", True)  # externalScaler.apiKeySecretRef only


class KubeWorkloadApi:
    def __init__(self, kube: AsyncKube) -> None:
        self.kube = kube
        self._missing_said = False

    def _missing(self) -> None:
        if not self._missing_said:
            log.warning("the TensorFusionWorkload CRD is not installed: workloads are kept in memory only")
            self._missing_said = True

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            path = resources.object_path(resources.TENSOR_FUSION_WORKLOADS, name, namespace)
            found: dict[str, Any] = await self.kube.request("GET", path, timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                return None
            raise
        return found

    async def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            created: dict[str, Any] = await self.kube.request(
                "POST", resources.collection_path(resources.TENSOR_FUSION_WORKLOADS, namespace), body=body,
                timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                self._missing()
                return body
            raise
        return created

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = resources.object_path(resources.TENSOR_FUSION_WORKLOADS, name, namespace, subresource="status")
        try:
            await self.kube.request("PATCH", path, body={"status": status}, content_type=MERGE, timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                self._missing()
                return
            raise

    async def profile(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.kube.request(
                "GET", resources.object_path(resources.WORKLOAD_PROFILES, name, namespace), timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                return None
            raise
        return found

    async def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            path = resources.object_path(SECRETS, name, namespace)
            found: dict[str, Any] = await self.kube.request("GET", path, timeout=10.0)
        except Exception as exc:
            if not_found(exc):
                return None
            raise
        return found
