"""Runs a third-party training script unchanged, the same way in every mode of the field matrix.

    python fieldrun.py [--arm] SCRIPT [ARGS...]

``--arm`` calls ``blackbox.arm()`` first (the ``arm()`` mode: one line a user adds, here added without
editing their file). Then, in every mode alike, it installs what the field plants through the
environment, and runs SCRIPT with ``runpy`` as ``__main__``:

- ``FIELD_STEPS``: a folder; after each optimizer step this process writes how many it has done to
  ``steps-<pid>`` (8 bytes, page cache only: it survives SIGKILL). The field kills at a known step
  from it and takes the truth from it: the step count the recorder must name.
- ``FIELD_EXIT=CODE@STEP[:raise|:segv]``: once STEP optimizer steps are done, as the next begins,
  ``sys.exit(CODE)`` (or ``raise SystemExit(CODE)``; or, ``segv``, a read of address 0 in libc, CODE unused:
  a native crash, SIGSEGV).
- ``FIELD_LEAK=MIB@RANK``: as each optimizer step after the first begins, rank RANK (RANK env, 0 when
  unset) keeps MIB MiB more.
- ``FIELD_EXIT_HANG=1``: an exit handler, registered before ``--arm`` arms (as a library imported before the
  job's own ``arm()`` call registers its own), that never returns once ``FIELD_EXIT`` has ended the job.
- ``FIELD_SAVER_HANG=STEP``: once STEP optimizer steps are done, as the next begins, a thread named ``saver``
  starts a checkpoint save that never returns, and the main thread joins it (a hang in a thread of the job's
  own, its main thread waiting for it).
"""

from __future__ import annotations

import atexit
import os
import runpy
import struct
import sys
import threading
import time

LEAKED: list[bytes] = []
EXITING: list[bool] = []


def _hang_at_exit() -> None:
    while EXITING:  # the planted exit ran: hang in this exit handler until a signal ends the process
        time.sleep(0.1)


def _save_hangs() -> None:
    threading.Event().wait()  # the checkpoint's upload never returns


def _plant() -> None:
    steps_dir = os.environ.get("FIELD_STEPS")
    exit_at = os.environ.get("FIELD_EXIT", "")
    leak = os.environ.get("FIELD_LEAK", "")
    saver_at = int(os.environ.get("FIELD_SAVER_HANG") or -1)
    if not (steps_dir or exit_at or leak or saver_at >= 0):
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    fd = os.open(os.path.join(steps_dir, f"steps-{os.getpid()}"), os.O_RDWR | os.O_CREAT, 0o644) if steps_dir else -1
    if fd >= 0:
        os.pwrite(fd, struct.pack("<q", 0), 0)
    code, _, at = exit_at.partition("@")
    at, _, how = at.partition(":")
    leak_mib, _, leak_rank = leak.partition("@")
    leaking = bool(leak) and int(os.environ.get("RANK", "0")) == int(leak_rank or "0")
    done = [0]
    first: list[int] = []

    def counted(optimizer: object) -> bool:
        first[:] = first or [id(optimizer)]
        return id(optimizer) == first[0]  # count the first optimizer only

    def after_step(optimizer: object, args: object, kwargs: object) -> None:
        if counted(optimizer):
            done[0] += 1
            if fd >= 0:
                os.pwrite(fd, struct.pack("<q", done[0]), 0)

    def before_step(optimizer: object, args: object, kwargs: object) -> None:
        # what is planted happens before the next step, never inside one: the step count is then
        # unambiguous (every hook of step k, the recorder's included, has run)
        if not counted(optimizer):
            return
        if leaking and done[0]:
            LEAKED.append(b"\x01" * (int(leak_mib) << 20))
        if done[0] == saver_at and int(os.environ.get("RANK", "0")) == 0:
            saver = threading.Thread(target=_save_hangs, name="saver", daemon=True)
            saver.start()
            saver.join()
        if exit_at and done[0] == int(at):
            EXITING.append(True)
            if how == "segv":
                import ctypes

                ctypes.string_at(0)  # a null pointer, read by libc's strlen
            if how == "raise":
                raise SystemExit(int(code))
            sys.exit(int(code))

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)


def main() -> None:
    args = sys.argv[1:]
    if os.environ.get("FIELD_EXIT_HANG"):
        atexit.register(_hang_at_exit)
    if args[:1] == ["--arm"]:
        import blackbox

        blackbox.arm()
        args = args[1:]
    _plant()
    script = os.path.abspath(args[0])
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
