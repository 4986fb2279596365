"""``kubectl tf``: the plugin dispatches to the project's own commands, and every failure is one line on
stderr with no traceback."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extender.common.version import version
from kubectl_tf import cli
from tests.unit.fixtures.simulate import CLUSTER, PODS
from tests.unit.fixtures.status import Closable, status_snapshot

PLUGIN = Path(sys.executable).parent / "kubectl-tf"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as kubectl runs it."""
    return subprocess.run([str(PLUGIN), *argv], capture_output=True, text=True, timeout=60)


def _one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_version_as_a_command_and_a_flag() -> None:
    assert _run("version").stdout == f"kubectl-tf {version()}\n"
    assert _run("--version").stdout == f"kubectl-tf {version()}\n"


def test_every_subcommand_is_the_projects_own_with_its_flags() -> None:
    parser = cli.build_parser()
    status = parser.parse_args(["status", "--context", "prod", "-n", "ml", "--watch", "-o", "json"])
    assert (status.context, status.namespace, status.watch, status.output) == ("prod", "ml", True, "json")
    assert status.watch_interval == 2.0
    assert parser.parse_args(["plan", "--cluster", "s.yaml", "--defrag"]).defrag
    assert parser.parse_args(["simulate", "--cluster", "c", "--pods", "p"]).pods == "p"
    assert parser.parse_args(["mutate", "--pod", "-"]).output == "yaml"
    from extender.plan_cmd import main_plan
    from extender.simulate_cmd import main_simulate
    from extender.status_cmd import main_status
    from webhook.cli import run_mutate

    runs = {name: cli._function(*parser.parse_args([name, *args]).run) for name, args in (
        ("status", []), ("plan", ["--cluster", "c"]), ("simulate", ["--cluster", "c", "--pods", "p"]),
        ("mutate", ["--pod", "p"]))}
    assert runs == {"status": main_status, "plan": main_plan, "simulate": main_simulate, "mutate": run_mutate}


@pytest.mark.parametrize(("argv", "needle"), [
    (["bogus"], "invalid choice: 'bogus'"),
    (["status", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["status", "--watch-interval", "soon"], "'soon' is not a duration"),
    (["simulate", "--pods", "p.yaml"], "the following arguments are required: --cluster"),
    (["crds"], "invalid choice: 'crds'"),
])
def test_usage_errors_are_one_line(argv: list[str], needle: str) -> None:
    line = _one_line_error(_run(*argv), 2)
    assert needle in line and line.startswith("kubectl tf") and "--help" in line


def test_a_missing_file_and_bad_yaml_are_one_line_naming_file_and_line(tmp_path: Path) -> None:
    line = _one_line_error(_run("simulate", "--cluster", str(tmp_path / "nope.yaml"), "--pods", "x"), 2)
    assert line.startswith("kubectl tf simulate: ") and "nope.yaml" in line
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Pod\nmetadata:\n  name: a\n   labels: {}\n")
    for argv in (["simulate", "--cluster", str(bad), "--pods", str(bad)], ["plan", "--cluster", str(bad)],
                 ["mutate", "--pod", str(bad)]):
        line = _one_line_error(_run(*argv), 2)
        assert f"{bad}:4:" in line, line


def test_an_unknown_context_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [],
                                          "contexts": [], "current-context": ""}))
    line = _one_line_error(_run("status", "--kubeconfig", str(kubeconfig), "--context", "prod"), 2)
    assert line.startswith("kubectl tf status: error: cannot load Kubernetes configuration")
    assert "'prod'" in line


def test_an_unexpected_failure_is_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def boom(_args: object) -> int:
        raise RuntimeError("the ledger\nfell over")

    monkeypatch.setattr(cli, "_boom", boom, raising=False)
    monkeypatch.setitem(cli.COMMANDS, "status", ("fails", "kubectl_tf.cli", "_add_no_arguments", "_boom"))
    assert cli.main(["status"]) == 1
    assert capsys.readouterr().err == "kubectl tf status: error: the ledger fell over\n"


def test_kubectl_tf_alone_prints_its_help() -> None:
    proc = _run()
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: kubectl tf") and "snapshot" in proc.stdout


def test_simulate_through_the_plugin_is_tf_extender_simulate(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cluster, pods = tmp_path / "cluster.yaml", tmp_path / "pods.yaml"
    cluster.write_text(yaml.safe_dump_all(CLUSTER))
    pods.write_text(yaml.safe_dump_all(PODS[:2]))
    from extender import cli as extender_cli

    assert cli.main(["simulate", "--cluster", str(cluster), "--pods", str(pods)]) == 0
    via_plugin = capsys.readouterr().out
    assert extender_cli.main(["simulate", "--cluster", str(cluster), "--pods", str(pods)]) == 0
    assert capsys.readouterr().out == via_plugin
    assert [json.loads(line)["pod"] for line in via_plugin.splitlines()] == ["ml/one", "ml/two"]


def test_status_json_through_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from extender import status_cmd

    monkeypatch.setattr(status_cmd, "read_snapshot", lambda _lister: status_snapshot())
    monkeypatch.setattr("extender.kube.client.load_api_client", lambda _path, context=None: Closable())
    out = io.StringIO()
    args = cli.build_parser().parse_args(["status", "-o", "json", "-n", "nowhere"])
    assert status_cmd.main_status(args, out) == 0
    report = json.loads(out.getvalue())
    assert report["pools"] and all(not pool["pendingPods"] for pool in report["pools"])
