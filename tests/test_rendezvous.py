"""A torchrun agent that died in its rendezvous, before any rank ran, is told what to change (recovery/rendezvous.py):
the nodes it waited for, where, for how long; the port another process held."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_port

from blackbox.recovery.rendezvous import launch_options, rendezvous_levers

TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
JOB = "import torch.distributed as dist\ndist.init_process_group('gloo')\nprint('rank', dist.get_rank(), flush=True)\n"


def _raised(label: str) -> list[dict[str, Any]]:
    return [{"label": label}]


@pytest.mark.parametrize("argv,expected", [
    (["torchrun", "--nnodes", "2", "--rdzv_endpoint=h:1", "train.py", "--nnodes=9"], {"nnodes": "2",
                                                                                         "rdzv-endpoint": "h:1"}),
    (["torchrun", "--nnodes=1:4", "--standalone", "-m", "pkg"], {"nnodes": "1:4", "standalone": "1"}),
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h:7", "--rdzv-conf", "join_timeout=5",
      "t.py"], {"nnodes": "2", "rdzv-endpoint": "h:7", "rdzv-conf": "join_timeout=5"}),  # (it stopped at "1")
    (["-m", "torch.distributed.run", "--node_rank", "1", "--nnodes=3", "t.py"], {"nnodes": "3"}),
    (["/x/run.py", "--master_addr", "10.0.0.1", "--master-port=1234", "t.py"], {"master-addr": "10.0.0.1",
                                                                               "master-port": "1234"}),
    ("torchrun --nnodes=2", {}), (["torchrun", 3], {}), (["torchrun", "--nnodes"], {"nnodes": ""}),
], ids=["spaced-and-underscored", "elastic-and-standalone", "every-option-spaced", "python-m-as-recorded",
        "run-py-path", "a-string", "not-strings", "no-value"])  # fmt: skip
def test_torchruns_options_are_read_up_to_its_script(argv: Any, expected: dict[str, str]) -> None:
    assert launch_options(argv) == expected


def test_each_rendezvous_failure_gets_its_lever_and_other_exceptions_none() -> None:
    argv = ["torchrun", "--nnodes=4", "--rdzv-endpoint=head:29400", "--rdzv-conf", "join_timeout=900,x=1", "t.py"]
    timeout = rendezvous_levers(_raised("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"), argv)
    assert timeout[0].startswith("the rendezvous did not complete in time: this agent waited 900 s (join_timeout "
                                 "in --rdzv-conf) for 4 nodes (--nnodes=4) at head:29400; "), timeout
    default = rendezvous_levers(_raised("RendezvousTimeoutError"), ["torchrun", "t.py"])
    assert "waited 600 s (torchrun's default join_timeout" in default[0] and "for every node at 127.0.0.1:29500" in \
        default[0]  # fmt: skip
    unreached = rendezvous_levers(_raised("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: "
                                          "The connection to the C10d store has failed."), argv)  # fmt: skip
    assert unreached[0].startswith("this agent lost or never reached the rendezvous store at head:29400"), unreached
    closed = rendezvous_levers(_raised("torch.distributed.elastic.rendezvous.api.RendezvousClosedError"), argv)
    assert closed[0].startswith("the rendezvous was closed: another node's agent ended the job's run"), closed
    taken = rendezvous_levers(_raised("torch.distributed.DistNetworkError: The server socket has failed to listen on "
                                      "any local network address. port: 29501, useIpv6: false, code: -98, name: "
                                      "EADDRINUSE, message: address already in use"), argv)  # fmt: skip
    assert taken[0].startswith("port 29501 was taken on this host"), taken
    elastic = rendezvous_levers(_raised("RendezvousTimeoutError"), ["torchrun", "--nnodes=2:4", "--rdzv-endpoint=h",
                                                                   "t.py"])  # fmt: skip
    assert "for at least 2 of 4 nodes (--nnodes=2:4) at h:29400; " in elastic[0], elastic
    for other in ("ValueError: bad", "torch.distributed.DistNetworkError: Connection reset by peer", ""):
        assert rendezvous_levers(_raised(other), argv) == []
    assert rendezvous_levers([], argv) == []


def _both(tmp_path: Path, args: list[str]) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """torchrun ``args`` unarmed, then under `blackbox run`: the unarmed run, and the armed bundle's metadata."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    plain = subprocess.run([str(TORCHRUN), *args, str(script)], capture_output=True, text=True, timeout=120,
                           env={**ENV, "PYTHONPATH": ""})  # fmt: skip
    armed = subprocess.run([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--",
                            str(TORCHRUN), *args, str(script)], capture_output=True, text=True, timeout=120,
                           env=ENV)  # fmt: skip
    assert armed.returncode == plain.returncode == 1, (plain.stderr[-2000:], armed.stderr[-2000:])
    assert armed.stdout == plain.stdout == ""
    (run,) = (tmp_path / "run").glob("run-*")
    return plain, json.loads((run / "bundle" / "metadata.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_a_node_that_never_joined_is_told_with_the_nodes_endpoint_and_timeout(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    # GIVEN torchrun for 2 nodes, of which only this one starts: its agent waits 5 s in the rendezvous, then raises
    # RendezvousTimeoutError, with no message (it read only that)
    endpoint = f"127.0.0.1:{free_port()}"
    plain, meta = _both(tmp_path, ["--nnodes=2", "--nproc-per-node=1", "--max-restarts=0", "--rdzv-backend=c10d",
                                   f"--rdzv-endpoint={endpoint}", "--rdzv-conf", "join_timeout=5"])  # fmt: skip
    assert "RendezvousTimeoutError" in plain.stderr
    # THEN the death's first lever says what the agent waited for, where and how long
    death = meta["death"]
    assert death["cause"] == "exception" and "RendezvousTimeoutError" in death["headline"], death
    assert death["levers"][0].startswith("the rendezvous did not complete in time: this agent waited 5 s "
                                         f"(join_timeout in --rdzv-conf) for 2 nodes (--nnodes=2) at {endpoint}; ")


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_a_port_another_process_holds_is_named_with_how_to_pick_another(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    # GIVEN a port another process listens on, and torchrun told to use it (two jobs on one host, both on 29500)
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        plain, meta = _both(tmp_path, ["--nproc-per-node=2", "--max-restarts=0", f"--master-port={port}"])
    assert "EADDRINUSE" in plain.stderr
    # THEN the lever names that port and how to give each job its own
    death = meta["death"]
    assert death["cause"] == "exception" and "DistNetworkError" in death["headline"], death
    assert death["levers"][0].startswith(f"port {port} was taken on this host"), death["levers"]
