"""``kubectl-tf``: the kubectl plugin (``kubectl tf status``, ``snapshot``, ``plan``, ``simulate``,
``mutate``, ``completion``, ``version``).

kubectl runs any executable named ``kubectl-NAME`` on PATH for ``kubectl NAME``, and asks
``kubectl_complete-NAME`` for Tab completions. The subcommands are the project's own (``tf-extender status``,
``plan``, ``simulate``; ``tf-webhook mutate``) with the same flags; this module only parses and dispatches,
importing a command's module only when that command runs. Every failure is one line on stderr and a
non-zero exit, never a traceback: 2 for usage and unreadable input, 1 for anything else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from extender.common.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, OneLineParser, describe, fail
from extender.common.version import version_line

PROG = "kubectl tf"
# The four programs the completion script covers (kubectl-tf answers for all of them: it imports them all).
PROGRAMS = {"tf-extender": "extender.cli", "tf-webhook": "webhook.cli", "tf-certs": "certs.cli",
            "kubectl-tf": "kubectl_tf.cli"}

# name -> (summary, module, its add-arguments function, its run function)
COMMANDS: dict[str, tuple[str, str, str, str]] = {
    "status": ("one screen on the GPU pools: modes, GPUs, allocated and free TFLOPS and VRAM, pending pods",
               "extender.status_cmd", "add_status_arguments", "main_status"),
    "snapshot": ("write everything plan, simulate and mutate read from the cluster to one YAML file",
                 "extender.snapshot_cmd", "add_snapshot_arguments", "main_snapshot"),
    "plan": ("what the capacity controllers would do now on a snapshot (offline)",
             "extender.plan_cmd", "add_plan_arguments", "main_plan"),
    "simulate": ("place pods on a cluster snapshot with the extender's own code (offline)",
                 "extender.simulate_cmd", "add_simulate_arguments", "main_simulate"),
    "mutate": ("show what the webhook does to a pod or a workload's pods (offline)",
               "webhook.cli", "add_mutate_arguments", "run_mutate"),
    "completion": ("print the bash or zsh completion of tf-extender, tf-webhook, tf-certs and kubectl-tf",
                   "kubectl_tf.cli", "_add_completion_arguments", "_completion"),
    "version": ("print the plugin's version", "kubectl_tf.cli", "_add_no_arguments", "_version"),
}


def _function(module: str, name: str) -> Callable[..., Any]:
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


def _add_no_arguments(_parser: argparse.ArgumentParser) -> None:
    return None


def _version(_args: argparse.Namespace) -> int:
    print(version_line("kubectl-tf"))
    return 0


def _add_completion_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=("bash", "zsh"),
                        help="the shell: source <(kubectl tf completion bash), or save it under "
                             "/etc/bash_completion.d/")


def _completion(args: argparse.Namespace) -> int:
    from extender.common.completion import script

    sys.stdout.write(script(args.shell, list(PROGRAMS)))
    return 0


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, only that subcommand's flags are added (for completion: each command's
    flags import its modules)."""
    parser = OneLineParser(prog=PROG,
                           description="GPU pools, placements and the webhook's view, as kubectl tf.")
    parser.add_argument("--version", action="version", version=version_line("kubectl-tf"))
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (summary, module, add_arguments, run) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if only is None or only == name:
            _function(module, add_arguments)(sub)
        sub.set_defaults(run=(module, run), prog=f"{PROG} {name}")
    return parser


def parser_of(program: str, words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of one of the four programs; for completing ``words``, with the flags of the subcommand
    they name only, where the program builds its subcommands' flags lazily."""
    build = _function(PROGRAMS[program], "build_parser")
    if program in LAZY_PARSERS and words is not None:
        chosen = next((w for w in words[:-1] if not w.startswith("-")), "")
        parser: argparse.ArgumentParser = build(only=chosen)
        return parser
    parser = build()
    return parser


LAZY_PARSERS = ("tf-extender", "kubectl-tf")  # their build_parser(only=...) adds one subcommand's flags


def complete_words(program: str, words: Sequence[str]) -> str:
    """``program``'s completions of ``words`` in cobra's format ("" and ":4" for an unknown program)."""
    from extender.common.completion import Completion, complete

    if program not in PROGRAMS:
        return Completion([], False).cobra()
    return complete(parser_of(program, words), words).cobra()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv in (["--version"], ["version"]):  # before the parser, which imports every command
        print(version_line("kubectl-tf"))
        return 0
    if argv[:1] == ["__complete"]:  # the completion scripts: __complete PROGRAM WORD...
        sys.stdout.write(complete_words(argv[1] if len(argv) > 1 else "", argv[2:]))
        return 0
    parser = build_parser()
    if not argv:  # `kubectl tf` alone: what it can do
        parser.print_help()
        return 0
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, and usage errors (already printed as one line)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        module, run = args.run
        return int(_function(module, run)(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `kubectl tf plan ... | head`
        return 0
    except Exception as exc:  # one line, no traceback: what failed and why
        return fail(args.prog, describe(exc), EXIT_FAILED)


def complete_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-tf``: kubectl's completion protocol for the plugin (the words after ``tf``)."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words == ["--help"]:  # a person, not kubectl (which always passes the word being typed, maybe "")
        print("usage: kubectl_complete-tf [WORD ...]\n\nkubectl's completion of kubectl tf: the words after "
              "`kubectl tf`, the last one being typed; prints the candidates, then cobra's directive.")
        return 0
    sys.stdout.write(complete_words("kubectl-tf", words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
