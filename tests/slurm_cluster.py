"""A real single-node Slurm cluster for tests: Debian's slurmctld, slurmd and munged, nothing in /etc.

Everything lives in one private folder: the munge key and socket, slurm.conf and
cgroup.conf, the state and spool folders, the logs and ``jobcomp/filetxt``'s
record of every finished job. The daemons are started in the foreground (``-D``,
``-F``) and stopped by their pids; clients find the cluster through
``SLURM_CONF``. Ports are free ones, and ``FirstJobId`` is random, so job ids
(and so the per-job ring folders named after them) never collide with an earlier
run's. Tests skip, saying why, only where the daemons are not installed or slurmd
cannot start (not root, no writable cgroup v1 hierarchy).

Jobs run as root or as a user made with ``useradd`` (``tests/users.py``); such a
user cannot execute a Python under /root (pyenv), so ``shared_python`` makes a
virtual environment from the system's Python of the same version, with this
checkout and its site-packages on its path.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.users import User

REPO = Path(__file__).resolve().parent.parent
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scancel", "scontrol", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}  # fmt: skip


def tool(name: str) -> str | None:
    """A Slurm or munge program, looked for where Debian puts it as well as on PATH."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def why_not() -> str | None:
    """Why no cluster can be brought up here, or None."""
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd runs jobs as their users)"
    missing = [n for n in (*DAEMONS, *CLIENTS) if tool(n) is None]
    if missing:
        install = "apt-get install slurmctld slurmd slurm-client munge"
        return f"Slurm is not installed ({', '.join(missing)} missing: {install})"
    if not os.access("/sys/fs/cgroup/memory", os.W_OK) or not os.access("/sys/fs/cgroup/freezer", os.W_OK):
        return "no writable cgroup v1 memory and freezer hierarchies for proctrack/cgroup and task/cgroup"
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _memory_mb() -> int:
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    return max(2048, min(total_kb // 1024 // 2, 16384))


@dataclass
class Cluster:
    folder: Path
    host: str
    proctrack: str
    first_job: int
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)
    jobs: list[int] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.folder / "etc" / "slurm.conf"

    @property
    def epilog_log(self) -> Path:
        return self.folder / "log" / "epilog.log"

    def run(self, *argv: str, user: User | None = None, check: bool = True, timeout: float = 60) -> str:
        """A Slurm client command (as ``user`` where given); its stdout."""
        kw = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
        proc = subprocess.run(
            [tool(argv[0]) or argv[0], *argv[1:]],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd="/",
            **kw,  # type: ignore[arg-type]
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, script: str, *options: str, user: User | None = None, folder: Path | None = None) -> int:
        """Submit ``script`` (a shell script's text) from ``folder``; its job id."""
        folder = folder or self.folder / "jobs"
        path = Path(tempfile.mkstemp(prefix="job-", suffix=".sh", dir=folder)[1])
        path.write_text(script)
        path.chmod(0o755)
        if user is not None:
            user.give(path)
        out = self.run("sbatch", "--parsable", f"--chdir={folder}", *options, str(path), user=user)
        job = int(out.strip().split(";")[0])
        self.jobs.append(job)
        return job

    def show(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields (first value of each name)."""
        text = self.run("scontrol", "-o", "show", "job", str(job), check=False)
        fields: dict[str, str] = {}
        for m in re.finditer(r"(\w+)=(\S*)", text):
            fields.setdefault(m.group(1), m.group(2))
        return fields

    def wait_state(self, job: int, states: set[str], timeout: float = 90) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            fields = self.show(job)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} not in {sorted(states)} after {timeout:.0f} s: {fields}")
            time.sleep(0.3)

    def wait(self, job: int, timeout: float = 90) -> dict[str, str]:
        """Wait for the job to end and its epilogue to have run; Slurm's account of it (scontrol)."""
        fields = self.wait_state(job, TERMINAL, timeout)
        deadline = time.monotonic() + timeout
        while "COMPLETING" in self.run("scontrol", "-o", "show", "job", str(job), check=False):
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} still completing (its epilogue) after {timeout:.0f} s")
            time.sleep(0.2)
        return fields

    def jobcomp(self, job: int) -> list[dict[str, str]]:
        """jobcomp/filetxt's records of the job (one per ended attempt)."""
        path = self.folder / "log" / "jobcomp.txt"
        text = path.read_text() if path.exists() else ""
        out = []
        for line in text.splitlines():
            fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))
            if fields.get("JobId") == str(job):
                out.append(fields)
        return out

    def wait_running(self, job: int, marker: Path | None = None, timeout: float = 60) -> None:
        """Wait for the job to run (and, where given, for ``marker`` to exist: the job's own sign)."""
        self.wait_state(job, {"RUNNING"} | TERMINAL, timeout)
        deadline = time.monotonic() + timeout
        while marker is not None and not marker.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} running but {marker} not there after {timeout:.0f} s")
            time.sleep(0.1)

    def log(self, name: str) -> str:
        path = self.folder / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _write_conf(c: Cluster, *, task: str, gather: str, gather_params: str, epilog: str | None, extra: str) -> None:
    f = c.folder
    ctld_port, slurmd_port = _free_ports(2)
    cpus = 8  # more than the machine has (config_overrides): the tests' jobs mostly wait, many at once
    lines = [
        "ClusterName=bbtest",
        f"SlurmctldHost={c.host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={f}/sock/munge.socket,cred_expire=10",
        f"StateSaveLocation={f}/state",
        f"SlurmdSpoolDir={f}/spool",
        f"SlurmctldPidFile={f}/run/slurmctld.pid",
        f"SlurmdPidFile={f}/run/slurmd.pid",
        f"SlurmctldLogFile={f}/log/slurmctld.log",
        f"SlurmdLogFile={f}/log/slurmd.log",
        "SlurmdDebug=debug2",
        f"ProctrackType=proctrack/{c.proctrack}",
        f"TaskPlugin=task/{task}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"JobAcctGatherType=jobacct_gather/{gather}",
        "JobAcctGatherFrequency=task=1",
        *([f"JobAcctGatherParams={gather_params}"] if gather_params else []),
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={f}/log/jobcomp.txt",
        "AccountingStorageType=accounting_storage/none",
        *([f"Epilog={epilog}"] if epilog else []),
        "JobRequeue=1",
        "KillWait=30",
        "SlurmdParameters=config_overrides",
        "MinJobAge=600",
        f"FirstJobId={c.first_job}",
        "MpiDefault=none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1",
        "SwitchType=switch/none",
        f"NodeName={c.host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_memory_mb()} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        *extra.splitlines(),
    ]
    (f / "etc" / "slurm.conf").write_text("\n".join(lines) + "\n")
    (f / "etc" / "cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainRAMSpace=yes\nConstrainSwapSpace=no\n"
    )
    for name in ("slurm.conf", "cgroup.conf"):
        (f / "etc" / name).chmod(0o644)


def _start(c: Cluster, name: str, argv: list[str]) -> None:
    out = open(c.folder / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon keeps it
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=c.env,
                            cwd=c.folder, start_new_session=True)  # fmt: skip
    out.close()
    c.pids[name] = proc.pid


def _stop(c: Cluster) -> None:
    for name in reversed(list(c.pids)):  # slurmd first, munged last
        pid = c.pids[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    c.pids.clear()


def _wait_idle(c: Cluster, timeout: float = 30) -> str | None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        for name, pid in c.pids.items():
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                c.pids.pop(name)
                return f"{name} exited ({status}): {c.log(name + '.out')[-600:]} {c.log(name + '.log')[-600:]}"
        state = c.run("sinfo", "-h", "-o", "%T", check=False).strip()
        if state == "idle":
            return None
        time.sleep(0.2)
    return f"the node is {state or 'unknown'} after {timeout:.0f} s: {c.log('slurmd.log')[-600:]}"


@contextlib.contextmanager
def slurm_cluster(
    *,
    proctrack: str = "cgroup",
    task: str = "cgroup",
    gather: str = "cgroup",
    gather_params: str = "",
    epilog: str | None = None,
    extra: str = "",
) -> Iterator[Cluster]:
    """A running cluster (see the module docstring); stopped, by pid, afterwards. ``epilog``: the text
    of the Epilog script (it runs as root with no PATH); its output goes to ``Cluster.epilog_log``."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="bb-slurm-"))
    folder.chmod(0o755)  # munged refuses a socket unless every folder above it can be searched by all
    host = socket.gethostname().split(".")[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BLACKBOX_"))}
    env["SLURM_CONF"] = str(folder / "etc" / "slurm.conf")
    c = Cluster(folder, host, proctrack, random.randrange(100_000, 60_000_000), env)
    try:
        for d in ("sock", "state", "spool", "log", "run", "etc", "munge", "jobs"):
            (folder / d).mkdir(mode=0o755)
        (folder / "munge").chmod(0o700)
        (folder / "jobs").chmod(0o1777)
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        script = None
        if epilog is not None:
            script = folder / "etc" / "epilog.sh"
            script.write_text(f"#!/bin/sh\nexec >>{c.epilog_log} 2>&1\n{epilog}\n")
            script.chmod(0o755)
        _write_conf(c, task=task, gather=gather, gather_params=gather_params, epilog=str(script) if script else None,
                    extra=extra)  # fmt: skip
        munged = f"{folder}/munge"
        _start(c, "munged", [str(tool("munged")), "-F", f"--socket={folder}/sock/munge.socket",
                             f"--key-file={key}", f"--log-file={munged}/munged.log", f"--pid-file={munged}/munged.pid",
                             f"--seed-file={munged}/munged.seed"])  # fmt: skip
        deadline = time.monotonic() + 10
        while not (folder / "sock" / "munge.socket").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _start(c, "slurmctld", [str(tool("slurmctld")), "-D", "-i"])
        _start(c, "slurmd", [str(tool("slurmd")), "-D"])
        problem = _wait_idle(c)
        if problem:
            pytest.skip(f"slurmd could not start: {problem}")
        yield c
    finally:
        with contextlib.suppress(Exception):
            if c.pids.get("slurmctld") and c.jobs:
                c.run("scancel", *map(str, c.jobs), check=False)
                time.sleep(1)
        _stop(c)
        _kill_left_over(c)
        for job in c.jobs:  # the per-job ring folders the jobs left under /var/tmp
            for pattern in (f"blackbox-*/slurm-{job}", f"blackbox-*/slurm-{job}-restart*"):
                for d in Path("/var/tmp").glob(pattern):
                    shutil.rmtree(d, ignore_errors=True)
        if not os.environ.get("BB_KEEP_CLUSTER"):  # kept for a look at the logs where it is set
            shutil.rmtree(folder, ignore_errors=True)
        _remove_empty_cgroups(host)


def _kill_left_over(c: Cluster) -> None:
    """SIGKILL, by pid, what is left in our jobs' cgroups (a job that outlived the daemons stopped
    under it: its slurmstepd, its processes)."""
    for job in c.jobs:
        for folder in Path("/sys/fs/cgroup").glob(f"*/slurm*/uid_*/job_{job}"):
            for procs in folder.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in map(int, procs.read_text().split()):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)


def _remove_empty_cgroups(host: str) -> None:
    """slurmd's own cgroup folders (``slurm_<host>``, ``slurm``), once no job is left in them."""
    for controller in Path("/sys/fs/cgroup").iterdir():
        for name in (f"slurm_{host}", "slurm"):
            top = controller / name
            if not top.is_dir() or top.is_symlink():
                continue
            for d in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                if d.is_dir():
                    with contextlib.suppress(OSError):
                        d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _readable_by_all(path: Path) -> bool:
    p = path.resolve()
    for d in [p, *p.parents]:
        mode = os.stat(d).st_mode
        if not mode & stat.S_IXOTH or (d == p and not mode & stat.S_IROTH):
            return False
    return True


def shared_python(folder: Path) -> Path:
    """A Python every user can execute, importing this checkout and its site-packages: a virtual
    environment made from the system's Python of this version (the pyenv one under /root is root's)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = next((p for p in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}") if os.access(p, os.X_OK)),
                None)  # fmt: skip
    if base is None:
        pytest.skip(f"no Python {version} every user can execute (the tests' own is {sys.executable})")
    site = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)))
    for needed in (REPO / "blackbox", site):
        if not _readable_by_all(needed):
            pytest.skip(f"{needed} cannot be read by other users: a job run as another user cannot import it")
    venv = folder / "py"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    lib = next((venv / "lib").glob("python*/site-packages"))
    (lib / "blackbox-tests.pth").write_text(f"{REPO}\n{site}\n")
    return venv / "bin" / "python"
