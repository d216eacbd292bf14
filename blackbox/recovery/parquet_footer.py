"""The footer of a Parquet file (Thrift compact ``FileMetaData``), walked without a Thrift library, so that
files of row groups written apart can be joined into one: ``Piece`` splits an encoded file into its column
chunks' bytes and its row groups' metadata (and where each byte offset lies in it), ``merged_footer`` lists
the row groups of several pieces one after the other, every offset moved by where its piece lands in the
joined file, the row count summed.

A Parquet file is ``PAR1``, the column chunks, the footer, its length and ``PAR1``. The pieces are
written by this process's own pyarrow from one schema and one set of options: a footer not of that shape (a
page index, encryption, another schema, a column chunk in another file) is refused, not guessed at.
"""

from __future__ import annotations

import pyarrow as pa

MAGIC = b"PAR1"

# Thrift compact protocol types
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_INTS = (_I16, _I32, _I64)

# Field ids (parquet.thrift)
_FILE_NUM_ROWS, _FILE_ROW_GROUPS = 3, 4
_FILE_ENCRYPTION = (8, 9)
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_OFFSET, _CC_META = 2, 3
_CC_REFUSED = (1, 4, 5, 6, 7, 8, 9)  # file_path, page index offsets and lengths, encryption
_CM_OFFSETS = (9, 10, 11, 14)  # data_page_offset, index_page_offset, dictionary_page_offset, bloom_filter_offset


class FooterError(ValueError):
    """A piece's footer is not one this module can merge."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FooterError("a varint longer than 10 bytes")


def _zigzag(n: int) -> bytes:
    """A signed integer as the compact protocol writes it: zigzag, then a varint."""
    value = (n << 1) ^ (n >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _unzigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _field(data: bytes, pos: int, last: int) -> tuple[int, int, int]:
    """(field id, type, position of its value) of the field header at ``pos``; type ``_STOP`` ends."""
    head = data[pos]
    pos += 1
    kind = head & 0x0F
    if kind == _STOP:
        return 0, _STOP, pos
    delta = head >> 4
    if delta:
        return last + delta, kind, pos
    raw, pos = _varint(data, pos)
    return _unzigzag(raw), kind, pos


def _skip(data: bytes, pos: int, kind: int, depth: int = 0) -> int:
    """The position just past a value of type ``kind`` at ``pos``. Scalars are stepped over inline: a
    row group's footer of 54 columns holds about 1,300 values, walked for each row group written."""
    if kind in _INTS:
        while data[pos] & 0x80:
            pos += 1
        return pos + 1
    if kind == _BINARY:
        size, pos = _varint(data, pos)
        return pos + size
    if kind == _STRUCT:
        if depth > 32:
            raise FooterError("values nested deeper than 32")
        while True:
            head = data[pos]
            pos += 1
            kind = head & 0x0F
            if kind == _STOP:
                return pos
            if not head >> 4:  # a field id of its own, not a delta
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            if kind in _INTS:
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            elif kind > _FALSE:  # a struct field's bool is in its header
                pos = _skip(data, pos, kind, depth + 1)
    if kind in (_TRUE, _FALSE):
        return pos
    if kind == _BYTE:
        return pos + 1
    if kind == _DOUBLE:
        return pos + 8
    if kind in (_LIST, _SET):
        size, element, pos = _list_head(data, pos)
        if element in (_TRUE, _FALSE, _BYTE):  # a list's bool is one byte
            return pos + size
        if element in _INTS:
            for _ in range(size):
                while data[pos] & 0x80:
                    pos += 1
                pos += 1
            return pos
        for _ in range(size):
            pos = _skip(data, pos, element, depth + 1)
        return pos
    if kind == _MAP:
        size, pos = _varint(data, pos)
        if not size:
            return pos
        types = data[pos]
        pos += 1
        for _ in range(size):
            pos = _skip(data, pos, types >> 4, depth + 1)
            pos = _skip(data, pos, types & 0x0F, depth + 1)
        return pos
    raise FooterError(f"unknown Thrift compact type {kind}")


def _list_head(data: bytes, pos: int) -> tuple[int, int, int]:
    """(size, element type, position of the first element) of a list or set header."""
    head = data[pos]
    pos += 1
    size = head >> 4
    if size == 15:
        size, pos = _varint(data, pos)
    return size, head & 0x0F, pos


def _list_header(size: int, element: int) -> bytes:
    if size < 15:
        return bytes([size << 4 | element])
    out = bytearray([0xF0 | element])
    while size > 0x7F:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


def _column_chunk(data: bytes, pos: int, moved: list[tuple[int, int]]) -> int:
    """Walk a column chunk at ``pos``, noting the spans of the offsets to move; where it ends."""
    last = 0
    while True:
        last, kind, pos = _field(data, pos, last)
        if kind == _STOP:
            return pos
        if last in _CC_REFUSED:
            raise FooterError(f"a column chunk with field {last} (a file path, a page index or encryption)")
        if last == _CC_META and kind == _STRUCT:  # its fields walked here, the integers inline
            meta = 0
            while True:
                head = data[pos]
                pos += 1
                kind = head & 0x0F
                if kind == _STOP:
                    break
                if head >> 4:
                    meta += head >> 4
                else:
                    raw, pos = _varint(data, pos)
                    meta = _unzigzag(raw)
                if kind in _INTS:
                    start = pos
                    while data[pos] & 0x80:
                        pos += 1
                    pos += 1
                    if meta in _CM_OFFSETS and kind == _I64:
                        moved.append((start, pos))
                elif kind > _FALSE:
                    pos = _skip(data, pos, kind)
        else:
            end = _skip(data, pos, kind)
            if last == _CC_FILE_OFFSET and kind == _I64 and data[pos]:  # deprecated: pyarrow writes 0 (none)
                moved.append((pos, end))
            pos = end


def _row_group(data: bytes, pos: int, moved: list[tuple[int, int]]) -> tuple[int, tuple[int, int] | None]:
    """Walk a row group at ``pos``, noting the spans of the offsets to move: (where it ends, the span of
    its ordinal)."""
    last, ordinal = 0, None
    while True:
        last, kind, pos = _field(data, pos, last)
        if kind == _STOP:
            return pos, ordinal
        if last == _RG_COLUMNS and kind == _LIST:
            size, element, pos = _list_head(data, pos)
            if element != _STRUCT:
                raise FooterError("a row group's columns are not a list of structs")
            for _ in range(size):
                pos = _column_chunk(data, pos, moved)
            continue
        end = _skip(data, pos, kind)
        if last == _RG_FILE_OFFSET and kind == _I64:
            moved.append((pos, end))
        elif last == _RG_ORDINAL and kind == _I16:
            ordinal = (pos, end)
        pos = end


Frame = tuple[bytes, bytes, bytes]  # a footer's bytes before its row count, between it and its row groups, after


def frame_of(footer: bytes) -> Frame:
    """What every piece of one file shares (the schema, the key-value metadata, the writer's name), found
    by walking the whole of one footer."""
    pos, last = 0, 0
    rows_at = groups_at = (-1, -1)
    while True:
        last, kind, pos = _field(footer, pos, last)
        if kind == _STOP:
            break
        if last in _FILE_ENCRYPTION:
            raise FooterError("an encrypted footer")
        end = _skip(footer, pos, kind)
        if last == _FILE_NUM_ROWS and kind == _I64:
            rows_at = (pos, end)
        elif last == _FILE_ROW_GROUPS and kind == _LIST:
            groups_at = (pos, end)
        pos = end
    if not 0 <= rows_at[1] <= groups_at[0] or pos != len(footer):
        raise FooterError("a footer without its row count before its row groups, or with bytes after its end")
    return footer[: rows_at[0]], footer[rows_at[1] : groups_at[0]], footer[groups_at[1] :]


class Piece:
    """One encoded file of row groups, split into its column chunks' bytes and its footer's row groups."""

    def __init__(self, encoded: pa.Buffer | bytes, frame: Frame | None = None) -> None:
        data = memoryview(encoded)
        if len(data) < 12 or data[:4] != MAGIC or data[-4:] != MAGIC:
            raise FooterError("a piece is not a Parquet file")
        size = int.from_bytes(data[-8:-4], "little")
        footer_at = len(data) - 8 - size
        if footer_at < 4:
            raise FooterError("a piece's footer is longer than the piece")
        self.body = data[4:footer_at]  # the column chunks, as written
        footer = bytes(data[footer_at:-8])
        self.frame = frame = frame_of(footer) if frame is None else frame
        before, between, after = frame
        if not (footer.startswith(before) and footer.endswith(after)):
            raise FooterError("pieces with different schemas or options")
        raw, pos = _varint(footer, len(before))
        self.num_rows = _unzigzag(raw)
        if footer[pos : pos + len(between)] != between:
            raise FooterError("pieces with different schemas or options")
        size, element, pos = _list_head(footer, pos + len(between))
        if element != _STRUCT:
            raise FooterError("row groups are not a list of structs")
        # each row group: (start, end, the spans of its offsets, the span of its ordinal)
        self.groups: list[tuple[int, int, list[tuple[int, int]], tuple[int, int] | None]] = []
        first = pos
        for _ in range(size):
            moved: list[tuple[int, int]] = []
            end, ordinal = _row_group(footer, pos, moved)
            self.groups.append((pos - first, end - first, [(a - first, b - first) for a, b in moved],
                                None if ordinal is None else (ordinal[0] - first, ordinal[1] - first)))  # fmt: skip
            pos = end
        if pos != len(footer) - len(after):
            raise FooterError("pieces with different schemas or options")
        self.footer = footer[first:pos]  # its row groups alone: the rest is the frame, held once for all pieces


def merged_footer(pieces: list[tuple[Piece, int]]) -> bytes:
    """The footer of the pieces joined in order: (piece, the position in the joined file where its
    column chunks begin) each. Every piece has the first one's frame (``Piece`` checked it)."""
    before, between, after = pieces[0][0].frame
    rows, count, parts = 0, 0, []
    for piece, at in pieces:
        footer, shift = piece.footer, at - 4  # its column chunks began just past its own PAR1
        for start, end, moved, ordinal in piece.groups:
            spans = [(a, b, _zigzag(_unzigzag(_varint(footer, a)[0]) + shift)) for a, b in moved]
            if ordinal is not None:
                spans.append((*ordinal, _zigzag(count)))
            at_byte = start
            for a, b, new in sorted(spans):
                parts.append(footer[at_byte:a])
                parts.append(new)
                at_byte = b
            parts.append(footer[at_byte:end])
            count += 1
        rows += piece.num_rows
    return b"".join([before, _zigzag(rows), between, _list_header(count, _STRUCT), *parts, after])
