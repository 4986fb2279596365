"""Tick-by-tick parity with TensorFusion's own Go code on fresh seeded streams, counted.

``python -m tests.differential.parity [--seeds 200] [--first 1000]`` makes ``--seeds`` random usage
streams (the generator of ``cases.py``, with random QoS including the empty one, initial delays including
``0s``, and history periods up to 90 days) and as many random cron rule cases, runs them through
``tfrecommend`` (built by ``generate.sh``, cached) and through this project's recommender (with five times as
many random cron expressions to accept or refuse and ten times as many next firings), and prints one
JSON line: ticks equal, ticks that differ only where docs/autoscaling.md lists a deliberate difference, and
ticks that differ otherwise (each named). A deliberate difference is recognised by what explains it:

- ``vram_peak_weight``: the tick equals TensorFusion's when ours subtracts a replaced VRAM peak with
  TensorFusion's weight (``VramPeakWeight.WINDOW_END``);
- ``bad_rule_alone``: a rule TensorFusion's parser refuses makes TensorFusion fail the whole evaluation,
  where ours ignores that rule alone (and names it).

Exits 1 when any tick differs without a listed reason.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from extender.autoscaling.config import parse_config
from extender.autoscaling.usage import VramPeakWeight
from tests.differential.cases import BASE_UNIX_S, CRON_ZONES, _rule, random_cron, random_streams
from tests.differential.ours import cron_accepts, cron_next, run_case, run_cron_case

COMMIT = "3e0a4901044d"


def _binary() -> Path:
    return Path.home() / ".cache" / "tensor-fusion-extender" / "bin" / f"tfrecommend-{COMMIT}" / "tfrecommend"


def cron_streams(first: int, count: int) -> dict[str, Any]:
    cases = []
    for seed in range(first, first + count):
        rng = random.Random(seed)
        rules = [_rule(f"r{j}", random_cron(rng), random_cron(rng), str(rng.choice([2, 8, 32])))
                 for j in range(rng.choice([1, 1, 2]))]
        zone = rng.choice(CRON_ZONES)
        for rule in rules:
            if rng.random() < 0.6:
                rule["start"] = f"CRON_TZ={zone} {rule['start']}"
                rule["end"] = f"CRON_TZ={zone} {rule['end']}"
        start = BASE_UNIX_S + rng.randint(0, 400 * 86400)
        step = rng.choice([300, 1800, 3600, 4 * 3600])
        cases.append({"name": f"cron_parity_{seed}", "rules": rules,
                      "resources": {"requests.tflops": "1", "limits.tflops": "1", "requests.vram": "2Gi",
                                    "limits.vram": "2Gi"},
                      "ticks": [{"unix_ns": (start + k * step + 13) * 10**9}
                                for k in range(rng.randint(10, 60))]})
    rng = random.Random(first)
    parse = [random_cron(rng) for _ in range(count * 5)]
    nexts = [{"expr": random_cron(rng), "zone": rng.choice(CRON_ZONES),
              "unix_ns": (BASE_UNIX_S + rng.randint(0, 800 * 86400)) * 10**9 + rng.randint(0, 10**9 - 1)}
             for _ in range(count * 10)]
    nexts = [n for n in nexts if cron_accepts(n["expr"])]
    return {"parse": parse, "next": nexts, "cases": cases}


def _run(args: list[str], payload: Any) -> Any:
    done = subprocess.run([str(_binary()), *args], input=json.dumps(payload), capture_output=True, text=True,
                          check=True, timeout=600)
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=1000)
    args = parser.parse_args(argv)
    if not _binary().exists():
        print(f"{_binary()} is missing: run tests/differential/generate.sh first", file=sys.stderr)
        return 2
    counts = {"equal": 0, "documented": {"vram_peak_weight": 0}, "undocumented": 0}
    undocumented: list[str] = []
    cases = random_streams(args.first, args.seeds)
    theirs = {r["name"]: r["ticks"] for r in _run([], cases)}
    for case in cases:
        ours = run_case(case, VramPeakWeight.ADDED)
        compat = run_case(case, VramPeakWeight.WINDOW_END)
        for i, (o, c, t) in enumerate(zip(ours, compat, theirs[case["name"]], strict=True)):
            if o == t:
                counts["equal"] += 1
            elif c == t:
                counts["documented"]["vram_peak_weight"] += 1
            else:
                counts["undocumented"] += 1
                undocumented.append(f"{case['name']}[{i}]")
    cron = cron_streams(args.first, args.seeds)
    cron_answers = _run(["cron"], cron)
    cron_theirs = cron_answers["cases"]
    grammar = {"parse_equal": 0, "next_equal": 0, "differ": 0}
    for expr, theirs in zip(cron["parse"], cron_answers["parse"], strict=True):
        if cron_accepts(expr) == theirs:
            grammar["parse_equal"] += 1
        else:
            grammar["differ"] += 1
            undocumented.append(f"parse {expr!r}")
    for case, theirs in zip(cron["next"], cron_answers["next"], strict=True):
        if cron_next(case) == theirs:
            grammar["next_equal"] += 1
        else:
            grammar["differ"] += 1
            undocumented.append(f"next {case}")
    cron_counts = {"equal": 0, "documented": {"bad_rule_alone": 0}, "undocumented": 0}
    for case, t in zip(cron["cases"], cron_theirs, strict=True):
        refused = any("rule ignored" in p for p in parse_config({"cronScalingRules": case["rules"]}).problems)
        for i, (o, tt) in enumerate(zip(run_cron_case(case), t["ticks"], strict=True)):
            if o == tt:
                cron_counts["equal"] += 1
            elif refused and tt["error"]:
                cron_counts["documented"]["bad_rule_alone"] += 1
            else:
                cron_counts["undocumented"] += 1
                undocumented.append(f"{case['name']}[{i}]")
    print(json.dumps({"seeds": [args.first, args.first + args.seeds - 1], "recommendation_ticks": counts,
                      "cron_ticks": cron_counts, "cron_grammar": grammar, "undocumented": undocumented[:50]}))
    return 1 if undocumented else 0


if __name__ == "__main__":
    sys.exit(main())
