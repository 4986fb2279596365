"""Webhook throughput: requests/s, p50 and p99 of ``tf-webhook serve`` over TLS at 10 and 100 connections,
side by side with a bare aiohttp handler (bench/bare_admission.py) that echoes the same AdmissionReview.

Load comes from wrk (Debian package) with bench/wrk_post.lua. ``tf-webhook serve`` has no offline mode
(its views come from watch caches), so it runs against the benchmark control plane, which holds the
default GPUPool the pod falls into. Rounds alternate the order of the two servers so that drift in the
machine's load hits both alike; each figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.common import (
    BENCH_DIR,
    TMP_DIR,
    BenchResult,
    Table,
    Target,
    console_script,
    ensure_apt,
    log,
    quick_mode,
    ratio,
)

CONCURRENCY = (10, 100)
QUIET = "tf-webhook --log-level warning"
LOW = "bare aiohttp, low-level server"
TARGET_RATIO = 0.8  # of bare aiohttp, at 10 and 100 connections


def review_body() -> bytes:
    """An AdmissionReview CREATE of an opted-in pod, the way kube-apiserver sends it."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "infer-", "namespace": fixtures.NAMESPACE,
                     "labels": {"tensor-fusion.ai/enabled": "true", "app": "infer"},
                     "annotations": {"tensor-fusion.ai/tflops-request": "20",
                                     "tensor-fusion.ai/tflops-limit": "40",
                                     "tensor-fusion.ai/vram-request": "4Gi",
                                     "tensor-fusion.ai/vram-limit": "8Gi"}},
        "spec": {"containers": [{"name": "main", "image": "registry.example/infer:1.0",
                                 "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                                 "env": [{"name": "MODEL", "value": "llama"}]}],
                 "restartPolicy": "Always"},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0f4f9b0e-6d1c-4e59-9d42-bench0000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": fixtures.NAMESPACE, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    return json.dumps(review).encode()


def generate_certs(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    tool = console_script("tf-certs")
    argv = [tool] if tool else [sys.executable, "-m", "certs"]
    subprocess.run([*argv, "generate", "--out-dir", str(out_dir), "--dns", "localhost", "--ip", "127.0.0.1"],
                   check=True, stdout=subprocess.DEVNULL)
    return out_dir


def post(url: str, body: bytes, ca: Path, timeout: float = 5) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(ca))
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
        return dict(json.loads(r.read()))


def wait_ready(url: str, ca: Path, proc: subprocess.Popen[bytes], timeout: float = 60,
               body: bytes | None = None) -> None:
    """Until ``url`` answers 200 (to a GET, or to a POST of ``body``)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=2, context=ctx) as r:
                if r.status == 200:
                    return
        except Exception as exc:
            last = exc
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last!r}")


def run_wrk(wrk: str, url: str, body_file: Path, connections: int, seconds: float) -> dict[str, Any]:
    threads = min(2, connections)
    out = subprocess.run(
        [wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s",
         "-s", str(BENCH_DIR / "wrk_post.lua"), url],
        capture_output=True, text=True, env={**os.environ, "WRK_BODY_FILE": str(body_file)},
        timeout=seconds + 60, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            data = dict(json.loads(line[len("WRK_JSON "):]))
            data["rps"] = data["requests"] / (data["duration_us"] / 1e6)
            return data
    raise RuntimeError(f"wrk printed no result (rc {out.returncode}): {out.stdout[-500:]} "
                       f"{out.stderr[-500:]}")


class Servers:
    """The two servers under test, started as subprocesses on loopback."""

    def __init__(self, kubeconfig: Path, workdir: Path,
                 wrap: Callable[[str], list[str]] = lambda name: [], start_timeout: float = 60) -> None:
        """``wrap``: a command prefix for the server of that name (a row's name: a key of ``urls``), e.g.
        valgrind's; ``start_timeout``: how long each may take to start (much longer under valgrind)."""
        from tests.harness import free_port  # the harness's helper, importable via bench.cluster

        self.workdir = workdir
        self.start_timeout = start_timeout
        self.certs = generate_certs(workdir / "certs")
        self.ca = self.certs / "ca.crt"
        self.webhook_port, self.quiet_port, self.bare_port = free_port(), free_port(), free_port()
        self.low_port = free_port()
        tool = console_script("tf-webhook")
        argv = [tool] if tool else [sys.executable, "-m", "webhook.cli"]
        self._logs = [open(workdir / name, "wb")  # noqa: SIM115 - closed in stop()
                      for name in ("tf-webhook.log", "tf-webhook-quiet.log", "bare.log", "bare-low.log")]

        def webhook(port: int, log_file: Any, *extra: str) -> subprocess.Popen[bytes]:
            name = QUIET if extra else "tf-webhook"
            return subprocess.Popen(
                [*wrap(name), *argv, "serve", "--port", str(port), "--bind-address", "127.0.0.1",
                 "--cert-dir", str(self.certs), "--kubeconfig", str(kubeconfig), *extra],
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

        self.webhook = webhook(self.webhook_port, self._logs[0])
        # the same server without its per-admission log line: what logging costs
        self.quiet = webhook(self.quiet_port, self._logs[1], "--log-level", "warning")

        def bare(port: int, log_file: Any, *extra: str) -> subprocess.Popen[bytes]:
            name = LOW if extra else "bare aiohttp"
            return subprocess.Popen(
                [*wrap(name), sys.executable, "-m", "bench.bare_admission", "--port", str(port),
                 "--cert", str(self.certs / "tls.crt"), "--key", str(self.certs / "tls.key"), *extra],
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(BENCH_DIR.parent))

        self.bare = bare(self.bare_port, self._logs[2])
        # tf-webhook serves on aiohttp's low-level server; the same echo there shows what that alone saves
        self.low = bare(self.low_port, self._logs[3], "--low-level")

    @property
    def urls(self) -> dict[str, str]:
        return {"tf-webhook": f"https://127.0.0.1:{self.webhook_port}/mutate",
                QUIET: f"https://127.0.0.1:{self.quiet_port}/mutate",
                "bare aiohttp": f"https://127.0.0.1:{self.bare_port}/mutate",
                LOW: f"https://127.0.0.1:{self.low_port}/mutate"}

    def wait(self) -> None:
        body = review_body()
        for name, port, proc in (("tf-webhook", self.webhook_port, self.webhook),
                                 (QUIET, self.quiet_port, self.quiet)):
            wait_ready(f"https://127.0.0.1:{port}/readyz", self.ca, proc, self.start_timeout)
            deadline = time.monotonic() + max(30.0, self.start_timeout / 2)
            while True:  # wait for the cache to see the bench pool, or the pod is denied
                answer = post(self.urls[name], body, self.ca)["response"]
                if (answer.get("allowed") and answer.get("patch")) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if not (answer.get("allowed") and answer.get("patch")):
                raise RuntimeError(f"{name} did not mutate the bench pod: {answer}")
            self.patch_ops = len(json.loads(base64.b64decode(answer["patch"])))
        for name in ("bare aiohttp", LOW):
            wait_ready(self.urls[name], self.ca, self.procs[name], self.start_timeout, body=body)
            if json.dumps(post(self.urls[name], body, self.ca)).encode() != body:
                raise RuntimeError(f"{name} did not echo the body")

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        """Each server's process, by the name its rows carry (the keys of ``urls``)."""
        return {"tf-webhook": self.webhook, QUIET: self.quiet, "bare aiohttp": self.bare, LOW: self.low}

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for f in self._logs:
            f.close()


def measure(servers: Servers, wrk: str, body_file: Path, rounds: int, seconds: float) -> dict[str, Any]:
    from bench.e2e_throughput import cpu_seconds

    pids = servers.pids()
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in CONCURRENCY}
                                                       for name in servers.urls}
    names = list(servers.urls)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for c in CONCURRENCY:
            for name in order:
                cpu_before = cpu_seconds(pids[name])
                res = run_wrk(wrk, servers.urls[name], body_file, c, seconds)
                cpu = cpu_seconds(pids[name]) - cpu_before
                res["cpu_us_per_request"] = cpu * 1e6 / max(1, res["requests"])
                raw[name][c].append(res)
                log(f"webhook bench round {r + 1}/{rounds} c={c} {name}: {res['rps']:.0f} req/s "
                    f"p50 {res['p50_us'] / 1e3:.2f} ms p99 {res['p99_us'] / 1e3:.2f} ms "
                    f"CPU {res['cpu_us_per_request']:.0f} µs/request")
    out: dict[str, Any] = {"raw": raw, "summary": {}}
    for name in names:
        for c in CONCURRENCY:
            runs = raw[name][c]
            out["summary"].setdefault(name, {})[c] = {
                "rps": round(statistics.median(x["rps"] for x in runs), 1),
                "p50_ms": round(statistics.median(x["p50_us"] for x in runs) / 1e3, 3),
                "p99_ms": round(statistics.median(x["p99_us"] for x in runs) / 1e3, 3),
                "cpu_us": round(statistics.median(x["cpu_us_per_request"] for x in runs), 1),
                "errors": sum(x["status_errors"] + x["timeouts"] + x["read_errors"] + x["connect_errors"]
                              for x in runs),
            }
    return out


def measure_instructions(servers: Servers, wrk: str, body_file: Path, seconds: float) -> dict[str, Any]:
    """Instructions per request of each server under callgrind, counted only during one wrk run at 10
    connections after a warm-up run (every pod index's answer remembered, as in the timed runs)."""
    out: dict[str, Any] = {}
    for name, proc in servers.procs.items():
        pid = str(proc.pid)
        run_wrk(wrk, servers.urls[name], body_file, 10, seconds)
        control = ["callgrind_control", "--instr=on", pid]
        subprocess.run(control, check=True, capture_output=True, timeout=120)
        res = run_wrk(wrk, servers.urls[name], body_file, 10, seconds)
        for step in ("--instr=off", "--dump"):
            subprocess.run([*control[:1], step, pid], check=True, capture_output=True, timeout=120)
        dumps = sorted(servers.workdir.glob(f"callgrind.{pid}.*"), key=lambda f: f.stat().st_mtime)
        total = next((int(line.split()[1]) for line in reversed(dumps[-1].read_text().splitlines())
                      if line.startswith(("summary:", "totals:"))), 0) if dumps else 0
        out[name] = {"requests": res["requests"],
                     "instructions_per_request": round(total / max(1, res["requests"]))}
        log(f"webhook instructions {name}: {out[name]['instructions_per_request']} per request "
            f"over {res['requests']} requests")
    return out


def instructions_table(counts: dict[str, Any]) -> Table:
    table = Table("Webhook: instructions per request under callgrind (deterministic, user space only)",
                  ["server", "requests counted", "instructions / request", "ratio bare / this"])
    bare = counts["bare aiohttp"]["instructions_per_request"]
    for name, row in counts.items():
        table.add(name, row["requests"], row["instructions_per_request"],
                  ratio(bare, row["instructions_per_request"]))
    table.notes += [
        "valgrind --tool=callgrind with instrumentation off until a warm-up wrk run at 10 connections has "
        "passed, then on for one more run: the instructions the server executed (user space, every thread) / "
        "the requests answered. The machine's load does not change the count, so two checkouts compare "
        "exactly; it leaves out the kernel's share (the same for every server: one read and one write a "
        "request) and the cost of cache misses.",
    ]
    return table


def profile_webhook(servers: Servers, wrk: str, body_file: Path, seconds: float) -> dict[str, Any]:
    """One more wrk run at 10 connections with py-spy on tf-webhook (kept out of the measured runs)."""
    from bench.profiling import PySpy, summarise

    out = servers.workdir / "tf-webhook.pyspy.txt"
    with PySpy(servers.webhook.pid, out):
        run_wrk(wrk, servers.urls["tf-webhook"], body_file, 10, seconds)
    return summarise(out)


def breakdown(repeat: int) -> dict[str, float]:
    """In-process cost of one admission's steps (microseconds, median of ``repeat``)."""
    import io
    import itertools
    import logging

    import orjson

    from bench.common import time_calls
    from extender.common.batched_log import BatchedLog
    from extender.common.logs import JsonFormatter
    from webhook.admission import admit, allow, encode_review, parse_review
    from webhook.memo import MutationCache
    from webhook.replay import ReviewReplay
    from webhook.view import StaticClusterView

    body = review_body()
    view = StaticClusterView(fixtures.pool_objects())
    review = parse_review(body)
    cache = MutationCache()
    indexes = itertools.cycle(range(1, 129))

    def us(fn: Any) -> float:
        return round(statistics.median(time_calls(fn, repeat, warmup=20)) * 1e6, 1)

    def do_admit(memo: MutationCache | None = None) -> Any:
        return admit(review, view, scheduler_name="tensor-fusion-scheduler",
                     next_index=lambda: next(indexes), cache=memo)

    decision = do_admit()
    fields = {"uid": "u", "operation": "CREATE", "namespace": "bench", "pod": "infer-x",
              "outcome": "mutated", "reason": None, "detail": None, "duration_ms": 0.5}
    record = logging.LogRecord("webhook.server", logging.INFO, __file__, 1, "admission", None, None)
    record.__dict__.update(fields)
    formatter = JsonFormatter()
    logger = logging.getLogger("bench.webhook.admission")
    logger.setLevel(logging.INFO)
    line = BatchedLog(logger, io.StringIO())
    replay = ReviewReplay()
    for _ in range(2):  # remembered on its second sighting
        replay.remember(body, review.uid, encode_review(decision.response), owner=None, context=0,
                        index=None, outcome=decision.outcome, reason=None)
    other = body.replace(review.uid.encode(), review.uid[:-4].encode() + b"0002")  # the next pod's review

    def replayed() -> Any:
        answer = replay.answer(other, lambda owner: 0, lambda: 1)
        assert answer is not None
        return answer

    return {
        "json.loads(review)": us(lambda: json.loads(body)),
        "orjson.loads(review)": us(lambda: orjson.loads(body)),
        "parse_review (shipped: orjson and a hand check of the request)": us(lambda: parse_review(body)),
        "admit (mutate + patch), no cache": us(do_admit),
        "admit with the mutation cache (pods of one workload; shipped)": us(lambda: do_admit(cache)),
        "replayed answer: lookup and uid splice, no decoding (pods of one workload; shipped)": us(replayed),
        "json.dumps(response)": us(lambda: json.dumps(decision.response)),
        "encode_review(response) (shipped: orjson)": us(lambda: encode_review(decision.response)),
        "log line through logging (JsonFormatter.format only)": us(lambda: formatter.format(record)),
        "admission line, shipped (BatchedLog.write, written at once)": us(
            lambda: line.write(logging.INFO, "admission", dict(fields))),
        "allow() without patch": us(lambda: allow("u")),
    }


def stage(cluster: Any, workdir: Path) -> Path:
    """The default GPUPool the bench pod falls into, on ``cluster``, and the review wrk posts (its file)."""
    from bench.cluster import create_cluster_scoped

    for obj in fixtures.pool_objects():
        create_cluster_scoped(cluster.api, "gpupools", obj)
    body_file = workdir / "review.json"
    body_file.write_bytes(review_body())
    return body_file


def run_instructions(seconds: float = 10.0) -> BenchResult:
    """The instruction counts alone (``--instructions``): the four servers under callgrind."""
    from bench.cluster import BenchCluster

    wrk, valgrind = ensure_apt("wrk"), ensure_apt("valgrind")
    if wrk is None or valgrind is None:
        return BenchResult("webhook", {}, [], error="wrk or valgrind is not installed and apt-get failed")
    cluster = BenchCluster(TMP_DIR / "controlplane-webhook").start()
    workdir = TMP_DIR / "webhook-instructions"
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("callgrind.*"):
        old.unlink()
    try:
        body_file = stage(cluster, workdir)
        servers = Servers(cluster.kubeconfig, workdir, start_timeout=600, wrap=lambda name: [
            valgrind, "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={workdir}/callgrind.%p"])
        try:
            servers.wait()
            counts = measure_instructions(servers, wrk, body_file, seconds)
        finally:
            servers.stop()
    finally:
        cluster.stop()
    return BenchResult("webhook-instructions", {"instructions": counts}, [instructions_table(counts)])


def run(quick: bool = False, cluster: Any = None, profile: bool = False) -> BenchResult:
    from bench.cluster import BenchCluster

    rounds, seconds = (1, 3.0) if quick else (3, 8.0)
    wrk = ensure_apt("wrk")
    if wrk is None:
        return BenchResult("webhook", {}, [], error="wrk is not installed and apt-get could not install it")
    own = cluster is None
    if own:
        cluster = BenchCluster(TMP_DIR / "controlplane-webhook").start()
    workdir = TMP_DIR / "webhook"
    workdir.mkdir(parents=True, exist_ok=True)
    body_file = stage(cluster, workdir)
    body = body_file.read_bytes()
    servers = Servers(cluster.kubeconfig, workdir)
    try:
        servers.wait()
        data = measure(servers, wrk, body_file, rounds, seconds)
        if profile:
            data["webhook_profile"] = profile_webhook(servers, wrk, body_file, seconds)
    finally:
        servers.stop()
        if own:
            cluster.stop()
    data.update({"rounds": rounds, "seconds_per_run": seconds, "body_bytes": len(body),
                 "patch_ops": servers.patch_ops, "wrk_threads": 2})
    summary = data["summary"]
    data["breakdown_us"] = breakdown(300 if quick else 2000)
    table = Table("Webhook throughput over TLS (wrk, same machine, same run)",
                  ["connections", "server", "req/s", "p50 ms", "p99 ms", "errors", "CPU µs/request",
                   "ratio req/s", "ratio CPU", "target", "met"])
    targets = []
    for c in CONCURRENCY:
        hook, bare = summary["tf-webhook"][c], summary["bare aiohttp"][c]
        r = ratio(hook["rps"], bare["rps"])
        data.setdefault("ratio", {})[c] = r
        data.setdefault("cpu_ratio", {})[c] = ratio(bare["cpu_us"], hook["cpu_us"])
        target = Target(f"webhook req/s ratio at {c} connections", r, ">=", TARGET_RATIO)
        targets.append(target)
        table.add(c, "tf-webhook serve", hook["rps"], hook["p50_ms"], hook["p99_ms"], hook["errors"],
                  hook["cpu_us"], r, data["cpu_ratio"][c], f">= {TARGET_RATIO}", target.verdict())
        quiet = summary[QUIET][c]
        table.add(c, "tf-webhook serve --log-level warning", quiet["rps"], quiet["p50_ms"], quiet["p99_ms"],
                  quiet["errors"], quiet["cpu_us"], ratio(quiet["rps"], bare["rps"]),
                  ratio(bare["cpu_us"], quiet["cpu_us"]), "(what-if)", "")
        table.add(c, "bare aiohttp echo", bare["rps"], bare["p50_ms"], bare["p99_ms"], bare["errors"],
                  bare["cpu_us"], 1.0, 1.0, "", "")
        low = summary[LOW][c]
        table.add(c, "bare aiohttp echo, low-level server", low["rps"], low["p50_ms"], low["p99_ms"],
                  low["errors"], low["cpu_us"], ratio(low["rps"], bare["rps"]),
                  ratio(bare["cpu_us"], low["cpu_us"]), "(reference)", "")
    table.notes += [
        f"Body: one AdmissionReview CREATE of an opted-in pod ({len(body)} bytes), each request with its own "
        f"request.uid as kube-apiserver sends them (bench/wrk_post.lua); tf-webhook answers with a "
        f"{servers.patch_ops}-operation JSON Patch, the bare handler echoes the body unchanged.",
        f"wrk -t2 -cN -d{seconds:g}s over HTTPS (keep-alive), {rounds} round(s) alternating server order; "
        "figures are medians over rounds. Both servers are single aiohttp processes sharing the 2 cores "
        "with wrk; tf-webhook logs one JSON line per admission at its default level (info).",
        "ratio = tf-webhook req/s / bare req/s at the same connection count. CPU µs/request: the server "
        "process's user+system CPU during the run / requests answered; ratio CPU = bare's / tf-webhook's, "
        "what the req/s ratio would be with each server alone on a saturated core (on a loaded machine "
        "it is the steadier of the two figures).",
        "tf-webhook serves on aiohttp's low-level server (web.Server with its own path dispatch); the "
        "baseline is the usual minimal aiohttp app (web.Application and its router). The reference row "
        "runs the same echo on web.Server: the part of the gap that is aiohttp's Application layer.",
    ]
    steps = Table("Webhook: in-process cost of one admission (median µs, no TLS, no HTTP)",
                  ["step", "µs"])
    for step, value in data["breakdown_us"].items():
        steps.add(step, value)
    steps.notes += [
        "The pool lookup goes through an in-memory StaticClusterView here (the server uses watch caches).",
        "The cache row cycles through all 128 pod indexes, as the server does.",
    ]
    return BenchResult("webhook", data, [table, steps], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true", help="py-spy tf-webhook in one extra wrk run")
    parser.add_argument("--instructions", action="store_true",
                        help="instead: instructions per request of each server under callgrind (valgrind)")
    args = parser.parse_args(argv)
    result = run_instructions() if args.instructions else run(quick_mode(args.quick), profile=args.profile)
    if result.error:
        print(result.error, file=sys.stderr)
    for t in result.tables:
        print(t.markdown())


if __name__ == "__main__":
    main()
