"""Smoke tests of the local control plane: API server, CRDs, kwok, and the shipped scheduler
configuration driving an extender (a stub here; the real extender is tested elsewhere)."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from tests import harness as cpl

pytestmark = pytest.mark.e2e


def _pod(
    name: str,
    scheduler: str,
    node_selector: dict | None = None,
    resources: dict | None = None,
    affinity: dict | None = None,
) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": node_selector or {},
            "affinity": affinity,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": resources or {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }


def test_apiserver_version_and_crds(control_plane, api_client):
    info = client.VersionApi(api_client).get_code()
    assert info.git_version == "v1.36.3"
    ext = client.ApiextensionsV1Api(api_client)
    names = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    assert {
        "gpus.tensor-fusion.ai",
        "gpupools.tensor-fusion.ai",
        "schedulingconfigtemplates.tensor-fusion.ai",
        "workloadprofiles.tensor-fusion.ai",
    } <= names


def test_gpu_status_subresource(api_client, make_node, make_gpu):
    node = make_node(kwok=False)
    gpu = make_gpu(f"{node}-gpu0", node, pool="pool-a", model="H100", tflops="989", vram="80Gi", index=0)
    got = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        "tensor-fusion.ai", "v1", "gpus", gpu["metadata"]["name"]
    )
    assert got["status"]["capacity"] == {"tflops": "989", "vram": "80Gi"}
    assert got["status"]["nodeSelector"] == {"kubernetes.io/hostname": node}
    assert got["metadata"]["labels"]["tensor-fusion.ai/gpupool"] == "pool-a"
    # status is a subresource: a plain update of the object cannot change it
    got["status"]["phase"] = "Pending"
    client.CustomObjectsApi(api_client).replace_cluster_custom_object(
        "tensor-fusion.ai", "v1", "gpus", node + "-gpu0", got
    )
    again = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        "tensor-fusion.ai", "v1", "gpus", node + "-gpu0"
    )
    assert again["status"]["phase"] == "Running"


def test_kwok_runs_bound_pods_and_finishes_deletion(api_client, kwok, make_node, namespace):
    core = client.CoreV1Api(api_client)
    node = make_node()
    # no scheduler serves this name: we bind by hand, as a scheduler would
    core.create_namespaced_pod(namespace, _pod("manual", "nobody"))
    cpl.bind_pod(api_client, namespace, "manual", node)
    pod = cpl.wait_for_pod_running(api_client, namespace, "manual", timeout=60)
    assert pod.spec.node_name == node
    assert pod.status.pod_ip
    core.delete_namespaced_pod("manual", namespace)  # default grace period: kwok must finish it
    cpl.wait_for_pod_gone(api_client, namespace, "manual", timeout=60)


def test_kwok_keeps_nodes_ready(api_client, kwok, make_node):
    node = make_node()
    got = client.CoreV1Api(api_client).read_node(node)
    ready = [c for c in got.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    assert got.status.allocatable["tensor-fusion.ai/index_f"] == cpl.DEFAULT_INDEX_CAPACITY


def test_plain_pod_of_gpu_profile_skips_the_extender(api_client, cluster, make_node, namespace):
    """managedResources: a tensor-fusion-scheduler pod without index_* requests never calls the extender,
    so it is placed even though nothing listens on the extender port."""
    label = {"e2e-group": uuid.uuid4().hex[:8]}
    node = make_node(labels=label)
    client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, _pod("plain", cpl.GPU_SCHEDULER_NAME, label)
    )
    pod = cpl.wait_for_pod_running(api_client, namespace, "plain", timeout=60)
    assert pod.spec.node_name == node


class _StubExtender:
    """A minimal scheduler extender: filter passes every node, prioritize gives ``favourite`` 10 and every
    other node 9, bind posts the Binding. Records every call."""

    def __init__(self, api_client, favourite: str):
        self.calls: list[tuple[str, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                verb = self.path.rsplit("/", 1)[-1]
                stub.calls.append((verb, body))
                lower = {k.lower(): v for k, v in body.items()}
                if verb == "filter":
                    out = {
                        "nodenames": lower.get("nodenames") or [],
                        "failedNodes": {},
                        "failedAndUnresolvableNodes": {},
                        "error": "",
                    }
                elif verb == "prioritize":
                    out = [
                        {"host": n, "score": 10 if n == favourite else 9}
                        for n in lower.get("nodenames") or []
                    ]
                elif verb == "bind":
                    try:
                        cpl.bind_pod(api_client, lower["podnamespace"], lower["podname"], lower["node"])
                        out = {"error": ""}
                    except Exception as exc:
                        out = {"error": str(exc)}
                else:
                    out = {"error": f"unexpected verb {verb}"}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/scheduler"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_shipped_scheduler_config_drives_an_extender(
    control_plane, api_client, e2e_binaries, kwok, make_node, namespace
):
    """The shipped KubeSchedulerConfiguration (under another profile name, against a stub extender):
    filter/prioritize/bind are called with node names only (nodeCacheCapable), index_* are ignored by the
    in-tree fit check, and the extender's first choice wins against in-tree scoring that prefers another
    node."""
    group = {"e2e-group": uuid.uuid4().hex[:8]}
    # the in-tree plugins prefer `liked`: `favourite` carries a PreferNoSchedule taint and the pod prefers
    # `liked` by node affinity. The extender prefers `favourite` by one point.
    favourite = make_node(
        labels={**group, "pick": "favourite"},
        taints=[{"key": "e2e/avoid", "value": "x", "effect": "PreferNoSchedule"}],
    )
    liked = make_node(labels={**group, "pick": "liked"})
    stub = _StubExtender(api_client, favourite)
    profile = f"tf-smoke-{group['e2e-group']}"
    cfg = cpl.scheduler_config(control_plane.kubeconfig, stub.url)
    cfg["profiles"][0]["schedulerName"] = profile
    sched = cpl.start_scheduler(
        control_plane, e2e_binaries["kube-scheduler"], stub.url, name=f"kube-scheduler-{profile}", config=cfg
    )
    try:
        affinity = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchExpressions": [{"key": "pick", "operator": "In", "values": ["liked"]}]
                        },
                    }
                ]
            }
        }
        # far more than the node's allocatable 1024: proves ignoredByScheduler
        res = {"requests": {"cpu": "100m"}, "limits": {"tensor-fusion.ai/index_3": "5000"}}
        core = client.CoreV1Api(api_client)
        core.create_namespaced_pod(namespace, _pod("gpu", profile, group, res, affinity))
        pod = cpl.wait_for_pod_running(api_client, namespace, "gpu", timeout=60)
        assert pod.spec.node_name == favourite
        verbs = [v for v, _ in stub.calls]
        assert {"filter", "prioritize", "bind"} <= set(verbs), verbs
        filter_args = next(b for v, b in stub.calls if v == "filter")
        lower = {k.lower(): v for k, v in filter_args.items()}
        assert sorted(lower["nodenames"]) == sorted([favourite, liked])
        assert not lower.get("nodes")

        # a pod without index_* requests is not the extender's business
        before = len(stub.calls)
        core.create_namespaced_pod(namespace, _pod("plain", profile, group, None, affinity))
        pod = cpl.wait_for_pod_running(api_client, namespace, "plain", timeout=60)
        assert pod.spec.node_name == liked  # in-tree scoring alone
        assert len(stub.calls) == before
    finally:
        sched.stop()
        cpl.PROCESSES.forget(sched)
        stub.close()


def test_unreachable_extender_keeps_gpu_pod_pending(api_client, cluster, extender_url, make_node, namespace):
    """With nothing listening on the extender port, a GPU pod is not placed and the scheduler says why.
    (Skipped once the real extender is plugged into ``extender_port``.)"""
    import urllib.request

    try:
        urllib.request.urlopen(extender_url.rsplit("/", 1)[0] + "/", timeout=1)
        pytest.skip("an extender is listening on extender_port")
    except Exception as exc:
        if "refused" not in str(exc).lower():
            pytest.skip(f"extender port answers: {exc}")
    group = {"e2e-group": uuid.uuid4().hex[:8]}
    make_node(labels=group)
    res = {"requests": {"cpu": "100m"}, "limits": {"tensor-fusion.ai/index_0": "1"}}
    client.CoreV1Api(api_client).create_namespaced_pod(
        namespace, _pod("gpu", cpl.GPU_SCHEDULER_NAME, group, res)
    )
    msg = cpl.wait_until(
        lambda: cpl.scheduling_failure(api_client, namespace, "gpu"), 60, what="PodScheduled=False"
    )
    assert extender_url.split("//")[1].split("/")[0] in msg or "extender" in msg.lower(), msg
