"""``sitecustomize`` for ``blackbox run``: arms the recorder in every Python process of a job.

``blackbox run`` puts a folder holding a ``sitecustomize.py`` that imports this
module first on ``PYTHONPATH``. Python imports it at start-up (unless run with
``-S`` or ``-I``), so the job, its torchrun workers and any Python subprocess
arm a ring in ``$BLACKBOX_DIR`` with no code change. The ``sitecustomize``
that ours shadows (a distribution's, a virtualenv's) is then imported too.
"""

from __future__ import annotations

import importlib
import os
import sys

BOOT_ENV = "BLACKBOX_RUN_BOOT"  # the folder holding our sitecustomize.py
SITECUSTOMIZE = """\
# Written by `blackbox run`: arm the flight recorder in this Python process.
import blackbox.run.bootstrap

blackbox.run.bootstrap.start()
"""


def start() -> None:
    """Arm (never raising), then import the sitecustomize ours shadows, if there is one."""
    try:
        import blackbox

        blackbox.arm(os.environ.get("BLACKBOX_DIR") or None)
    except Exception as exc:  # never break the job, even here
        sys.stderr.write(f"blackbox: not armed: {type(exc).__name__}: {exc}\n")
    _chain()


def _chain() -> None:
    boot = os.environ.get(BOOT_ENV)
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
        sys.stderr.write(f"blackbox: the job's own sitecustomize failed: {type(exc).__name__}: {exc}\n")
    finally:
        sys.path[:] = saved
