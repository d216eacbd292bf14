"""The program an armed process replaces itself with (``exec``): a mark just before, so that its ring's
missing end is told as what it was, not as a SIGKILL.

An ``exec`` runs no exit handler: the ring is left as a SIGKILL leaves it. Where
the new program is a Python process that ``blackbox run`` arms, recovery chains
the two rings by pid and start time (``recovery.pipeline.exec_successors``).
Anywhere else (a job that calls ``arm()`` itself and then ``os.execv``'s a shell,
a launcher that becomes its trainer) nothing follows it, so ``os.execv`` and
``os.execve`` are wrapped (every other ``os.exec*`` calls one of the two): the
armed process writes a mark labelled ``EXEC_PREFIX`` + the command line, then
calls the real function; where that raises (a path ``execvp`` tried in vain), a
mark labelled ``EXEC_FAILED`` follows, and the job gets the exception as it
would. Recovery takes the last of these marks (``exec_mark``): an ``exec`` not
followed by a failure is how the process left its ring.

A child forked from the armed process (``os.fork()`` then ``os.execv``) shares its
mapping: it writes nothing (its pid is not the armed one's). ``exec`` from C code
(``posix_spawn``, a library's own ``execve``) is not seen.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..ring import format as fmt

MAX_TEXT = 200  # characters of the command line kept in the mark


class ExecWatch:
    """Wraps ``os.execv`` and ``os.execve`` while armed (``install``/``uninstall``)."""

    def __init__(self, mark: Callable[[str], None]) -> None:
        self._mark = mark
        self._pid = os.getpid()
        self._saved: dict[str, tuple[Any, Any]] = {}  # name -> (the function we replaced, our wrapper)

    def install(self) -> None:
        for name in ("execv", "execve"):
            original = getattr(os, name)
            wrapper = self._wrap(original)
            self._saved[name] = (original, wrapper)
            setattr(os, name, wrapper)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def exec_(*args: Any, **kwargs: Any) -> Any:  # (execve takes its words by name too)
            ours = os.getpid() == self._pid
            if ours:
                self._say(fmt.EXEC_PREFIX + _command(kwargs.get("path", args[0] if args else None),
                                                     kwargs.get("argv", args[1] if len(args) > 1 else None)))
            try:
                return original(*args, **kwargs)
            except BaseException:
                if ours:
                    self._say(fmt.EXEC_FAILED)
                raise

        exec_.__wrapped__ = original  # type: ignore[attr-defined]
        exec_.__name__ = getattr(original, "__name__", "exec")
        exec_.__doc__ = getattr(original, "__doc__", None)
        return exec_

    def _say(self, label: str) -> None:
        try:
            self._mark(label)
        except Exception:  # the recorder's trouble is never the job's: its exec goes on
            pass

    def uninstall(self) -> None:
        for name, (original, wrapper) in self._saved.items():
            if getattr(os, name, None) is wrapper:  # (a later wrapper of the job's own stays in place)
                setattr(os, name, original)
        self._saved.clear()


def _command(path: Any, args: Any) -> str:
    """The command line as the new program gets it (its ``argv``), else the path; never raises."""
    try:
        words = [os.fsdecode(a) for a in args] if isinstance(args, list | tuple) else []
        text = " ".join(words) or os.fsdecode(path)
    except (TypeError, ValueError):
        text = ""
    return (text or "another program")[:MAX_TEXT]
