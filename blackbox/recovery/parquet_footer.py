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
_CM_UNCOMPRESSED, _CM_COMPRESSED, _CM_DATA_PAGE, _CM_DICTIONARY_PAGE = 6, 7, 9, 11
_CM_SIZES = (_CM_UNCOMPRESSED, _CM_COMPRESSED, _CM_DATA_PAGE, _CM_DICTIONARY_PAGE)
_RG_TOTAL_BYTES, _RG_TOTAL_COMPRESSED = 2, 6  # the sums of its columns' uncompressed and compressed sizes
# a row group's fields after its columns that a join sets again, moves or numbers: their types
_RG_TAIL = {_RG_TOTAL_BYTES: _I64, _RG_TOTAL_COMPRESSED: _I64, _RG_FILE_OFFSET: _I64, _RG_ORDINAL: _I16}


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


def _column_chunk(data: bytes, pos: int, moved: list[tuple[int, int]], sizes: dict[int, int] | None = None) -> int:
    """Walk a column chunk at ``pos``, noting the spans of the offsets to move (and, given ``sizes``, the values
    of its metadata's sizes and page offsets, by field id); where it ends."""
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
                    if meta in _CM_OFFSETS and kind == _I64 and data[start]:  # 0: none (a row group of no rows)
                        moved.append((start, pos))
                    if sizes is not None and meta in _CM_SIZES and kind == _I64:
                        sizes[meta] = _unzigzag(_varint(data, start)[0])
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
        if last == _RG_FILE_OFFSET and kind == _I64 and data[pos]:  # 0: none (no rows, no pages: ParquetWriter's 0)
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


def _split(encoded: pa.Buffer | bytes) -> tuple[memoryview, int, bytes]:
    """(the file, where its footer begins, the footer) of an encoded Parquet file."""
    data = memoryview(encoded)
    if len(data) < 12 or data[:4] != MAGIC or data[-4:] != MAGIC:
        raise FooterError("a piece is not a Parquet file")
    footer_at = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    if footer_at < 4:
        raise FooterError("a piece's footer is longer than the piece")
    return data, footer_at, bytes(data[footer_at:-8])


class Piece:
    """One encoded file of row groups, split into its column chunks' bytes and its footer's row groups."""

    def __init__(self, encoded: pa.Buffer | bytes, frame: Frame | None = None) -> None:
        data, footer_at, footer = _split(encoded)
        self.body = data[4:footer_at]  # the column chunks, as written
        self.parts = [self.body]  # the body in the pieces it is written from
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

    @classmethod
    def made(cls, parts: list[memoryview], frame: Frame, rows: int, group: bytes, moved: list[tuple[int, int]],
             ordinal: tuple[int, int] | None) -> Piece:  # fmt: skip
        """The piece of one row group whose parts are known (``joined_columns``): nothing walked again, its
        column chunks not copied into one body (``body`` is empty, ``parts`` are written in order)."""
        piece = cls.__new__(cls)
        piece.body, piece.parts, piece.frame, piece.num_rows, piece.footer = memoryview(b""), parts, frame, rows, group
        piece.groups = [(0, len(group), moved, ordinal)]
        return piece


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


class Column:
    """One column chunk of a file of one row group: its pages, its entry in the footer (a ``ColumnChunk``), the
    spans of the entry's offsets, where its pages began in that file, and its uncompressed size."""

    __slots__ = ("pages", "entry", "moved", "start", "uncompressed")

    def __init__(self, pages: memoryview, entry: bytes, moved: list[tuple[int, int]], start: int, uncompressed: int):
        self.pages, self.entry, self.moved, self.start, self.uncompressed = pages, entry, moved, start, uncompressed


class Columns:
    """A file of one row group split into its column chunks (``columns``, in the schema's order), with what its
    row group holds besides them: the bytes before its columns' list (``head``) and after it (``tail``), and in
    ``tail`` the spans of the values to set again (its totals, summed from its columns' sizes), to move (its
    file offset) and to number (its ordinal). One walk of the footer; its frame is not kept."""

    def __init__(self, encoded: pa.Buffer | bytes) -> None:
        data, footer_at, footer = _split(encoded)
        self.columns: list[Column] = []
        pos = last = 0
        while True:
            last, kind, pos = _field(footer, pos, last)
            if kind == _STOP:
                break
            if last in _FILE_ENCRYPTION:
                raise FooterError("an encrypted footer")
            if last == _FILE_ROW_GROUPS and kind == _LIST:
                size, element, pos = _list_head(footer, pos)
                if size != 1 or element != _STRUCT:
                    raise FooterError(f"expected a file of one row group, found {size}")
                pos = self._group(data, footer, pos)
            else:
                pos = _skip(footer, pos, kind)
        ends = [c.start + len(c.pages) for c in self.columns]
        if not ends or [c.start for c in self.columns] != [4, *ends[:-1]] or ends[-1] != footer_at:
            raise FooterError("column chunks that are not laid one after the other, filling the file's body")

    def _group(self, data: memoryview, footer: bytes, pos: int) -> int:
        start, last, tail_at = pos, 0, -1
        self.spans: dict[int, tuple[int, int]] = {}  # field id -> the span of its value in ``tail``
        while True:
            last, kind, pos = _field(footer, pos, last)
            if kind == _STOP:
                break
            if last == _RG_COLUMNS and kind == _LIST and tail_at < 0:
                self.head = footer[start:pos]  # the row group's fields before its columns, and the list's field header
                size, element, pos = _list_head(footer, pos)
                if element != _STRUCT:
                    raise FooterError("a row group's columns are not a list of structs")
                for _ in range(size):
                    moved: list[tuple[int, int]] = []
                    sizes: dict[int, int] = {}
                    at = pos
                    pos = _column_chunk(footer, pos, moved, sizes)
                    self.columns.append(_column(data, footer[at:pos], [(a - at, b - at) for a, b in moved], sizes))
                tail_at = pos
                continue
            end = _skip(footer, pos, kind)
            if tail_at >= 0 and _RG_TAIL.get(last) == kind:
                self.spans[last] = (pos - tail_at, end - tail_at)
            pos = end
        if tail_at < 0 or not {_RG_TOTAL_BYTES, _RG_TOTAL_COMPRESSED} <= self.spans.keys():
            raise FooterError("a row group without its columns, or without the totals of their sizes after them")
        self.tail = footer[tail_at:pos]
        return pos


def _column(data: memoryview, entry: bytes, moved: list[tuple[int, int]], sizes: dict[int, int]) -> Column:
    pages = [sizes[f] for f in (_CM_DICTIONARY_PAGE, _CM_DATA_PAGE) if sizes.get(f, 0) > 0]
    if not pages or _CM_COMPRESSED not in sizes or _CM_UNCOMPRESSED not in sizes:
        raise FooterError("a column chunk without its page offsets or sizes")
    start, length = min(pages), sizes[_CM_COMPRESSED]
    if not 4 <= start <= start + length <= len(data) - 8:
        raise FooterError("a column chunk's pages outside its file")
    return Column(data[start : start + length], entry, moved, start, sizes[_CM_UNCOMPRESSED])


def joined_columns(frame: Frame, rows: int, group: Columns, columns: list[Column]) -> Piece:
    """The piece of one row group of ``rows`` rows whose column chunks are ``columns``, in order, taken from files
    of one row group written apart (``group``: one of them, whose row group's other fields it keeps; ``frame``:
    the frame of the whole schema's footer): what one writer writes for the whole row group, the columns'
    offsets moved to where they land and the row group's totals summed again."""
    parts: list[bytes] = [group.head, _list_header(len(columns), _STRUCT)]
    size = sum(map(len, parts))
    body: list[memoryview] = []
    moved: list[tuple[int, int]] = []
    at = 4
    for column in columns:
        shift, done = at - column.start, 0
        for a, b in column.moved:
            value = _zigzag(_unzigzag(_varint(column.entry, a)[0]) + shift)
            parts.append(column.entry[done:a])
            size += a - done
            moved.append((size, size + len(value)))
            parts.append(value)
            size += len(value)
            done = b
        parts.append(column.entry[done:])
        size += len(column.entry) - done
        body.append(column.pages)
        at += len(column.pages)
    sums = {_RG_TOTAL_BYTES: sum(c.uncompressed for c in columns), _RG_TOTAL_COMPRESSED: at - 4}
    tail, done, ordinal = group.tail, 0, None
    for field, (a, b) in sorted(group.spans.items(), key=lambda item: item[1]):
        value = _zigzag(sums[field]) if field in sums else tail[a:b]
        parts.append(tail[done:a])
        size += a - done
        if field == _RG_FILE_OFFSET:
            moved.append((size, size + len(value)))
        elif field == _RG_ORDINAL:
            ordinal = (size, size + len(value))
        parts.append(value)
        size += len(value)
        done = b
    parts.append(tail[done:])
    return Piece.made(body, frame, rows, b"".join(parts), moved, ordinal)
