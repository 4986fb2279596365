"""The mutation cache: a cached admission gives the patch (or denial) ``mutate`` gives, operation for
operation, with its own pod index; a changed pool, profile or template (a new generation) is seen at once."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.common import contract as c
from tests.unit.fixtures.webhook import (
    ANNOTATION_MAPS,
    CONTAINER_LISTS,
    LABEL_MAPS,
    OBJECTS,
    POOL_A,
    PROFILE,
    SCHEDULER,
    TEMPLATE,
    pod,
    tf,
    view,
)
from webhook.memo import Mutation, MutationCache
from webhook.mutation import mutate
from webhook.view import StaticClusterView


def uncached(p: dict[str, Any], v: StaticClusterView, index: int, **kw: Any) -> Mutation:
    r = mutate(p, v, scheduler_name=SCHEDULER, index=index, **kw)
    return Mutation(r.patch, r.denial, r.skipped, r.request)


def cached(cache: MutationCache, p: dict[str, Any], v: StaticClusterView, index: int,
           generation: int = 0, **kw: Any) -> Mutation:
    return cache.mutate(p, v, scheduler_name=SCHEDULER, index=index, generation=generation, **kw)


OWNED = {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f",
                              "controller": True}]}


def owned(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"].update(OWNED)
    return p


def same(a: Mutation, b: Mutation) -> None:
    if a.encoded is not None:
        assert json.loads(base64.b64decode(a.encoded)) == a.patch
    assert (a.patch, a.denial, a.skipped, a.request) == (b.patch, b.denial, b.skipped, b.request)


TWO = [{"name": "main", "image": "cuda"}, {"name": "side", "resources": {"limits": {"nvidia.com/gpu": 1}}},
       {"name": "log", "resources": {"requests": {"cpu": "1"}}}]
INDEXED = [{"name": "main", "resources": {"limits": {f"{c.INDEX_RESOURCE_PREFIX}2": "3"}}}]

CASES: dict[str, dict[str, Any]] = {
    "plain": pod(tf(tflops_request="1", vram_request="1Gi")),
    "owned by a deployment's replicaset": owned(pod(tf(tflops_request="1"))),
    "profile and autoscale template": pod(tf(workload_profile="small"), labels={"tier": "batch"}),
    "three containers, native gpu on the second": pod(tf(tflops_request="2"), containers=TWO),
    "inject into two": pod(tf(tflops_request="2", inject_container="main,log"), containers=TWO),
    "already indexed": pod(tf(tflops_request="1"), containers=INDEXED),
    "denied: bad value": pod(tf(tflops_request="abc")),
    "denied: no such profile": pod(tf(workload_profile="missing")),
    "denied: preset allocation": pod(tf(tflops_request="1", gpu_ids="gpu-0")),
    "denied: nodeName": pod(tf(tflops_request="1"), nodeName="n1"),
    "not opted in": {**pod(), "metadata": {"name": "p", "labels": {}}},
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("do_not_disrupt", [False, True])
def test_cached_and_uncached_give_identical_results_for_every_index(name: str, do_not_disrupt: bool) -> None:
    cache = MutationCache()
    v = view()
    for index in (1, 9, 8, 128, 1, 64):  # the first call fills the entry, the others hit it
        p = copy.deepcopy(CASES[name])
        expected = uncached(p, v, index, do_not_disrupt=do_not_disrupt)
        got = cached(cache, p, v, index, do_not_disrupt=do_not_disrupt)
        same(got, expected)
        assert p == CASES[name]  # the pod is left unchanged
        if got.denial is None and not got.skipped:
            assert jsonpatch.apply_patch(p, got.patch)["metadata"]["labels"][c.POOL_LABEL]
    opted_in = CASES[name]["metadata"]["labels"]
    assert cache.hits == (5 if opted_in else 0)


def test_pods_of_one_workload_share_an_entry_and_keep_their_own_index() -> None:
    cache = MutationCache()
    v = view()
    patches = [cached(cache, pod(tf(tflops_request="1")), v, index).patch for index in (1, 2, 9)]
    assert (cache.hits, cache.misses, len(cache)) == (2, 1, 1)
    indexes = [jsonpatch.apply_patch(pod(tf(tflops_request="1")), patch)["spec"]["containers"][0]
               ["resources"]["limits"] for patch in patches]
    assert indexes == [{f"{c.INDEX_RESOURCE_PREFIX}0": "1"}, {f"{c.INDEX_RESOURCE_PREFIX}0": "2"},
                       {f"{c.INDEX_RESOURCE_PREFIX}1": "1"}]


def _changed(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    target = new
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value
    return new


@pytest.mark.parametrize("old, new, p", [
    (POOL_A, _changed(POOL_A, ("spec", "schedulingConfigTemplate"), "gone"),
     pod(tf(tflops_request="1"), labels={"tier": "batch"})),
    (PROFILE, _changed(PROFILE, ("spec", "qos"), "low"), pod(tf(workload_profile="small"))),
    (TEMPLATE, _changed(TEMPLATE, ("spec", "verticalScalingRules"), []),
     pod(tf(tflops_request="1"), labels={"tier": "batch"})),
], ids=["pool", "profile", "template"])
def test_a_new_generation_sees_a_changed_pool_profile_or_template(old: dict[str, Any], new: dict[str, Any],
                                                                  p: dict[str, Any]) -> None:
    cache = MutationCache()
    before = view(*OBJECTS)
    after = view(*[new if o is old else o for o in OBJECTS])
    first = cached(cache, p, before, 1, generation=1)
    assert first.patch != uncached(p, after, 1).patch  # the change matters to this pod
    same(cached(cache, p, after, 1, generation=2), uncached(p, after, 1))
    # the same generation would (by contract) return the old answer: the generation is the invalidation
    same(cached(cache, p, after, 1, generation=1), first)


def test_a_different_owner_chain_is_another_key() -> None:
    cache = MutationCache()
    p = owned(pod(tf(tflops_request="1")))
    with_rs = cached(cache, p, view(), 1)
    without_rs = cached(cache, p, view(*[o for o in OBJECTS if o["kind"] != "ReplicaSet"]), 1)
    assert cache.misses == 2
    same(without_rs, uncached(p, view(*[o for o in OBJECTS if o["kind"] != "ReplicaSet"]), 1))
    same(with_rs, uncached(p, view(), 1))
    assert with_rs.patch != without_rs.patch  # workload web (the Deployment) against web-7d9f


def test_the_cache_is_bounded_and_skips_large_pods() -> None:
    cache = MutationCache(max_entries=3, max_pod_bytes=2000)
    v = view()
    for i in range(10):
        cached(cache, pod(tf(tflops_request=str(i + 1))), v, 1)
    assert len(cache) == 3
    big = pod(tf(tflops_request="1", other="x" * 3000))
    same(cached(cache, big, v, 5), uncached(big, v, 5))
    same(cached(cache, big, v, 6), uncached(big, v, 6))
    assert len(cache) == 3 and cache.hits == 0


@settings(max_examples=200)
@given(ANNOTATION_MAPS, LABEL_MAPS, CONTAINER_LISTS,
       st.lists(st.integers(min_value=1, max_value=128), min_size=2, max_size=4),
       st.booleans(), st.booleans())
def test_cached_mutation_equals_uncached_for_any_pod(annotations: dict[str, str], labels: dict[str, str],
                                                     containers: list[dict[str, Any]], indexes: list[int],
                                                     do_not_disrupt: bool, plain_json: bool) -> None:
    cache = MutationCache()
    v = view()
    for index in indexes:
        p = pod(annotations, labels=labels, containers=containers)
        same(cached(cache, p, v, index, do_not_disrupt=do_not_disrupt, plain_json=plain_json),
             uncached(p, v, index, do_not_disrupt=do_not_disrupt))
    assert cache.hits == len(indexes) - 1


def test_a_nan_is_not_a_null_in_the_key() -> None:
    # orjson writes NaN as null: a pod only json.loads decodes (NaN) is keyed by the standard library's text
    cache, v = MutationCache(), view()
    with_nan = pod(tf(tflops_request="1"), priority=float("nan"))
    with_null = pod(tf(tflops_request="1"), priority=None)
    cached(cache, with_nan, v, 1)
    cached(cache, with_null, v, 1, plain_json=True)
    cached(cache, with_null, v, 2)
    assert (cache.misses, cache.hits, len(cache)) == (3, 0, 3)
    cached(cache, with_null, v, 3, plain_json=True)
    assert cache.hits == 1


def test_serving_caches_bump_the_generation_on_every_change_of_a_pool_profile_or_template() -> None:
    from webhook.caches import ServingCaches

    serving = ServingCaches.from_api(object())  # the watch caches only use the client once run
    pools, profiles, templates = serving.pools, serving.profiles, serving.templates
    seen = [serving.generation]
    for cache, obj in ((pools, POOL_A), (profiles, PROFILE), (templates, TEMPLATE)):
        cache.handle("ADDED", copy.deepcopy(obj))  # type: ignore[attr-defined]
        seen.append(serving.generation)
    pools.handle("MODIFIED", _changed(POOL_A, ("metadata", "resourceVersion"), "2"))  # type: ignore[attr-defined]
    seen.append(serving.generation)
    assert seen == sorted(set(seen)) and len(seen) == 5


def test_the_priority_grant_is_part_of_the_key() -> None:
    """The same pod under two grants: the cache never answers one with the other's decision."""
    from webhook.priority import PriorityPolicy

    cache = MutationCache()
    p = pod(tf(tflops_request="1", tflops_limit="2", qos="critical"))
    objects = view()
    everywhere = cache.mutate(p, objects, scheduler_name=SCHEDULER, index=1, namespace="team",
                              priority=PriorityPolicy.from_lists("*"))
    nowhere = cache.mutate(p, objects, scheduler_name=SCHEDULER, index=1, namespace="team",
                           priority=PriorityPolicy.from_lists("tensor-fusion-sys"))
    assert everywhere.denial is None and nowhere.denial is not None
    assert nowhere.denial.reason == c.QOS
