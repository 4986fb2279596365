"""The Prometheus usage reader without a Prometheus (the real one is in tests/e2e/test_usage_prometheus_e2e):
paging, template substitution, answers that are not usage, flags, ``plan --autoscale --prometheus``, and
the loop's answer to an unreachable source (a condition, never a resize)."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from typing import Any

import pytest
from aiohttp import web

from extender.controllers.autoscale import config as autoscale_config
from extender.controllers.autoscale.prometheus import (
    DCGM_TFLOPS,
    HYPERVISOR_VRAM,
    PrometheusOptions,
    PrometheusUsage,
    UsageUnavailable,
    pages,
    render,
)
from tests.unit.fixtures.autoscale import (
    NOW,
    Workloads,
    autoscale_snapshot,
    autoscaled_worker,
    autoscaler,
    g1_used,
    state_with,
    usage_source,
)
from tests.unit.fixtures.fakes import Events


def test_pages_cover_the_range_once_with_bounded_points() -> None:
    assert pages(0, 100, 10, 5) == [(0, 40), (50, 90), (100, 100)]
    assert pages(0, 30, 10, 11000) == [(0, 30)]
    covered = [p for begin, end in pages(60, 60 * 180, 60, 50) for p in range(int(begin), int(end) + 1, 60)]
    assert covered == list(range(60, 60 * 181, 60))


def test_templates_take_the_names_as_promql_strings() -> None:
    query = render(DCGM_TFLOPS, 'a"b', "w\\1")
    assert 'namespace="a\\"b"' in query and 'workload="w\\\\1"' in query
    assert '"$1"' in render(HYPERVISOR_VRAM, "ns", "w")  # label_replace's $1 is not a placeholder


async def _serve(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/api/v1/query_range", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _read(handler, start_s: float, end_s: float, **options: Any) -> tuple[Any, list[dict[str, str]]]:
    asked: list[dict[str, str]] = []

    async def recording(request: web.Request) -> web.StreamResponse:
        asked.append(dict(await request.post()))  # type: ignore[arg-type]
        return await handler(request, asked[-1])

    async def go() -> Any:
        runner, url = await _serve(recording)
        try:
            reader = PrometheusUsage(PrometheusOptions(url, "T $workload", "V $workload", **options))
            return await reader.workload_usage("ns", "wl", int(start_s * 1e9), int(end_s * 1e9))
        finally:
            await runner.cleanup()

    return asyncio.run(go()), asked


def test_samples_per_worker_from_two_queries_paged() -> None:
    async def handler(request: web.Request, form: dict[str, str]) -> web.Response:
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        points = [start + i * step for i in range(int((end - start) / step) + 1)]
        value = "12.5" if form["query"].startswith("T") else str(3 * 2**30)
        result = [{"metric": {"pod": "w-0"}, "values": [[p, value] for p in points]},
                  {"metric": {"pod": "w-1"}, "values": [[p, "NaN"] for p in points]},
                  {"metric": {}, "values": [[start, "1"]]}]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    samples, asked = _read(handler, 1000, 1000 + 3600, step_seconds=30, max_points=50)
    assert [a["query"] for a in asked[:2]] == ["T wl", "V wl"]
    assert len(asked) == 2 * 3  # 120 points, 50 a request
    assert len(samples) == 120 and {s.worker for s in samples} == {"w-0"}
    assert samples[0].unix_ns == 1020 * 10**9  # the first step after the start (read once)
    assert samples[0].tflops == 12.5 and samples[0].vram == 3 * 2**30


@pytest.mark.parametrize(("status", "body", "says"), [
    (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
    (200, {"status": "success", "data": {"resultType": "vector", "result": []}}, "not a range vector"),
    (502, None, "HTTP 502, not a Prometheus answer"),
])
def test_an_answer_that_is_not_usage_is_named(status: int, body: Any, says: str) -> None:
    async def handler(request: web.Request, form: dict[str, str]) -> web.Response:
        if body is None:
            return web.Response(status=status, text="<html>bad gateway</html>")
        return web.json_response(body, status=status)

    with pytest.raises(UsageUnavailable, match=says):
        _read(handler, 0, 600)


def test_nothing_listening_is_unavailable() -> None:
    reader = PrometheusUsage(PrometheusOptions("http://127.0.0.1:9"))
    with pytest.raises(UsageUnavailable, match=r"127\.0\.0\.1:9"):
        asyncio.run(reader.workload_usage("ns", "wl", 0, 600 * 10**9))


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    autoscale_config.add_arguments(parser)
    return parser.parse_args(["--autoscale", *argv])


def test_flags() -> None:
    options = autoscale_config.from_args(_args("--autoscale-prometheus-url", "http://p:9090",
                                               "--autoscale-usage-metrics", "hypervisor",
                                               "--autoscale-prometheus-step", "1m"))
    assert options.prometheus is not None and options.prometheus.step_seconds == 60
    assert "tf_worker_usage_compute_tflops" in options.prometheus.tflops_query
    assert autoscale_config.from_args(_args()).prometheus is None
    url = ("--autoscale-prometheus-url", "http://p")
    for argv, says in [(("--autoscale-prometheus-url", "p:9090"), "not an http"),
                       ((*url, "--autoscale-prometheus-max-points", "20000"), r"not in \[2, 11000\]"),
                       ((*url, "--autoscale-usage-file", "f"), "give one")]:
        with pytest.raises(SystemExit, match=says):
            autoscale_config.from_args(_args(*argv))


@pytest.mark.parametrize("step", ["often", "0s", "30"])
def test_a_step_that_is_not_a_positive_go_duration_is_a_usage_error_naming_the_flag(
        step: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _args("--autoscale-prometheus-url", "http://p", "--autoscale-prometheus-step", step)
    err = capsys.readouterr().err
    assert "error: argument --autoscale-prometheus-step:" in err and step in err, err


class Down:
    async def workload_usage(self, namespace: str, workload: str, start_ns: int, end_ns: int) -> Any:
        raise UsageUnavailable("Prometheus at http://p: ClientConnectorError")


def test_an_unreachable_source_is_a_condition_and_no_resize() -> None:
    a = autoscaled_worker("a", "ua", "10")
    state, workloads, events = state_with(a), Workloads(), Events()
    loop = autoscaler(state, [a], workloads, Down(), events)
    asyncio.run(loop.reconcile(NOW))
    (condition,) = workloads.objects[("ml", "a")]["status"]["conditions"]
    assert condition["status"] == "False" and condition["reason"] == "UsageUnavailable"
    assert "http://p" in condition["message"]
    assert events.recorded == [] and g1_used(state) == 10
    # back again: what was missed is read, from where the last good read ended
    loop.source = usage_source("a", 40.0)
    asyncio.run(loop.reconcile(NOW + dt.timedelta(seconds=30)))
    assert g1_used(state) == 47


def test_the_preset_templates_parse_as_promql() -> None:
    import promql_parser

    from extender.controllers.autoscale.prometheus import PRESETS

    for pair in PRESETS.values():
        for template in pair:
            promql_parser.parse(render(template, "ns", "wl"))


def test_plan_autoscale_reads_prometheus(tmp_path, capsys) -> None:
    """``plan --autoscale --prometheus``: the same plan as from a samples file, read over query_range from
    a stand-in for Prometheus' HTTP API (the real one is in the e2e module)."""
    import http.server
    import json
    import threading
    import urllib.parse

    from extender.cli import main

    cluster, _ = autoscale_snapshot(tmp_path)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
            start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
            value = "40" if "tflops" in form["query"] else str(3 * 2**30)
            values = [[start + i * step, value] for i in range(int((end - start) / step) + 1)]
            result = [{"metric": {"pod": "a"}, "values": values}] if 'workload="w"' in form["query"] else []
            data = {"resultType": "matrix", "result": result}
            body = json.dumps({"status": "success", "data": data}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc = main(["plan", "--cluster", str(cluster), "--now", "2026-01-01T12:00:00Z", "--autoscale",
                   "--prometheus", f"http://127.0.0.1:{server.server_address[1]}", "--history", "1h"])
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    mine = next(line for line in lines if line.get("action") == "autoscale" and line["workload"] == "w")
    assert mine["recommendation"]["requests"]["tflops"] == "47" and mine["samples"] == 120


def test_plan_autoscale_with_an_unreachable_prometheus_says_why(tmp_path, capsys) -> None:
    from extender.cli import main

    cluster, _ = autoscale_snapshot(tmp_path)
    rc = main(["plan", "--cluster", str(cluster), "--autoscale", "--prometheus", "http://127.0.0.1:9"])
    assert rc == 2
    assert "--prometheus: Prometheus at http://127.0.0.1:9" in capsys.readouterr().err
