"""``sitecustomize`` for ``blackbox run``: arms the recorder in every Python process of a job.

``blackbox run`` puts a folder holding a ``sitecustomize.py`` (and a link to the
blackbox package, nothing else) first on ``PYTHONPATH``. Python imports it at
start-up (unless run with ``-S`` or ``-I``); it loads this file on its own (the
standard library alone, not the blackbox package) and calls :func:`boot`:

- The job's own process (the one ``blackbox run`` started, or a rank torchrun
  started, with ``RANK`` set) arms a full ring in ``$BLACKBOX_DIR`` at once.
  So do multiprocessing's workers and services and torch.compile's workers,
  with small rings.
- Any other Python process of the job (a script a shell loop runs, a tool the
  job calls) arms once it has imported numpy or torch, the moment it starts
  doing array work: importing blackbox and arming costs about 0.2 s of CPU
  (numpy's import about half of it), eight times what a short Python process
  costs without it, and a job of hundreds of short scripts would pay that for
  each. One that never imports either is not recorded. Where the import that
  brings numpy is the job's own ``import blackbox``, arming waits for that
  import to be done (the package's last line). Its ring is a full one
  where no Python process of the job is above it (a shell wrapper's python:
  the job's own work, ``identity.role`` calls it ``main``), else a small one.

A job that sets PYTHONPATH itself (``PYTHONPATH=src python train.py``, ``export PYTHONPATH=...`` in its
launch script) drops our folder from it. Where blackbox is installed (not editable) in the job's Python,
``blackbox-run.pth``, in site-packages, runs this same sitecustomize at start-up for a process of the run
(``BLACKBOX_RUN_BOOT`` set, the file ours) whose ``sys.path`` lacks our folder, and not with ``-I``; its
own sitecustomize is then imported by Python as usual. Elsewhere ``run/unarmed.py`` says what to change.

Any process but the job's own and its ranks that ends cleanly (status 0, no
uncaught exception) is folded into one line of ``folded.jsonl`` and its ring
removed, so hundreds of short-lived helpers leave a bounded footprint; one that
ends otherwise keeps its ring, whatever its place in the process tree. The exit
status decides, read inside libc's exit() where the C extension can
(``collect.exceptions.record_status_at_exit``), else what Python saw. The ``sitecustomize`` that ours shadows (a
distribution's, a virtualenv's) is then imported too. Where this interpreter
cannot run blackbox (another Python, no numpy), the job runs unarmed after one
line on stderr.
"""

from __future__ import annotations

import importlib.util
import os
import sys

TYPE_CHECKING = False  # typing is not imported: every Python process of the job loads this file
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

BOOT_ENV = "BLACKBOX_RUN_BOOT"  # the folder holding our sitecustomize.py (the template below names it too)
RUN_PID_ENV = "BLACKBOX_RUN_PID"  # as collect.identity.RUN_PID_ENV (this file imports no blackbox module)
FIRST_PY_ENV = "BLACKBOX_RUN_PY"  # as collect.identity.FIRST_PY_ENV: set by the first Python process of a branch
HELPER_CAPACITY = 8192  # slots: 1 MiB of records
HELPER_STRINGS = 64 << 10
# As collect.signals.RECORDED (a test keeps them in step): in a multiprocessing or torch.compile helper (ARM_AT_START),
# held on the main thread from before blackbox's import of numpy until the handlers are in. numpy's BLAS threads
# start as it loads and inherit the thread's mask: started with these unblocked, they took a signal sent while
# arming held it on the main thread and died of its default action, unrecorded ("killed; no handler ran": a spawn
# Pool helper SIGTERMed by the Pool's teardown as it armed, 5 runs in 60 under load). Not in the job's own
# process: there the BLAS threads keep them blocked for good, and a job that blocks SIGTERM for a critical section
# after loading numpy dies at once unarmed (a BLAS thread takes it) but only after it armed.
HELD = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
TRIGGERS = ("numpy", "torch")  # a child process arms once it has imported one of these
ARM_WHEN_IMPORTED = "_arm_when_imported"  # set on the blackbox package where a trigger fired inside its import
# Command-line marks of the helpers that arm at start (collect.identity.role names them).
ARM_AT_START = ("compile_worker", "multiprocessing.forkserver", "multiprocessing.resource_tracker",
                "--multiprocessing-fork")  # fmt: skip
SITECUSTOMIZE = """\
# Written by `blackbox run`: arm the flight recorder in this Python process, then run the
# sitecustomize this one shadows. Standard library only until blackbox imports: an interpreter
# that cannot run blackbox (another Python, no numpy) says so in one line and runs the job as is.
import importlib, importlib.util, os, sys


def _boot():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        spec = importlib.util.spec_from_file_location(
            "_blackbox_run_boot", os.path.join(here, "blackbox", "run", "bootstrap.py"))
        early = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(early)
        early.boot()
    except Exception as exc:
        sys.stderr.write(f"blackbox: not armed ({type(exc).__name__}: {exc}); the job runs unrecorded\\n")


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


_boot()
if __name__ == "sitecustomize":  # (run by blackbox-run.pth instead, the job's own sitecustomize comes as usual)
    _chain()
"""


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def arms_at_start() -> bool:
    """The job's own process, a rank, multiprocessing's and torch.compile's helpers: arm at start-up."""
    if _int_env("RANK") is not None:
        return True
    launcher = _int_env(RUN_PID_ENV)
    if launcher is None or os.getppid() == launcher:
        return True
    return _helper_at_start()


def _helper_at_start() -> bool:
    """This process is a multiprocessing or torch.compile helper, by its command line (``ARM_AT_START``)."""
    command = " ".join(getattr(sys, "orig_argv", sys.argv))
    return any(mark in command for mark in ARM_AT_START)


class ArmAfterImport:
    """A ``sys.meta_path`` finder that finds nothing itself: it calls ``arm`` once the first of TRIGGERS
    this process imports has been imported (torch imports numpy: the outermost import, done), then
    leaves ``sys.meta_path``."""

    def __init__(self, arm: Callable[[], None]) -> None:
        self._arm = arm
        self._finding = False
        self._depth = 0
        self.done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in TRIGGERS or self._finding or self.done:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)  # the finders after us (we answer None meanwhile)
        except Exception:
            return None  # let the import system find it (and fail) as it would without us
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        self._wrap(spec.loader, fullname)
        return spec

    def _wrap(self, loader: Any, name: str) -> None:
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            if self.done or module.__name__ != name:
                run(module)
                return
            self._depth += 1
            try:
                run(module)
            finally:
                self._depth -= 1
            if self._depth == 0:
                self.finish()

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader we cannot wrap: arm now rather than never
            self.finish()

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        package = sys.modules.get("blackbox")
        if package is not None and getattr(package.__spec__, "_initializing", False):
            # numpy imported by the job's own `import blackbox`, half done: arming now would find no
            # `blackbox.arm`; the package calls this as its last line instead (ARM_WHEN_IMPORTED)
            setattr(package, ARM_WHEN_IMPORTED, self._arm)
            return
        self._arm()


def _runs_blackbox() -> bool:
    """This process runs blackbox's own command line (``python -m blackbox``, the ``blackbox`` script)."""
    argv = [str(a) for a in getattr(sys, "orig_argv", sys.argv)]
    by_module = any(a == "-m" and b == "blackbox" for a, b in zip(argv, argv[1:], strict=False))
    return by_module or os.path.basename(sys.argv[0] if sys.argv else "") == "blackbox"


def boot() -> None:
    """Arm now (the job's own process and the helpers that arm at start), or once this process has
    imported numpy or torch. Never raises."""
    try:
        os.environ.setdefault(FIRST_PY_ENV, str(os.getpid()))  # the first Python process of this branch
        if "--multiprocessing-fork" in " ".join(getattr(sys, "orig_argv", sys.argv)):
            import multiprocessing.util  # noqa: F401  (a spawn child imports it next: armed, we hook its bootstrap)
        if arms_at_start():
            try:
                start()
            except KeyboardInterrupt:
                _interrupted()
        elif not _runs_blackbox():  # (`blackbox recover` a job's script calls is not the job's work)
            sys.meta_path.insert(0, ArmAfterImport(start))
    except Exception as exc:  # never break the job
        sys.stderr.write(f"blackbox: not armed ({type(exc).__name__}: {exc}); the job runs unrecorded\n")


def start() -> None:
    """Arm, never raising: the job's own processes get a full ring, a helper a small one; all but the
    one ``blackbox run`` started and the ranks are folded away if they end cleanly."""
    held = _hold() if _helper_at_start() else None
    try:
        import blackbox
        from blackbox.collect.identity import role

        main = role() == "main"
        own = main and (_int_env("RANK") is not None or _int_env(RUN_PID_ENV) in (None, os.getppid()))
        settings = {} if main else {"capacity": HELPER_CAPACITY, "strings_size": HELPER_STRINGS}
        blackbox.arm(os.environ.get("BLACKBOX_DIR") or None, **settings)  # type: ignore[arg-type]
        if not own:
            blackbox.active()._fold_clean = True
        if not _forks_watched:
            _forks_watched.append(True)
            os.register_at_fork(after_in_child=_after_fork)
    except Exception as exc:  # never break the job, even here
        sys.stderr.write(f"blackbox: not armed ({type(exc).__name__}: {exc}); the job runs unrecorded\n")
    finally:
        if held is not None:  # a signal that came meanwhile is delivered now, to the handler in place
            _restore(held)


def _restore(held: Any) -> None:
    import signal

    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    except Exception as exc:
        sys.stderr.write(f"blackbox: signals left blocked ({type(exc).__name__}: {exc})\n")


def _interrupted() -> None:
    """A SIGINT as the process armed at start-up (in a helper, held and delivered as the hold ends) raised
    KeyboardInterrupt inside the interpreter's import of site, which it cannot survive ("Fatal Python error:
    init_import_site", status 1, and the verdict a deliberate exit): the process ends of SIGINT instead, as a job
    interrupted as it starts does unarmed (130). Where the handler was in by then, its ring holds the SIGINT;
    one that came before the ring was made leaves none."""
    import signal

    sys.stderr.write("KeyboardInterrupt\n")
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _hold() -> Any:
    """``HELD`` blocked on this thread; returns the mask to put back (None where masks cannot be set). The threads
    that start meanwhile (numpy's BLAS threads: blackbox's import is a helper's first of numpy) keep them blocked,
    so a signal sent to the helper waits for its handler."""
    import signal

    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, [getattr(signal, n) for n in HELD if hasattr(signal, n)])
    except (AttributeError, OSError, ValueError):
        return None


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
