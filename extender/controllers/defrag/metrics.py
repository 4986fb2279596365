"""Prometheus metrics of defragmentation runs."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class DefragMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.runs = Counter("tf_extender_defrag_runs_total",
                            "Defragmentation runs, by pool, trigger (schedule, manual) and outcome "
                            "(completed, stopped, failed)", ["pool", "trigger", "outcome"], registry=r)
        self.evictions = Counter("tf_extender_defrag_evictions_total",
                                 "GPU workers evicted by defragmentation", ["pool"], registry=r)
        self.nodes_emptied = Counter("tf_extender_defrag_nodes_emptied_total",
                                     "Nodes a defragmentation run left without GPU workers", ["pool"],
                                     registry=r)
        self.skips = Counter("tf_extender_defrag_skips_total",
                             "Candidate nodes a defragmentation run left as they are, by reason",
                             ["pool", "reason"], registry=r)
