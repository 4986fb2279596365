"""Random GPU topologies for the differential test against TensorFusion's ``gputopo`` evaluators.

Seeded, so the cases are the same on every machine: ``python -m tests.differential.topology_cases`` prints
them as the JSON that ``tftopo/main.go`` reads. Each case is one node's free GPUs (NVLink islands reported
in the ``status.topology.peers`` form, NUMA nodes, reported PCIe tiers, one-way and malformed reports,
missing UUIDs), a GPU count, a topology source, least damage on or off, and optionally a placement score
per GPU.
"""

from __future__ import annotations

import json
import random
from typing import Any

SEED = 39
CASES = 600


def _case(rng: random.Random, number: int) -> dict[str, Any]:
    n = rng.choice([2, 3, 4, 4, 5, 6, 8, 8, 8, 10, 12, 16])
    numa_style = rng.choice(["none", "pairs", "halves", "random", "some-missing"])
    numa: list[int | None]
    if numa_style == "none":
        numa = [None] * n
    elif numa_style == "pairs":
        numa = [i // 2 for i in range(n)]
    elif numa_style == "halves":
        numa = [0 if i < n // 2 else 1 for i in range(n)]
    else:
        numa = [rng.randrange(4) for _ in range(n)]
        if numa_style == "some-missing":
            numa = [v if rng.random() < 0.7 else rng.choice([None, -1]) for v in numa]
    order = list(range(n))
    rng.shuffle(order)
    islands: list[list[int]] = []
    link_style = rng.choice(["none", "islands", "islands", "nvswitch", "islands+pcie", "noisy"])
    if link_style in ("islands", "islands+pcie", "noisy"):
        rest = order[:]
        while rest:
            size = min(len(rest), rng.choice([1, 2, 2, 3, 4, 4, 8]))
            islands.append(rest[:size])
            rest = rest[size:]
    elif link_style == "nvswitch":
        islands = [order[:]]
    peers: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for island in islands:
        for a in island:
            for b in island:
                if a != b:
                    bandwidth = rng.choice([0, 50, 100, 300])
                    peers[a].append({"uuid": f"GPU-{b}", "tier": 0, "bandwidth": bandwidth})
    if link_style in ("islands+pcie", "noisy"):
        for a in range(n):
            for b in range(n):
                if a != b and not any(a in i and b in i for i in islands) and rng.random() < 0.6:
                    peers[a].append({"uuid": f"GPU-{b}", "tier": rng.choice([1, 2, 2]), "bandwidth": 16})
    if link_style == "noisy":
        for a in range(n):
            if rng.random() < 0.3:
                peers[a].append({"uuid": f"GPU-{rng.randrange(n + 2)}", "tier": rng.choice([-1, 0, 1, 5]),
                                 "bandwidth": rng.randrange(500)})
    uuids = [f"GPU-{i}" if link_style != "noisy" or rng.random() < 0.9 else "" for i in range(n)]
    scored = rng.random() < 0.5
    gpus = []
    for i in range(n):
        gpu: dict[str, Any] = {"name": f"gpu-{i:02d}", "uuid": uuids[i], "numa": numa[i], "peers": peers[i]}
        if scored:
            gpu["score"] = rng.choice([0, 0, 10, 50, 50, 70, 100])
        gpus.append(gpu)
    rng.shuffle(gpus)
    return {
        "name": f"topo-{number:03d}-{link_style}-{numa_style}",
        "source": rng.choice(["auto", "auto", "auto", "numa", "vendor"]),
        "max_allowed_tier": rng.choice([0, 1, 2, 3]),
        "count": rng.choice([1, 1, 2, 2, 3, 4, 4, 5, 6, 8]) if n >= 2 else 1,
        "prefer_least_damage": rng.random() < 0.8,
        "scored": scored,
        "gpus": gpus,
    }


def cases() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    out = []
    for number in range(CASES):
        case = _case(rng, number)
        if case["count"] <= len(case["gpus"]):
            out.append(case)
    return out


if __name__ == "__main__":
    print(json.dumps(cases()))
