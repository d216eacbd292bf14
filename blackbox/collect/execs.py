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

from .._jobsignal import raised_by_signal_handler
from ..ring import format as fmt

MAX_TEXT = 200  # characters of the command line kept in the mark


class ExecWatch:
    """Wraps ``os.execv`` and ``os.execve`` while armed (``install``/``uninstall``)."""

    def __init__(self, mark: Callable[[str], None]) -> None:
        self._mark = mark
        self._pid = os.getpid()
        self._wrappers: dict[str, _Exec] = {}  # name -> our wrapper of it (the function replaced: its __wrapped__)

    def install(self) -> None:
        for name in ("execv", "execve"):
            self._wrappers[name] = _Exec(getattr(os, name), self)
            setattr(os, name, self._wrappers[name])

    def before(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Say what the process becomes; False where it is not ours (a forked child sharing the mapping)."""
        if os.getpid() != self._pid:
            return False
        path = kwargs.get("path", args[0] if args else None)
        self.say(fmt.EXEC_PREFIX + _command(path, kwargs.get("argv", args[1] if len(args) > 1 else None)))
        return True

    def say(self, label: str) -> None:
        try:
            self._mark(label)
        except Exception as exc:  # the recorder's trouble is never the job's: its exec goes on
            if raised_by_signal_handler(exc):  # (the job's own handler's exception, raised meanwhile: its)
                raise

    def uninstall(self) -> None:
        for name, wrapper in self._wrappers.items():
            if getattr(os, name, None) is wrapper:  # (a later wrapper of the job's own stays in place)
                setattr(os, name, wrapper.__wrapped__)
        self._wrappers.clear()


class _Exec:
    """``os.execv``/``os.execve`` wrapped: a callable object, not a function, so that, as the builtin, it
    binds to no instance (``class A: run = os.execv``) and pickles as ``os.<name>``."""

    def __init__(self, original: Callable[..., Any], watch: ExecWatch) -> None:
        self.__wrapped__, self._watch = original, watch
        self.__name__ = self.__qualname__ = getattr(original, "__name__", "execv")
        self.__module__, self.__doc__ = "os", getattr(original, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # (execve takes its words by name too)
        ours = self._watch.before(args, kwargs)
        try:
            return self.__wrapped__(*args, **kwargs)
        except BaseException:
            if ours:
                self._watch.say(fmt.EXEC_FAILED)
            raise

    def __reduce__(self) -> str:
        return self.__name__

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


def _command(path: Any, args: Any) -> str:
    """The command line as the new program gets it (its ``argv``), else the path; never raises."""
    try:
        words = [os.fsdecode(a) for a in args] if isinstance(args, list | tuple) else []
        text = " ".join(words) or os.fsdecode(path)
    except (TypeError, ValueError):
        text = ""
    return (text or "another program")[:MAX_TEXT]
