"""``tf-extender``: run the scheduler extender, or simulate placements offline."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import TYPE_CHECKING

from extender.common import eventloop
from extender.common.numbers import int_flag
from extender.common.options import (
    add_config_argument,
    duration,
    parse_with_sources,
    subcommand,
    take_deprecations,
)
from extender.common.version import version_line
from extender.controllers import leadership, registry
from extender.scheduling.state import InventorySource

if TYPE_CHECKING:
    from extender.service import ExtenderService, Settings

log = logging.getLogger(__name__)

# Every ``serve`` option can also come from TF_EXTENDER_<FLAG> (TF_EXTENDER_BIND_DEADLINE=30s) or from
# ``--config FILE`` (extender/common/options.py).
ENV_PREFIX = "TF_EXTENDER"


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The process's own flags (API access, the HTTP face, the scheduling core), then every controller's."""
    serve.add_argument("--port", type=int_flag(0, 65535), default=8080,
                       help="port of the verbs, /healthz, /readyz and /metrics")
    serve.add_argument("--bind-address", default="127.0.0.1",
                       help="listen address (default loopback: a sidecar of kube-scheduler)")
    serve.add_argument("--metrics-port", type=int_flag(0, 65535), default=0,
                       help="also serve /metrics, /healthz and /readyz (nothing else) on this port, so that "
                            "Prometheus and the kubelet reach them on the pod IP while the verbs stay on "
                            "loopback (default 0: off)")
    serve.add_argument("--metrics-bind-address", default="0.0.0.0",
                       help="listen address of --metrics-port (default 0.0.0.0)")
    serve.add_argument("--prefix", default="/scheduler", help="URL prefix of the verbs (default /scheduler)")
    serve.add_argument("--kubeconfig", default=None,
                       help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    serve.add_argument("--cert-dir", default=None, help="serve HTTPS with tls.crt/tls.key from this folder")
    serve.add_argument("--inventory-source", default=InventorySource.AUTO.value,
                       choices=[s.value for s in InventorySource],
                       help="GPUs from TensorFusion GPU objects, from GPU Feature Discovery node labels, or "
                            "auto: GPU objects where a node has them, labels elsewhere (default auto)")
    serve.add_argument("--max-pods-per-node", type=int_flag(1), default=256,
                       help="at most this many GPU pods per node (default 256)")
    serve.add_argument("--bind-deadline", type=duration("--bind-deadline", positive=True), default=55.0,
                       metavar="DURATION",
                       help="answer a bind within this time, even while its outcome is still being found "
                            "out; keep it below the scheduler's extender httpTimeout (default 55s)")
    serve.add_argument("--filter-first-choice", action=argparse.BooleanOptionalAction, default=True,
                       help="filter answers only the node the extender would score highest, so "
                            "kube-scheduler skips prioritize (one extender call per pod instead of two); "
                            "--no-filter-first-choice answers every fitting node and lets the scheduler's "
                            "scoring weigh them (default on)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    leadership.add_arguments(serve)
    for package in registry.CONTROLLERS:  # each controller package declares its own options
        package.add_arguments(serve)
    add_config_argument(serve, ENV_PREFIX)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tf-extender", description=__doc__)
    parser.add_argument("--version", action="version", version=version_line("tf-extender"))
    commands = parser.add_subparsers(dest="command", required=True)

    add_serve_arguments(commands.add_parser("serve", help="run the kube-scheduler HTTP extender"))

    simulate = commands.add_parser("simulate", help="place pods on a cluster snapshot, offline")
    try:
        from extender.simulate_cmd import add_simulate_arguments
    except ImportError:  # the simulator ships separately from the server
        simulate.set_defaults(simulate_missing=True)
    else:
        add_simulate_arguments(simulate)

    status = commands.add_parser("status", help="one screen on the GPU pools, read from the API server")
    from extender.status_cmd import add_status_arguments

    add_status_arguments(status)

    from extender.plan_cmd import add_plan_arguments

    add_plan_arguments(commands.add_parser(
        "plan", help="print, as JSON lines, what the capacity controllers would do now on a snapshot"))

    from extender.crds_cmd import add_crds_arguments

    add_crds_arguments(commands.add_parser(
        "crds", help="install the project's CRDs, refusing to replace TensorFusion's or any that has more"))
    return parser


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return subcommand(parser, "serve")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parse_with_sources(parser, serve_parser(parser) if argv[:1] == ["serve"] else None, argv,
                              ENV_PREFIX)
    if args.command == "simulate":
        if getattr(args, "simulate_missing", False):
            print("tf-extender: the simulator is not installed", file=sys.stderr)
            return 2
        from extender.simulate_cmd import main_simulate

        return int(main_simulate(args))
    if args.command == "status":
        from extender.status_cmd import main_status

        return main_status(args)
    if args.command == "plan":
        from extender.plan_cmd import main_plan

        return main_plan(args)
    if args.command == "crds":
        from extender.crds_cmd import main_crds

        return main_crds(args)
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    from certs.authority import CertificateError
    from extender.common.logs import setup_logging
    from extender.kube.client import KubeConfigError, load_api_client
    from extender.service import ExtenderService

    setup_logging(args.log_level)
    for line in take_deprecations():
        log.warning(line)
    try:
        api_client = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        print(f"tf-extender: {exc}", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    try:
        eventloop.run(_run(ExtenderService(api_client, settings)))
    except (OSError, CertificateError) as exc:  # port in use, unreadable certificates ...
        log.error("cannot serve", extra={"error": str(exc)})
        print(f"tf-extender: {exc}", file=sys.stderr)
        return 1
    return 0


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``serve``'s flags as the service's settings, each controller's read by its own package."""
    from extender.service import Settings

    return Settings(
        port=args.port, bind_address=args.bind_address, prefix=args.prefix, cert_dir=args.cert_dir,
        metrics_port=args.metrics_port, metrics_bind_address=args.metrics_bind_address,
        inventory=InventorySource(args.inventory_source), max_pods_per_node=args.max_pods_per_node,
        bind_deadline=args.bind_deadline, filter_first_choice=args.filter_first_choice,
        lease_namespace=leadership.from_args(args),
        controllers={package.NAME: package.from_args(args) for package in registry.CONTROLLERS},
    )


async def _run(service: ExtenderService) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await service.run(stop)



