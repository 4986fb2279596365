"""A real Prometheus (built by build-control-plane.sh) and a dcgm-exporter stand-in for it to scrape.

``DcgmStandIn`` stands in for NVIDIA dcgm-exporter on a GPU node, which cannot run here (no GPU, no DCGM):
it serves dcgm-exporter's metric names and labels (``DCGM_FI_DEV_FB_USED`` MiB, ``DCGM_FI_DEV_GPU_UTIL`` %,
``DCGM_FI_PROF_*`` ratios; ``gpu``, ``UUID``, ``modelName``, ``Hostname``, ``pod``, ``namespace``,
``container``) with values the test scripts. Everything else is real: Prometheus scrapes it and the
extender's /metrics, stores the samples, answers PromQL. ``backfill`` writes history with ``promtool tsdb
create-blocks-from openmetrics`` into the data directory before Prometheus starts.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .processes import ManagedProcess, ProcessRegistry, free_port, http_ready, wait_until

DCGM_FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
               "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")
_HELP = {"DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).", "DCGM_FI_DEV_FB_USED": "Framebuffer memory used "
         "(in MiB).", "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
         "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
         "DCGM_FI_PROF_SM_ACTIVE": "The ratio of cycles an SM has at least 1 warp assigned.",
         "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of cycles the device memory interface is active."}


@dataclass
class ScriptedGPU:
    """One device as dcgm-exporter reports it: ``pod``/``namespace``/``container`` only when the kubelet's
    PodResources API attributes the whole GPU to one pod (empty for a shared GPU, as dcgm-exporter leaves
    them)."""

    uuid: str
    hostname: str
    index: int = 0
    model: str = "NVIDIA A100-SXM4-40GB"
    util_percent: float = 0.0
    fb_used_mib: float = 0.0
    fb_total_mib: float = 40960.0
    pod: str = ""
    namespace: str = ""
    container: str = ""

    def labels(self) -> str:
        pairs = {"gpu": str(self.index), "UUID": self.uuid, "device": f"nvidia{self.index}",
                 "modelName": self.model, "Hostname": self.hostname, "DCGM_FI_DRIVER_VERSION": "570.124.06",
                 "container": self.container, "namespace": self.namespace, "pod": self.pod}
        return ",".join(f'{k}="{v}"' for k, v in pairs.items())

    def values(self) -> dict[str, float]:
        ratio = self.util_percent / 100
        return {"DCGM_FI_DEV_GPU_UTIL": self.util_percent, "DCGM_FI_DEV_FB_USED": self.fb_used_mib,
                "DCGM_FI_DEV_FB_FREE": max(0.0, self.fb_total_mib - self.fb_used_mib),
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ratio, "DCGM_FI_PROF_SM_ACTIVE": ratio * 0.9,
                "DCGM_FI_PROF_DRAM_ACTIVE": ratio * 0.5}


def exposition(gpus: Iterable[ScriptedGPU]) -> str:
    """The text dcgm-exporter serves for these devices now."""
    gpus = list(gpus)
    lines: list[str] = []
    for name in DCGM_FIELDS:
        lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge"]
        lines += [f"{name}{{{gpu.labels()}}} {gpu.values()[name]:g}" for gpu in gpus]
    return "\n".join(lines) + "\n"


class DcgmStandIn:
    """dcgm-exporter's /metrics with scripted values, on 127.0.0.1 (see the module docstring)."""

    def __init__(self) -> None:
        self.gpus: dict[str, ScriptedGPU] = {}
        self._lock = threading.Lock()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with stand_in._lock:
                    body = exposition(stand_in.gpus.values()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="dcgm-stand-in")
        self._thread.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, gpu: ScriptedGPU) -> None:
        with self._lock:
            self.gpus[gpu.uuid] = gpu

    def update(self, uuid: str, **values: Any) -> None:
        with self._lock:
            for key, value in values.items():
                setattr(self.gpus[uuid], key, value)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def backfill(promtool: Path, data_dir: Path, gpus: Iterable[ScriptedGPU], start: float, end: float,
             step: float, work: Path) -> None:
    """History for ``gpus`` (their current values, every ``step`` seconds from ``start`` to ``end``) as
    TSDB blocks in ``data_dir``, with promtool, before Prometheus opens it."""
    import subprocess

    gpus = list(gpus)
    lines: list[str] = []
    for name in DCGM_FIELDS:
        lines.append(f"# HELP {name} {_HELP[name]}")
        lines.append(f"# TYPE {name} gauge")
        at = start
        while at <= end:
            for gpu in gpus:
                lines.append(f"{name}{{{gpu.labels()}}} {gpu.values()[name]:g} {at:.3f}")
            at += step
    source = work / "backfill.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
                   check=True, capture_output=True, timeout=300)


@dataclass
class PrometheusServer:
    binary: Path
    workdir: Path
    registry: ProcessRegistry
    log_dir: Path
    targets: dict[str, list[str]] = field(default_factory=dict)  # job -> host:port
    scrape_interval: str = "1s"
    port: int = 0
    proc: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    def start(self, timeout: float = 90) -> PrometheusServer:
        self.port = self.port or free_port()
        config = self.workdir / "prometheus.yml"
        every = self.scrape_interval
        jobs = [{"job_name": job, "scrape_interval": every, "scrape_timeout": every,
                 "static_configs": [{"targets": targets}]} for job, targets in self.targets.items()]
        # JSON is YAML
        config.write_text(json.dumps({"global": {"scrape_interval": self.scrape_interval},
                                      "scrape_configs": jobs}))
        self.proc = self.registry.start("prometheus", [
            str(self.binary), f"--config.file={config}", f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=15d",
        ], self.log_dir)
        proc = self.proc
        wait_until(lambda: http_ready(f"{self.url}/-/ready", proc), timeout, interval=0.3,
                   what="Prometheus /-/ready")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.registry.forget(self.proc)
        self.proc = None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector's samples)."""
        data = urllib.parse.urlencode({"query": promql}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, timeout: float = 60) -> list[dict[str, Any]]:
        return wait_until(lambda: self.query(promql) or None, timeout, interval=0.5,
                          what=f"Prometheus to answer {promql}")
