"""The conventions every command line of the project follows, in one place.

- a time is a Go duration (``30s``, ``5m``, ``1h30m``): :func:`duration` is the argparse type; a bare
  number is still read as seconds where a flag took seconds before, and noted for a deprecation line;
- every option of a long-running ``serve`` command can also come from an environment variable named after
  the flag (``TF_EXTENDER_BIND_DEADLINE`` for ``tf-extender serve --bind-deadline``) or from a YAML file
  given with ``--config`` whose keys are the flag names (``bind-deadline: 30s``); the command line wins
  over the environment, which wins over the file, which wins over the built-in default
  (:func:`apply_sources`);
- a file that cannot be read as YAML is reported with its name and the line and column at fault
  (:func:`load_yaml_file`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from extender.common.numbers import NumberError, parse_float
from extender.common.timefmt import format_duration, parse_duration
from extender.common.yamlio import YAMLFileError, read_text_file

MAX_CONFIG_BYTES = 1024 * 1024  # a config file of settings, not a data file

CONFIG_FLAG = "--config"
_BARE_NUMBER = re.compile(r"^\s*\d+(?:\.\d*)?\s*$|^\s*\.\d+\s*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

_deprecations: list[str] = []


class OptionSourceError(Exception):
    """A setting from the environment or a config file that cannot be used; the message names where."""


class DurationType:
    """The argparse ``type`` of a time option: a Go duration as seconds (a float).

    ``positive`` refuses 0; ``legacy_seconds`` still takes a bare number as seconds (the flag took
    seconds before) and keeps a deprecation line for :func:`take_deprecations`."""

    def __init__(self, flag: str, *, positive: bool = False, legacy_seconds: bool = True) -> None:
        self.flag, self.positive, self.legacy_seconds = flag, positive, legacy_seconds
        self.__name__ = "duration"  # argparse's "invalid duration value" message

    def __call__(self, text: str) -> float:
        bare = self.legacy_seconds and _BARE_NUMBER.match(text) is not None
        if bare:
            try:
                seconds = parse_float(text, maximum=dt.timedelta.max.total_seconds())
            except NumberError as exc:
                raise argparse.ArgumentTypeError(f"{exc} (seconds)") from None
        else:
            try:
                seconds = parse_duration(text).total_seconds()
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        if self.positive and not seconds > 0:
            raise argparse.ArgumentTypeError(f"{text} is not a positive duration")
        if bare:
            _deprecations.append(f"{self.flag} {text.strip()}: bare seconds are deprecated, "
                                 f"write a Go duration ({format_duration(seconds)})")
        return seconds


def duration(flag: str, *, positive: bool = False, legacy_seconds: bool = True) -> DurationType:
    return DurationType(flag, positive=positive, legacy_seconds=legacy_seconds)


def take_deprecations() -> list[str]:
    """The deprecation lines noted while parsing since the last call (a command logs them once its logging
    is set up)."""
    out = list(dict.fromkeys(_deprecations))
    _deprecations.clear()
    return out


def env_name(prefix: str, flag: str) -> str:
    """``TF_EXTENDER`` and ``--bind-deadline`` give ``TF_EXTENDER_BIND_DEADLINE``."""
    return f"{prefix}_{flag.lstrip('-').upper().replace('-', '_')}"


def configurable(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a config file or the environment may set: every long flag but ``--help`` and
    ``--config`` itself."""
    return [a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
            and _long_flag(a) != CONFIG_FLAG]


def _long_flag(action: argparse.Action) -> str:
    return next((s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-")),
                action.option_strings[0])


_ENV_PREFIX_ATTR = "tf_env_prefix"


def env_prefix_of(parser: argparse.ArgumentParser) -> str | None:
    """The environment prefix ``add_config_argument`` gave ``parser`` (None: no environment variables)."""
    prefix = getattr(parser, _ENV_PREFIX_ATTR, None)
    return prefix if isinstance(prefix, str) else None


def add_config_argument(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    setattr(parser, _ENV_PREFIX_ATTR, env_prefix)  # for the flag reference's environment column
    parser.add_argument(CONFIG_FLAG, metavar="FILE.yaml", default=None,
                        help="read options from this YAML file, keys named as the flags without their dashes "
                             f"(bind-deadline: 30s); the command line and {env_prefix}_<FLAG> environment "
                             f"variables win over it (also {env_prefix}_CONFIG)")


def load_yaml_file(path: str | Path) -> Any:
    """The one YAML document of ``path``; an ``OptionSourceError`` naming the file, line and column when
    it cannot be read or parsed."""
    try:
        text = read_text_file(str(path), MAX_CONFIG_BYTES)
    except YAMLFileError as exc:
        raise OptionSourceError(str(exc)) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise OptionSourceError(f"{where}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise OptionSourceError(f"{path}: not valid YAML: {exc}") from None


def _config_lines(path: str | Path) -> dict[str, int]:
    """The line of each top-level key of a config file, for messages."""
    lines: dict[str, int] = {}
    try:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            match = re.match(r"^([A-Za-z0-9_-]+)\s*:", line)
            if match:
                lines.setdefault(match[1], number)
    except (OSError, UnicodeDecodeError):
        pass
    return lines


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, value: object, where: str) -> object:
    flag = _long_flag(action)
    if isinstance(action, argparse.BooleanOptionalAction):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise OptionSourceError(f"{where}: {flag} is a switch: {value!r} is not true or false")
    if isinstance(value, dict | list) or value is None:
        raise OptionSourceError(f"{where}: {flag} takes one value, not {value!r}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = parser._get_value(action, text)  # the flag's own type, as on the command line
    except argparse.ArgumentError as exc:
        raise OptionSourceError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise OptionSourceError(f"{where}: {flag}: {value!r} is not one of {choices}")
    return converted


def apply_sources(parser: argparse.ArgumentParser, argv: Sequence[str], env_prefix: str,
                  environ: Mapping[str, str] | None = None) -> None:
    """Set ``parser``'s defaults from ``--config FILE`` (in ``argv``, or ``<env_prefix>_CONFIG``) and then
    from ``<env_prefix>_<FLAG>`` variables, so that parsing ``argv`` afterwards lets the command line win.
    ``OptionSourceError`` for an unknown key, a value the flag refuses, or a file that is not YAML."""
    env = os.environ if environ is None else environ
    actions = configurable(parser)
    by_key = {_long_flag(a).lstrip("-"): a for a in actions}
    pre = argparse.ArgumentParser(prog=parser.prog, add_help=False)
    pre.add_argument(CONFIG_FLAG, default=None)
    known, _ = pre.parse_known_args(list(argv))
    config_path = known.config or env.get(f"{env_prefix}_CONFIG") or None
    if config_path:
        document = load_yaml_file(config_path)
        if document is None:
            document = {}
        if not isinstance(document, dict):
            raise OptionSourceError(f"{config_path}: expected a mapping of option names to values, "
                                    f"not {type(document).__name__}")
        lines = _config_lines(config_path)
        for key, value in document.items():
            where = f"{config_path}:{lines[key]}" if key in lines else str(config_path)
            action = by_key.get(str(key))
            if action is None:
                close = difflib.get_close_matches(str(key), list(by_key), n=1)
                hint = f": did you mean {close[0]!r}?" if close else " (keys are the flags, as in --help)"
                raise OptionSourceError(f"{where}: unknown option {key!r}{hint}")
            _set_default(action, _convert(parser, action, value, where))
    for key, action in by_key.items():
        name = env_name(env_prefix, "--" + key)
        if name in env:
            _set_default(action, _convert(parser, action, env[name], name))


def _set_default(action: argparse.Action, value: object) -> None:
    action.default = value
    action.required = False


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of ``parser``'s subcommand ``name``."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub: argparse.ArgumentParser = commands.choices[name]
    return sub


def parse_with_sources(parser: argparse.ArgumentParser, subparser: argparse.ArgumentParser | None,
                       argv: Sequence[str], env_prefix: str,
                       on_error: Callable[[str], object] | None = None) -> argparse.Namespace:
    """Parse ``argv`` with ``parser`` after :func:`apply_sources` on ``subparser`` (the ``serve`` command),
    reporting a bad source the way argparse reports a bad flag (usage, the message, exit status 2)."""
    if subparser is not None:
        try:
            apply_sources(subparser, argv, env_prefix)
        except OptionSourceError as exc:
            (on_error or subparser.error)(str(exc))
    return parser.parse_args(list(argv))
