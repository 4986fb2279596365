"""``kubectl-tf``: the kubectl plugin (``kubectl tf status|plan|simulate|mutate|version``).

kubectl runs any executable named ``kubectl-NAME`` on PATH for ``kubectl NAME``. The subcommands are the
project's own (``tf-extender status``, ``plan``, ``simulate``; ``tf-webhook mutate``) with the same flags;
this module only parses and dispatches. Every failure is one line on stderr and a non-zero exit, never a
traceback: 2 for usage and unreadable input, 1 for anything else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from extender.common.version import version_line
from extender.plan_cmd import add_plan_arguments, main_plan
from extender.simulate_cmd import add_simulate_arguments, main_simulate
from extender.status_cmd import add_status_arguments, main_status
from webhook.cli import add_mutate_arguments, run_mutate

PROG = "kubectl tf"
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A command line argparse refused, as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints usage and exits: one line instead
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def _version(_args: argparse.Namespace) -> int:
    print(version_line("kubectl-tf"))
    return 0


Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: dict[str, Command] = {
    "status": ("one screen on the GPU pools: modes, GPUs, allocated and free TFLOPS and VRAM, pending pods",
               add_status_arguments, main_status),
    "plan": ("what the capacity controllers would do now on a snapshot, as JSON lines (offline)",
             add_plan_arguments, main_plan),
    "simulate": ("place pods on a cluster snapshot with the extender's own code (offline)",
                 add_simulate_arguments, main_simulate),
    "mutate": ("show what the webhook does to a pod (offline)", add_mutate_arguments, run_mutate),
    "version": ("print the plugin's version", lambda _parser: None, _version),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="GPU pools, placements and the webhook's view, as kubectl tf.")
    parser.add_argument("--version", action="version", version=version_line("kubectl-tf"))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, (summary, add_arguments, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        add_arguments(sub)
        sub.set_defaults(run=run, prog=f"{PROG} {name}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kubectl tf plan ... | head`
        return 0
    except Exception as exc:  # one line, no traceback: what failed and why
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{args.prog}: error: {type(exc).__name__}: {message}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
