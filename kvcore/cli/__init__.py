"""The ``kvcore`` command line: ``kvcore plan``, ``kvcore plugins``, ...

Each sub-command is a module named for it, holding ``COMMAND`` (its help texts, a
:class:`~kvcore.cli.command.Command`), ``add_options(parser)`` and ``run(args, registry)``;
:func:`build_parser` makes every sub-parser from them.

Errors kvcore knows about are printed as one line (``kvcore: error: ...``) with exit status 1,
naming the options to change where the Python message names parameters
(:data:`kvcore.cli.inputs.FLAG_NAMES`); usage errors exit with status 2, as argparse does;
Ctrl-C ends a command with one line (``kvcore: interrupted``) and status 130, as a shell
reports an interrupted command. An option is never abbreviated (argparse's ``allow_abbrev`` is
off on every parser): ``--gpu`` is an option of its own, never the start of ``--gpu-memory``.
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

from kvcore.cli.command import Command
from kvcore.errors import KVCoreError, KVCoreWarning, PluginFailedWarning

#: Sub-command modules, in the order ``kvcore --help`` lists them.
COMMANDS: tuple[str, ...] = (
    "plan",
    "compare",
    "simulate",
    "tune",
    "profile",
    "allocate",
    "check",
    "models",
    "plugins",
)


def _command_modules() -> list[ModuleType]:
    import importlib

    return [importlib.import_module(f"kvcore.cli.{name}") for name in COMMANDS]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvcore")
    except PackageNotFoundError:  # pragma: no cover - a checkout run without installing
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(
        prog="kvcore",
        description="Plan, allocate and bind the KV cache of an LLM inference engine.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"kvcore {_version()}")
    parser.add_argument(
        "--no-plugin-autoload",
        action="store_true",
        help="do not load third-party plugins from the 'kvcore' entry-point group",
    )
    parser.add_argument(
        "--block-plugin",
        action="append",
        default=[],
        metavar="NAME",
        help="do not register this plugin (built-in module or entry-point name); repeatable",
    )
    parser.add_argument("--trace-plugins", action="store_true", help="print every hook call to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in zip(COMMANDS, _command_modules(), strict=True):
        command: Command = module.COMMAND
        # no abbreviations: `--gpu H100` must never be read as `--gpu-memory H100`
        command_parser = sub.add_parser(
            name, help=command.help, description=command.description, allow_abbrev=False
        )
        module.add_options(command_parser)
        command_parser.set_defaults(run=module.run)
    return parser


#: The exit status after Ctrl-C: 128 + SIGINT (2), as a shell reports a command SIGINT stopped.
INTERRUPTED = 130


def _show_warnings(caught: Sequence[warnings.WarningMessage]) -> None:
    """kvcore's own warnings (a skipped plugin, a simulation's limit) as one ``kvcore: warning:``
    line each, the same text once; any other warning as Python shows it."""
    shown: set[str] = set()
    for w in caught:
        if issubclass(w.category, KVCoreWarning):
            text = str(w.message)
            if text not in shown:
                shown.add(text)
                print(f"kvcore: warning: {text}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


#: A value that starts like a negative number (``-40GiB``, ``-1.5``, ``-2k``): no kvcore option
#: starts so, so after an option it is that option's value.
_NEGATIVE_VALUE = re.compile(r"-\.?[0-9]")


def attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with each negative-looking value joined to the option before it
    (``--memory -40GiB`` becomes ``--memory=-40GiB``).

    argparse reads ``-40GiB`` as an option of its own (only a bare number such as ``-40`` passes
    as a value), and then says "expected one argument" and prints the whole usage; joined, the
    value reaches the option's type, which says what is wrong with it (a size must be positive).
    """
    joined: list[str] = []
    for arg in argv:
        previous = joined[-1] if joined else ""
        if (
            _NEGATIVE_VALUE.match(arg)
            and previous.startswith("--")
            and "=" not in previous
            and previous != "--"
        ):
            joined[-1] = f"{previous}={arg}"
        else:
            joined.append(arg)
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(attach_negative_values(sys.argv[1:] if argv is None else argv))
    from kvcore.cli.inputs import echo_given

    echo_given(args)  # what a unit or suffix made of a number, before anything runs
    try:
        from kvcore.planning.registry import Registry

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PluginFailedWarning)
            registry = Registry.default(
                autoload=False if args.no_plugin_autoload else None,
                block=args.block_plugin,
                trace=True if args.trace_plugins else None,
            )
        _show_warnings(caught)
        ran: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as ran:
                warnings.simplefilter("always", KVCoreWarning)
                status: int = args.run(args, registry)
        finally:  # shown (once the recording is over) before an error's line too
            _show_warnings(ran)
    except KVCoreError as exc:
        from kvcore.cli.inputs import FLAG_NAMES
        from kvcore.error_messages import render

        print(f"kvcore: error: {render(exc, FLAG_NAMES)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # pragma: no cover - e.g. `kvcore plan ... | head`
        return 0
    except KeyboardInterrupt:  # Ctrl-C in a long simulate or tune: one line, no traceback
        print("kvcore: interrupted", file=sys.stderr)
        return INTERRUPTED
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
