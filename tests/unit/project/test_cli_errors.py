"""Every command line error is one line naming what is at fault (the flag, the file, the API server, the
resource), with argparse's exit codes: 2 for usage and unreadable input, 1 for failures afterwards."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from certs.cli import main as certs_main
from extender.cli import main as extender_main
from kubectl_tf.cli import main as plugin_main
from webhook.cli import main as webhook_main

MAINS: dict[str, Callable[[list[str]], int]] = {
    "tf-extender": extender_main, "tf-webhook": webhook_main, "tf-certs": certs_main,
    "kubectl-tf": plugin_main,
}


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """{tmp}/unreachable: a kubeconfig whose API server refuses connections; {tmp}/bad.yaml: not YAML.
    The root logger as a command line starts with it (no handler: other tests' handlers would print
    urllib3's retry warnings, which a user never sees)."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    (tmp_path / "unreachable").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    (tmp_path / "bad.yaml").write_text("kind: Pod\nmetadata:\n  name: a\n   labels: {}\n")
    return tmp_path


UNREACHABLE = "cannot reach the API server at https://127.0.0.1:1"
CASES = [
    # usage: the flag and its value
    ("tf-extender", ["bogus"], 2, "invalid choice: 'bogus'"),
    ("tf-extender", ["serve", "--config", "{tmp}/none.yaml"], 2, "none.yaml: no such file or directory"),
    ("tf-extender", ["serve", "--port", "eighty"], 2, "argument --port: 'eighty' is not an integer"),
    ("tf-extender", ["crds", "apply", "--timeout", "soon"], 2,
     "argument --timeout: 'soon' is not a duration"),
    ("tf-extender", ["status", "--watch-interval", "0s"], 2, "--watch-interval"),
    ("tf-extender", ["plan", "--cluster", "{tmp}/bad.yaml", "--now", "yesterday"], 2, "--now 'yesterday'"),
    ("tf-webhook", ["serve"], 2, "the following arguments are required: --cert-dir"),
    ("tf-webhook", ["serve", "--cert-dir", "x", "--config", "{tmp}/none.yaml"], 2,
     "none.yaml: no such file or directory"),
    ("tf-certs", ["generate", "--out-dir", "{tmp}/out", "--ip", "999.1.1.1"], 2,
     "argument --ip: '999.1.1.1' is not an IP address"),
    ("tf-certs", ["generate"], 2, "the following arguments are required: --out-dir"),
    ("kubectl-tf", ["status", "--bogus"], 2, "unrecognized arguments: --bogus"),
    ("kubectl-tf", ["completion", "fish"], 2, "argument shell: invalid choice: 'fish'"),
    # files: the path and what is wrong with it
    ("tf-extender", ["simulate", "--cluster", "{tmp}/none.yaml", "--pods", "p"], 2,
     "{tmp}/none.yaml: no such file or directory"),
    ("tf-extender", ["plan", "--cluster", "{tmp}/bad.yaml"], 2, "{tmp}/bad.yaml:4:"),
    ("tf-extender", ["crds", "check", "-f", "{tmp}/none"], 2, "none: no such file"),
    ("tf-webhook", ["mutate", "--pod", "{tmp}/none.yaml"], 2, "{tmp}/none.yaml: no such file or directory"),
    ("tf-certs", ["patch-webhook", "--name", "w", "--ca-file", "{tmp}/none.crt"], 1,
     "{tmp}/none.crt: no such file or directory"),
    ("kubectl-tf", ["mutate", "--pod", "{tmp}/bad.yaml"], 2, "{tmp}/bad.yaml:4:"),
    # the cluster: the kubeconfig, the context, the API server
    ("tf-extender", ["status", "--kubeconfig", "{tmp}/unreachable", "--context", "prod"], 2,
     "context 'prod'"),
    ("tf-extender", ["status", "--kubeconfig", "{tmp}/unreachable"], 1, UNREACHABLE),
    ("tf-extender", ["crds", "check", "--kubeconfig", "{tmp}/unreachable"], 1, UNREACHABLE),
    ("tf-extender", ["crds", "apply", "--kubeconfig", "{tmp}/unreachable", "--context", "c",
                     "--timeout", "1m"], 1, UNREACHABLE),
    ("kubectl-tf", ["snapshot", "--kubeconfig", "{tmp}/unreachable"], 1, UNREACHABLE),
    ("tf-certs", ["secret", "--namespace", "n", "--name", "s", "--cert-dir", "{tmp}", "--context", "nope",
                  "--kubeconfig", "{tmp}/unreachable"], 1, "missing"),
]


@pytest.mark.parametrize(("program", "argv", "code", "needle"), CASES,
                         ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_each_error_is_one_line_naming_what_is_at_fault(
    files: Path, capsys: pytest.CaptureFixture[str], program: str, argv: list[str], code: int, needle: str,
) -> None:
    tmp = str(files)
    try:
        assert MAINS[program]([arg.replace("{tmp}", tmp) for arg in argv]) == code
    except SystemExit as exc:  # tf-extender and tf-webhook leave usage errors to argparse's exit
        assert exc.code == code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert needle.replace("{tmp}", tmp) in lines[0], lines[0]
    assert "Traceback" not in captured.err and "Errno" not in captured.err and "MaxRetryError" not in lines[0]
    assert "error" in lines[0] and lines[0].startswith(program.replace("kubectl-tf", "kubectl tf"))
    if program == "tf-certs" and code == 2:
        assert not (files / "out").exists(), "a usage error writes nothing"
