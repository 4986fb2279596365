"""Shell completion: what Tab offers after each word, for the four programs and kubectl's plugin protocol."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from extender.common.completion import complete
from extender.common.completion import script as completion_script
from kubectl_tf import cli


@pytest.mark.parametrize(("program", "words", "candidates", "files"), [
    ("kubectl-tf", [""], ["completion", "mutate", "plan", "simulate", "snapshot", "status", "version"],
     False),
    ("kubectl-tf", ["s"], ["simulate", "snapshot", "status"], False),
    ("kubectl-tf", ["status", "--con"], ["--context"], False),
    ("kubectl-tf", ["status", "-o", ""], ["json", "table", "yaml"], False),
    ("kubectl-tf", ["plan", "--cluster", ""], [], True),  # a file name
    ("kubectl-tf", ["completion", ""], ["bash", "zsh"], False),
    ("kubectl-tf", ["completion", "bash", ""], [], True),
    ("tf-extender", ["crds", ""], ["apply", "check"], False),
    ("tf-extender", ["crds", "apply", "--t"], ["--timeout"], False),
    ("tf-extender", ["serve", "--inventory-source", "n"], ["node-labels"], False),
    ("tf-extender", ["serve", "--inventory-source=auto", "--log-l"], ["--log-level"], False),
    ("tf-webhook", ["mutate", "-o", ""], ["json", "yaml"], False),
    ("tf-certs", ["gen"], ["generate"], False),
    ("tf-certs", ["ensure", "--ca"], ["--ca-secret"], False),
])
def test_tab_offers_what_fits_after_the_words(program: str, words: list[str], candidates: list[str],
                                              files: bool) -> None:
    found = complete(cli.parser_of(program, words), words)
    assert found == complete(cli.parser_of(program), words)  # the lazy parser completes as the whole one
    assert (found.candidates, found.files) == (candidates, files)


def test_kubectl_complete_tf_answers_in_cobras_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.complete_main(["status", "--watch-i"]) == 0
    assert capsys.readouterr().out == "--watch-interval\n:4\n"
    assert cli.complete_main(["simulate", "--pods", ""]) == 0
    assert capsys.readouterr().out == ":0\n"  # file names welcome


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_completion_script_registers_the_four_programs_and_is_valid_shell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shell: str
) -> None:
    assert cli.main(["completion", shell]) == 0
    text = capsys.readouterr().out
    assert ("complete -o default -F _tensor_fusion_extender_complete tf-extender tf-webhook tf-certs "
            "kubectl-tf") in text
    script = tmp_path / "completion.sh"
    script.write_text(text)
    if shell == "bash":
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_the_bash_function_completes_through_kubectl_tf(tmp_path: Path) -> None:
    """The script as bash runs it: COMP_WORDS in, COMPREPLY out, answered by kubectl-tf __complete."""
    script = tmp_path / "completion.sh"
    script.write_text(completion_script("bash", ["tf-extender"]))
    shim = tmp_path / "kubectl-tf"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m kubectl_tf.cli \"$@\"\n")
    shim.chmod(0o755)
    run = (f"source {script}; COMP_WORDS=(tf-extender crds ap); COMP_CWORD=2; "
           "_tensor_fusion_extender_complete tf-extender; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin", "PYTHONPATH": str(Path.cwd())})
    assert out.stdout.split() == ["apply"], out
