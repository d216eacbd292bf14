"""Helpers shared by subcommands' standalone ``main(argv)``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import ModuleType


def standalone(module: ModuleType, prog: str, argv: Sequence[str] | None) -> int:
    from . import run_command

    doc = (module.__doc__ or "").strip().splitlines()[0]
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    module.add_arguments(parser)
    import sys

    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(module, args)
