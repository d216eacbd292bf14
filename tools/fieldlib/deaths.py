"""The deaths of the field matrix: how each is planted or dealt, and what the truth then is.

Every death is known to the field before the recorder says anything: the step from the job's own
step file (fieldrun.py), the victim from the kernel's kill line or the pid the field signalled, the
sender from the pid that sent it (the field itself, or `timeout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Death:
    name: str
    at_step: int = 0  # deal it once the target has done this many optimizer steps (0: not step-dealt)
    action: str = ""  # sigkill | sigint-group | slurm | pod | "" (planted or time-dealt)
    env: dict[str, str] = field(default_factory=dict)  # FIELD_EXIT / FIELD_LEAK
    job_args: list[str] = field(default_factory=list)  # worker options for the jobs that take them
    leak: str = ""  # main | worker: a real kernel OOM kill in the run's memory cgroup
    timeout: bool = False  # the job runs under `timeout T` (T: the job's timeout_s)
    long: bool = False  # the job must outlast the death
    rerun: bool = False  # SIGKILL at at_step, then the same command again into the same folders, to its end
    causes: tuple[str, ...] = ()  # the right causes (empty: from how the victim ended)
    sender: str = ""  # field | timeout: who sent the signal the verdict must name
    signal: str = ""  # the signal the verdict must name
    exit_status: int | None = None
    site: str = ""  # where a hang was: the function the verdict must name
    headline: str = ""  # words the verdict's headline must hold (a native crash's fault)
    namespace: bool = False  # the job is its PID namespace's first process (`unshare -fp`: a container's)

    @property
    def timed(self) -> bool:
        """Ended by the clock: `timeout`, or a grace period after a SIGTERM (a pod's, Slurm's KillWait), in which
        either run, armed or not, may get further along (more steps, a later checkpoint)."""
        return self.timeout or self.action in ("pod", "slurm")


DEATHS = {
    "sigkill": Death("sigkill", at_step=6, action="sigkill", causes=("killed",)),
    "oom": Death("oom", leak="main", causes=("host_oom_kill",)),
    "workers-spawn": Death("workers-spawn", leak="worker", job_args=["--workers", "2", "--context", "spawn"],
                           long=True, causes=("host_oom_kill",)),  # fmt: skip
    "workers-forkserver": Death("workers-forkserver", leak="worker", job_args=["--workers", "2", "--context",
                                "forkserver"], long=True, causes=("host_oom_kill",)),  # fmt: skip
    "ctrlc": Death("ctrlc", at_step=6, action="sigint-group", sender="field", signal="SIGINT", long=True),
    "exit3": Death("exit3", env={"FIELD_EXIT": "3@5"}, causes=("nonzero_exit",), exit_status=3),
    "systemexit2": Death("systemexit2", env={"FIELD_EXIT": "2@5:raise"}, causes=("nonzero_exit",), exit_status=2),
    "timeout": Death("timeout", timeout=True, long=True, sender="timeout", signal="SIGTERM"),
    # the job's work ends (sys.exit(0) at step 5), then an exit handler registered before arm (a library imported
    # before the job's arm() call) hangs until `timeout` ends it: in `arm` mode after blackbox's clean end
    "exit-hang": Death("exit-hang", env={"FIELD_EXIT": "0@5", "FIELD_EXIT_HANG": "1"}, timeout=True, long=True,
                       sender="timeout", signal="SIGTERM", causes=("signal", "hang"),
                       site="_hang_at_exit"),  # fmt: skip
    # a native crash at step 5: a read of address 0 (in libc's strlen), told with its fault and library
    "segv": Death("segv", env={"FIELD_EXIT": "0@5:segv"}, causes=("signal",),
                  headline="died of SIGSEGV in native code (a null pointer: address 0x0, in libc.so.6)"),
    # a checkpoint thread of the job's own never returns at step 5, the main thread joining it (rank 0 alone)
    "saver-hang": Death("saver-hang", env={"FIELD_SAVER_HANG": "5"}, timeout=True, long=True, sender="timeout",
                        signal="SIGTERM", causes=("signal", "hang"), site="_save_hangs"),  # fmt: skip
    "slurm": Death("slurm", at_step=6, action="slurm", sender="field", signal="SIGTERM", long=True),
    # a pod's deletion: SIGTERM to the container's first process alone (the job's, or blackbox run's), its
    # DataLoader workers (fork) never sent one; SIGKILL to every process after the grace period
    "pod": Death("pod", at_step=6, action="pod", job_args=["--workers", "2", "--context", "fork"], sender="field",
                 signal="SIGTERM", long=True),  # fmt: skip
    # the same, the job a container's first process (PID 1 of its PID namespace, armed by arm() or blackbox run
    # in its place): a SIGTERM it has no handler for is dropped; the runtime, outside the namespace, is no sender
    "container": Death("container", at_step=6, action="pod", job_args=["--workers", "2", "--context", "fork"],
                       long=True, namespace=True),  # fmt: skip
    "rerun": Death("rerun", at_step=6, action="sigkill", rerun=True, causes=("clean_exit",)),
}

LEAK_HEADROOM = {"main": 320 << 20, "worker": 600 << 20}  # the limit: usage at LEAK_AFTER steps + this
LEAK_AFTER = 3


def cause_of_status(status: int | None, interrupted_by_handler: bool = False) -> tuple[str, ...]:
    """The causes that fit how the victim ended (a status as a shell reports it), for signal deaths."""
    if status is None:
        return ()
    return {137: ("killed",), 143: ("signal",), 130: ("interrupted",), 0: ("clean_exit",)}.get(
        status, ("nonzero_exit", "interrupted") if interrupted_by_handler else ("nonzero_exit",)
    )
