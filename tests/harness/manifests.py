"""The project's manifests as the harness applies them: CRDs (waited until served), a kustomization rendered
the way ``kustomize build`` does, the shipped scheduler and webhook configurations pointed at loopback.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.upstream import karpenter_crds_dir

from .processes import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
CRDS_DIR = MANIFESTS / "crds"
SCHEDULER_CONFIG = MANIFESTS / "scheduler" / "kube-scheduler-config.yaml"
ADMISSION_POLICY = MANIFESTS / "admission-policy.yaml"


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_crds(api_client, paths: Iterable[Path], timeout: float = 60) -> list[str]:
    """Create (or replace) CRDs and wait until each is Established. Returns the CRD names."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for path in paths:
        for doc in load_yaml_docs(Path(path)):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            names.append(name)
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                cur = ext.read_custom_resource_definition(name)
                doc["metadata"]["resourceVersion"] = cur.metadata.resource_version
                ext.replace_custom_resource_definition(name, doc)

    def established(name: str) -> bool:
        crd = ext.read_custom_resource_definition(name)
        return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))

    for name in names:
        wait_until(lambda name=name: established(name), timeout, what=f"CRD {name} Established")
    # discovery can lag Established by a moment
    custom = client.CustomObjectsApi(api_client)
    for path in paths:
        for doc in load_yaml_docs(Path(path)):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served", True))
            group, plural = spec["group"], spec["names"]["plural"]

            def served(group=group, version=version, plural=plural, cluster=spec["scope"] == "Cluster"):
                if cluster:
                    return custom.list_cluster_custom_object(group, version, plural, limit=1)
                return custom.list_custom_object_for_all_namespaces(group, version, plural, limit=1)

            wait_until(served, timeout, what=f"{spec['names']['plural']}.{spec['group']} served")
    return names


def project_crd_files() -> list[Path]:
    """The CRD files of manifests/crds/ (not its kustomization.yaml)."""
    return sorted(p for p in CRDS_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def karpenter_crd_files() -> list[Path]:
    """Karpenter's CRDs from the Karpenter module the suite builds (see tests/upstream.py)."""
    return sorted(karpenter_crds_dir().glob("*.yaml"))


def render_kustomization(directory: Path) -> list[dict]:
    """Render a kustomization the way ``kustomize build`` does for the features manifests/ uses:
    ``resources`` (files and nested kustomization directories) and ``configMapGenerator`` with ``files``
    (``key=path`` or ``path``), ``literals``, ``namespace``, ``options.labels/annotations`` and
    ``disableNameSuffixHash: true``, and ``images`` (name, newName, newTag). Anything else raises, so the
    renderer never silently diverges."""
    directory = Path(directory)
    kfile = next(
        (
            directory / n
            for n in ("kustomization.yaml", "kustomization.yml", "Kustomization")
            if (directory / n).exists()
        ),
        None,
    )
    if kfile is None:
        raise FileNotFoundError(f"no kustomization in {directory}")
    k = yaml.safe_load(kfile.read_text()) or {}
    supported = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "images"}
    unsupported = set(k) - supported
    if unsupported:
        raise NotImplementedError(f"{kfile}: unsupported kustomization fields {sorted(unsupported)}")
    out: list[dict] = []
    for res in k.get("resources", []):
        p = directory / res
        out.extend(render_kustomization(p) if p.is_dir() else load_yaml_docs(p))
    global_opts = k.get("generatorOptions") or {}
    for gen in k.get("configMapGenerator", []):
        opts = {**global_opts, **(gen.get("options") or {})}
        if not opts.get("disableNameSuffixHash"):
            raise NotImplementedError(
                f"{kfile}: configMapGenerator {gen['name']} needs disableNameSuffixHash: true"
            )
        data: dict[str, str] = {}
        for f in gen.get("files", []):
            key, _, rel = f.partition("=") if "=" in f else (Path(f).name, "", f)
            data[key] = (directory / rel).read_text()
        for lit in gen.get("literals", []):
            key, _, value = lit.partition("=")
            data[key] = value
        meta: dict[str, Any] = {"name": gen["name"]}
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        if opts.get("annotations"):
            meta["annotations"] = dict(opts["annotations"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    for image in k.get("images", []):  # name -> newName/newTag, on every container of every pod template
        for obj in out:
            pod_spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            for container in [*pod_spec.get("containers", []), *pod_spec.get("initContainers", [])]:
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return out


def scheduler_config(
    kubeconfig: Path, extender_url: str, source: Path = SCHEDULER_CONFIG, leader_elect: bool = False
) -> dict:
    """The shipped KubeSchedulerConfiguration pointed at the test cluster and a loopback extender."""
    cfg = yaml.safe_load(Path(source).read_text())
    cfg.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    cfg.setdefault("leaderElection", {})["leaderElect"] = leader_elect
    for ext in cfg.get("extenders", []):
        ext["urlPrefix"] = extender_url
    return cfg


def webhook_configuration(url: str, source: Path = MANIFESTS / "webhook.yaml") -> dict:
    """The shipped MutatingWebhookConfiguration with clientConfig pointed at ``url`` instead of the Service
    (rules, selectors, failurePolicy ... unchanged). The caBundle is left to ``tf-certs patch-webhook``."""
    docs = [d for d in load_yaml_docs(source) if d.get("kind") == "MutatingWebhookConfiguration"]
    if len(docs) != 1:
        raise ValueError(f"{source}: expected one MutatingWebhookConfiguration, found {len(docs)}")
    cfg = docs[0]
    for hook in cfg["webhooks"]:
        hook["clientConfig"] = {"url": url}
    return cfg


def create_or_replace(create, read, replace, body: dict) -> None:
    from kubernetes.client.rest import ApiException

    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        body["metadata"]["resourceVersion"] = read(body["metadata"]["name"]).metadata.resource_version
        replace(body["metadata"]["name"], body)
