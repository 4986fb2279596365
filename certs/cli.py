"""``tf-certs``: generate certificates, store them in a Secret, wire the webhook ``caBundle``."""

from __future__ import annotations

import argparse
import ssl
import sys
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from certs import authority, files
from certs.authority import CertificateError

PROG = "tf-certs"
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, as every command of the project (certs imports nothing of
    extender, so not its ``OneLineParser``)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _version() -> str:
    """The distribution's version, as extender.common.version reads it (certs imports nothing of extender)."""
    try:
        return metadata.version("tensor-fusion-extender")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        problem = usage_problem(args)
        if problem:
            parser.error(problem)
    except SystemExit as exc:  # argparse exits on --help and on usage errors; callers want a code
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "secret":
            return _secret(args)
        if args.command == "ensure":
            return _ensure(args)
        return _patch_webhook(args)
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"{PROG} {args.command}: error: {where}{(exc.strerror or str(exc)).lower()}", file=sys.stderr)
        return 1
    except (CertificateError, RuntimeError) as exc:
        print(f"{PROG} {args.command}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, description="Certificates for the tensor-fusion webhook and scheduler extender."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser(
        "generate",
        help="write a CA and a serving certificate (and optionally a client certificate) to a directory",
        description=(
            "Write ca.crt, tls.crt and tls.key to --out-dir, signed by the CA in --ca-dir "
            "(ca.crt + ca.key; default: --out-dir). An existing CA is reused unless --regenerate-ca is "
            "given. With --client-cn, also write client.crt and client.key (CN = user, each --client-org "
            "= group)."
        ),
    )
    generate.add_argument("--out-dir", required=True, type=Path, metavar="DIR",
                          help="where ca.crt, tls.crt and tls.key (and client.crt, client.key) are written")
    generate.add_argument("--dns", action="append", default=[], metavar="NAME", type=_dns,
                          help="DNS name (repeatable)")
    generate.add_argument("--ip", action="append", default=[], metavar="IP", type=_ip,
                          help="IP address (repeatable)")
    generate.add_argument(
        "--days", type=_days, default=authority.DEFAULT_LEAF_DAYS, metavar="N", help="leaf validity (365)"
    )
    generate.add_argument("--ca-dir", type=Path, metavar="DIR", help="where the CA lives (--out-dir)")
    generate.add_argument(
        "--ca-days", type=_days, default=authority.DEFAULT_CA_DAYS, metavar="N", help="validity of a new CA"
    )
    generate.add_argument("--regenerate-ca", action=argparse.BooleanOptionalAction, default=False,
                          help="replace an existing CA")
    generate.add_argument("--client-cn", metavar="CN", help="also issue a client certificate for this user")
    generate.add_argument(
        "--client-org", action="append", default=[], metavar="ORG", help="client group (repeatable)"
    )

    secret = commands.add_parser(
        "secret", help="create or replace a kubernetes.io/tls Secret from a certificate directory"
    )
    secret.add_argument("--namespace", required=True, metavar="NS", help="namespace of the Secret")
    secret.add_argument("--name", required=True, metavar="NAME", help="name of the Secret")
    secret.add_argument("--cert-dir", required=True, type=Path, metavar="DIR",
                        help="the folder generate wrote (ca.crt, tls.crt, tls.key)")
    _add_cluster_arguments(secret)

    patch = commands.add_parser(
        "patch-webhook", help="set caBundle on every webhook of a MutatingWebhookConfiguration"
    )
    patch.add_argument("--name", required=True, metavar="CONFIG",
                       help="name of the MutatingWebhookConfiguration")
    patch.add_argument("--ca-file", required=True, type=Path, metavar="PATH", help="the CA certificate (PEM)")
    _add_cluster_arguments(patch)
    _add_ensure(commands)
    return parser


def _add_ensure(commands: argparse._SubParsersAction[_Parser]) -> None:
    ensure = commands.add_parser(
        "ensure", help="keep the CA and serving Secrets (and the webhook's caBundle) valid, idempotently",
        description="Reuse the CA Secret and the serving Secret while they are valid for the DNS names; "
                    "create or reissue what is missing, foreign or near expiry; set the caBundle of "
                    "--webhook when it exists. Run by the Helm chart's hook Jobs.")
    ensure.add_argument("--namespace", required=True, metavar="NS", help="namespace of both Secrets")
    ensure.add_argument("--secret", required=True, metavar="NAME", help="the kubernetes.io/tls Secret")
    ensure.add_argument("--ca-secret", metavar="NAME", help="the CA's Secret (default: <secret>-ca)")
    ensure.add_argument("--dns", action="append", required=True, type=_dns, metavar="NAME",
                        help="DNS name (repeatable)")
    ensure.add_argument("--webhook", metavar="CONFIG", help="MutatingWebhookConfiguration to set caBundle on")
    ensure.add_argument("--days", type=_days, default=authority.DEFAULT_LEAF_DAYS, help="serving validity")
    ensure.add_argument("--renew-before-days", type=int, default=30,
                        help="reissue what expires within this many days (default 30)")
    _add_cluster_arguments(ensure)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="PATH",
                        help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    parser.add_argument("--context", default=None,
                        help="the kubeconfig context to use (default: its current context)")


def _dns(text: str) -> str:
    try:
        return authority.check_dns_name(text)
    except CertificateError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid DNS name") from exc


def _days(text: str) -> int:
    """A number of days, at least 1; ``90d`` is read as 90 too."""
    try:
        days = int(text.removesuffix("d"))
        authority.check_days(days)
    except (ValueError, CertificateError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days of at least 1 (such as 365 or "
                                         "365d)") from exc
    return days


def _ip(text: str) -> str:
    """An IP address, checked while parsing: nothing is written for a command that names a bad one."""
    try:
        authority.parse_ip(text)
    except CertificateError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IP address") from exc
    return text


def _ensure(args: argparse.Namespace) -> int:
    from certs import kube
    from certs.ensure import ensure

    api = kube.api_client(args.kubeconfig, args.context)
    for line in ensure(api, namespace=args.namespace, secret=args.secret,
                       ca_secret=args.ca_secret or f"{args.secret}-ca", dns_names=args.dns,
                       webhook=args.webhook, days=args.days, renew_before_days=args.renew_before_days):
        _say(line)
    return 0


def usage_problem(args: argparse.Namespace) -> str | None:
    """Argument combinations that argparse cannot express."""
    if args.command != "generate":
        return None
    if not args.dns and not args.ip and not args.client_cn:
        return "generate: give at least one --dns or --ip (or --client-cn for a client certificate)"
    if args.client_org and not args.client_cn:
        return "generate: --client-org needs --client-cn"
    return None


def _generate(args: argparse.Namespace) -> int:
    out_dir: Path = args.out_dir
    ca_dir: Path = args.ca_dir or out_dir
    ca, created = files.ensure_ca(ca_dir, regenerate=args.regenerate_ca, days=args.ca_days)
    _say(f"{'generated' if created else 'reused'} CA {_subject(ca)} in {ca_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.dns or args.ip:
        serving = authority.issue_serving_cert(ca, dns_names=args.dns, ip_addresses=args.ip, days=args.days)
        files.write_serving(out_dir, ca.cert_pem, serving)
        _say(f"wrote {files.CA_CERT}, {files.TLS_CERT}, {files.TLS_KEY} to {out_dir}")
    else:
        files.write_atomic(out_dir / files.CA_CERT, ca.cert_pem)
    if args.client_cn:
        client = authority.issue_client_cert(
            ca, common_name=args.client_cn, groups=args.client_org, days=args.days
        )
        files.write_client(out_dir, client)
        _say(f"wrote {files.CLIENT_CERT}, {files.CLIENT_KEY} to {out_dir}")
    return 0


def _secret(args: argparse.Namespace) -> int:
    from certs import kube, reload  # the kubernetes client is slow to import; only these commands need it

    bundle = files.read_serving(args.cert_dir)
    # Refuse to publish a pair that the servers would not load.
    reload.load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), authority.PemPair(bundle.cert, bundle.key))
    kube.ca_bundle_value(bundle.ca_cert)
    api = kube.api_client(args.kubeconfig, args.context)
    outcome = kube.apply_tls_secret(api, args.namespace, args.name, bundle)
    _say(f"{outcome} Secret {args.namespace}/{args.name}")
    return 0


def _patch_webhook(args: argparse.Namespace) -> int:
    from certs import kube

    ca_pem = args.ca_file.read_bytes()
    changed = kube.patch_webhook_ca_bundle(kube.api_client(args.kubeconfig, args.context), args.name, ca_pem)
    if changed:
        _say(f"set caBundle on {changed} webhook(s) of MutatingWebhookConfiguration {args.name}")
    else:
        _say(f"MutatingWebhookConfiguration {args.name} already carries this caBundle")
    return 0


def _subject(ca: authority.Authority) -> str:
    return ca.certificate.subject.rfc4514_string()


def _say(message: str) -> None:
    print(message)
