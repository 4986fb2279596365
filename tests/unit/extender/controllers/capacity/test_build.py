"""The capacity package as the service builds it: off by default, its controllers leader-only, its caches
from the one factory under the names the other packages ask for (so NodeClaims, TensorFusionClusters and
GPUNodes are each one watch), and the filter hook."""

from __future__ import annotations

import argparse
import dataclasses

from extender.controllers import capacity
from extender.controllers.capacity.config import CapacityConfig
from extender.kube.resources import (
    GPU_NODE_CLAIMS,
    GPU_NODE_CLASSES,
    GPU_NODES,
    NODECLAIMS,
    TENSOR_FUSION_CLUSTERS,
)
from tests.unit.fixtures.wiring import deps as make_deps


def test_the_default_is_off() -> None:
    assert capacity.NAME == "capacity"
    assert CapacityConfig(enabled=False) == capacity.DEFAULT


def test_options_parse() -> None:
    parser = argparse.ArgumentParser()
    capacity.add_arguments(parser)
    assert capacity.from_args(parser.parse_args([])) == dataclasses.replace(capacity.DEFAULT, enabled=True)
    assert not capacity.from_args(parser.parse_args(["--no-capacity-controllers"])).enabled


async def test_off_it_builds_nothing_and_watches_nothing() -> None:
    deps = make_deps()
    before = list(deps.informers.caches())
    assert capacity.build(deps, capacity.DEFAULT) is None
    assert list(deps.informers.caches()) == before
    await deps.kube.close()


async def test_on_its_caches_are_the_factory_s_shared_ones() -> None:
    deps = make_deps()
    informers = deps.informers
    # what the expansion, tfcluster and gpunode packages ask for: the same cache objects
    nodeclaims = informers.cache(NODECLAIMS, optional=True, name="nodeclaims")
    clusters = informers.cache(TENSOR_FUSION_CLUSTERS, optional=True, name="tensorfusionclusters")
    gpunodes = informers.cache(GPU_NODES, optional=True, name="gpunodes")
    built = capacity.build(deps, dataclasses.replace(capacity.DEFAULT, enabled=True))
    assert built is not None
    part = built.part
    assert list(built.hooks) == [part] and list(built.controllers) == list(part.controllers)
    assert part.view.nodeclaims is nodeclaims and part.clusters is clusters and part.view.gpunodes is gpunodes
    assert part.view.gpunodeclaims is informers.cache(GPU_NODE_CLAIMS)
    assert part.node_classes is informers.cache(GPU_NODE_CLASSES)
    assert part.view.nodes is deps.core.nodes and part.view.pools is deps.core.gpupools
    names = {c.name for c in informers.caches()}
    assert {"gpunodeclaims", "nodeclaims", "gpunodeclasses", "tensorfusionclusters", "gpunodes"} <= names
    for c in built.controllers:
        assert c.leader_only
        assert set(deps.core.all) <= set(c.caches)
        assert {nodeclaims, clusters, gpunodes, part.view.gpunodeclaims, part.node_classes} <= set(c.caches)
    await deps.kube.close()
