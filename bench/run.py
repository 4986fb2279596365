"""Run every benchmark and write bench/results/latest.json and bench/results/latest.md.

    python -m bench.run            # full sizes (about 20-30 minutes on 2 cores)
    python -m bench.run --quick    # or QUICK=1: small sizes, under 5 minutes
    python -m bench.run --only packing,extender_cost --profile

Benchmarks never fail on wall time: each reports ratios measured side by side in this one run and the
targets of issue 6 as met / missed. A benchmark that cannot run (no Go toolchain for the control plane,
no wrk) is reported as not measured; the others still run. The exit code is 0 unless the run itself
crashed.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.common import (
    RESULTS_DIR,
    BenchResult,
    Table,
    Target,
    ensure_apt,
    ensure_pip,
    environment,
    log,
    quick_mode,
    write_json,
)

ORDER = ("packing", "extender_cost", "offline_tools", "webhook", "e2e")
TITLES = {
    "packing": "Packing quality (simulator)",
    "extender_cost": "Extender cost vs cluster size",
    "offline_tools": "Offline tools (simulate, plan) at 2,000 pods",
    "webhook": "Webhook throughput",
    "e2e": "End-to-end scheduling throughput",
}


def _guard(name: str, fn: Callable[[], BenchResult]) -> BenchResult:
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:
        log(f"{name} failed: {exc!r}")
        detail = traceback.format_exc(limit=6)
        result = BenchResult(name, {}, [], error=f"{type(exc).__name__}: {exc}\n{detail}")
    result.data["duration_s"] = round(time.perf_counter() - t0, 1)
    return result


def run_all(quick: bool, only: set[str], profile: bool) -> dict[str, BenchResult]:
    missing = ensure_pip("psutil", "matplotlib")
    if profile:
        from bench.profiling import py_spy

        if py_spy() is None:
            missing.append("py-spy")
    if missing:
        log(f"optional bench tools missing (results without them): {missing}")
    if {"webhook"} & only:
        ensure_apt("wrk")
    results: dict[str, BenchResult] = {}
    if "packing" in only:
        from bench import packing

        results["packing"] = _guard("packing", lambda: packing.run(quick))
    if "extender_cost" in only:
        from bench import extender_cost

        results["extender_cost"] = _guard("extender_cost", lambda: extender_cost.run(quick))
    if "offline_tools" in only:
        from bench import offline_tools

        results["offline_tools"] = _guard("offline_tools", lambda: offline_tools.run(quick))
    if {"webhook", "e2e"} & only:
        cluster: Any = None
        try:
            from bench.cluster import BenchCluster

            cluster = BenchCluster().start()
        except Exception as exc:
            error = f"control plane unavailable: {type(exc).__name__}: {exc}"
            log(error)
            for name in ("webhook", "e2e"):
                if name in only:
                    results[name] = BenchResult(name, {}, [], error=error)
        if cluster is not None:
            try:
                if "webhook" in only:
                    from bench import webhook_throughput

                    results["webhook"] = _guard(
                        "webhook", lambda: webhook_throughput.run(quick, cluster=cluster, profile=profile))
                if "e2e" in only:
                    from bench import e2e_throughput

                    results["e2e"] = _guard(
                        "e2e", lambda: e2e_throughput.run(quick, cluster=cluster, profile=profile))
            finally:
                cluster.stop()
    return results


def render_markdown(results: dict[str, BenchResult], meta: dict[str, Any]) -> str:
    env = meta["environment"]
    lines = [
        "# Benchmark results",
        "",
        f"Generated {meta['generated_at']} by `python -m bench.run{' --quick' if meta['quick'] else ''}` "
        f"in {meta['duration_s']:.0f} s; {env['cpus']} CPUs, Python {env['python']}, commit "
        f"{env['git_commit']}, load average at start {env['loadavg_at_start']}, at end "
        f"{meta.get('loadavg_at_end')}. "
        "Every ratio compares two things measured in this same run on this machine; absolute times on a "
        "shared 2-core machine are noisy. See bench/README.md for the methods.",
        "",
    ]
    summary = Table("Targets (reported, never gating)", ["target", "measured", "goal", "verdict"])
    for name in ORDER:
        if name not in results:
            continue
        for target in results[name].targets:
            summary.add(*target.row())
        if results[name].error:
            summary.add(f"{TITLES[name]}", "n/a", "", "not measured")
    lines.append(summary.markdown())
    for name in ORDER:
        if name not in results:
            continue
        result = results[name]
        lines += [f"## {TITLES[name]}", ""]
        if result.error:
            lines += ["**Not measured**:", "", "```", result.error.strip()[:2000], "```", ""]
            continue
        for table in result.tables:
            lines.append(table.markdown())
        for png in result.plots:
            lines += [f"![{png}]({png})", ""]
        profile = result.data.get("extender_profile") or result.data.get("webhook_profile")
        if profile:
            lines += ["Profile (py-spy, share of samples, inclusive):", ""]
            lines += [f"- {share:.1%} {frame}" for frame, share in profile.get("inclusive", [])[:12]]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (same as QUICK=1)")
    parser.add_argument("--only", default=",".join(ORDER), help=f"comma list of {', '.join(ORDER)}")
    parser.add_argument("--profile", action="store_true",
                        help="also py-spy tf-webhook (an extra wrk run) and tf-extender (its e2e phase)")
    args = parser.parse_args(argv)
    quick = quick_mode(args.quick)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(ORDER)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    meta: dict[str, Any] = {"generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "quick": quick,
                            "environment": environment()}
    t0 = time.perf_counter()
    results = run_all(quick, only, args.profile)
    meta["duration_s"] = round(time.perf_counter() - t0, 1)
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    targets: list[Target] = [t for name in ORDER if name in results for t in results[name].targets]
    write_json(RESULTS_DIR / "latest.json", {
        **meta,
        "targets": [t.as_dict() for t in targets],
        "benchmarks": {name: {"data": r.data, "error": r.error, "plots": r.plots,
                              "targets": [t.as_dict() for t in r.targets]} for name, r in results.items()},
    })
    (RESULTS_DIR / "latest.md").write_text(render_markdown(results, meta))
    log(f"wrote {RESULTS_DIR / 'latest.md'} and latest.json in {meta['duration_s']:.0f}s")
    for t in targets:
        log(f"target: {t.name}: {t.verdict()} ({t.value} {t.op} {t.limit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
