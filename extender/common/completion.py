"""Shell completion from the argparse parsers themselves, for bash, zsh and kubectl's plugin protocol.

``complete(parser, words)`` is pure: given the words after the program name, the last one being typed, it
answers the subcommands, flags or flag values that fit, and whether a file name fits instead. The shell
scripts ``script`` prints ask ``kubectl-tf __complete PROG WORD...`` for each Tab; kubectl (1.26 and
later) asks the executable ``kubectl_complete-tf`` on PATH, which answers in cobra's format: one candidate
a line, then ``:4`` (no file names) or ``:0`` (file names welcome). Standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

# cobra's ShellCompDirective values, as kubectl reads them from a plugin's completion
DIRECTIVE_DEFAULT = 0  # the shell may complete file names
DIRECTIVE_NO_FILES = 4


@dataclass(frozen=True)
class Completion:
    candidates: list[str]
    files: bool  # a file name (or anything free) fits here

    def cobra(self) -> str:
        """kubectl's plugin completion answer."""
        directive = DIRECTIVE_DEFAULT if self.files else DIRECTIVE_NO_FILES
        return "".join(f"{c}\n" for c in self.candidates) + f":{directive}\n"


SubParsers = argparse._SubParsersAction  # argparse's own name for the subcommands action


def _subcommands(parser: argparse.ArgumentParser) -> SubParsers[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def complete(parser: argparse.ArgumentParser, words: Sequence[str]) -> Completion:
    """What may follow ``words[:-1]`` and start with ``words[-1]`` (an empty list: anything)."""
    words = list(words) or [""]
    *done, current = words
    expecting: argparse.Action | None = None
    positionals = 0  # free words given to the current parser
    for word in done:
        if expecting is not None:
            expecting = None
            continue
        if word.startswith("-"):
            action = _options(parser).get(word.split("=", 1)[0])
            if action is not None and _takes_value(action) and "=" not in word:
                expecting = action
            continue
        commands = _subcommands(parser)
        if commands is not None and word in commands.choices:
            parser, positionals = commands.choices[word], 0
        else:
            positionals += 1
    if expecting is not None:
        if expecting.choices is not None:
            return Completion(sorted(str(c) for c in expecting.choices if str(c).startswith(current)), False)
        return Completion([], True)
    if current.startswith("-"):
        flags = sorted(f for f in _options(parser) if f.startswith("--") and f.startswith(current))
        return Completion(flags, False)
    commands = _subcommands(parser)
    if commands is not None:
        return Completion(sorted(c for c in commands.choices if c.startswith(current)), False)
    free = [a for a in parser._actions if not a.option_strings]
    options = free[positionals].choices if positionals < len(free) else None
    if options is not None:
        choices = [str(c) for c in options]
        return Completion(sorted(c for c in choices if c.startswith(current)), False)
    return Completion([], True)


_BASH = """\
# bash completion for {progs} (tensor-fusion-extender); zsh: autoload -U +X bashcompinit && bashcompinit first
_tensor_fusion_extender_complete() {{
    local IFS=$'\\n' answer
    answer=$(kubectl-tf __complete "$1" "${{COMP_WORDS[@]:1:COMP_CWORD}}" 2>/dev/null) || return
    COMPREPLY=($(printf '%s\\n' "$answer" | sed '$d'))
}}
complete -o default -F _tensor_fusion_extender_complete {progs}
"""
_ZSH_PREFIX = "autoload -U +X bashcompinit && bashcompinit\n"


def script(shell: str, progs: Sequence[str]) -> str:
    """The completion script for ``shell`` (bash or zsh) registering ``progs``."""
    body = _BASH.format(progs=" ".join(progs))
    return (_ZSH_PREFIX + body) if shell == "zsh" else body
