"""Workload objects for the end-to-end tests: Deployments, Jobs and PodDisruptionBudgets of GPU pods.

The pods are created by kube-controller-manager's controllers (see ``start_controller_manager``), not by
the test; their template is a pod as a user writes it (``gpu_pod_body``), so the webhook mutates each one.
"""

from __future__ import annotations

import copy
from typing import Any

from .processes import wait_until


def _template(pod: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    template = copy.deepcopy(pod)
    meta = template.setdefault("metadata", {})
    meta.pop("name", None)
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    template.pop("apiVersion", None)
    template.pop("kind", None)
    return template


def deployment_body(name: str, pod: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    """A Deployment of ``replicas`` copies of ``pod`` (a body from ``gpu_pod_body``), selected by app=name."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _template(pod, labels),
        },
    }


def job_body(name: str, pod: dict[str, Any], parallelism: int = 1) -> dict[str, Any]:
    template = _template(pod, {"job": name})
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism, "backoffLimit": 0,
                 "template": template},
    }


def pdb_body(name: str, match_labels: dict[str, str], max_unavailable: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": match_labels}},
    }


def create_deployment(api_client: Any, namespace: str, body: dict[str, Any]) -> Any:
    from kubernetes import client

    return client.AppsV1Api(api_client).create_namespaced_deployment(namespace, body)


def create_job(api_client: Any, namespace: str, body: dict[str, Any]) -> Any:
    from kubernetes import client

    return client.BatchV1Api(api_client).create_namespaced_job(namespace, body)


def create_pdb(api_client: Any, namespace: str, body: dict[str, Any], timeout: float = 60) -> Any:
    """Create the PDB and wait until the disruption controller has computed its status for the pods there
    now (only then does the Eviction API allow evictions it covers)."""
    from kubernetes import client

    policy = client.PolicyV1Api(api_client)
    created = policy.create_namespaced_pod_disruption_budget(namespace, body)

    def observed() -> Any:
        pdb = policy.read_namespaced_pod_disruption_budget(body["metadata"]["name"], namespace)
        status = pdb.status
        if status is None or (status.observed_generation or 0) < (pdb.metadata.generation or 1):
            return None
        return pdb if status.expected_pods else None

    wait_until(observed, timeout, what=f"PDB {namespace}/{body['metadata']['name']} status")
    return created


def pods_of(api_client: Any, namespace: str, selector: str) -> list[Any]:
    """The pods matching ``selector`` that are not being deleted, by name."""
    from kubernetes import client

    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items
    return sorted((p for p in pods if p.metadata.deletion_timestamp is None), key=lambda p: p.metadata.name)


def wait_running(api_client: Any, namespace: str, selector: str, count: int,
                 timeout: float = 90) -> list[Any]:
    """Until exactly ``count`` live pods match ``selector``, all bound and Running; returns them."""

    def ready() -> list[Any] | None:
        pods = pods_of(api_client, namespace, selector)
        if len(pods) != count:
            return None
        if all(p.spec.node_name and p.status and p.status.phase == "Running" for p in pods):
            return pods
        return None

    return wait_until(ready, timeout, interval=0.3,
                          what=f"{count} Running pods {selector} in {namespace}")
