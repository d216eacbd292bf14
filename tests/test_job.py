"""The job-wide view over node bundles: `blackbox summary` and `blackbox recover` given several bundles,
a folder of them or a URI prefix (a local S3-compatible server), reading only metadata and rank tables."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import REPO, readme_fleet_query

from blackbox._postmortem import job_account, write_postmortem
from blackbox.recovery import bundle
from blackbox.views.across import first_death_lines

FLEET = REPO / "tools" / "fleet.py"
BUCKET = "postmortems"


def blackbox_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blackbox", *args], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
    )  # fmt: skip


def fleet(folder: Path, ranks: int, hosts: int, victim: int, mib: int = 1, gap: float = 0.2) -> None:
    """Real processes under their own host names, every one SIGKILLed, the victim first, the others ``gap``
    seconds later."""
    subprocess.run(
        [sys.executable, str(FLEET), str(folder), "--ranks", str(ranks), "--hosts", str(hosts),
         "--ring-mib", str(mib), "--victim", str(victim), "--per-host", "--gap", str(gap)],
        check=True, capture_output=True, text=True, timeout=1200, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip


@pytest.fixture(scope="module")
def node_bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hosts of four ranks each, rank 5 (on node001) killed first, each host recovered on its own. The
    others die 2 s after it: with 0.2 s, a rank starved of the CPU for longer than that just before (a loaded
    CI lane, 7 tests at once) had left its last step before rank 5's death and read, rightly for its ring, as
    the first death (the thousand-rank test below says the same)."""
    rings, out = tmp_path_factory.mktemp("rings"), tmp_path_factory.mktemp("bundles")
    fleet(rings, 8, 2, victim=5, gap=2.0)
    for host in sorted(p.name for p in rings.iterdir()):
        write_postmortem([rings / host], out / host, plot=False)
    return out


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A local S3-compatible server (moto's server mode) with one bucket; the environment that
    pyarrow's S3 filesystem needs to reach it."""
    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install '.[dev]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    try:
        server.start()
    except OSError as exc:
        pytest.skip(f"moto's server could not start: {exc}")
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True).create_dir(
        BUCKET
    )
    try:
        yield env
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_summary_over_a_folder_of_bundles_names_the_jobs_first_death(node_bundles: Path) -> None:
    proc = blackbox_cli("summary", str(node_bundles))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# blackbox: job of 8 rings on 2 hosts, from 2 bundles")
    assert "**First death: rank 5 (host node001," in proc.stdout
    assert "8 ranks `killed`" in proc.stdout
    assert f"Its timeline: `{node_bundles}/node001/timeline.parquet`" in proc.stdout
    assert "### blackbox: node001 pid" in proc.stdout  # the first death's own account, from its bundle


def test_summary_takes_several_bundles_named_one_by_one(node_bundles: Path) -> None:
    proc = blackbox_cli("summary", str(node_bundles / "node000"), str(node_bundles / "node001"))
    assert proc.returncode == 0, proc.stderr
    assert "from 2 bundles" in proc.stdout and "**First death: rank 5 (host node001," in proc.stdout


def test_recover_of_bundles_writes_a_job_bundle_without_timelines(node_bundles: Path, tmp_path: Path) -> None:
    out = tmp_path / "job"
    proc = blackbox_cli("recover", str(node_bundles), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "job-wide: 8 rings on 2 hosts from 2 bundles" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["metadata.json", "ranks.parquet", "summary.md"]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["scope"] == "job" and meta["ring_count"] == 8 and meta["hosts"] == 2
    assert meta["first_death"]["rank"] == 5 and meta["first_death"]["host"] == "node001"
    assert meta["first_death"]["bundle"] == str(node_bundles / "node001")
    ranks = pq.read_table(out / "ranks.parquet")
    assert sorted(ranks["rank"].to_pylist()) == list(range(8))
    assert set(ranks["host"].to_pylist()) == {"node000", "node001"}
    # AND the job bundle's summary is what `summary` prints of it, and of the node bundles
    again = blackbox_cli("summary", str(out))
    assert again.stdout == (out / "summary.md").read_text() == blackbox_cli("summary", str(node_bundles)).stdout


def test_the_job_view_reads_no_timeline(node_bundles: Path, tmp_path: Path) -> None:
    # GIVEN node bundles whose timelines are gone (only metadata and rank tables copied off the nodes)
    slim = tmp_path / "slim"
    for host in ("node000", "node001"):
        (slim / host).mkdir(parents=True)
        for name in ("metadata.json", "ranks.parquet"):
            (slim / host / name).write_bytes((node_bundles / host / name).read_bytes())
    # THEN the job's account is the same
    _, meta, text = job_account([str(slim)])
    assert meta["first_death"]["rank"] == 5 and meta["ring_count"] == 8
    assert "**First death: rank 5 (host node001," in text


def test_an_unreadable_bundle_is_named_and_the_others_still_read(node_bundles: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    for host in ("node000", "node001"):
        (job / host).mkdir(parents=True)
        for name in ("metadata.json", "ranks.parquet", "summary.md"):
            (job / host / name).write_bytes((node_bundles / host / name).read_bytes())
    (job / "node000" / "metadata.json").write_text('{"rings": "not a list"}')
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0, proc.stderr
    assert "job of 4 rings on 1 host, from 1 bundle" in proc.stdout
    assert "## Bundles that could not be read (1)" in proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"blackbox: not read: {job}/node000/metadata.json: expected blackbox bundle metadata, found other JSON"
    ]


def test_a_link_among_bundles_is_never_followed(node_bundles: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "node000").symlink_to(node_bundles / "node000")  # planted: would add another host's ranks
    (job / "node001").mkdir()
    for name in ("metadata.json", "ranks.parquet"):
        (job / "node001" / name).write_bytes((node_bundles / "node001" / name).read_bytes())
    _, meta, _ = job_account([str(job)])
    assert [b["bundle"] for b in meta["bundles"]] == [str(job / "node001")]


def test_names_that_are_neither_rings_nor_bundles_are_one_line_errors(tmp_path: Path, node_bundles: Path) -> None:
    proc = blackbox_cli("summary", str(tmp_path))
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "expected ring files, a bundle, or a folder or URI prefix of bundles, found none" in proc.stderr
    ring = next((node_bundles.parent).glob("rings*/node000/*.ring"))
    mixed = blackbox_cli("summary", str(ring), str(node_bundles))
    assert mixed.returncode == 1 and "expected ring files or bundles, found both" in mixed.stderr


def test_node_bundles_on_object_storage_give_the_job_wide_account(
    node_bundles: Path, s3: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN each host's rings recovered straight to object storage
    rings = next(node_bundles.parent.glob("rings*"))
    for host in ("node000", "node001"):
        proc = blackbox_cli("recover", str(rings / host), "-o", f"s3://{BUCKET}/job42/{host}", env=s3)
        assert proc.returncode == 0, proc.stderr
    # WHEN the job's account is asked of the prefix (the URI keeps both slashes on the way)
    proc = blackbox_cli("summary", f"s3://{BUCKET}/job42/", env=s3)
    assert proc.returncode == 0, proc.stderr
    assert "from 2 bundles" in proc.stdout and "**First death: rank 5 (host node001," in proc.stdout
    assert f"Its timeline: `s3://{BUCKET}/job42/node001/timeline.parquet`" in proc.stdout
    # AND a job bundle can be written beside them, and one node bundle read alone
    proc = blackbox_cli("recover", f"s3://{BUCKET}/job42/", "-o", f"s3://{BUCKET}/job42-all", env=s3)
    assert proc.returncode == 0, proc.stderr
    meta = json.loads(bundle.Destination(f"s3://{BUCKET}/job42-all").fs.open_input_file(
        f"{BUCKET}/job42-all/metadata.json").read())  # fmt: skip
    assert meta["first_death"]["bundle"] == f"s3://{BUCKET}/job42/node001"
    one = blackbox_cli("summary", f"s3://{BUCKET}/job42/node000", env=s3)
    assert one.returncode == 0 and one.stdout.startswith("# blackbox: 4 rings on 1 host")


def test_a_bundle_rewritten_on_object_storage_never_shows_earlier_metadata(
    node_bundles: Path, s3: dict[str, str]
) -> None:
    # GIVEN a bundle already at the prefix
    rings = next(node_bundles.parent.glob("rings*"))
    prefix = f"s3://{BUCKET}/again"
    write_postmortem([rings / "node000"], prefix, plot=False)
    dest = bundle.Destination(prefix)
    seen: list[dict[str, Any] | None] = []

    def views(meta: dict[str, Any], read: bundle.Reader | None) -> dict[str, bytes]:
        # WHILE another recovery writes there: before its verdict, and before its whole bundle
        there = dest.fs.get_file_info(dest.path("metadata.json")).type == pafs.FileType.File
        seen.append(json.loads(dest.fs.open_input_file(dest.path("metadata.json")).read()) if there else None)
        return {}

    from blackbox.recovery.pipeline import RecoveryPass

    bundle.stream_bundle(RecoveryPass([rings / "node001"]), prefix, views)
    # THEN a reader listing the prefix saw no metadata.json before the verdict, then the verdict
    # (complete: false, the new host's), and sees the whole new one now
    assert len(seen) == 2 and seen[0] is None
    assert seen[1] is not None and seen[1]["complete"] is False and seen[1]["rings"][0]["host"] == "node001"
    now = json.loads(dest.fs.open_input_file(dest.path("metadata.json")).read())
    assert now["complete"] is True and now["rings"][0]["host"] == "node001"


def test_a_bundle_rewritten_on_object_storage_keeps_only_its_own_raw_rings(
    node_bundles: Path, s3: dict[str, str]
) -> None:
    # GIVEN a bundle of host node000's rings, raw rings kept, at a prefix
    rings = next(node_bundles.parent.glob("rings*"))
    prefix = f"s3://{BUCKET}/raw"
    write_postmortem([rings / "node000"], prefix, plot=False)
    dest = bundle.Destination(prefix)

    def kept() -> list[str]:
        listing = dest.fs.get_file_info(pafs.FileSelector(dest.path("rings"), allow_not_found=True))
        return sorted(i.base_name for i in listing if i.type == pafs.FileType.File)

    assert kept() == sorted(f"{p.name}.zst" for p in (rings / "node000").glob("*.ring"))
    # WHEN node001's rings are recovered to the same prefix
    meta = write_postmortem([rings / "node001"], prefix, plot=False)
    # THEN rings/ holds node001's rings alone, each the bytes metadata.json names
    assert kept() == sorted(f"{p.name}.zst" for p in (rings / "node001").glob("*.ring"))
    for row in meta["raw_rings"]["kept"]:
        packed = dest.fs.open_input_file(dest.path(row["file"])).read()
        data = zstandard.ZstdDecompressor().stream_reader(packed).read()
        original = Path(row["ring"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["sha256"] == hashlib.sha256(original).hexdigest()


# ------------------------------------------------------------------ clocks: an order the hosts cannot tell


def _row(host: str, rank: int, at: str, error: float | None = None) -> dict[str, Any]:
    return {"host": host, "rank": rank, "pid": 100 + rank, "cause": "killed", "death_time": at,
            "clock_error_s": error}  # fmt: skip


FIRST = {"host": "a", "rank": 0, "pid": 100, "cause": "killed", "time": "2026-01-01T00:00:00.000000Z"}


@pytest.mark.parametrize(
    ("other", "unknown"),
    [
        (_row("b", 1, "2026-01-01T00:00:00.150000Z"), True),  # 150 ms apart, ±100 ms assumed per host
        (_row("b", 1, "2026-01-01T00:00:00.250000Z"), False),  # farther than both clocks' error
        (_row("a", 1, "2026-01-01T00:00:00.010000Z"), False),  # the same host: one clock
        (_row("b", 1, "2026-01-01T00:00:00.150000Z", error=0.001), False),  # a synced host says ±1 ms
    ],
    ids=["close, unsynced clocks", "far apart", "same host", "close, one clock reported tight"],
)
def test_first_death_says_when_the_hosts_clocks_cannot_order_two_deaths(other: dict[str, Any], unknown: bool) -> None:
    me = _row("a", 0, FIRST["time"], error=0.001 if other["clock_error_s"] else None)
    text = "\n".join(first_death_lines(FIRST, [me, other]))
    assert ("Order not known: rank 1 (host b" in text) is unknown


# ------------------------------------------------------------------ a thousand ranks on four hosts


@pytest.mark.slow
def test_a_thousand_ranks_on_four_hosts_read_back_over_object_storage(s3: dict[str, str], tmp_path: Path) -> None:
    # GIVEN 1,000 real processes under four host names, rank 613 killed first, the others 2 s later. A rank's
    # death is its last event (a step every 50 ms until the kill); a thousand processes on two cores wait
    # longer than 0.2 s for the CPU at times, so with a 0.2 s gap a rank starved just before the others'
    # kill can have left its last step before the victim's death, and then reads as the first death (the
    # order blackbox gives is right for the events the rings hold). 2 s: a margin ten times as wide.
    rings = tmp_path / "rings"
    fleet(rings, 1000, 4, victim=613, gap=2.0)
    hosts = sorted(p.name for p in rings.iterdir())
    assert hosts == ["node000", "node001", "node002", "node003"]
    # WHEN each host recovers its own rings to object storage
    for host in hosts:
        proc = blackbox_cli("recover", str(rings / host), "-o", f"s3://{BUCKET}/job1000/{host}", env=s3)
        assert proc.returncode == 0, proc.stderr
    # THEN the job-wide account over the prefix names rank 613 on node002 and stays short
    proc = blackbox_cli("summary", f"s3://{BUCKET}/job1000", env=s3)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.startswith("# blackbox: job of 1000 rings on 4 hosts, from 4 bundles")
    assert "1000 ranks `killed`" in text
    assert len(text.splitlines()) <= 200
    # AND the job bundle's ranks.parquet holds one row per rank, for DuckDB and pandas
    out = tmp_path / "job"
    assert blackbox_cli("recover", f"s3://{BUCKET}/job1000", "-o", str(out), env=s3).returncode == 0
    ranks = pq.read_table(out / "ranks.parquet")
    assert sorted(ranks["rank"].to_pylist()) == list(range(1000))
    assert {h: ranks["host"].to_pylist().count(h) for h in hosts} == dict.fromkeys(hosts, 250)
    # AND the first death named is rank 613 or, on a host so loaded that the ranks were starved of CPU (a
    # starved rank's last record may be older than its death), one whose death's window holds 613's (or 613's
    # holds it), the order said not to be known and the starved ranks named
    if "**First death: rank 613 (host node002," not in text:
        named = int(text.split("**First death: rank ", 1)[1].split(" ", 1)[0])
        rows = {r["rank"]: r for r in ranks.select(["rank", "host", "death_time", "death_time_error_s"]).to_pylist()}
        (a, b), margin = (rows[named], rows[613]), 0.1 + 0.1  # the clock error assumed per host
        ta, tb = a["death_time"].timestamp(), b["death_time"].timestamp()
        assert tb <= ta + a["death_time_error_s"] + margin and ta <= tb + b["death_time_error_s"] + margin, (a, b)
        assert "Order not known: " in text and "Starved at the end: " in text, text[:3000]
    # AND README's fleet query runs as written (pyarrow lists and reads the bucket, DuckDB downloads nothing)
    pytest.importorskip("duckdb")
    code = readme_fleet_query().replace("s3://ml-postmortems/", f"s3://{BUCKET}/job1000/")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    first_row = next(line for line in printed.getvalue().splitlines() if "node" in line)
    earliest = min(ranks.select(["rank", "host", "death_time"]).to_pylist(), key=lambda r: r["death_time"])
    assert earliest["host"] in first_row and f" {earliest['rank']} " in first_row, printed.getvalue()


# ------------------------------------------------------------------ hostile bundles (as root over users' files)


def copy_bundles(node_bundles: Path, to: Path, files: tuple[str, ...] = ("metadata.json", "ranks.parquet")) -> Path:
    for host in ("node000", "node001"):
        (to / host).mkdir(parents=True)
        for name in files:
            (to / host / name).write_bytes((node_bundles / host / name).read_bytes())
    return to


def edit_rings(bundle: Path, change: Any, rank: int | None = None) -> None:
    """Change the rings of a bundle's metadata (only rank ``rank``'s, if given)."""
    meta = json.loads((bundle / "metadata.json").read_text())
    for ring in meta["rings"]:
        if rank is None or ring["rank"] == rank:
            change(ring)
    (bundle / "metadata.json").write_text(json.dumps(meta))


def test_the_first_deaths_bundle_with_fields_of_the_wrong_type_still_gives_the_account(
    node_bundles: Path, tmp_path: Path
) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job")
    edit_rings(job / "node001", lambda r: r.update(recovery=None, argv=5, peaks="x", last_sample="x"))
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "**First death: rank 5 (host node001," in proc.stdout and "8 ranks `killed`" in proc.stdout
    assert "### blackbox: node001" not in proc.stdout  # its own account could not be drawn; the rest is there


def test_without_ranks_parquet_fields_of_the_wrong_type_are_left_out_not_fatal(
    node_bundles: Path, tmp_path: Path
) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job", files=("metadata.json",))
    edit_rings(job / "node000", lambda r: r.update(pid="a", rank="five", started_at="garbage", death="x"), rank=1)
    edit_rings(job / "node001", lambda r: r.update(last_event_at="0001-01-01T00:00:00+14:00"), rank=6)
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "job of 8 rings on 2 hosts" in proc.stdout and "**First death: rank 5 (host node001," in proc.stdout
    assert "- 1 process `unknown`" in proc.stdout  # rank 1's death could not be read: not guessed


def test_a_ranks_table_that_disagrees_with_its_metadata_is_not_believed(node_bundles: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    job = copy_bundles(node_bundles, tmp_path / "job")
    pq.write_table(pa.table({"rank": pa.array(range(100_000), pa.int64())}), job / "node000" / "ranks.parquet")
    _, meta, text = job_account([str(job)])
    assert "8 ranks `killed`" in text and "left no ring" not in text


def test_a_metadata_json_that_would_parse_into_millions_of_objects_is_refused(
    node_bundles: Path, tmp_path: Path
) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job")
    (job / "node000" / "metadata.json").write_text('{"rings": [' + ",".join(["{}"] * 2_500_000) + "]}")
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0 and "job of 4 rings on 1 host, from 1 bundle" in proc.stdout
    assert "expected at most 2000000 JSON objects and lists, found 2500002" in proc.stderr


def test_when_no_bundle_can_be_read_it_is_an_error_not_a_clean_exit(tmp_path: Path) -> None:
    for name, text in (("a", "["), ("b", '{"scope": "job"}')):
        (tmp_path / "job" / name).mkdir(parents=True)
        (tmp_path / "job" / name / "metadata.json").write_text(text)
    for args in (["summary", str(tmp_path / "job")], ["recover", str(tmp_path / "job"), "-o", str(tmp_path / "o")]):
        proc = blackbox_cli(*args)
        assert proc.returncode == 1 and proc.stderr.startswith("blackbox: error: no bundle could be read: ")
        assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_names_from_other_users_bundles_reach_the_terminal_escaped(node_bundles: Path, tmp_path: Path) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job")
    edit_rings(job / "node001", lambda r: r.update(host="evil\x1b]0;PWNED\x07\x1b[2J\nline2"))
    (job / "bad\x1b[31mRED\nblackbox: forged").mkdir()
    (job / "bad\x1b[31mRED\nblackbox: forged" / "metadata.json").write_text("[")
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout
    assert "evil\\x1b]0;PWNED" in proc.stdout
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("blackbox:")] == [
        ln for ln in proc.stderr.splitlines() if ln.startswith("blackbox: not read: ")
    ]


def test_a_bundle_whose_metadata_is_a_fifo_or_a_link_is_named_not_dropped(node_bundles: Path, tmp_path: Path) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job")
    (job / "node001" / "metadata.json").unlink()
    os.mkfifo(job / "node001" / "metadata.json")
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0 and "job of 4 rings on 1 host, from 1 bundle" in proc.stdout
    assert f"{job}/node001/metadata.json: expected metadata.json, found a FIFO" in proc.stderr


def test_a_bundle_named_twice_is_read_once_and_a_copy_is_named(node_bundles: Path, tmp_path: Path) -> None:
    _, meta, _ = job_account([str(node_bundles), str(node_bundles / "node001"), f"{node_bundles}/./node000"])
    assert meta["ring_count"] == 8 and len(meta["bundles"]) == 2
    copy = copy_bundles(node_bundles, tmp_path / "copy")
    _, meta, _ = job_account([str(node_bundles), str(copy)])
    assert meta["ring_count"] == 8 and len(meta["unread_bundles"]) == 2
    assert all("(a copy)" in u["reason"] for u in meta["unread_bundles"])


def test_the_job_bundle_never_replaces_a_bundle_it_reads(node_bundles: Path, tmp_path: Path) -> None:
    job = copy_bundles(node_bundles, tmp_path / "job", files=("metadata.json", "ranks.parquet", "summary.md"))
    before = (job / "node001" / "metadata.json").read_bytes()
    proc = blackbox_cli("recover", str(job / "node000"), str(job / "node001"), "-o", str(job / "node001"))
    assert proc.returncode == 1 and "a bundle it reads (it would be replaced)" in proc.stderr
    assert (job / "node001" / "metadata.json").read_bytes() == before


@pytest.mark.parametrize("spelling", ["file://{}", "{}/", "{}/../node001"], ids=["file://", "trailing slash", ".."])
def test_the_job_bundle_never_replaces_a_bundle_it_reads_however_out_is_spelled(
    node_bundles: Path, tmp_path: Path, spelling: str
) -> None:
    # GIVEN node bundles with their timelines
    job = copy_bundles(node_bundles, tmp_path / "job", files=("metadata.json", "ranks.parquet", "timeline.parquet"))
    before = {p.name: p.read_bytes() for p in (job / "node001").iterdir()}
    # WHEN the job bundle's OUT names one of them, spelled otherwise than the bundles were named
    proc = blackbox_cli("recover", str(job / "node000"), str(job / "node001"), "-o",
                        spelling.format(job / "node001"))  # fmt: skip
    # THEN it is refused, and that bundle is as it was, its timeline too
    assert proc.returncode == 1 and "a bundle it reads (it would be replaced)" in proc.stderr
    assert {p.name: p.read_bytes() for p in (job / "node001").iterdir()} == before


def test_the_job_bundle_never_replaces_a_bundle_it_reads_on_object_storage(
    node_bundles: Path, s3: dict[str, str]
) -> None:
    # GIVEN node bundles on object storage
    rings = next(node_bundles.parent.glob("rings*"))
    for host in ("node000", "node001"):
        write_postmortem([rings / host], f"s3://{BUCKET}/spelled/{host}", plot=False)
    dest = bundle.Destination(f"s3://{BUCKET}/spelled/node001")
    names = sorted(i.base_name for i in dest.fs.get_file_info(pafs.FileSelector(dest.root)))
    assert "timeline.parquet" in names
    # WHEN the job bundle's OUT is one of them with the region spelled out in the URI
    proc = blackbox_cli("recover", f"s3://{BUCKET}/spelled/", "-o", f"s3://{BUCKET}/spelled/node001?region=us-east-1",
                        env=s3)  # fmt: skip
    # THEN it is refused, and that bundle keeps every file, its timeline too
    assert proc.returncode == 1 and "a bundle it reads (it would be replaced)" in proc.stderr
    assert sorted(i.base_name for i in dest.fs.get_file_info(pafs.FileSelector(dest.root))) == names
