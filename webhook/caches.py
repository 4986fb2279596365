"""The serving ``ClusterView``: GPUPools, WorkloadProfiles, SchedulingConfigTemplates and GPUResourceQuotas
from watch caches, owners from the owner cache. The only module of the webhook that talks to the API
server."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from typing import Any, Protocol, cast

from extender.common.tasks import cancel_and_wait
from extender.kube.informer import WatchCache
from extender.kube.resources import (
    GPU_POOLS,
    GPU_RESOURCE_QUOTAS,
    SCHEDULING_CONFIG_TEMPLATES,
    WORKLOAD_PROFILES,
)
from webhook.owners import OwnerCache, OwnerKey, api_fetcher, owners_of
from webhook.view import ClusterView, KubeObject, pick_default_pool

DEFAULT_OWNER_TIMEOUT = 2.0


class ObjectSource(Protocol):
    """What the view reads from a watch cache."""

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...

    def list(self) -> list[dict[str, Any]]: ...


class CachedClusterView:
    """A ``ClusterView`` for one admission request."""

    def __init__(self, pools: ObjectSource, profiles: ObjectSource, templates: ObjectSource,
                 owners: Mapping[OwnerKey, KubeObject], quotas: ObjectSource | None = None) -> None:
        self._pools = pools
        self._profiles = profiles
        self._templates = templates
        self._owners = owners
        self._quotas = quotas

    def pool(self, name: str) -> KubeObject | None:
        return self._pools.get(name)

    def default_pool(self) -> KubeObject | None:
        return pick_default_pool(self._pools.list())

    def profile(self, namespace: str, name: str) -> KubeObject | None:
        return self._profiles.get(name, namespace)

    def template(self, name: str) -> KubeObject | None:
        return self._templates.get(name)

    def quotas(self, namespace: str) -> list[KubeObject]:
        if self._quotas is None:
            return []
        return [q for q in self._quotas.list() if (q.get("metadata") or {}).get("namespace") == namespace]

    def owner(self, namespace: str, kind: str, name: str) -> KubeObject | None:
        return self._owners.get((namespace, kind, name))


class ServingCaches:
    """Watch caches plus the owner cache; ``view_for`` builds the view of one request."""

    def __init__(self, pools: ObjectSource, profiles: ObjectSource, templates: ObjectSource,
                 owners: OwnerCache, *, synced: list[asyncio.Event] | None = None,
                 owner_timeout: float = DEFAULT_OWNER_TIMEOUT, quotas: ObjectSource | None = None) -> None:
        self.pools = pools
        self.profiles = profiles
        self.templates = templates
        self.quotas = quotas
        self.owners = owners
        self.owner_timeout = owner_timeout
        self._synced = synced or []
        self._ownerless = CachedClusterView(pools, profiles, templates, {}, quotas)
        self._tasks: list[asyncio.Task[None]] = []
        self._caches: list[WatchCache] = []
        # Bumped on every change of a pool, profile, template or quota: the mutation cache's invalidation.
        self.generation = 0

    def bump(self, *_event: Any) -> None:
        self.generation += 1

    @classmethod
    def from_api(cls, api_client: Any) -> ServingCaches:
        # Optional: a cluster without the TensorFusion CRDs still serves (and denies for lack of a pool).
        pools, profiles, templates, quotas = caches = [
            WatchCache(api_client, resource, optional=True)
            for resource in (GPU_POOLS, WORKLOAD_PROFILES, SCHEDULING_CONFIG_TEMPLATES, GPU_RESOURCE_QUOTAS)
        ]
        serving = cls(pools, profiles, templates, OwnerCache(api_fetcher(api_client)),
                      synced=[cache.synced for cache in caches], quotas=quotas)
        serving._caches = caches
        for cache in caches:
            cache.on_change = serving.bump
        return serving

    def ready(self) -> bool:
        return all(event.is_set() for event in self._synced)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(cache.run(), name=f"watch-{cache.name}") for cache in self._caches]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)  # the watches retry their errors: only cancellation ends them
        self._tasks = []

    def owner_token(self, owner: Hashable) -> object:
        """The owner object ``view_for`` would use now for ``owner`` (namespace, kind, name), while the owner
        cache holds it; else a fresh object, equal to nothing (``WebhookService.owner_token``)."""
        if owner is None:
            return None
        namespace, kind, name = cast(OwnerKey, owner)
        known, obj = self.owners.cached(namespace, kind, name)
        return obj if known else object()

    async def view_for(self, pod: KubeObject, namespace: str) -> ClusterView:
        owners = await owners_of(pod, namespace, self.owners, self.owner_timeout)
        if not owners:  # most pods: one view serves them all (it reads the caches live)
            return self._ownerless
        return CachedClusterView(self.pools, self.profiles, self.templates, owners, self.quotas)
