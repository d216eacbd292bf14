"""``sitecustomize`` for ``blackbox run``: arms the recorder in every Python process of a job.

``blackbox run`` puts a folder holding a ``sitecustomize.py`` that imports this
module (and a link to the blackbox package, nothing else) first on
``PYTHONPATH``. Python imports it at start-up (unless run with ``-S`` or
``-I``), so the job, its torchrun workers and any Python subprocess arm a ring
in ``$BLACKBOX_DIR`` with no code change. The job's own process gets a full
ring; helpers (multiprocessing workers, torch.compile's workers, other Python
subprocesses) get small ones, and a helper that ends cleanly is folded into one
line of ``folded.jsonl`` and its ring removed, so hundreds of short-lived
helpers leave a bounded footprint. The ``sitecustomize`` that ours shadows (a
distribution's, a virtualenv's) is then imported too. Where this interpreter
cannot run blackbox (another Python, no numpy), the job runs unarmed after one
line on stderr.
"""

from __future__ import annotations

import os
import sys

BOOT_ENV = "BLACKBOX_RUN_BOOT"  # the folder holding our sitecustomize.py (the template below names it too)
HELPER_CAPACITY = 8192  # slots: 1 MiB of records
HELPER_STRINGS = 64 << 10
SITECUSTOMIZE = """\
# Written by `blackbox run`: arm the flight recorder in this Python process, then run the
# sitecustomize this one shadows. Standard library only until blackbox imports: an interpreter
# that cannot run blackbox (another Python, no numpy) says so in one line and runs the job as is.
import importlib, os, sys

try:
    import blackbox.run.bootstrap
except Exception as exc:
    sys.stderr.write(f"blackbox: not armed ({type(exc).__name__}: {exc}); the job runs unrecorded\\n")
else:
    blackbox.run.bootstrap.start()


def _chain():
    boot = os.environ.get("BLACKBOX_RUN_BOOT")
    if not boot:
        return
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.abspath(boot)]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
    except Exception as exc:
        sys.stderr.write(f"blackbox: the job's own sitecustomize failed: {type(exc).__name__}: {exc}\\n")
    finally:
        sys.path[:] = saved


_chain()
"""


def start() -> None:
    """Arm, never raising: the job's own process gets a full ring, a helper a small one, folded away
    if it ends cleanly."""
    try:
        import blackbox
        from blackbox.collect.identity import role

        helper = role() != "main"
        settings = {"capacity": HELPER_CAPACITY, "strings_size": HELPER_STRINGS} if helper else {}
        blackbox.arm(os.environ.get("BLACKBOX_DIR") or None, **settings)  # type: ignore[arg-type]
        if helper:
            blackbox.active()._fold_clean = True
        if not _forks_watched:
            _forks_watched.append(True)
            os.register_at_fork(after_in_child=_after_fork)
    except Exception as exc:  # never break the job, even here
        sys.stderr.write(f"blackbox: not armed ({type(exc).__name__}: {exc}); the job runs unrecorded\n")


_forks_watched: list[bool] = []


class _Anchor:
    """A weakly referable object for multiprocessing's after-fork registry."""


_ANCHOR = _Anchor()


def _after_fork() -> None:
    """In a forked child: a multiprocessing worker started by fork (a DataLoader worker) arms its own
    helper ring once multiprocessing has made it one (its after-fork callbacks run in the worker's
    bootstrap, where ``role()`` reads ``worker``), as spawn and forkserver workers arm at start-up."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        try:
            util.register_after_fork(_ANCHOR, lambda _anchor: start())
        except Exception:
            pass
