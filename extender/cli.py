"""``tf-extender``: run the scheduler extender, or simulate placements offline."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from extender.common.cli import EXIT_FAILED, EXIT_USAGE, OneLineParser, describe, fail
from extender.common.numbers import int_flag
from extender.common.options import (
    add_config_argument,
    duration,
    parse_with_sources,
    subcommand,
    take_deprecations,
)
from extender.common.version import version_line

# The controllers, the scheduling core, numpy and aiohttp are imported where a command needs them, never
# at start: ``tf-extender --version`` and shell completion stay fast (docs/cli.md).
if TYPE_CHECKING:
    from extender.service import ExtenderService, Settings

log = logging.getLogger(__name__)

# Every ``serve`` option can also come from TF_EXTENDER_<FLAG> (TF_EXTENDER_BIND_DEADLINE=30s) or from
# ``--config FILE`` (extender/common/options.py).
ENV_PREFIX = "TF_EXTENDER"


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """The process's own flags (API access, the HTTP face, the scheduling core), then every controller's."""
    from extender.controllers import leadership, registry
    from extender.scheduling.state import InventorySource

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
    serve.add_argument("--instance-topology-configmap", default="", metavar="NAMESPACE/NAME",
                       help="a ConfigMap whose instance-topology.yaml adds or replaces entries of the "
                            "built-in GPU topology table of cloud instance types (docs/topology.md); watched "
                            "(default: the built-in table only)")
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
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="the least severe log lines written (default info)")
    leadership.add_arguments(serve)
    for package in registry.CONTROLLERS:  # each controller package declares its own options
        package.add_arguments(serve)
    add_config_argument(serve, ENV_PREFIX)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, only that subcommand's flags are added (shell completion asks for the one
    it completes: each command's flags import its modules)."""
    parser = OneLineParser(prog="tf-extender", description="Run the scheduler extender, or look at and plan "
                                                           "GPU pools offline.")
    parser.add_argument("--version", action="version", version=version_line("tf-extender"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary, add in _COMMANDS:
        sub = commands.add_parser(name, help=summary)
        if only is None or only == name:
            add(sub)
    return parser


def _add_simulate(simulate: argparse.ArgumentParser) -> None:
    try:
        from extender.simulate_cmd import add_simulate_arguments
    except ImportError:  # the simulator ships separately from the server
        simulate.set_defaults(simulate_missing=True)
    else:
        add_simulate_arguments(simulate)


def _add_status(parser: argparse.ArgumentParser) -> None:
    from extender.status_cmd import add_status_arguments

    add_status_arguments(parser)


def _add_plan(parser: argparse.ArgumentParser) -> None:
    from extender.plan_cmd import add_plan_arguments

    add_plan_arguments(parser)


def _add_crds(parser: argparse.ArgumentParser) -> None:
    from extender.crds_cmd import add_crds_arguments

    add_crds_arguments(parser)


_COMMANDS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("serve", "run the kube-scheduler HTTP extender", add_serve_arguments),
    ("simulate", "place pods on a cluster snapshot, offline", _add_simulate),
    ("status", "one screen on the GPU pools, read from the API server", _add_status),
    ("plan", "print, as JSON lines, what the capacity controllers would do now on a snapshot", _add_plan),
    ("crds", "install the project's CRDs, refusing to replace TensorFusion's or any that has more",
     _add_crds),
)


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return subcommand(parser, "serve")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:  # before the parser, which imports every controller for its flags
        print(version_line("tf-extender"))
        return 0
    parser = build_parser()
    args = parse_with_sources(parser, serve_parser(parser) if argv[:1] == ["serve"] else None, argv,
                              ENV_PREFIX)
    if args.command == "serve":
        return serve(args)
    try:
        return _run_command(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tf-extender plan ... | head`
        return 0
    except Exception as exc:  # one line, never a traceback
        return fail(f"tf-extender {args.command}", describe(exc))


def _run_command(args: argparse.Namespace) -> int:
    if args.command == "simulate":
        if getattr(args, "simulate_missing", False):
            return fail("tf-extender simulate", "the simulator is not installed", EXIT_USAGE)
        from extender.simulate_cmd import main_simulate

        return int(main_simulate(args))
    if args.command == "status":
        from extender.status_cmd import main_status

        return main_status(args)
    if args.command == "plan":
        from extender.plan_cmd import main_plan

        return main_plan(args)
    from extender.crds_cmd import main_crds

    return main_crds(args)


def serve(args: argparse.Namespace) -> int:
    from certs.authority import CertificateError
    from extender.common import eventloop
    from extender.common.logs import setup_logging
    from extender.kube.client import KubeConfigError, load_api_client
    from extender.service import ExtenderService

    setup_logging(args.log_level)
    for line in take_deprecations():
        log.warning(line)
    try:
        api_client = load_api_client(args.kubeconfig)
    except KubeConfigError as exc:
        return fail("tf-extender serve", str(exc), EXIT_USAGE)
    settings = settings_from_args(args)
    try:
        eventloop.run(_run(ExtenderService(api_client, settings)))
    except (OSError, CertificateError) as exc:  # port in use, unreadable certificates ...
        log.error("cannot serve", extra={"error": str(exc)})
        return fail("tf-extender serve", describe(exc), EXIT_FAILED)
    return 0


def settings_from_args(args: argparse.Namespace) -> Settings:
    """``serve``'s flags as the service's settings, each controller's read by its own package."""
    from extender.controllers import leadership, registry
    from extender.scheduling.state import InventorySource
    from extender.service import Settings

    return Settings(
        port=args.port, bind_address=args.bind_address, prefix=args.prefix, cert_dir=args.cert_dir,
        metrics_port=args.metrics_port, metrics_bind_address=args.metrics_bind_address,
        inventory=InventorySource(args.inventory_source), max_pods_per_node=args.max_pods_per_node,
        instance_topology_configmap=args.instance_topology_configmap,
        bind_deadline=args.bind_deadline, filter_first_choice=args.filter_first_choice,
        lease_namespace=leadership.from_args(args),
        controllers={package.NAME: package.from_args(args) for package in registry.CONTROLLERS},
    )


async def _run(service: ExtenderService) -> None:
    import asyncio
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await service.run(stop)



