"""Command lines that refuse what they do not know.

traitlets only warns about an unknown `--option` ("Unrecognized alias … it will have no effect")
and goes on, so a typo such as `install --gpu 1` would install a kernelspec with the default
GPUs. `StrictOptions` checks every option of the command line against the app's aliases and
flags before traitlets parses it, and exits 2 with a sentence naming the option and the nearest
known one. `--Class.trait=value` stays traitlets' business.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

from jupyter_core.application import JupyterApp

HELP = ("-h", "--help", "--help-all", "--version")
"""Handled by traitlets before any alias or flag."""


def unknown_option(argv: list[str], aliases: set[str], flags: set[str]) -> str | None:
    """The first option of `argv` (`--name`, `--name value` or `--name=value`) that is neither
    one of `aliases` (which take a value) nor of `flags`; None if every one is known. Words
    after `--` are not options."""
    args = iter(argv)
    for arg in args:
        if arg == "--":
            return None
        if not arg.startswith("-") or arg == "-" or arg in HELP:
            continue
        name, has_value, _ = arg.partition("=")
        key = name.lstrip("-")
        if "." in key:
            continue  # --Class.trait=value
        if key in aliases:
            if not has_value and key not in flags:
                next(args, None)  # its value, even one that starts with '-'
            continue
        if key not in flags:
            return name
    return None


def refusal(command: str, option: str, known: set[str]) -> str:
    """The sentence for an unknown option, with the closest known one when there is one."""
    wanted = option.lstrip("-")
    close = difflib.get_close_matches(wanted, sorted(known), n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else ""
    return f"{command}: unknown option {option}{hint} (`{command} --help` lists the options)"


class StrictOptions(JupyterApp):
    """A JupyterApp whose command line may hold only its own aliases and flags (and
    `--Class.trait=value`); `command` names it in the refusal."""

    command = "jupyter kernel-queue"
    takes_arguments = False
    """Whether words that are not options (`park KERNEL_ID`) are allowed."""

    def parse_command_line(self, argv: Any = None) -> None:
        args = list(sys.argv[1:] if argv is None else argv)
        aliases, flags = _names(self.aliases), _names(self.flags)
        option = unknown_option(args, aliases, flags)
        if option is not None:
            print(refusal(self.command, option, aliases | flags), file=sys.stderr)
            self.exit(2)
        super().parse_command_line(args)
        if self.extra_args and not self.takes_arguments:
            words = " ".join(self.extra_args)
            print(
                f"{self.command}: takes no arguments, only options, but was given {words!r} "
                f"(`{self.command} --help` lists the options)",
                file=sys.stderr,
            )
            self.exit(2)


def _names(keys: Any) -> set[str]:
    """The option names of an app's `aliases` or `flags` (a key may be a tuple of names)."""
    names: set[str] = set()
    for key in keys:
        names.update(key if isinstance(key, tuple) else (key,))
    return names
