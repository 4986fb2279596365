"""Filter verdicts per request shape: pods of one shape (kube-scheduler's ``PodSignature``) share them.

A table holds the verdict of one shape for every node asked about so far, current as of a tick of the
picture's change log; the next use re-judges only the nodes changed since. A stream of similar pods so
costs one dictionary lookup per node after the first. A shape never seen before (the cold path) judges
every node asked about; from ``vector_min`` nodes on, the columnar check finds the fitting ones at once and
only the others are judged one by one, for the reason their verdict gives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse

from extender.scheduling.cluster import Cluster
from extender.scheduling.placement import Fit, Verdict, evaluate, is_hard
from extender.scheduling.requests import Parsed

UNKNOWN_NODE = "node has no GPUs known to the extender"
VERDICT_CACHE_SHAPES = 64
VECTOR_MIN = 64  # this many nodes to judge at once: the columnar check (columns.py) pays off

FITS = Verdict(Fit.FITS)


@dataclass
class Table:
    """Verdicts of one request shape for the nodes asked about so far, current as of tick ``synced``."""

    synced: int
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    fit_load: dict[str, float] = field(default_factory=dict)  # fitting nodes: mean load in the pool


class Verdicts:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        # the picture's parts read per node, bound once: this is the hot path at thousands of nodes
        self._slots = cluster.slots
        self._pods_on = cluster.ledger.pods_on
        self._load_table = cluster.load_table
        self._columns = cluster.columns
        self._tables: OrderedDict[tuple[object, ...], Table] = OrderedDict()
        self.vector_min = VECTOR_MIN

    def table(self, parsed: Parsed) -> Table:
        """The verdict table of this request shape, brought up to date with the nodes changed since."""
        tick = self._cluster.tick
        # the pool's topology setting is part of the shape: a template change judges afresh
        key = (parsed.shape, self._cluster.topology_for(parsed.request.pool))
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = Table(tick)
            if len(self._tables) > VERDICT_CACHE_SHAPES:
                self._tables.popitem(last=False)
            return table
        self._tables.move_to_end(key)
        if table.synced == tick:
            return table
        changed_nodes, _ = self._cluster.changed_since(table.synced)
        changed: Iterable[str] = list(table.verdicts) if changed_nodes is None else changed_nodes
        for node in changed:
            if node in table.verdicts:
                self.judge(table, node, parsed)
        table.synced = tick
        return table

    def judge(self, table: Table, node: str, parsed: Parsed) -> Verdict:
        slots = self._slots(node)
        if not slots:
            verdict = Verdict(Fit.UNRESOLVABLE, UNKNOWN_NODE)
        else:
            verdict = evaluate(slots, parsed.request, self._pods_on(node), self._cluster.max_pods,
                               parsed.demand, self._cluster.topology_for(parsed.request.pool))
        if verdict.fit is Fit.FITS:
            verdict = FITS
            table.fit_load[node] = self._load_table()[node].get(parsed.request.pool, 0.0)
        else:
            table.fit_load.pop(node, None)
        table.verdicts[node] = verdict
        return verdict

    def for_nodes(self, parsed: Parsed, node_names: Sequence[str]) -> Table:
        """The shape's table with a verdict for every one of ``node_names``."""
        table = self.table(parsed)
        # map/filter keep the per-node work in C: this is the hot path at thousands of nodes.
        missing = list(filterfalse(table.verdicts.__contains__, node_names))
        # the columns know free amounts, not links: hard topology judges node by node
        fits = (self._columns.fitting_nodes(missing, parsed.request, parsed.demand, self._cluster.max_pods)
                if len(missing) >= self.vector_min
                and not is_hard(parsed.request, self._cluster.topology_for(parsed.request.pool)) else None)
        if fits is None:
            for name in missing:
                self.judge(table, name, parsed)
            return table
        verdicts, fit_load, pool = table.verdicts, table.fit_load, parsed.request.pool
        loads = self._load_table()
        for name, fits_now in zip(missing, fits, strict=True):
            if fits_now:
                verdicts[name] = FITS
                fit_load[name] = loads[name].get(pool, 0.0)
            else:
                self.judge(table, name, parsed)
        return table
