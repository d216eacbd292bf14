"""Helpers shared by subcommands' standalone ``main(argv)``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType


def one_line(module: ModuleType) -> str:
    """A subcommand's help text: the first line of its module docstring."""
    return (module.__doc__ or "").strip().splitlines()[0]


def standalone(module: ModuleType, prog: str, argv: Sequence[str] | None) -> int:
    from . import run_command

    parser = argparse.ArgumentParser(prog=prog, description=one_line(module))
    module.add_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(module, args)
