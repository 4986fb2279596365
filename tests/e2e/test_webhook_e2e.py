"""The admission webhook behind the real API server: pods come out canonical, bad pods are refused.

The webhook runs as ``tf-webhook serve`` with a serving certificate from ``tf-certs``; the API server calls
it over TLS through the shipped MutatingWebhookConfiguration (see the ``webhook`` fixture).
"""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl

pytestmark = pytest.mark.e2e

TF = "tensor-fusion.ai/"


def test_opted_in_pod_is_stored_canonical_and_scheduled(api_client, gpu_cluster, webhook, make_pool,
                                                        make_node, make_gpu, namespace):
    pool = make_pool()
    node = make_node()
    make_gpu(f"{node}-gpu-0", node, pool=pool, tflops="100", vram="40Gi")
    body = cpl.gpu_pod_body("canonical", annotations={
        TF + "gpupool": pool,
        TF + "tflops-request": "15000m",  # non-canonical spellings
        TF + "tflops-limit": "20",
        TF + "vram-request": "4096Mi",
        TF + "vram-limit": "8Gi",
    })
    stored = client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)  # as stored, before binding
    ann = stored.metadata.annotations
    assert {k: v for k, v in ann.items() if k.startswith(TF)} == {
        TF + "gpupool": pool,
        TF + "tflops-request": "15",
        TF + "tflops-limit": "20",
        TF + "vram-request": "4Gi",
        TF + "vram-limit": "8Gi",
        TF + "gpu-count": "1",
        TF + "isolation": "soft",
        TF + "qos": "medium",
        TF + "autoscale": "false",
        TF + "autoscale-target": "all",
    }
    assert stored.metadata.labels == {
        TF + "enabled": "true", TF + "component": "worker", TF + "gpupool": pool,
        TF + "workload": "canonical",
    }
    assert stored.spec.scheduler_name == cpl.GPU_SCHEDULER_NAME
    limits = stored.spec.containers[0].resources.limits
    index_limits = {k: v for k, v in limits.items() if k.startswith(TF + "index_")}
    assert len(index_limits) == 1, limits
    (resource, quantity), = index_limits.items()
    assert resource in cpl.INDEX_RESOURCES and 1 <= int(quantity) <= 8
    assert stored.spec.containers[0].resources.requests[resource] == quantity
    assert any(t.key == TF + "used-by" and t.value == "tensor-fusion" and t.effect == "PreferNoSchedule"
               for t in stored.spec.tolerations)

    # ... and the GPU scheduler places it, recording the GPU it got
    bound = cpl.wait_for_pod_bound(api_client, namespace, "canonical", timeout=60)
    assert bound.spec.node_name == node
    assert cpl.gpu_ids_of(bound) == [f"{node}-gpu-0"]


def test_pod_without_a_pool_gets_the_default_pool(api_client, gpu_cluster, webhook, namespace):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, cpl.gpu_pod_body("defaulted", tflops="1", vram="1Gi"))
    stored = core.read_namespaced_pod("defaulted", namespace)
    assert stored.metadata.annotations[TF + "gpupool"] == webhook.default_pool
    assert stored.metadata.labels[TF + "gpupool"] == webhook.default_pool


def test_critical_pod_gets_the_critical_priority_class(api_client, gpu_cluster, webhook, namespace):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, cpl.gpu_pod_body("vip", tflops="1", vram="1Gi", qos="critical"))
    stored = core.read_namespaced_pod("vip", namespace)
    assert stored.spec.priority_class_name == "tensor-fusion-critical"
    assert stored.spec.priority == 1000000  # resolved by the API server's Priority admission


def replay_figures(webhook: cpl.WebhookServer) -> dict[str, float]:
    context = ssl.create_default_context(cafile=str(webhook.ca_file))
    with urllib.request.urlopen(f"{webhook.url}/metrics", timeout=5, context=context) as r:
        lines = r.read().decode().splitlines()
    samples = (line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples
            if name in ("tf_webhook_replayed_answers_total", "tf_webhook_replay_entries")}


def test_pods_of_one_template_are_reviewed_as_the_same_bytes_but_for_the_uid(api_client, gpu_cluster,
                                                                            webhook, namespace):
    """What webhook/replay.py relies on, checked against kube-apiserver: a pod created by generateName (as a
    ReplicaSet or Job creates them) gets its name after admission, so the pods of one template reach the
    webhook as one review's bytes but for request.uid, and the webhook keeps one replay entry for them."""
    core = client.CoreV1Api(api_client)
    before = replay_figures(webhook)
    body = cpl.gpu_pod_body("unused", tflops="1", vram="1Gi", labels={"app": "replicas"})
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "replica-"
    pods = [core.create_namespaced_pod(namespace, json.loads(json.dumps(body))) for _ in range(3)]
    after = replay_figures(webhook)
    assert after["tf_webhook_replay_entries"] == before["tf_webhook_replay_entries"] + 1  # on the 2nd
    # each pod its own index (answers are kept per index: replayed once an index comes round again)
    indexes = {tuple(sorted((k, v) for k, v in pod.spec.containers[0].resources.limits.items()
                            if k.startswith(TF + "index_"))) for pod in pods}
    assert len(indexes) == 3
    assert len({json.dumps(pod.metadata.annotations, sort_keys=True) for pod in pods}) == 1


def test_pod_not_opted_in_is_left_alone(api_client, gpu_cluster, webhook, namespace):
    body = cpl.gpu_pod_body("plain", tflops="abc")  # would be refused if the webhook looked at it
    del body["metadata"]["labels"][cpl.ENABLED_LABEL]
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, body)
    stored = core.read_namespaced_pod("plain", namespace)
    assert stored.metadata.annotations == {TF + "tflops-request": "abc", TF + "tflops-limit": "abc"}
    assert stored.spec.scheduler_name == "default-scheduler"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({TF + "tflops-request": "abc"}, [TF + "tflops-request", "abc"]),
        ({TF + "tflops-request": "20", TF + "tflops-limit": "10"}, [TF + "tflops-limit", "10", "20"]),
        ({TF + "gpu-count": "0"}, [TF + "gpu-count", "0"]),
        ({TF + "gpupool": "no-such-pool"}, [TF + "gpupool", "no-such-pool"]),
    ],
    ids=["malformed-quantity", "limit-below-request", "gpu-count-zero", "unknown-pool"],
)
def test_bad_pod_is_refused_with_the_webhooks_message(api_client, webhook, namespace, annotations, expected):
    body = cpl.gpu_pod_body("bad", annotations={TF + "vram-request": "1Gi", **annotations})
    with pytest.raises(ApiException) as caught:
        client.CoreV1Api(api_client).create_namespaced_pod(namespace, body)
    assert caught.value.status in (400, 403), caught.value.body  # a denial without a code is 403
    message = json.loads(caught.value.body)["message"]
    assert 'admission webhook "mutate.tensor-fusion.ai" denied the request' in message
    for part in expected:
        assert part in message, message
    with pytest.raises(ApiException) as gone:
        client.CoreV1Api(api_client).read_namespaced_pod("bad", namespace)
    assert gone.value.status == 404
