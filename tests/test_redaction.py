"""Secrets on the command line never reach the disk: redacted at arm, before the header is written.

The rule (``collect/identity.py``, FORMAT.md ``identity.argv``): the value of an option named like a
password, token, secret, API or access key or credentials becomes ``***``; so does a value shaped
like a known key (``sk-``, ``ghp_``, ``hf_``, ``AKIA``, a JSON web token) and a URL's password.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.collect.identity import redact_argv

SECRETS = {
    "openai": "sk-proj-A1b2C3d4E5f6G7h8I9j0KLMNOP",
    "token": "tok-3f9a2b7c",
    "password": "hunter2-but-longer",
    "url_password": "s3cr3tpass",
    "github": "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "hf": "hf_abcdefghijklmnopqrstuvwxyzABCDEF",
    "aws": "AKIAIOSFODNN7EXAMPLE",
}
ARGV = [
    "train.py",
    "--api-key", SECRETS["openai"],
    "--token", SECRETS["token"],
    "--password=" + SECRETS["password"],
    "--data", f"https://alice:{SECRETS['url_password']}@storage.example.com/bucket/data",
    "--lr", "0.1",
    "--tokenizer", "gpt2",
    "--max-tokens", "512",
    SECRETS["github"],
    f"--hub={SECRETS['hf']}",
    "--aws-access-key-id", SECRETS["aws"],
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--api-key", "sk-" + "x" * 24], ["--api-key", "***"]),
        (["--api_key=anything"], ["--api_key=***"]),
        (["--token", "X"], ["--token", "***"]),
        (["--hf-token", "X", "--step", "3"], ["--hf-token", "***", "--step", "3"]),
        (["--password=pa55", "--passwd", "p"], ["--password=***", "--passwd", "***"]),
        (["--secret", "s", "--client-secret=t"], ["--secret", "***", "--client-secret=***"]),
        (["--credentials", "c.json"], ["--credentials", "***"]),
        (["https://user:pass@host/"], ["https://user:***@host/"]),
        (["--url=postgres://bob:pw@db:5432/x"], ["--url=postgres://bob:***@db:5432/x"]),
        (["sk-" + "a" * 30], ["***"]),
        (["--note", "key=" + "ghp_" + "b" * 30], ["--note", "key=***"]),
        (["--tokenizer", "gpt2", "--max-tokens", "512", "--author", "me"],
         ["--tokenizer", "gpt2", "--max-tokens", "512", "--author", "me"]),
        (["--token"], ["--token"]),  # nothing follows: nothing to hide
        (["--token", "--verbose"], ["--token", "--verbose"]),  # an option follows, not a value
        (["https://host/path", "user@host"], ["https://host/path", "user@host"]),
    ],
)  # fmt: skip
def test_redact_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


def test_no_secret_reaches_the_ring_the_bundle_or_the_summary_of_blackbox_run(tmp_path: Path) -> None:
    # GIVEN a job run by `blackbox run` with secrets on its command line, and killed (no clean end)
    job = tmp_path / "train.py"
    job.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--",
                           sys.executable, str(job), *ARGV[1:]], capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    # THEN no file it left and nothing it printed holds a secret, and the redacted argv is recorded
    (run,) = (tmp_path / "run").glob("run-*")
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.suffix == ".ring" for p in files) and any(p.name == "metadata.json" for p in files)
    everything = b"".join(p.read_bytes() for p in files) + (proc.stdout + proc.stderr).encode()
    for name, secret in SECRETS.items():
        assert secret.encode() not in everything, f"the {name} secret leaked"
    assert b'"--api-key", "***"' in everything or b'"--api-key","***"' in everything
    assert b"alice:***@storage.example.com" in everything and b"--tokenizer" in everything


def test_python_c_records_its_code_on_one_line_with_secrets_redacted(tmp_path: Path) -> None:
    # GIVEN a job run as `python -c CODE` (sys.argv is ["-c"] alone: the summary's Command read `-c`), a key in it
    code = f"import sys, blackbox\nkey = '{SECRETS['hf']}'\nblackbox.arm(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(tmp_path) + "/"], check=True, env={"PYTHONPATH": str(REPO)})
    # THEN the ring's argv holds the code on one line, the key redacted
    from blackbox.ring.reader import read_ring

    (ring,) = tmp_path.glob("*.ring")
    argv = read_ring(ring).meta["identity"]["argv"]
    assert argv == ["-c", "import sys, blackbox key = '***' blackbox.arm(sys.argv[1])", str(tmp_path) + "/"], argv
