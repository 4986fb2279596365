"""What ``--help`` shows a user of the four programs: every flag explained, no reStructuredText markup (the
docstrings' ``double backquotes`` read as noise in a terminal), and ``--version`` answered before anything
heavy is imported."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kubectl_tf.cli import PROGRAMS, parser_of

MARKUP = re.compile(r"``|:[a-z]+:`|\.\. [a-z]+::")


def _parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


ALL = [(path, parser) for program in PROGRAMS for path, parser in _parsers(parser_of(program), program)]


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[path for path, _ in ALL])
def test_every_flag_has_help_and_no_markup(path: str, parser: argparse.ArgumentParser) -> None:
    silent = [a.option_strings or [a.dest] for a in parser._actions
              if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert not silent, f"{path}: flags without help: {silent}"
    text = parser.format_help()
    assert not MARKUP.search(text), f"{path} --help shows markup: {MARKUP.findall(text)}"


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_version_imports_neither_numpy_nor_aiohttp_nor_the_kubernetes_client(program: str) -> None:
    """--version (and the plugin's version command) answer before the commands' modules are imported."""
    module = PROGRAMS[program]
    code = (f"import sys\nfrom {module} import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('numpy', 'aiohttp', 'kubernetes', 'extender.controllers') "
            "if m in sys.modules)\nprint('heavy:', ','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(f"{program} ") and lines[-1] == "heavy:", out.stdout
