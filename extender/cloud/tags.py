"""The tags every VM and volume the extender launches carries: TensorFusion's three (``managed-by``,
``node-name`` = the claim, ``node-class``) so its tools recognise them, plus the cluster and the pool,
which the orphan sweep and a user's cost reports select on. The GPUNodeClass's own tags come first; ours
win on a clash."""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.common.contract import POOL_LABEL
from extender.common.labels import (
    CLOUD_MANAGED_BY,
    CLOUD_TAG_CLUSTER,
    CLOUD_TAG_NODE_CLASS,
    CLOUD_TAG_NODE_NAME,
)

if TYPE_CHECKING:
    from extender.cloud.provider import LaunchRequest

TAG_CLAIM = CLOUD_TAG_NODE_NAME
TAG_CLUSTER = CLOUD_TAG_CLUSTER
MANAGED_BY_VALUE = "tensor-fusion.ai"


def instance_tags(request: LaunchRequest) -> dict[str, str]:
    return {
        **request.node_class.tags,
        CLOUD_MANAGED_BY: MANAGED_BY_VALUE,
        TAG_CLAIM: request.claim,
        CLOUD_TAG_NODE_CLASS: request.node_class.name,
        TAG_CLUSTER: request.cluster,
        POOL_LABEL: request.pool,
    }
