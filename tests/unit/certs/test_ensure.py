"""tf-certs ensure: when the stored CA and serving pair are kept, and when they are reissued."""

from __future__ import annotations

import datetime as dt

import pytest

from certs import authority, cli
from certs.ensure import leaf_problem, load_stored_ca

NOW = dt.datetime.now(dt.UTC)
DNS = ["tensor-fusion-webhook.ns.svc", "tensor-fusion-webhook.ns.svc.cluster.local"]
RENEW = dt.timedelta(days=30)


@pytest.fixture(scope="module")
def ca() -> authority.Authority:
    return authority.generate_ca()


def test_a_valid_pair_naming_every_dns_name_is_kept(ca):
    pair = authority.issue_serving_cert(ca, dns_names=DNS, days=365)
    assert leaf_problem(ca, pair.cert, DNS, RENEW, NOW) is None


@pytest.mark.parametrize(("case", "expected"), [
    ("missing", "no serving certificate yet"),
    ("garbage", "not valid PEM"),
    ("foreign", "not signed by the CA"),
    ("fewer-names", "does not name tensor-fusion-webhook.ns.svc.cluster.local"),
    ("expiring", "expires at"),
])
def test_reasons_to_reissue(ca, case, expected):
    cert = {
        "missing": None,
        "garbage": b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
        "foreign": authority.issue_serving_cert(authority.generate_ca(), dns_names=DNS, days=365).cert,
        "fewer-names": authority.issue_serving_cert(ca, dns_names=DNS[:1], days=365).cert,
        "expiring": authority.issue_serving_cert(ca, dns_names=DNS, days=10).cert,
    }[case]
    assert expected in (leaf_problem(ca, cert, DNS, RENEW, NOW) or "")


def test_stored_ca_is_reused_only_while_it_is_valid_long_enough(ca):
    pem = ca.to_pem()
    assert load_stored_ca({"ca.crt": pem.cert, "ca.key": pem.key}, RENEW, NOW) is not None
    assert load_stored_ca({"ca.crt": pem.cert}, RENEW, NOW) is None
    other = authority.generate_ca().to_pem()
    assert load_stored_ca({"ca.crt": pem.cert, "ca.key": other.key}, RENEW, NOW) is None  # key mismatch
    short = authority.generate_ca(days=10).to_pem()
    assert load_stored_ca({"ca.crt": short.cert, "ca.key": short.key}, RENEW, NOW) is None


def test_ensure_usage():
    args = cli.build_parser().parse_args(["ensure", "--namespace", "ns", "--secret", "s", "--dns", "a.b"])
    assert (args.ca_secret, args.webhook, args.days, args.renew_before_days) == (None, None, 365, 30)
    assert cli.main(["ensure", "--namespace", "ns", "--secret", "s"]) == 2  # --dns is required
