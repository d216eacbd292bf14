"""The ``blackbox`` command: one small module per subcommand.

Each subcommand module has ``add_arguments(parser)``, ``run(args) -> int`` and a
standalone ``main(argv) -> int``. Bad input ends in one line on stderr and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from .._errors import BlackboxError, one_line
from .._version import __version__
from . import demo, epilog, export, info, plot, prune, recover, run, summary, watch
from ._common import command_process, os_error_line
from ._common import one_line as help_line

COMMANDS: dict[str, ModuleType] = {
    "recover": recover,
    "info": info,
    "summary": summary,
    "run": run,
    "plot": plot,
    "export": export,
    "watch": watch,
    "prune": prune,
    "epilog": epilog,
    "demo": demo,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blackbox", description="Crash-survivable flight recorder for training jobs.")
    parser.add_argument("--version", action="version", version=f"blackbox {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        doc = help_line(module)
        module.add_arguments(sub.add_parser(name, help=doc, description=doc))
    return parser


def run_command(module: ModuleType, args: argparse.Namespace) -> int:
    """Run one subcommand, turning expected failures into one line and exit status 1."""
    try:
        return int(module.run(args))
    except BlackboxError as exc:
        print(f"blackbox: error: {one_line(str(exc))}", file=sys.stderr)
        return 1
    except OSError as exc:  # one no command named better: the file it names, else the command's paths
        print(f"blackbox: error: {os_error_line(exc, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the command's own process (the console script, python -m blackbox)
        command_process()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(COMMANDS[args.command], args)
