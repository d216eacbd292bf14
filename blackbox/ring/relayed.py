"""``relayed.jsonl``: the signals ``blackbox run`` passed on to its job, with who really sent them.

``blackbox run`` reads every signal sent to it (``sigtimedwait``) and sends it
on to the job's process group, so the job's rings record the launcher as the
sender. Before each relay the launcher appends one line here, in its rings
folder: ``signal`` (its number), ``code`` (the original ``si_code``: 0 for
``kill``, 128 for the kernel, e.g. a terminal's hang-up), ``sender_pid``,
``sender_uid``, ``sender`` (the program it runs: its command name, or for a
Python interpreter the script or module it runs, ``torchrun`` rather than
``python``) and ``command`` (its command line, redacted, at most 1024
characters), all null when the kernel sent it; ``via`` (the launcher's pid,
the sender the job's rings name) and ``time_ns`` (UTC nanoseconds when the
launcher received it). Recovery (``recovery.relays``) gives the job's signal records their real
sender from it. One ``O_APPEND`` write per line; readers treat the file as
untrusted: bounded size, one JSON object per line, fields checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from .._errors import BlackboxError
from .inputs import Folder, folder_at, open_input, read_at

RELAYED = "relayed.jsonl"
MAX_RELAYED_BYTES = 1 << 20
MAX_LINE = 4096
MAX_SENDER = 64
MAX_COMMAND = 1024


@dataclass(frozen=True)
class Relay:
    """One signal the launcher (pid ``via``) passed on, and who sent it to the launcher."""

    signal: int
    code: int
    sender_pid: int | None  # None: the kernel sent it
    sender_uid: int | None
    sender: str | None  # the program it runs (see the module docstring), read when the signal arrived
    command: str | None  # its command line, redacted
    via: int
    time_ns: int


def relay_line(relay: Relay) -> bytes:
    """The line for one relayed signal (always shorter than MAX_LINE: every field is bounded)."""
    entry = {
        "signal": relay.signal,
        "code": relay.code,
        "sender_pid": relay.sender_pid,
        "sender_uid": relay.sender_uid,
        "sender": None if relay.sender is None else relay.sender[:MAX_SENDER],
        "command": None if relay.command is None else relay.command[:MAX_COMMAND],
        "via": relay.via,
        "time_ns": relay.time_ns,
    }
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def _int(value: object, *, optional: bool = False) -> bool:
    if value is None:
        return optional
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)


def _text(value: object, limit: int) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= limit)


def _relay(entry: object) -> Relay | None:
    if not isinstance(entry, dict):
        return None
    ints = all(_int(entry.get(k)) for k in ("signal", "code", "via", "time_ns"))
    optional = all(_int(entry.get(k), optional=True) for k in ("sender_pid", "sender_uid"))
    sender, command = entry.get("sender"), entry.get("command")
    texts = _text(sender, MAX_SENDER) and _text(command, MAX_COMMAND)
    if not (ints and optional and texts) or not 0 < entry["signal"] < 65 or entry["via"] <= 0:
        return None
    return Relay(entry["signal"], entry["code"], entry.get("sender_pid"), entry.get("sender_uid"), sender, command,
                 entry["via"], entry["time_ns"])  # fmt: skip


def read_relayed(folder: Folder | Path, owners: Collection[int] = ()) -> list[Relay]:
    """The signals relayed into a ring folder's job, oldest first; lines that are not such an object are
    skipped. Read as untrusted input (``inputs``): a regular file of the folder's owner or of ``owners``
    (the owners of the rings recovered from it), never through a link; anything else counts as no file."""
    try:
        with folder_at(folder) as where:
            fd, _ = open_input(where, RELAYED, {where.uid, *owners}, "a relayed.jsonl of the rings' owner")
    except BlackboxError:
        return []
    try:
        data = read_at(fd, MAX_RELAYED_BYTES, 0)
    finally:
        os.close(fd)
    out = []
    for raw in data.splitlines():
        if len(raw) > MAX_LINE:
            continue
        try:
            relay = _relay(json.loads(raw))
        except (ValueError, RecursionError):
            continue
        if relay is not None:
            out.append(relay)
    return out
