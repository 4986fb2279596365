"""Which computingVendor a Provisioned pool, and a GPUNodeClaim, go through (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from extender.cloud.vendor import parse_vendor
from extender.common.labels import COMPUTING_VENDOR, MANAGED_BY
from extender.controllers.capacity.vendors import (
    VendorChoice,
    claim_vendor,
    owner_cluster,
    pool_vendor,
    recorded_text,
    recorded_vendor,
    vendor_key,
)


def raw_vendor(region: str = "us-east-1", **params: Any) -> dict[str, Any]:
    return {"type": "aws", "authType": "accessKey",
            "params": {"defaultRegion": region, "accessKeyPath": "/tmp/secret/ak",
                       "secretKeyPath": "/tmp/secret/sk", **params}}


def cluster(name: str, vendor: Any = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"gpuPools": [{"name": "p"}]}
    if vendor is not None:
        spec["computingVendor"] = vendor
    return {"kind": "TensorFusionCluster", "metadata": {"name": name, "uid": "u1"}, "spec": spec}


def pool(name: str, owner: str = "", label: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "tensor-fusion.ai/v1", "kind": "TensorFusionCluster",
                                    "name": owner, "uid": "u1", "controller": True}]
    if label:
        meta["labels"] = {MANAGED_BY: label}
    return {"kind": "GPUPool", "metadata": meta, "spec": {}}


FALLBACK = VendorChoice(parse_vendor(raw_vendor("eu-west-1"), "computingVendor"), "--computing-vendor f.yaml")


def test_the_owner_is_the_cluster_reference_else_the_managed_by_label() -> None:
    assert owner_cluster(pool("a-p", owner="a", label="b")) == "a"
    assert owner_cluster(pool("b-p", label="b")) == "b"
    assert owner_cluster(pool("mine")) == ""


def test_a_derived_pool_uses_its_clusters_computing_vendor_not_the_file() -> None:
    clusters = {"a": cluster("a", raw_vendor("us-west-2"))}
    choice = pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK)
    assert choice.config.region == "us-west-2" and not choice.config.problems
    assert choice.source == "TensorFusionCluster a spec.computingVendor"


def test_a_pool_no_cluster_owns_uses_the_file_and_without_it_says_so() -> None:
    assert pool_vendor(pool("mine"), {}, FALLBACK) is FALLBACK
    choice = pool_vendor(pool("mine"), {}, None)
    assert choice.config.problems and "--computing-vendor" in choice.config.problems[0]
    assert "GPUPool mine" in choice.config.problems[0]


def test_a_cluster_without_computing_vendor_falls_back_to_the_file_else_names_the_field() -> None:
    clusters = {"a": cluster("a")}
    assert pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK) is FALLBACK
    problem = pool_vendor(pool("a-p", owner="a"), clusters, None).config.problems[0]
    assert "TensorFusionCluster a spec.computingVendor: missing" in problem


def test_a_missing_owner_cluster_falls_back_else_is_a_problem_naming_it() -> None:
    assert pool_vendor(pool("gone-p", owner="gone"), {}, FALLBACK) is FALLBACK
    problem = pool_vendor(pool("gone-p", owner="gone"), {}, None).config.problems[0]
    assert "TensorFusionCluster gone" in problem and "does not exist" in problem


def test_a_bad_computing_vendor_names_the_cluster_and_the_field() -> None:
    clusters = {"a": cluster("a", {"type": "aws", "params": {}}),
                "k": cluster("k", {"type": "karpenter"})}
    problems = pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK).config.problems
    assert "TensorFusionCluster a spec.computingVendor.params.defaultRegion: required" in problems
    problems = pool_vendor(pool("k-p", label="k"), clusters, FALLBACK).config.problems
    assert any("TensorFusionCluster k spec.computingVendor.type='karpenter'" in p for p in problems)


def test_equal_vendors_share_one_key_and_different_ones_do_not() -> None:
    a = parse_vendor(raw_vendor(extraParams={"endpoint": "http://x"}), "one")
    b = parse_vendor(json.loads(json.dumps(raw_vendor(extraParams={"endpoint": "http://x"}))), "two")
    assert vendor_key(a) == vendor_key(b)
    assert vendor_key(a) != vendor_key(parse_vendor(raw_vendor("us-west-2"), "one"))
    hash(vendor_key(a))


def test_the_recorded_vendor_round_trips_without_secrets() -> None:
    config = parse_vendor(raw_vendor(extraParams={"endpoint": "http://x"}), "x")
    text = recorded_text(config)
    assert "/tmp/secret/ak" in text and "extraParams" in text
    claim = {"metadata": {"name": "c1", "annotations": {COMPUTING_VENDOR: text}}}
    found = recorded_vendor(claim)
    assert found is not None and vendor_key(found.config) == vendor_key(config)
    broken = {"metadata": {"name": "c", "annotations": {COMPUTING_VENDOR: "{not json"}}}
    assert recorded_vendor(broken) is None


def claim(name: str, vendor: dict[str, Any] | None = None) -> dict[str, Any]:
    annotations = {COMPUTING_VENDOR: recorded_text(parse_vendor(vendor, "x"))} if vendor else {}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_a_claim_uses_its_pools_vendor_while_it_is_at_the_recorded_place() -> None:
    rotated = raw_vendor()
    rotated["params"]["accessKeyPath"] = "/tmp/other/ak"  # new credentials, same cloud and region
    clusters = {"a": cluster("a", rotated)}
    choice = claim_vendor(claim("c1", raw_vendor()), pool("a-p", owner="a"), clusters, FALLBACK)
    assert choice.config.access_key_path == "/tmp/other/ak"


def test_a_claim_whose_pool_moved_region_keeps_the_recorded_vendor() -> None:
    clusters = {"a": cluster("a", raw_vendor("us-west-2"))}
    choice = claim_vendor(claim("c1", raw_vendor("us-east-1")), pool("a-p", owner="a"), clusters, FALLBACK)
    assert choice.config.region == "us-east-1" and "GPUNodeClaim c1" in choice.source


def test_a_claim_whose_pool_and_cluster_are_gone_uses_what_it_recorded_then_the_file() -> None:
    choice = claim_vendor(claim("c1", raw_vendor("ap-south-1")), None, {}, None)
    assert choice.config.region == "ap-south-1" and not choice.config.problems
    assert claim_vendor(claim("c2"), None, {}, FALLBACK) is FALLBACK
    problem = claim_vendor(claim("c3"), None, {}, None).config.problems[0]
    assert "GPUNodeClaim c3" in problem and "cannot be terminated" in problem


def test_a_claim_without_a_record_uses_its_pools_vendor() -> None:
    clusters = {"a": cluster("a", raw_vendor("us-west-2"))}
    assert claim_vendor(claim("c1"), pool("a-p", owner="a"), clusters, FALLBACK).config.region == "us-west-2"


def test_a_clusters_key_files_must_be_under_the_key_dir_symlinks_resolved(tmp_path: Any) -> None:
    """Whoever may write a TensorFusionCluster must not make the extender read another file (the
    ServiceAccount token) and send it, as the access key id, to an endpoint of theirs."""
    keys = tmp_path / "keys"
    (keys / "..data").mkdir(parents=True)
    (keys / "..data" / "ak").write_text("AKIA")
    (keys / "ak").symlink_to(keys / "..data" / "ak")  # as kubelet mounts a Secret
    (keys / "sk").write_text("s")
    (keys / "escape").symlink_to("/etc/hostname")
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    cases = {
        "inside": (str(keys / "ak"), str(keys / "sk"), None),
        "the token": (token, str(keys / "sk"), f"params.accessKeyPath='{token}'"),
        "a symlink out": (str(keys / "ak"), str(keys / "escape"), "params.secretKeyPath="),
        "dot-dot": (str(keys / ".." / "ak"), str(keys / "sk"), "params.accessKeyPath="),
    }
    for case, (ak, sk, problem) in cases.items():
        clusters = {"a": cluster("a", raw_vendor(accessKeyPath=ak, secretKeyPath=sk))}
        choice = pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK, str(keys))
        if problem is None:
            assert not choice.config.problems, (case, choice.config.problems)
        else:
            (text,) = choice.config.problems
            assert text.startswith("TensorFusionCluster a spec.computingVendor." + problem), (case, text)
            assert f"key files are read only under --cloud-key-dir {keys}" in text, (case, text)
    # the operator's own file is exempt; a claim's recorded vendor, which a tenant could edit, is not
    outside = VendorChoice(parse_vendor(raw_vendor(accessKeyPath=token), "computingVendor"),
                           "--computing-vendor")
    assert pool_vendor(pool("mine"), {}, outside, str(keys)).config.problems == ()
    claim = {"metadata": {"name": "c", "annotations": {COMPUTING_VENDOR: recorded_text(outside.config)}}}
    recorded = recorded_vendor(claim, str(keys))
    assert recorded is not None and "params.accessKeyPath" in recorded.config.problems[0]


# --- the cloud endpoint is the administrator's -------------------------------------------------------------

def test_an_endpoint_from_a_cluster_is_used_only_when_the_flag_allows_it_https_only() -> None:
    from extender.cloud.vendor import parse_endpoint_allow

    allow = parse_endpoint_allow("ec2.vpce.example.com, https://ecs.internal:8443,http://127.0.0.1")
    cases = {
        "https://ec2.vpce.example.com": None,
        "ec2.vpce.example.com": None,  # a bare host is HTTPS, as the clients take it
        "https://ec2.vpce.example.com:444": None,  # an entry without a port allows any port of its host
        "https://ecs.internal:8443/path": None,
        "http://127.0.0.1:5000": None,  # a local emulator, listed with http:// explicitly
        "http://ec2.vpce.example.com": "not listed in --cloud-endpoint-allow (https only)",
        "https://ecs.internal:9443": "not listed",
        "https://attacker.example.net": "not listed",
        "https://user@ec2.vpce.example.com": "is not an https:// endpoint of a host",
        "ftp://ec2.vpce.example.com": "is not an https:// endpoint of a host",
    }
    for url, problem in cases.items():
        clusters = {"a": cluster("a", raw_vendor(extraParams={"endpoint": url}))}
        choice = pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK, "", allow)
        if problem is None:
            assert not choice.config.problems, (url, choice.config.problems)
        else:
            assert any(f"params.extraParams.endpoint='{url}'" in p and problem in p
                       for p in choice.config.problems), (url, choice.config.problems)
    # no flag: no endpoint from a cluster object at all (the file --computing-vendor is exempt)
    clusters = {"a": cluster("a", raw_vendor(extraParams={"vpcEndpoint": "https://vpc.example.com"}))}
    problems = pool_vendor(pool("a-p", owner="a"), clusters, FALLBACK, "", ()).config.problems
    assert any("extraParams.vpcEndpoint='https://vpc.example.com': endpoints from cluster objects are not "
               "used unless --cloud-endpoint-allow lists them" in p for p in problems)


def test_the_allow_list_refuses_plain_http_to_a_remote_host() -> None:
    import pytest

    from extender.cloud.vendor import parse_endpoint_allow

    with pytest.raises(ValueError, match="only https:// endpoints may be allowed"):
        parse_endpoint_allow("http://ec2.example.com")


def test_a_claims_recorded_endpoint_is_held_to_the_same_allow_list() -> None:
    """A patched annotation cannot send the signed describe and terminate calls to a host of the writer's."""
    forged = claim("c1", raw_vendor(extraParams={"endpoint": "https://attacker.example.net"}))
    assert recorded_vendor(forged, "", ()) is None or recorded_vendor(forged, "", ()).config.problems
    choice = claim_vendor(forged, None, {}, None, "", ())
    assert choice.config.problems and "attacker.example.net" in "; ".join(choice.config.problems)


@pytest.mark.parametrize("annotation", ['{"type":"aws","params":"x"}', '{"type":"aws","params":[1]}',
                                        "[" * 5000, '{"params":{"extraParams":{"endpoint":5}}}', "5"])
def test_a_malformed_recorded_vendor_is_no_record_not_an_exception(annotation: str) -> None:
    obj = {"kind": "GPUNodeClaim", "metadata": {"name": "c1", "annotations": {COMPUTING_VENDOR: annotation}}}
    assert recorded_vendor(obj) is None
    assert claim_vendor(obj, None, {}, FALLBACK) is FALLBACK


def test_every_field_of_a_computing_vendor_of_the_wrong_type_is_a_named_problem() -> None:
    from tests.unit.fixtures.sweep import sweep

    valid = {"type": "aws", "authType": "accessKey", "enable": True,
             "params": {"defaultRegion": "us-east-1", "accessKeyPath": "/tmp/secret/ak",
                        "secretKeyPath": "/tmp/secret/sk", "extraParams": {"endpoint": "https://e.example.com"}}}
    failures = sweep(valid, lambda raw: list(parse_vendor(raw, "spec.computingVendor").problems))
    assert not failures, "\n".join(failures)
