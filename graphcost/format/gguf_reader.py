"""Read a GGUF file's header — metadata and tensor infos — without touching tensor data.

The reader memory-maps the file and walks the header with bounds checks on every count,
length and offset, so a truncated or hostile file fails with one :class:`GGUFError` line
naming the file and offset, and no allocation is ever sized by an unchecked count.
Large arrays (a tokenizer's 262k strings, scores, merges) are skipped and kept as
:class:`LazyArray` handles; string arrays are skipped with a vectorised scan of their
length prefixes (see :func:`_skip_string_array`), which is what keeps a 262k-token header
well under the 50 ms budget.

Format constants (magic, value types, default alignment, type ids, block sizes) come from
the ``gguf`` package. Split models (``name-00001-of-00003.gguf``) are read shard by shard
and their tensor infos merged (:func:`read_model`).

A file cut inside its header is an error; one whose header is whole but whose tensor
data is absent (a header-only file) or cut short (a partial download) is read, with
``has_data`` false and ``partial`` saying where the data stops: costs and memory need
the header alone, and only running the graph needs the data.
"""
from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from graphcost.format import ggml_types
from graphcost.errors import GGUFError
from graphcost.files import file_kind
from graphcost.format.sources import HeaderSource, LocalFile

#: GGUF versions whose counts are 64-bit (v1 used 32-bit counts and is long obsolete).
SUPPORTED_VERSIONS = (2, 3)
#: ggml's GGML_MAX_DIMS.
MAX_DIMS = 4
#: Arrays up to this many elements are read into Python lists; larger ones stay lazy.
EAGER_ARRAY_LIMIT = 4096
#: Nested arrays deeper than this are rejected (no real model nests at all).
MAX_ARRAY_DEPTH = 4

_SCALAR = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_NUMPY = {
    GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "<u1", GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SHARD_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _label(value: Any) -> str:
    """A key, tensor name or value from the file, fit for a one-line message: repr'd (so
    quoted, with control characters escaped: a corrupted length can pull a newline into
    a key) and shortened."""
    s = repr(value)
    return s if len(s) <= 60 else s[:57] + "..."


@dataclass(frozen=True)
class LazyArray:
    """A metadata array left in the file: ``count`` items of ``item_type`` at ``offset``."""

    path: str
    offset: int
    count: int
    item_type: GGUFValueType
    nbytes: int
    #: where the bytes are when not in the local file ``path`` (a remote file)
    source: Any = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return self.count

    def load(self) -> list:
        """Read the items (strings as ``str``); only call when they are really needed."""
        raw = (self.source or LocalFile(self.path)).read(self.offset, self.nbytes)
        if self.item_type == GGUFValueType.STRING:
            out, pos = [], 0
            for _ in range(self.count):
                (n,) = _U64.unpack_from(raw, pos)
                out.append(raw[pos + 8: pos + 8 + n].decode("utf-8", "replace"))
                pos += 8 + n
            return out
        items = np.frombuffer(raw, dtype=_NUMPY[self.item_type], count=self.count).tolist()
        return [bool(x) for x in items] if self.item_type == GGUFValueType.BOOL else items


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry. ``ne`` is in ggml order (ne[0] is the contiguous dim)."""

    name: str
    ne: tuple[int, ...]
    type: ggml_types.GGMLType
    offset: int  # bytes from the start of the shard's data section
    shard: int = 0

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in the file (ggml_nbytes of a contiguous tensor)."""
        return ggml_types.row_size(self.type, self.ne[0]) * (self.n_elements // self.ne[0])

    @property
    def type_name(self) -> str:
        return ggml_types.type_name(self.type)


@dataclass
class GGUFHeader:
    """Everything a GGUF header says; ``has_data`` tells whether the tensor bytes are present."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_offset: int
    file_size: int
    shards: list[Path] = field(default_factory=list)
    has_data: bool = True
    #: where the tensor data is cut short (a partial download), None if it is whole or absent
    partial: str | None = None

    @property
    def data_note(self) -> str | None:
        """One line on missing tensor data for the reports (None when every byte is there).

        A header-only file and a partial one give the same costs and memory as the whole
        file: both are computed from the tensor infos alone."""
        if self.has_data:
            return None
        if self.partial is not None:
            return (f"partial file: tensor data is cut short ({self.partial}); "
                    "sizes come from the tensor infos")
        return "header-only file: tensor data is absent; sizes come from the tensor infos"

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; every failure names the offset."""

    __slots__ = ("buf", "pos", "size", "path", "src")

    def __init__(self, buf, path: str, size: int, src: HeaderSource | None = None):
        self.buf, self.pos, self.size, self.path = buf, 0, size, path
        self.src = src  # a remote file: bytes are fetched (src.ensure) before they are read

    def fail(self, what: str, at: int | None = None):
        raise GGUFError(self.path, self.pos if at is None else at, what)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated: {what} needs {n} bytes, {self.size - self.pos} left in the file")
        if self.src is not None:
            self.src.ensure(self.pos, n)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos: self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8", at=start)

    def new_name(self, seen: dict, what: str, kind: str) -> tuple[str, str]:
        """A string naming a new entry of ``seen`` (a metadata key, a tensor name) and its
        :func:`_label`; a name already in ``seen`` fails at the string's offset."""
        at = self.pos
        name = self.string(what)
        label = _label(name)
        if name in seen:
            self.fail(f"duplicate {kind} {label}", at=at)
        return name, label

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            self.fail(f"unknown value type {raw} for {what}", at=at)

    def scalar(self, vtype: GGUFValueType, what: str):
        st = _SCALAR[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def value(self, vtype: GGUFValueType, key: str, depth: int = 0):
        """Read one value; ``key`` is the quoted key, used only in messages."""
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key}")
        if vtype != GGUFValueType.ARRAY:
            return self.scalar(vtype, f"value of {key}")
        if depth >= MAX_ARRAY_DEPTH:
            self.fail(f"arrays nested deeper than {MAX_ARRAY_DEPTH} in {key}")
        item_type = self.value_type(f"item type of {key}")
        count_at = self.pos
        count = self.u64(f"item count of {key}")
        if item_type in _SCALAR:
            size = _SCALAR[item_type].size
            if count > (self.size - self.pos) // size:
                self.fail(f"{key} claims {count} items of {size} bytes; the file cannot hold them",
                          at=count_at)
            start = self.pos
            self.pos += count * size
            if count > EAGER_ARRAY_LIMIT:
                return LazyArray(self.path, start, count, item_type, count * size, self.src)
            if self.src is not None:
                self.src.ensure(start, count * size)
            arr = np.frombuffer(self.buf, dtype=_NUMPY[item_type], count=count, offset=start)
            if item_type == GGUFValueType.BOOL:
                return [bool(x) for x in arr]
            return arr.tolist()
        if item_type == GGUFValueType.STRING:
            # each string is at least its 8-byte length prefix
            if count > (self.size - self.pos) // 8:
                self.fail(f"{key} claims {count} strings; the file cannot hold them", at=count_at)
            if count > EAGER_ARRAY_LIMIT:
                start = self.pos
                self.pos = _skip_string_array(self, count, key)
                return LazyArray(self.path, start, count, item_type, self.pos - start, self.src)
            return [self.string(f"item {i} of {key}") for i in range(count)]
        # arrays of arrays: each needs at least its 12-byte type and count
        if count > (self.size - self.pos) // 12:
            self.fail(f"{key} claims {count} nested arrays; the file cannot hold them", at=count_at)
        return [self.value(item_type, key, depth + 1) for _ in range(count)]


def _skip_string_array(cur: _Cursor, count: int, key: str) -> int:
    """Return the offset just past ``count`` length-prefixed strings starting at ``cur.pos``.

    :func:`_skip_strings_fast` verifies as many strings as it can; the plain loop walks
    the rest (a long or empty string, a NUL character, a corrupted or truncated array)
    and names the string that is wrong.
    """
    ensure = cur.src.ensure if cur.src is not None else None
    limit = cur.size if cur.src is None else min(cur.size, cur.src.limit)
    done, pos = _skip_strings_fast(cur.buf, cur.pos, limit, count, ensure)
    # slow, exact path
    buf, size, unpack = cur.buf, cur.size, _U64.unpack_from
    for i in range(done, count):
        if pos + 8 > size:
            raise GGUFError(cur.path, pos, f"truncated: string {i} of {key} has no length")
        if ensure is not None:
            ensure(pos, 8)
        (n,) = unpack(buf, pos)
        pos += 8 + n
        if pos > size:
            raise GGUFError(cur.path, pos - n - 8,
                            f"truncated: string {i} of {key} claims {n} bytes past the end of the file")
    return pos


def _skip_strings_fast(buf, start: int, limit: int, count: int,
                       ensure: Callable[[int, int], None] | None = None) -> tuple[int, int]:
    """``(i, pos)``: the first ``i`` of ``count`` strings at ``start`` end at ``pos``.

    Token strings are short, so every true length prefix has its six high bytes zero and
    is followed by a non-zero first character. Such positions are found with one
    vectorised pass over the region (an unaligned uint64 view), and the chain
    ``next = pos + 8 + len`` is verified for all of them at once, up to the first string
    that breaks the pattern (or is cut off by the end of the file). The numpy views of
    ``buf`` live only in this function, so an error raised by the caller cannot keep the
    mmap exported (which would make closing it fail). ``ensure`` fetches the bytes of a
    remote file before they are looked at.
    """
    window = min(limit - start, 24 * count + 4096)
    while window > 9:
        if ensure is not None:
            ensure(start, window)
        raw = np.frombuffer(buf, dtype=np.uint8, count=window, offset=start)
        zero = raw == 0
        # q = p + 7: the last (zero) byte of a length prefix, followed by a non-zero byte
        q = np.flatnonzero(zero[7:-1] & ~zero[8:])
        p = q  # q - 7 + 7 offset of the slices above cancels: p is the prefix start
        ok = zero[p + 2] & zero[p + 3] & zero[p + 4] & zero[p + 5] & zero[p + 6]
        p = p[ok]
        if not p.size or p[0] != 0:
            return 0, start  # the first string does not fit the fast path's pattern
        if p.size >= count or window == limit - start:
            p = p[:count]
            nxt = p + 8 + raw[p].astype(np.int64) + (raw[p + 1].astype(np.int64) << 8)
            broken = np.flatnonzero(nxt[:-1] != p[1:])
            # p[0..k] are true string starts: the chain holds up to string k
            k = int(broken[0]) if broken.size else p.size - 1
            if k == count - 1 and start + int(nxt[k]) <= limit:
                return count, start + int(nxt[k])
            return k, start + int(p[k])
        window = min(limit - start, window * 2)
    return 0, start


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse one GGUF file's header. Raises :class:`GGUFError` with a one-line reason."""
    p = Path(path)
    try:  # a FIFO would block open() and read(); /dev/zero would never end
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(p, None, f"cannot open: {file_kind(st.st_mode)}, not a regular file")
        f = open(p, "rb")
    except OSError as e:
        raise GGUFError(p, None, f"cannot open: {e.strerror or e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise GGUFError(p, 0, "empty file, not a GGUF")
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise GGUFError(p, None, f"cannot map: {e}") from None
        try:
            return _parse(buf, p, size)
        finally:
            buf.close()


def read_source(src: HeaderSource) -> GGUFHeader:
    """Parse the header of a file whose bytes come from ``src`` (a remote file,
    :mod:`graphcost.format.remote`): only the bytes the walk looks at are fetched."""
    if src.size == 0:
        raise GGUFError(src.name, 0, "empty file, not a GGUF")
    return _parse(src.buf, src.name, src.size, src)


def _parse(buf, p: Path, size: int, src: HeaderSource | None = None) -> GGUFHeader:
    cur = _Cursor(buf, str(p), size, src)
    magic = cur.u32("magic")
    if magic != GGUF_MAGIC:
        cur.fail(f"not a GGUF file (magic {magic:#010x}, expected {GGUF_MAGIC:#010x})", at=0)
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            cur.fail("big-endian GGUF is not supported", at=4)
        cur.fail(f"GGUF version {version} is not supported (only {SUPPORTED_VERSIONS})", at=4)
    n_tensors_at = cur.pos
    n_tensors = cur.u64("tensor count")
    n_kv_at = cur.pos
    n_kv = cur.u64("metadata count")
    # a metadata pair needs >= 8 (key length) + 4 (type) + 1 bytes; a tensor info >= 8+4+8+4+8
    if n_kv > (size - cur.pos) // 13:
        cur.fail(f"metadata count {n_kv} is larger than the file could hold", at=n_kv_at)
    if n_tensors > (size - cur.pos) // 32:
        cur.fail(f"tensor count {n_tensors} is larger than the file could hold", at=n_tensors_at)

    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key, label = cur.new_name(metadata, f"key of metadata pair {i}", "metadata key")
        vtype = cur.value_type(f"type of {label}")
        metadata[key] = cur.value(vtype, label)

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 \
            or alignment & (alignment - 1) or alignment > 1 << 20:
        raise GGUFError(p, None, f"general.alignment {_label(alignment)} is not a power of two "
                                  f"up to {1 << 20}")

    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        at = cur.pos
        name, label = cur.new_name(tensors, f"name of tensor {i}", "tensor name")
        n_dims = cur.u32(f"dimension count of {label}")
        if not 1 <= n_dims <= MAX_DIMS:
            cur.fail(f"tensor {label} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
        ne = tuple(cur.u64(f"dimension {d} of {label}") for d in range(n_dims))
        type_at = cur.pos
        type_id = cur.u32(f"type of {label}")
        if not ggml_types.is_known(type_id):
            cur.fail(f"tensor {label} has unknown type id {type_id}", at=type_at)
        ttype = ggml_types.GGMLType(type_id)
        offset = cur.u64(f"data offset of {label}")
        n_el = 1
        for d in ne:
            if d <= 0:
                cur.fail(f"tensor {label} has a zero dimension {list(ne)}", at=at)
            n_el *= d
        if n_el >= 1 << 62:
            cur.fail(f"tensor {label} has {n_el} elements, more than ggml can address", at=at)
        blk = ggml_types.block(ttype)[0]
        if ne[0] % blk:
            cur.fail(f"tensor {label} row of {ne[0]} is not a multiple of the "
                     f"{ggml_types.type_name(ttype)} block size {blk}", at=at)
        if offset % alignment:
            cur.fail(f"tensor {label} data offset {offset} is not aligned to {alignment}", at=at)
        tensors[name] = TensorInfo(name, ne, ttype, offset)

    data_offset = ggml_types.ggml_pad(cur.pos, alignment)
    end, last = data_offset, None
    for t in tensors.values():
        if data_offset + t.offset + t.nbytes > end:
            end, last = data_offset + t.offset + t.nbytes, t
    _check_overlaps(p, tensors, data_offset)
    # a header-only file stops at (or before) data_offset; a partial download goes on but
    # stops inside the data: both have a whole header, which is all the cost model reads
    partial = None
    if data_offset < size < end:
        partial = f"{Path(str(p)).name}: tensor {_label(last.name)} ends at byte {end}, the file has {size} bytes"
    return GGUFHeader(p, version, metadata, tensors, alignment, data_offset, size,
                      shards=[p], has_data=size >= end, partial=partial)


def _check_overlaps(p: Path, tensors: dict[str, TensorInfo], data_offset: int) -> None:
    """Tensor data ranges must not overlap (a hostile header could alias them)."""
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
    for (a0, a1, an), (b0, _b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise GGUFError(p, data_offset + b0, f"tensor {_label(bn)} overlaps tensor {_label(an)}")


def shard_paths(path: str | os.PathLike) -> list[Path]:
    """All shards of a split model named like ``x-00001-of-00003.gguf`` (else just ``path``)."""
    p = Path(path)
    m = _SHARD_RE.match(p.name)
    if not m:
        return [p]
    count = int(m.group("count"))
    if count < 1:
        raise GGUFError(p, None, "split count in the file name is 0")
    for i in range(1, count + 1):  # stop at the first gap: no list of 99,999 paths
        shard = p.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf")
        if not shard.exists():
            raise GGUFError(shard, None, f"shard {i} of {count} is missing")
    return [p.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_model(path: str | os.PathLike) -> GGUFHeader:
    """Read a model: one file, or every shard of a split model with tensor infos merged.

    The first shard holds the model metadata; each tensor keeps the index of its shard.
    ``has_data`` is true only if every shard holds its tensor bytes.
    """
    paths = shard_paths(path)
    if len(paths) == 1:
        return read_header(paths[0])
    return merge_shards([read_header(sp) for sp in paths])


def merge_shards(headers: list[GGUFHeader]) -> GGUFHeader:
    """One header for a split model from its shards' headers, in shard order (local or
    remote): the first shard's metadata, every shard's tensor infos."""
    paths = [h.path for h in headers]
    first = None
    tensors: dict[str, TensorInfo] = {}
    has_data = True
    partial = None
    for i, h in enumerate(headers):
        sp = h.path
        declared = h.metadata.get("split.count")
        if declared is not None and declared != len(paths):
            raise GGUFError(sp, None, f"split.count is {_label(declared)} but the file name "
                                      f"says {len(paths)}")
        for name, t in h.tensors.items():
            if name in tensors:
                raise GGUFError(sp, None, f"tensor {_label(name)} appears in two shards")
            tensors[name] = TensorInfo(t.name, t.ne, t.type, t.offset, shard=i)
        has_data &= h.has_data
        partial = partial or h.partial
        first = first or h
    assert first is not None
    expected = first.metadata.get("split.tensors.count")
    if isinstance(expected, int) and expected != len(tensors):
        raise GGUFError(paths[0], None,
                        f"split.tensors.count is {expected} but the shards hold {len(tensors)} tensors")
    return GGUFHeader(first.path, first.version, first.metadata, tensors, first.alignment,
                      first.data_offset, first.file_size, shards=paths, has_data=has_data,
                      partial=partial)
