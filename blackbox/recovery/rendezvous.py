"""What to change where torchrun's agent died before its ranks ran: in its rendezvous (pure).

A multi-node job's agents meet at a rendezvous before any rank starts, and its failures say little:
``RendezvousTimeoutError`` has no message at all (not every node joined within the join timeout, 600 s
unless ``--rdzv-conf join_timeout=S``), ``RendezvousConnectionError`` names no address, and a port another
process holds is a ``DistNetworkError`` of EADDRINUSE. The levers here name what the agent's own command line
says: how many nodes it waited for (``--nnodes``), where (``--rdzv-endpoint``, or ``--master-addr`` and
``--master-port``: 29500 unless given) and for how long.
"""

from __future__ import annotations

import re
from typing import Any

JOIN_TIMEOUT_S = 600  # torchrun's default join_timeout (torch.distributed.elastic.rendezvous)
RDZV_PORT = "29400"  # torchrun's port for an --rdzv-endpoint given without one
_VALUED = ("--nnodes", "--rdzv-endpoint", "--rdzv-conf", "--master-addr", "--master-port", "--rdzv-backend")
# torchrun's options that take no value (argparse's store_true): every other takes one, `--x V` or `--x=V`
_FLAGS = frozenset({"--standalone", "--no-python", "--run-path", "--module", "-m", "--virtual-local-rank"})


def launch_options(argv: Any) -> dict[str, str]:
    """torchrun's options before its script (``--nnodes 2`` and ``--nnodes=2``, ``_`` or ``-`` in a name), the
    values of ``_VALUED``; ``standalone`` where ``--standalone`` was given. Its command is ``torchrun ...``, or
    ``python -m torch.distributed.run ...`` as the recorder reads it (``-m torch.distributed.run ...``, or run.py's
    path). {} for a command that is not a list of strings."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return {}
    start = 2 if argv[:2] == ["-m", "torch.distributed.run"] else 1
    out: dict[str, str] = {}
    args = iter(argv[start:])
    for arg in args:
        if not arg.startswith("-"):
            break  # the script: what follows is its own
        name, eq, value = arg.partition("=")
        name = name.replace("_", "-")
        if name == "--standalone":
            out["standalone"] = "1"
        if not eq and name not in _FLAGS:  # its value is the next word, never the script (`--node-rank 1 t.py`)
            value = next(args, "")
        if name in _VALUED:
            out[name[2:]] = value
    return out


def _join_timeout(conf: str) -> str:
    for part in conf.split(","):
        key, _, value = part.partition("=")
        if key.strip() == "join_timeout" and value.strip():
            return f"{value.strip()} s (join_timeout in --rdzv-conf)"
    return f"{JOIN_TIMEOUT_S} s (torchrun's default join_timeout; --rdzv-conf join_timeout=S sets it)"


def _endpoint(opts: dict[str, str]) -> str:
    if opts.get("rdzv-endpoint"):  # (one without a port: torchrun's 29400; an IPv6 address in brackets)
        said = opts["rdzv-endpoint"]
        return said if re.search(r":\d+$", said) and not said.endswith("]") else f"{said}:{RDZV_PORT}"
    return f"{opts.get('master-addr') or '127.0.0.1'}:{opts.get('master-port') or '29500'}"


def _nodes(said: str) -> str:
    """The nodes the agent waited for, from ``--nnodes``: ``2``, or a range ``1:4`` (elastic: at least its first)."""
    if not said:
        return "every node"
    low, colon, high = said.partition(":")
    return f"at least {low} of {high} nodes (--nnodes={said})" if colon else f"{said} nodes (--nnodes={said})"


def rendezvous_levers(uncaught: Any, argv: Any) -> list[str]:
    """Levers for the last of a ring's uncaught exceptions (``Facts.main_uncaught``: its ``label`` "module.Class:
    message") where it is a rendezvous's failure; [] for any other."""
    label = str(uncaught[-1]["label"] or "") if len(uncaught) else ""
    cls = label.partition(":")[0].rpartition(".")[2]
    opts = launch_options(argv)
    nodes, where = _nodes(opts.get("nnodes", "")), _endpoint(opts)
    if cls == "RendezvousTimeoutError":
        waited = _join_timeout(opts.get("rdzv-conf", ""))
        return [f"the rendezvous did not complete in time: this agent waited {waited} for {nodes} at {where}; "
                "look at the other nodes' logs for one that never started or failed before it joined, check that "
                "each names the same --rdzv-endpoint (a host:port every node reaches) and --rdzv-id, and raise "
                "join_timeout where nodes start far apart (a scheduler's queue, a slow image pull)"]  # fmt: skip
    if cls == "RendezvousConnectionError":
        return [f"this agent lost or never reached the rendezvous store at {where}: the host serving it (the "
                "--rdzv-endpoint's, which starts the store) was not up, had ended (another job's store on the same "
                "endpoint ends with that job: give each job its own), or is not reachable from this node (a wrong "
                "address, a firewall)"]  # fmt: skip
    if cls == "RendezvousClosedError":
        return ["the rendezvous was closed: another node's agent ended the job's run (its ranks failed past "
                "--max-restarts, or it finished); that node's bundle holds the first death"]  # fmt: skip
    if cls == "DistNetworkError" and "EADDRINUSE" in label:
        said = re.search(r"port: (\d+)", label)
        port = said.group(1) if said else where.rpartition(":")[2]
        return [f"port {port} was taken on this host (another job's torchrun, or one left running): give each "
                "job its own port (--master-port, --rdzv-endpoint), or --standalone, which picks a free one"]
    return []
