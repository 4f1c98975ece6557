"""Command-line arguments checked by the Python API's own rules, when they are parsed.

``python -m specdecode demo`` and ``bench`` take the values of :func:`specdecode.generate`
(gamma, rule, temperature, lengths); each ``type=`` here runs the same check the API runs
(:func:`~specdecode.integrations.hf.arguments.check_int`, :class:`~specdecode.SamplingParams`,
the rule registry) and turns its message into an argparse error, so a bad value stops the
command at once, with the API's words, before any model is loaded.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

from specdecode.integrations.hf.arguments import check_int
from specdecode.rules import get_rule
from specdecode.sampling import SamplingParams


class ArgumentParser(argparse.ArgumentParser):
    """A parser whose errors are one line (``PROG: error: MESSAGE``), exit code 2: the usage
    block argparse prints before an error buries the message (``--help`` shows it).
    Subcommands' parsers are of this class too (``add_subparsers`` takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default (unless it is None or a flag's False) and keeps
    the description's line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _checked(check: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return check(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what  # argparse names the type in "invalid <name> value" messages
    return parse


def checked(check: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """``type=`` from a check that raises ``TypeError`` / ``ValueError`` with the API's message
    (argparse names the type ``what`` in its own messages)."""
    return _checked(check, what)


def _int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}: expected an int, got {text!r}") from None


def int_at_least(name: str, minimum: int) -> Callable[[str], int]:
    """``type=`` for an int >= ``minimum``, checked by ``check_int`` (errors name ``name``)."""
    return _checked(lambda text: check_int(name, _int(name, text), minimum), name)


def temperature(text: str) -> float:
    """``type=`` for a temperature: 0 is greedy; the rest is :class:`SamplingParams`' check."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"temperature: expected a number >= 0 (0 = greedy), got {text!r}") from None
    try:
        SamplingParams(temperature=value)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def rule(text: str) -> str:
    """``type=`` for a chain verification rule: a name from :func:`specdecode.list_rules`."""
    try:
        return get_rule(text).name
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_empty(name: str) -> Callable[[str], str]:
    """``type=`` for a string that must not be empty (a prompt)."""

    def check(text: str) -> str:
        if not text:
            raise ValueError(f"{name}: expected a non-empty string")
        return text

    return _checked(check, name)


def sampling(temperature_value: float) -> dict[str, Any]:
    """``generate``'s sampling keywords for a command-line temperature (0 = greedy). Sampling is
    from the whole distribution (``top_k=0``): Hugging Face's ``generate`` would otherwise apply
    its generation config's default top-50 filter, and specdecode applies no filter unless told,
    so the baselines and specdecode's runs sample the same law."""
    return (dict(do_sample=True, temperature=temperature_value, top_k=0) if temperature_value > 0
            else dict(do_sample=False))


CPU_FAST_PATH = {"auto": None, "on": True, "off": False}


def add_cpu_fast_path(parser: argparse.ArgumentParser) -> None:
    """``--cpu-fast-path auto|on|off``: :func:`specdecode.generate`'s ``cpu_fast_path`` (None,
    True, False), for the speculative runs and the target-alone baseline alike."""
    parser.add_argument("--cpu-fast-path", choices=sorted(CPU_FAST_PATH), default="auto",
                        help="the CPU fast path for multi-token forwards (specdecode.cpu): auto turns it on for "
                             "float32 models on the CPU; the target-alone baseline runs through the same path")


def cpu_fast_path(args: argparse.Namespace) -> bool | None:
    """The ``cpu_fast_path`` value that ``--cpu-fast-path`` names."""
    return CPU_FAST_PATH[getattr(args, "cpu_fast_path", "auto")]


def existing_dir(name: str) -> Callable[[str], str]:
    """``type=`` for the path of a local model folder that must exist (checked before any
    model is loaded; Hugging Face would otherwise take the path for a hub name)."""

    def check(text: str) -> str:
        if not Path(text).is_dir():
            raise ValueError(f"{name}: no such folder: {text!r} (the path of a local Hugging Face model)")
        return text

    return _checked(check, name)


def device(text: str) -> str:
    """``type=`` for a torch device name (``cpu``, ``cuda``, ``cuda:1``, ...)."""
    import torch

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"device: expected a torch device such as 'cpu' or 'cuda', got {text!r}"
                                         ) from None
    return text


def run_command(main: Callable[[], Any]) -> None:
    """Run a command's ``main``; when the reader of its output goes away (``... | head -5``),
    stop quietly as command-line tools do, without a ``BrokenPipeError`` traceback (Python's
    recipe: point stdout at the null device, then exit with status 1)."""
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
