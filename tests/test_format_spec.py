"""FORMAT.md is normative: its tables must match the code that reads and writes rings."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from blackbox.recovery.timeline import TIMELINE_SCHEMA
from blackbox.ring import format as fmt

SPEC = (Path(fmt.__file__).parent / "FORMAT.md").read_text(encoding="utf-8")


def table_after(heading: str) -> list[list[str]]:
    """Rows of the first Markdown table after a heading, without header and rule."""
    start = SPEC.index(heading)
    rows, started = [], False
    for line in SPEC[start:].splitlines()[1:]:
        if line.startswith("|"):
            started = True
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif started:
            break
    return rows[2:]


def test_header_prefix_table_matches_struct() -> None:
    rows = table_after("## Header prefix")
    offsets = [int(r[0]) for r in rows]
    sizes = [int(r[1]) for r in rows]
    codes = re.findall(r"(\d*)([a-zA-Z])", fmt.PREFIX.format.lstrip("<"))
    struct_sizes = [int(n) if c == "s" else {"H": 2, "I": 4, "Q": 8}[c] for n, c in codes]
    assert sizes == struct_sizes
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]
    assert sum(sizes) == fmt.PREFIX_SIZE
    assert [r[2] for r in rows][1:3] == ["version", "state"] and offsets[2] == fmt.STATE_OFFSET
    assert bytes.fromhex(rows[0][3].split("`")[1]) == fmt.MAGIC


def test_record_table_matches_dtype_and_struct() -> None:
    rows = table_after("## Record slots")
    names = fmt.RECORD_DTYPE.names or ()
    assert [r[2] for r in rows] == list(names)
    for offset, size, name, typ, _ in rows:
        field_dtype, field_offset = fmt.RECORD_DTYPE.fields[name][:2]
        assert int(offset) == field_offset and int(size) == field_dtype.itemsize, name
        assert typ[0] == field_dtype.kind and int(typ[1]) == field_dtype.itemsize, name
    assert fmt.RECORD_DTYPE.itemsize == fmt.RECORD_SIZE == 128


def test_kind_table_matches_codes() -> None:
    rows = table_after("### Kinds")
    assert {int(r[0]): r[1] for r in rows} == fmt.KINDS


def test_payload_layout_table_matches_code() -> None:
    rows = table_after("### Payload layouts")
    spec: dict[int, dict[str, tuple[str | None, ...]]] = {}
    for version, kind, *words in rows:
        names = [None if w == "-" else w for w in words]
        while names and names[-1] is None:
            names.pop()
        spec.setdefault(int(version), {})[kind] = tuple(names)
    assert spec == fmt.PAYLOAD_COLUMNS
    assert all(len(r) == 2 + fmt.PAYLOAD_WORDS for r in rows)


def test_string_entry_table_matches_struct() -> None:
    rows = table_after("## String region")
    assert [int(r[0]) for r in rows[:4]] == [0, 4, 8, 12] and fmt.STRING_ENTRY.size == 16
    assert f"<= {fmt.MAX_STRING_BYTES}" in rows[1][2]
    assert fmt.STRING_FULL_TEXT in SPEC


def test_timeline_column_table_matches_schema() -> None:
    rows = table_after("## Timeline columns")
    assert [r[0] for r in rows] == TIMELINE_SCHEMA.names
    for name, typ, _ in rows:
        t = TIMELINE_SCHEMA.field(name).type
        if pa.types.is_dictionary(t):
            assert typ == f"dictionary<{t.value_type}>", name
        elif pa.types.is_timestamp(t):
            assert typ == f"timestamp[{t.unit}, {t.tz}]", name
        else:
            assert typ == str(t), name


def test_version_named_in_spec_is_the_current_one() -> None:
    assert SPEC.splitlines()[0] == f"# The blackbox ring format, version {fmt.FORMAT_VERSION}"


def test_stack_entry_table_matches_struct() -> None:
    rows = table_after("## Stack table (version 3)")
    offsets, sizes = [int(r[0]) for r in rows[:-1]], [int(r[1]) for r in rows[:-1]]
    codes = re.findall(r"[a-zA-Z]", fmt.STACK_ENTRY.format.lstrip("<"))
    assert sizes == [{"H": 2, "I": 4}[c] for c in codes] and sum(sizes) == fmt.STACK_ENTRY.size == 24
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))]
    assert "1 = frame, 2 = stack" in rows[1][2] and (fmt.STACK_FRAME, fmt.STACK_STACK) == (1, 2)
    assert f"at most {fmt.MAX_FRAME_BYTES} bytes" in SPEC and f"at most {fmt.MAX_STACK_DEPTH}" in SPEC
    assert fmt.STACK_TRUNCATED_TEXT in SPEC and fmt.STRING_BUSY_TEXT in SPEC


def test_readme_lists_every_kind_of_the_timeline() -> None:
    # README's paragraph on timeline.parquet names every kind a row may have (cgroup_sample was missing)
    readme = (Path(fmt.__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    paragraph = readme.split("`timeline.parquet` has one row per event", 1)[1].split("`label`, `value`", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", paragraph))
    assert set(fmt.KIND_CODES) <= named, sorted(set(fmt.KIND_CODES) - named)


def test_the_recorders_own_marks_are_the_ones_format_md_names() -> None:
    for label in (fmt.HELPER_PREFIX + "NAME", fmt.EXEC_PREFIX + "COMMAND", fmt.EXEC_FAILED, fmt.RANK_PREFIX + "R of N"):
        assert f"`{label}`" in SPEC, label
