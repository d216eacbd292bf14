"""The command line's conventions, run as a user runs it (subprocesses, real pipes, a real pty):
``-o -`` is standard output, ``--json`` where a script reads the answer, each frame of ``watch``
flushed into a pipe, progress and colour only on a terminal, shell completion, whole help texts and
one vocabulary of metavars."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, run_py, spawn_py

import blackbox
from blackbox.cli import COMMANDS, build_parser

JOB = """
import os, signal, sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 13, sample_interval=0.02)
hog = []
def leak():
    hog.append(b"\\1" * (4 << 20))
    time.sleep(0.05)
for step in range(1, 9):
    blackbox.step(step)
    leak()
os.kill(os.getpid(), signal.SIGKILL)
"""
LIVE_JOB = """
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 12, sample_interval=0.05)
blackbox.step(7)
print("armed", flush=True)
time.sleep(120)
"""
SHELL_METAVARS = {"FILE", "OUT", "DIR", "SECONDS", "N", "SIZE", "SHELL", "SIG", "LEVELS"}
POSITIONAL = re.compile(r"^[A-Z]+(\|[A-Z]+)*$")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blackbox", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
        timeout=120,
    )


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the rings of a really SIGKILLed job, its bundle)."""
    d = tmp_path_factory.mktemp("killed")
    proc = run_py(JOB, f"{d / 'rings'}/", check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return d / "rings", blackbox.recover(d / "rings", d / "bundle")


# ---------------------------------------------------------------- -o -
@pytest.mark.slow
def test_export_folded_to_standard_output_feeds_a_pipe(killed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bundle = killed
    file = tmp_path / "stacks.folded"
    assert cli("export", "--folded", str(bundle), "-o", str(file)).returncode == 0
    piped = subprocess.run(f"{sys.executable} -m blackbox export --folded {bundle} -o - | sort -k2 -n -r",
                           shell=True, capture_output=True, text=True, cwd=tmp_path, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert sorted(piped.stdout.splitlines()) == sorted(file.read_text().splitlines()), "the same stacks, into the pipe"
    assert "wrote" not in piped.stdout and not (tmp_path / "-").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["--perfetto", "--speedscope"])
def test_export_json_to_standard_output_is_the_json_alone(killed: tuple[Path, Path], fmt: str) -> None:
    done = cli("export", fmt, str(killed[1]), "-o", "-")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert isinstance(json.loads(done.stdout), dict)


@pytest.mark.slow
def test_plot_to_standard_output_is_a_png(killed: tuple[Path, Path]) -> None:
    pytest.importorskip("matplotlib")
    done = subprocess.run([sys.executable, "-m", "blackbox", "plot", str(killed[1]), "-o", "-"], capture_output=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith(b"\x89PNG\r\n\x1a\n"), done.stderr


@pytest.mark.slow
def test_live_bytes_to_standard_output_folded_and_as_pprof(tmp_path: Path) -> None:
    job = JOB.replace("sample_interval=0.02)", "sample_interval=0.02, allocations=True)")
    assert run_py(job, f"{tmp_path / 'rings'}/", check=False).returncode == -signal.SIGKILL
    bundle = blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    for fmt, file in (("--live", "live.folded"), ("--pprof", "live.pb.gz")):
        assert cli("export", fmt, str(bundle), "-o", str(tmp_path / file)).returncode == 0
        piped = subprocess.run([sys.executable, "-m", "blackbox", "export", fmt, str(bundle), "-o", "-"],
                               capture_output=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                               timeout=120)  # fmt: skip
        assert piped.returncode == 0 and piped.stderr == b"", piped.stderr
        written = (tmp_path / file).read_bytes()
        if fmt == "--pprof":
            assert piped.stdout[:2] == b"\x1f\x8b", "gzip's bytes as they are"
            piped_bytes, written = gzip.decompress(piped.stdout), gzip.decompress(written)
        else:
            piped_bytes = piped.stdout
            assert b"leak (<string>:" in piped_bytes
        assert piped_bytes == written, f"{fmt}: the same profile into the pipe as into the file"


# ---------------------------------------------------------------- --json
@pytest.mark.slow
def test_summary_json_of_a_bundle_is_its_metadata(killed: tuple[Path, Path]) -> None:
    rings, bundle = killed
    done = cli("summary", "--json", str(bundle))
    assert done.returncode == 0 and json.loads(done.stdout) == json.loads((bundle / "metadata.json").read_text())
    on_the_fly = json.loads(cli("summary", "--json", str(rings)).stdout)
    assert on_the_fly["death"]["cause"] == "killed" and on_the_fly["last_step"] == 8


@pytest.mark.slow
def test_recover_json_says_what_was_written(killed: tuple[Path, Path], tmp_path: Path) -> None:
    rings, _ = killed
    done = cli("recover", str(rings), "-o", str(tmp_path / "b"), "--json", "--summary")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    meta = json.loads((tmp_path / "b" / "metadata.json").read_text())
    assert said["out"] == str(tmp_path / "b") and said["cause"] == "killed" and said["events"] == meta["events"]
    assert said["first_death"] == meta["first_death"] and said["clean"] is False and said["unread"] == []
    assert said["summary"] == (tmp_path / "b" / "summary.md").read_text()


def test_prune_json_lists_what_went_and_what_stayed(tmp_path: Path) -> None:
    for i in range(4):
        bundle = tmp_path / f"bundle{i}"
        bundle.mkdir()
        (bundle / "metadata.json").write_text("{}")
        (bundle / "timeline.parquet").write_bytes(b"x" * 1000)
        os.utime(bundle / "metadata.json", (1_000_000 + i, 1_000_000 + i))  # bundle3 the newest
    done = cli("prune", str(tmp_path), "--max-count", "1", "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert sorted(Path(r["path"]).name for r in said["removed"]) == ["bundle0", "bundle1", "bundle2"]
    assert [p.name for p in tmp_path.iterdir()] == ["bundle3"], "what it says went is what went"
    assert said["kept"] == 1 and said["kept_bytes"] == 1002 and said["dry_run"] is False


# ---------------------------------------------------------------- watch into a pipe
def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no frame arrived in {timeout} s"
    return proc.stdout.readline()


@pytest.mark.slow
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_watch_flushes_each_frame_into_a_pipe(tmp_path: Path, as_json: bool) -> None:
    job = spawn_py(LIVE_JOB, str(tmp_path / "live.ring"), stdout=subprocess.PIPE)
    watch = None
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "armed"
        # a long interval: unflushed, the first frame would wait in the pipe's buffer for minutes
        args = ["watch", str(tmp_path / "live.ring"), "--interval", "5"] + (["--json"] if as_json else [])
        buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a user's shell has it
        watch = subprocess.Popen([sys.executable, "-m", "blackbox", *args], stdout=subprocess.PIPE, text=True, cwd=REPO,
                                 env=dict(buffered, PYTHONPATH=str(REPO)))  # fmt: skip
        first = _read_line(watch, 30)
        assert watch.poll() is None, "the frame came while watch runs on"
        if as_json:
            frame = json.loads(first)
            (ring,) = frame["rings"]
            assert ring["pid"] == job.pid and ring["state"] == "running" and ring["step"] == 7
        else:
            assert first.startswith("blackbox watch ") and f"pid {job.pid}" in first
        job.send_signal(signal.SIGKILL)
        job.wait()
        rest = watch.communicate(timeout=60)[0]
        assert watch.returncode == 0
        last = rest.strip().splitlines()[-1] if as_json else rest
        assert ("ended without a clean end" in json.loads(last)["rings"][0]["state"]) if as_json else \
            "ENDED without a clean end" in last  # fmt: skip
    finally:
        for p in (job, watch):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_watch_json_says_who_holds_the_memory(tmp_path: Path) -> None:
    job = LIVE_JOB.replace("sample_interval=0.05)", "sample_interval=0.05, allocations=True)").replace(
        'print("armed"', 'kept = [bytearray(1 << 16) for _ in range(3200)]  # 200 MiB held here\nprint("armed"'
    )
    truth = 3200 * ((1 << 16) + 57)  # the bytearrays' buffers and headers
    proc = spawn_py(job, str(tmp_path / "live.ring"), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "armed"
        done = cli("watch", str(tmp_path / "live.ring"), "--once", "--json")
        assert done.returncode == 0, done.stderr
        (ring,) = json.loads(done.stdout)["rings"]
        held = ring["holders"]
        assert held["sites"][0]["site"].startswith("<") and "<string>:5)" in held["sites"][0]["site"], held
        top = held["sites"][0]
        # the estimate's 95% error is a claim: the truth lies within it (twice it, so a 1-in-20 draw does
        # not fail the test; about 4 standard deviations), and at 200 MiB that error is a small fraction
        assert abs(top["live_bytes"] - truth) <= 2 * top["error_bytes"], held
        assert 0.75 * truth <= top["live_bytes"] <= 1.25 * truth and top["error_bytes"] <= 0.2 * truth, held
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- a terminal, and not
def _on_pty(args: list[str], which: str, env: dict[str, str] | None = None) -> tuple[bytes, bytes]:
    """Run the command with ``which`` ('stdout' or 'stderr') on a pty, the other on a pipe: (what the pty
    showed, what the pipe got)."""
    master, slave = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, which: slave}
    proc = subprocess.Popen([sys.executable, "-m", "blackbox", *args], cwd=REPO, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(REPO), TERM="xterm", **(env or {})),
                            **streams)  # type: ignore[call-overload]  # fmt: skip
    os.close(slave)
    pipe = proc.stderr if which == "stdout" else proc.stdout
    drained: list[bytes] = []
    drain = threading.Thread(target=lambda: drained.append(pipe.read()))  # type: ignore[union-attr]
    drain.start()  # read at once: a pipe left full would stop the command before the pty ends
    shown = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the pty's other end closed
            break
        if not chunk:
            break
        shown += chunk
    drain.join(timeout=120)
    other = drained[0]
    proc.wait(timeout=120)
    os.close(master)
    assert proc.returncode == 0, (shown, other)
    return shown, other


@pytest.mark.slow
def test_progress_and_colour_only_on_a_terminal(killed: tuple[Path, Path]) -> None:
    rings = str(killed[0])
    progress, plain_out = _on_pty(["summary", rings], "stderr")
    assert re.search(rb"\r\x1b\[Krecovering 1/1 \S+\.ring", progress), progress
    assert b"\x1b" not in plain_out and plain_out.startswith(b"# blackbox:"), "stdout, a pipe: no colour"
    coloured, plain_err = _on_pty(["summary", rings], "stdout")
    assert b"\x1b[1m\x1b[4mblackbox:" in coloured and b"\x1b[1mThe main process" in coloured, coloured[:300]
    assert plain_err == b"", "stderr, a pipe: no progress"
    no_colour, _ = _on_pty(["summary", rings], "stdout", env={"NO_COLOR": "1"})
    assert b"\x1b" not in no_colour and b"# blackbox:" in no_colour


@pytest.mark.slow
@pytest.mark.parametrize("command", [["report"], ["export", "--folded"], ["plot"]], ids=lambda c: c[0])
def test_rings_read_for_a_view_show_progress_on_a_terminal_only(killed: tuple[Path, Path], command: list[str]) -> None:
    if command == ["plot"]:
        pytest.importorskip("matplotlib", reason="plot draws only where matplotlib is installed")
    progress, piped = _on_pty([*command, str(killed[0]), "-o", "-"], "stderr")
    assert re.search(rb"\r\x1b\[Krecovering 1/1 \S+\.ring", progress), progress
    starts = {"report": b"<!DOCTYPE html>", "export": b"<module> (", "plot": b"\x89PNG\r\n\x1a\n"}[command[0]]
    assert piped.startswith(starts) and b"recovering" not in piped, "the output itself, untouched"
    quiet = subprocess.run([sys.executable, "-m", "blackbox", *command, str(killed[0]), "-o", "-"], capture_output=True,
                           cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)  # fmt: skip
    assert quiet.returncode == 0 and quiet.stdout.startswith(starts) and quiet.stderr == b"", "a pipe: no progress"


# ---------------------------------------------------------------- completion
def _bash_complete(line: str) -> list[str]:
    script = cli("completion", "bash").stdout
    probe = (f'{script}\nread -ra COMP_WORDS <<< "$LINE"; [[ "$LINE" == *" " ]] && COMP_WORDS+=("")\n'
             'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _blackbox; printf "%s\\n" "${COMPREPLY[@]}"\n')  # fmt: skip
    done = subprocess.run(["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, LINE=line), cwd=REPO / "tests")  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_bash_completes_commands_options_and_choices() -> None:
    assert _bash_complete("blackbox rep") == ["report"]
    assert _bash_complete("blackbox export --sp") == ["--speedscope"]
    assert _bash_complete("blackbox completion ") == ["bash", "zsh", "fish"]
    assert "--json" in _bash_complete("blackbox watch --")
    assert _bash_complete("blackbox watch --interval ") == [], "seconds: no file names"
    assert "data" in _bash_complete("blackbox prune ") and "conftest.py" not in _bash_complete("blackbox prune ")
    assert "conftest.py" in _bash_complete("blackbox report -o ")


def test_fish_and_zsh_complete_where_installed(tmp_path: Path) -> None:
    shells = [s for s in ("fish", "zsh") if shutil.which(s)]
    if not shells:
        pytest.skip("neither fish nor zsh on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "blackbox").write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m blackbox "$@"\n')
    (bin_dir / "blackbox").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    if "fish" in shells:
        probe = 'blackbox completion fish | source; complete -C"blackbox export --sp"'
        out = subprocess.run(["fish", "-N", "-c", probe], capture_output=True, text=True, env=env, timeout=30).stdout
        assert out.startswith("--speedscope\t"), out
    if "zsh" in shells:
        probe = (
            "autoload -U compinit && compinit -u -D; source <(blackbox completion zsh); setopt ksharrays; "
            'COMP_WORDS=(blackbox completion ""); COMP_CWORD=2; _blackbox; print -l -- "${COMPREPLY[@]}"'
        )
        out = subprocess.run(["zsh", "-f", "-c", probe], capture_output=True, text=True, env=env, timeout=30).stdout
        assert out.split() == ["bash", "zsh", "fish"], out


# ---------------------------------------------------------------- help and metavars
def test_each_commands_help_is_its_whole_first_paragraph() -> None:
    for name, module in COMMANDS.items():
        first = " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
        assert first.endswith("."), f"{name}: {first!r}"
        shown = " ".join(cli(name, "--help").stdout.split("\n\n")[1].split())
        assert shown == first, f"{name}: the help says {shown!r}"
    assert "pprof profile (--pprof)." in " ".join(cli("export", "-h").stdout.split()), "the last words of its docstring"


def test_metavars_are_one_vocabulary() -> None:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in subparsers.choices.items():
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:
                assert action.metavar == "-- CMD..." or POSITIONAL.match(str(action.metavar)), (name, action.metavar)
            else:
                assert action.metavar in SHELL_METAVARS, (name, action.option_strings, action.metavar)
                if "--dir" in action.option_strings:
                    assert action.metavar == "DIR", name
                if "--out" in action.option_strings:
                    assert action.metavar in ("FILE", "OUT"), name


def test_times_are_seconds_everywhere() -> None:
    helps = {name: cli(name, "-h").stdout for name in ("watch", "epilog")}
    assert "--interval SECONDS" in helps["watch"] and "--timeout SECONDS" in helps["epilog"]
