"""``tf-webhook``: ``serve`` the admission webhook over HTTPS, or ``mutate`` one pod offline."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extender.common.cli import EXIT_USAGE, OneLineParser, describe, fail
from extender.common.numbers import int_flag
from extender.common.options import (
    add_config_argument,
    duration,
    parse_with_sources,
    subcommand,
    take_deprecations,
)
from extender.common.version import version_line

# The server, the mutation, aiohttp and the Kubernetes client are imported where a command needs them:
# ``tf-webhook --version`` and shell completion stay fast.

log = logging.getLogger("webhook.cli")

EXIT_DENIED = 1
# tf-webhook serve --request-timeout can also come from TF_WEBHOOK_REQUEST_TIMEOUT or --config FILE.
ENV_PREFIX = "TF_WEBHOOK"


def build_parser() -> argparse.ArgumentParser:
    from extender.common.contract import DEFAULT_SCHEDULER_NAME
    from webhook.deadline import DEFAULT_REQUEST_TIMEOUT
    from webhook.karpenter import Mode
    from webhook.priority import DEFAULT_NAMESPACES

    parser = OneLineParser(prog="tf-webhook", description="Serve the admission webhook, or show what it does "
                                                          "to a pod or workload offline.")
    parser.add_argument("--version", action="version", version=version_line("tf-webhook"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="serve the mutating admission webhook over HTTPS")
    serve.add_argument("--port", type=int_flag(0, 65535), default=9443,
                       help="HTTPS port of the webhook (default 9443)")
    serve.add_argument("--bind-address", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    serve.add_argument("--metrics-port", type=int_flag(0, 65535), default=0,
                       help="also serve /metrics, /healthz and /readyz over plain HTTP on this port "
                            "(default 0: off; they are always on the HTTPS port too)")
    serve.add_argument("--cert-dir", required=True, type=Path,
                       help="directory with tls.crt and tls.key, reloaded when they change")
    serve.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    serve.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME,
                       help=f"schedulerName set on GPU pods (default {DEFAULT_SCHEDULER_NAME})")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="the least severe log lines written (default info)")
    serve.add_argument("--request-timeout", type=duration("--request-timeout", positive=True),
                       default=DEFAULT_REQUEST_TIMEOUT, metavar="DURATION",
                       help="time to answer one AdmissionReview (default 8s)")
    serve.add_argument("--cert-reload-interval", type=duration("--cert-reload-interval", positive=True),
                       default=2.0, metavar="DURATION",
                       help="time between checks of the certificate files (default 2s)")
    serve.add_argument("--karpenter-do-not-disrupt", choices=[m.value for m in Mode], default=Mode.AUTO.value,
                       help='add karpenter.sh/do-not-disrupt: "true" to mutated pods, so Karpenter does not '
                            "consolidate nodes under them: auto (while the API serves Karpenter's "
                            "NodeClaims), true, false")
    serve.add_argument("--qos-priority-namespaces", default=DEFAULT_NAMESPACES, metavar="NS[,NS...]",
                       help="the namespaces whose pods may get the high and critical QoS priority "
                            "classes (tensor-fusion-high, tensor-fusion-critical); elsewhere a pod asking "
                            "for them is denied naming tensor-fusion.ai/qos; * for every namespace "
                            f"(default {DEFAULT_NAMESPACES})")
    serve.add_argument("--qos-priority-pools", default="", metavar="POOL[,POOL...]",
                       help="GPUPools whose pods may get those priority classes in any namespace "
                            "(default none)")
    add_config_argument(serve, ENV_PREFIX)

    add_mutate_arguments(commands.add_parser(
        "mutate", help="show what the webhook does to a pod or a workload's pods, without a cluster"))
    return parser


def add_mutate_arguments(offline: argparse.ArgumentParser) -> None:
    """``mutate``'s flags (``tf-webhook mutate`` and ``kubectl tf mutate``; both run ``run_mutate``)."""
    from extender.common.contract import DEFAULT_SCHEDULER_NAME

    offline.add_argument("--pod", required=True, metavar="FILE",
                         help="a Pod, or a Deployment, StatefulSet, Job, ReplicaSet, DaemonSet or CronJob "
                              "(its pod template), as YAML or JSON; - for stdin")
    offline.add_argument("--objects", default=None, metavar="FILE",
                         help="YAML stream or List of GPUPools, WorkloadProfiles, SchedulingConfigTemplates, "
                              "ReplicaSets, Jobs ... (kubectl tf snapshot writes one)")
    offline.add_argument("--namespace", default=None,
                         help="namespace of the pod (default: its own, else default)")
    offline.add_argument("--scheduler-name", default=DEFAULT_SCHEDULER_NAME,
                         help=f"schedulerName the webhook sets (default {DEFAULT_SCHEDULER_NAME})")
    offline.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml",
                         help="format of the mutated pod (default yaml)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:
        print(version_line("tf-webhook"))
        return 0
    parser = build_parser()
    args = parse_with_sources(parser, serve_parser(parser) if argv[:1] == ["serve"] else None, argv,
                              ENV_PREFIX)
    if args.command == "mutate":
        return run_mutate(args)
    from extender.common import eventloop
    from extender.common.logs import setup_logging

    setup_logging(args.log_level)
    for line in take_deprecations():
        log.warning(line)
    try:
        return eventloop.run(serve(args))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # startup failures: bad certificates, kubeconfig, port in use
        log.error("cannot serve", extra={"error": f"{type(exc).__name__}: {exc}"})
        return 1


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return subcommand(parser, "serve")


def run_mutate(args: argparse.Namespace) -> int:
    """Print the mutated pod, or every denial (one line each, exit 1)."""
    from webhook.mutation import mutate
    from webhook.offline import NotAPodError, every_denial, pod_of
    from webhook.view import ObjectsError, StaticClusterView, load_objects

    prog = getattr(args, "prog", "tf-webhook mutate")
    try:
        pod = pod_of(_read_object(args.pod), "--pod " + args.pod)
        objects = load_objects(_read_text(args.objects), args.objects) if args.objects else []
    except (ObjectsError, NotAPodError) as exc:
        return fail(prog, str(exc), EXIT_USAGE)
    except (OSError, UnicodeDecodeError) as exc:
        return fail(prog, describe(exc), EXIT_USAGE)
    namespace = args.namespace or str((pod.get("metadata") or {}).get("namespace") or "") or "default"
    view = StaticClusterView(objects, default_namespace=namespace)
    result, denials = every_denial(pod, lambda p: mutate(p, view, scheduler_name=args.scheduler_name, index=1,
                                                         namespace=namespace))
    if denials:
        for denial in denials:
            print(f"denied: {denial.message}", file=sys.stderr)
        return EXIT_DENIED
    if result.skipped:
        print("pod is not labelled tensor-fusion.ai/enabled=true: the webhook leaves it untouched",
              file=sys.stderr)
    sys.stdout.write(_render(result.pod, args.output))
    return 0


def _read_text(path: str) -> str:
    from extender.common.yamlio import YAMLFileError, read_text_file
    from webhook.view import ObjectsError

    if path == "-":
        return sys.stdin.read()
    try:
        return read_text_file(path)
    except YAMLFileError as exc:
        raise ObjectsError(str(exc)) from None


def _read_object(path: str) -> dict[str, Any]:
    from extender.common.yamlio import YAMLFileError, iter_documents
    from webhook.view import ObjectsError

    try:
        documents = [d for d in iter_documents(_read_text(path), path) if d is not None]
    except YAMLFileError as exc:
        raise ObjectsError(str(exc)) from exc
    if len(documents) != 1 or not isinstance(documents[0], dict):
        found = f"{len(documents)} documents" if len(documents) != 1 else \
            f"a {type(documents[0]).__name__} where a mapping with a kind belongs"
        raise ObjectsError(f"--pod {path}: expected exactly one object (a Pod or a workload), found {found}")
    return documents[0]


def _render(pod: dict[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(pod, indent=2) + "\n"
    import yaml

    return str(yaml.safe_dump(pod, sort_keys=False))


async def serve(args: argparse.Namespace) -> int:
    # Imported here so that the offline ``mutate`` does not pay for the Kubernetes client.
    import asyncio
    import signal

    from aiohttp import web

    from certs.files import TLS_CERT
    from certs.reload import serving_context, watch_certificates
    from extender.kube.client import load_api_client
    from webhook.caches import ServingCaches
    from webhook.karpenter import DoNotDisruptSwitch, Mode, api_probe, running
    from webhook.memo import MutationCache
    from webhook.priority import PriorityPolicy
    from webhook.replay import ReviewReplay
    from webhook.server import WebhookService, admission_log, create_monitoring_server, create_server

    ssl_context = serving_context(args.cert_dir)
    api_client = load_api_client(args.kubeconfig)
    caches = ServingCaches.from_api(api_client)
    mode = Mode(args.karpenter_do_not_disrupt)
    switch = DoNotDisruptSwitch(mode, api_probe(api_client) if mode is Mode.AUTO else None)
    service = WebhookService(caches.view_for, caches.ready, scheduler_name=args.scheduler_name,
                             request_timeout=args.request_timeout, do_not_disrupt=lambda: switch.enabled,
                             mutation_cache=MutationCache(), generation=lambda: caches.generation,
                             replay=ReviewReplay(), owner_token=caches.owner_token,
                             priority=PriorityPolicy.from_lists(args.qos_priority_namespaces,
                                                                args.qos_priority_pools))
    service.metrics.track_certificate(Path(args.cert_dir) / TLS_CERT)
    if service.replay is not None:
        service.metrics.track_replay(service.replay)
    runner = web.ServerRunner(create_server(service))
    await runner.setup()
    monitoring = None
    if args.metrics_port:
        monitoring = web.ServerRunner(create_monitoring_server(service))
        await monitoring.setup()
    caches.start()
    reloader = asyncio.create_task(watch_certificates(ssl_context, args.cert_dir, args.cert_reload_interval))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with running(switch):
            await web.TCPSite(runner, args.bind_address, args.port, ssl_context=ssl_context).start()
            if monitoring is not None:
                await web.TCPSite(monitoring, args.bind_address, args.metrics_port).start()
            log.info("serving", extra={"address": args.bind_address, "port": args.port,
                                       "scheduler_name": args.scheduler_name,
                                       "karpenter_do_not_disrupt": mode.value})
            await stop.wait()
            log.info("shutting down")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        from extender.common.tasks import cancel_and_wait

        await cancel_and_wait([reloader])
        if monitoring is not None:
            await monitoring.cleanup()
        await runner.cleanup()
        admission_log.flush()  # the lines still waiting for their write
        await caches.stop()
    return 0
