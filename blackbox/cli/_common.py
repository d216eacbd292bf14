"""Helpers shared by subcommands' standalone ``main(argv)``."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from .._errors import BlackboxError
from .._errors import one_line as _escaped

RUN_RINGS = "rings"  # a `blackbox run` folder (run-<time>-XXXX/) holds rings/, then bundle/ once the job ended
# Errors only a write meets: a full disk, a quota, a file too large, a read-only file system.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def one_line(module: ModuleType) -> str:
    """A subcommand's help text: the first paragraph of its module docstring, whole (never cut at the
    end of its first line), on one line."""
    paragraph = (module.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(paragraph.split())


def to_stdout(out: object) -> bool:
    """``-o -``: the output goes to standard output (``export --folded -o - | flamegraph.pl``)."""
    return out == "-"


def standalone(module: ModuleType, prog: str, argv: Sequence[str] | None) -> int:
    from . import run_command

    parser = argparse.ArgumentParser(prog=prog, description=one_line(module))
    module.add_arguments(parser)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(module, args)


def run_rings(target: str) -> Path | None:
    """The rings/ folder of a ``blackbox run`` folder (a real folder, not a link; empty until the job's
    first process arms), else None. A bundle's rings/ (the rings it keeps, compressed) is not one: a folder
    with a metadata.json is a bundle."""
    rings = Path(target) / RUN_RINGS
    if os.path.lexists(Path(target) / "metadata.json"):
        return None
    return rings if os.path.isdir(rings) and not os.path.islink(rings) else None


class WriteError(BlackboxError):
    """A file the command writes could not be written (a full disk, no permission, no such folder)."""


def found(exc: OSError) -> str:
    """What an OSError found, in words: its strerror (pyarrow's carry only a message)."""
    return _escaped(exc.strerror or str(exc) or type(exc).__name__)


def _under(name: object, path: str) -> bool:
    """``name`` is ``path``, inside it, or a temporary sibling of it (``.NAME.xxxx.tmp``, written then renamed)."""
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    text, path = os.fsdecode(name), path.rstrip("/")
    parent, base = os.path.split(path)
    sibling = os.path.dirname(text) == parent and os.path.basename(text).startswith(f".{base}.")
    return text == path or text.startswith(path + "/") or sibling


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], what: str, *, reads_too: bool = False) -> Iterator[None]:
    """Name ``path`` and ``what`` in the error of a write that fails: the OSError of a write to a full
    disk carries no file name. ``reads_too``: the block also reads, so an error naming no file is taken
    as the write's only where only a write meets it (a full disk); an error naming a file outside
    ``path`` goes on as it was. A file this made and could not finish is removed (a half-written
    picture is no picture)."""
    where = os.fspath(path)
    new = not os.path.lexists(where)
    try:
        yield
    except OSError as exc:
        named = exc.filename is not None
        mine = exc.errno in WRITE_ERRNOS or _under(exc.filename, where) or not (named or reads_too)
        if new and mine and os.path.isfile(path) and not os.path.islink(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        if not mine:
            raise
        raise WriteError(f"{_escaped(where)}: expected to write {what}, found {found(exc)}") from None


def os_error_line(exc: OSError, args: argparse.Namespace) -> str:
    """One line for an OSError that no command named better: the file it names, else the command's
    own paths (a full disk's error names no file), with what was expected and what was found."""
    if exc.filename is not None:
        where = _escaped(os.fsdecode(exc.filename) if isinstance(exc.filename, (str, bytes)) else str(exc.filename))
        if exc.filename2 is not None:
            where += f" -> {_escaped(str(exc.filename2))}"
        return f"{where}: expected to read or write it, found {found(exc)}"
    out = getattr(args, "out", None)
    if exc.errno in WRITE_ERRNOS and out:
        return f"{_escaped(str(out))}: expected to write it, found {found(exc)}"
    named = [getattr(args, name, None) for name in ("target", "rings", "ring", "out", "dir")]
    paths = [_escaped(str(p)) for value in named if value for p in (value if isinstance(value, list) else [value])]
    if not paths:
        return f"expected the command to finish, found {found(exc)}"
    return f"{', '.join(paths)}: expected to read or write {'these' if len(paths) > 1 else 'it'}, found {found(exc)}"


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:  # fmt: skip
        if name == "pandas":
            raise ModuleNotFoundError("not imported by the blackbox command", name=name)
        return None


_PROCESS = {"ours": False, "set": False}


def command_process() -> None:
    """Mark this process as the command's own (the console script, ``python -m blackbox``)."""
    _PROCESS["ours"] = True


def own_process() -> None:
    """Before a command reads rings or bundles: in the command's own process (never a library
    caller's, nor ``blackbox run``'s launcher while its job runs), memory it frees goes back to the
    system and pyarrow imports no pandas (below). Once; a no-op elsewhere."""
    if not _PROCESS["ours"] or _PROCESS["set"]:
        return
    _PROCESS["set"] = True
    release_freed_memory()
    skip_pandas()


M_MMAP_THRESHOLD = -3  # mallopt(3)


def release_freed_memory() -> None:
    """Recovery decodes one large ring after another: glibc raises its mmap threshold as large blocks
    are freed and then keeps them in its arenas, and pyarrow's mimalloc keeps its pages a while, so a
    second 128 MiB ring found 150 MiB still held by the first. A fixed threshold and the system
    allocator for Arrow hand every freed ring back (measured: 6 rings of 128 MiB peak at 351 MiB, as
    one ring alone does, instead of 474)."""
    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):  # not glibc: its own policy stands
        pass
    try:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:  # noqa: BLE001 - an optimisation only: whatever pyarrow does, the command goes on
        pass


def skip_pandas() -> None:
    """pyarrow imports pandas, where installed, the first time an array is made from Python objects
    (to ask whether they are pandas objects): 35 MiB and half a second that no command uses. The
    command's own process answers that first question with "no pandas"; pyarrow still imports it
    when a pandas conversion is asked for (``to_pandas``). Library callers are left alone."""
    if "pandas" in sys.modules:
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa

        pa.array([0])
    except Exception:  # noqa: BLE001 - an optimisation only: whatever pyarrow does, the command goes on
        pass
    finally:
        sys.meta_path.remove(finder)
