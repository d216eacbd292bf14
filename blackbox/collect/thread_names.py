"""Thread names for the allocation hooks, kept as threads start and are renamed.

The hooks write a thread's name beside a new stack's text at once (``_csample.name_threads`` fills the
table they read), so a thread that allocates and dies before the sampler's next tick is still named, by
the name it had then. ``threading.Thread._set_ident`` (run first in a new thread) and the ``name``
property's setter are wrapped to tell the table; the tick adds, once a second, what went around them (a
subclass's own ``name``, a thread started before arming and renamed through ``_name``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._jobsignal import raised_by_signal_handler


def encoded(names: dict[int | None, str]) -> list[tuple[int, bytes]]:
    """``{ident: name}`` as ``name_threads`` takes it."""
    return [(i, n.encode("utf-8", "replace")) for i, n in names.items() if i is not None]


def name_as_they_change(name_threads: Callable[[Any], None], named: dict[int | None, str]) -> Callable[[], None] | None:
    """Tell ``name_threads`` every thread alive now, each thread as it starts (``Thread._set_ident``, wrapped:
    a frame only while it runs, never in the thread's stacks) and as it is renamed, and keep ``named`` (ident:
    name) with it. Returns what puts both back (each only where ours is still the one in place), or None where
    they were wrapped already."""
    original = getattr(threading.Thread, "_set_ident", None)
    if original is None or getattr(original, "_blackbox", False):
        return None

    def tell(thread: threading.Thread) -> None:
        try:
            if thread.ident:
                name_threads(((thread.ident, thread.name.encode("utf-8", "replace")),))
                named[thread.ident] = thread.name
        except Exception as exc:  # (a rename runs in the job's threads, the main one too: its handlers' are its)
            if raised_by_signal_handler(exc):
                raise

    def _set_ident(thread: threading.Thread) -> None:
        original(thread)
        tell(thread)

    _set_ident._blackbox = True  # type: ignore[attr-defined]
    setattr(threading.Thread, "_set_ident", _set_ident)  # noqa: B010
    prop, renamed = threading.Thread.__dict__.get("name"), None
    if isinstance(prop, property) and prop.fget is not None and prop.fset is not None:
        setter = prop.fset

        def _set_name(thread: threading.Thread, name: str) -> None:
            setter(thread, name)
            tell(thread)

        renamed = property(prop.fget, _set_name, prop.fdel, prop.__doc__)
        setattr(threading.Thread, "name", renamed)  # noqa: B010

    def unname() -> None:
        if threading.Thread.__dict__.get("_set_ident") is _set_ident:
            setattr(threading.Thread, "_set_ident", original)  # noqa: B010
        if renamed is not None and threading.Thread.__dict__.get("name") is renamed:
            setattr(threading.Thread, "name", prop)  # noqa: B010

    named.update({t.ident: t.name for t in threading.enumerate()})
    name_threads(encoded(named))
    return unname
