"""Exact numbers from the GGUF header reader, on files written here with gguf.GGUFWriter,
and agreement with gguf-py's own GGUFReader on the real gemma-3-270m file.

Offsets are checked against arithmetic in the comments (GGUF v3: a 24-byte header; a
string is an 8-byte length then its bytes; a kv pair is key, 4-byte type, value; a tensor
info is name, 4-byte n_dims, 8 bytes per dim, 4-byte type, 8-byte offset), or against
GGUFReader where the arithmetic would be long.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from graphcost.format import gguf_reader
from graphcost.errors import GGUFError
from graphcost.format.gguf_reader import EAGER_ARRAY_LIMIT, LazyArray, read_header, read_model

SENTINEL = 0xC0FFEE  # a uint32 written after an array: read right only if the array's end is


def write(path: Path, fill: Callable[[gguf.GGUFWriter], None] = lambda w: None,
          tensors: dict[str, np.ndarray] | None = None, **writer_kw) -> Path:
    """A full GGUF v3 file (arch ``llama``): ``fill`` adds the metadata, then the tensors."""
    w = gguf.GGUFWriter(str(path), "llama", **writer_kw)
    fill(w)
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------------------
# layout: header, data offset, tensor offsets, header-only vs full, alignment
# --------------------------------------------------------------------------------------

TWO_TENSORS = {"a": np.arange(12, dtype=np.float32).reshape(3, 4),  # ne [4, 3], 48 bytes
               "b": np.ones(8, dtype=np.float16)}  # ne [8], 16 bytes


def test_offsets_of_a_small_file(tmp_path):
    h = read_header(write(tmp_path / "small.gguf", tensors=TWO_TENSORS))
    assert h.version == 3 and h.alignment == 32
    assert h.metadata == {"general.architecture": "llama"}
    # 24 header + kv (8+20 key, 4 type, 8+5 value = 45) = 69;
    # tensor infos: a (8+1 name, 4 n_dims, 2*8 dims, 4 type, 8 offset = 41), b (33) -> 143;
    # rounded up to 32 -> 160
    assert h.data_offset == 160
    a, b = h.tensors["a"], h.tensors["b"]
    assert (a.ne, a.type, a.offset, a.nbytes, a.n_elements) == ((4, 3), QT.F32, 0, 48, 12)
    # b follows a's 48 bytes padded to 32 -> 64
    assert (b.ne, b.type, b.offset, b.nbytes, b.n_elements) == ((8,), QT.F16, 64, 16, 8)
    # 160 + 64 + 16 bytes of b padded to 32
    assert h.file_size == 256 == os.path.getsize(h.path)
    assert h.has_data and h.shards == [h.path]


def test_header_only_file(tmp_path):
    """The same header without the tensor data: same infos, has_data False."""
    full = write(tmp_path / "full.gguf", tensors=TWO_TENSORS)
    head = tmp_path / "head.gguf"
    head.write_bytes(full.read_bytes()[:160])
    h, f = read_header(head), read_header(full)
    assert (h.has_data, f.has_data) == (False, True)
    assert (h.file_size, f.file_size) == (160, 256)
    assert h.tensors == f.tensors and h.metadata == f.metadata
    assert h.data_offset == f.data_offset == 160


def test_file_cut_inside_tensor_data(tmp_path):
    """A file that goes past data_offset but stops before its last tensor ends (a partial
    download) is read like a header-only one: same infos, has_data False, and ``partial``
    says where the data stops."""
    full = write(tmp_path / "full.gguf", tensors=TWO_TENSORS)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[:160 + 64 + 15])  # b ends at 160 + 64 + 16
    h, f = read_header(cut), read_header(full)
    assert (h.has_data, f.has_data) == (False, True)
    assert h.tensors == f.tensors and h.metadata == f.metadata
    assert h.partial == "cut.gguf: tensor 'b' ends at byte 240, the file has 239 bytes"
    assert "partial file: tensor data is cut short" in h.data_note
    assert f.partial is None and f.data_note is None
    head = tmp_path / "head.gguf"
    head.write_bytes(full.read_bytes()[:160])
    assert read_header(head).partial is None
    assert "header-only file" in read_header(head).data_note


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment(tmp_path, alignment):
    path = write(tmp_path / f"align{alignment}.gguf", lambda w: w.add_custom_alignment(alignment),
                 tensors={"a": np.zeros(3, np.float32), "b": np.zeros(5, np.float32)})
    h = read_header(path)
    r = gguf.GGUFReader(path)
    assert h.alignment == alignment == r.alignment
    assert h.metadata["general.alignment"] == alignment
    assert h.data_offset == r.data_offset and h.data_offset % alignment == 0
    # a is 12 bytes: b starts at 12 rounded up to the alignment
    assert h.tensors["b"].offset == -(-12 // alignment) * alignment
    assert [h.data_offset + t.offset for t in h.tensors.values()] == \
        [t.data_offset for t in r.tensors]
    assert h.has_data


# --------------------------------------------------------------------------------------
# values: every scalar type, version 2, arrays eager and lazy, nested arrays
# --------------------------------------------------------------------------------------

# (adder, value written, value read back)
SCALARS = {
    "uint8": ("add_uint8", 255, 255),
    "int8": ("add_int8", -128, -128),
    "uint16": ("add_uint16", 65535, 65535),
    "int16": ("add_int16", -32768, -32768),
    "uint32": ("add_uint32", 2**32 - 1, 2**32 - 1),
    "int32": ("add_int32", -2**31, -2**31),
    "float32": ("add_float32", 0.1, float(np.float32(0.1))),  # 0.10000000149011612
    "bool-true": ("add_bool", True, True),
    "bool-false": ("add_bool", False, False),
    "uint64": ("add_uint64", 2**64 - 1, 2**64 - 1),
    "int64": ("add_int64", -2**63, -2**63),
    "float64": ("add_float64", 0.1, 0.1),
    "string": ("add_string", "héllo ✓ 世界", "héllo ✓ 世界"),
}


@pytest.fixture(scope="module")
def scalars_file(tmp_path_factory) -> Path:
    def fill(w):
        for key, (adder, value, _) in SCALARS.items():
            getattr(w, adder)(f"test.{key}", value)
        w.add_uint32("test.after", SENTINEL)

    return write(tmp_path_factory.mktemp("scalars") / "scalars.gguf", fill)


@pytest.mark.parametrize("key", list(SCALARS))
def test_scalar_types(scalars_file, key):
    value = read_header(scalars_file).metadata[f"test.{key}"]
    expected = SCALARS[key][2]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("version", [2, 3])
def test_versions_2_and_3(scalars_file, tmp_path, version):
    """GGUFWriter writes only v3; v2 has the same layout (64-bit counts), so patch the field."""
    buf = bytearray(scalars_file.read_bytes())
    buf[4:8] = struct.pack("<I", version)
    path = tmp_path / f"v{version}.gguf"
    path.write_bytes(buf)
    h = read_header(path)
    assert h.version == version
    assert h.metadata == read_header(scalars_file).metadata
    assert len(h.metadata) == len(SCALARS) + 2  # + general.architecture, test.after
    assert h.metadata["test.after"] == SENTINEL


# item kind -> (value for index i, value read back)
ITEMS: dict[str, tuple[Callable[[int], object], Callable[[object], object]]] = {
    "int32": (lambda i: i - 7, lambda v: v),
    "float32": (lambda i: i / 3, lambda v: float(np.float32(v))),
    "bool": (lambda i: i % 3 == 0, lambda v: v),
    "string": (lambda i: f"tok{i}", lambda v: v),
}
ITEM_BYTES = {"int32": 4, "float32": 4, "bool": 1}


@pytest.mark.parametrize("n", [1, EAGER_ARRAY_LIMIT, EAGER_ARRAY_LIMIT + 1, 20_000])
@pytest.mark.parametrize("kind", list(ITEMS))
def test_arrays_eager_up_to_the_limit_then_lazy(tmp_path, kind, n):
    make, read_back = ITEMS[kind]
    values = [make(i) for i in range(n)]

    def fill(w):
        w.add_array("test.array", values)
        w.add_uint32("test.after", SENTINEL)

    h = read_header(write(tmp_path / "arr.gguf", fill))
    got = h.metadata["test.array"]
    expected = [read_back(v) for v in values]
    if n <= EAGER_ARRAY_LIMIT:
        assert got == expected and type(got) is list
    else:
        assert isinstance(got, LazyArray) and len(got) == got.count == n
        # 24 header + general.architecture kv (45) + key (8+10) + ARRAY type, item type, count
        assert got.offset == 24 + 45 + 18 + 4 + 4 + 8
        nbytes = sum(8 + len(v.encode()) for v in values) if kind == "string" \
            else n * ITEM_BYTES[kind]
        assert got.nbytes == nbytes
        loaded = got.load()
        assert loaded == expected and type(loaded[0]) is type(expected[0])
    assert h.metadata["test.after"] == SENTINEL


# index of the odd string among 5000 short ones, and the odd string
N_STRINGS = 5000
ODD_STRINGS = {
    "all-short": (None, None),
    "empty-first": (0, ""),
    "empty-middle": (2500, ""),
    "empty-before-256-byte": (2500, ""),  # the next string's length has a zero low byte
    "70000-bytes-middle": (2500, "x" * 70_000),
    "70000-bytes-last": (N_STRINGS - 1, "y" * 70_000),
    "nul-first-char": (0, "\x00abc"),
    "nul-first-char-middle": (2500, "\x00abc"),
    "nul-first-char-last": (N_STRINGS - 1, "\x00"),
}


@pytest.mark.parametrize("case", list(ODD_STRINGS))
def test_lazy_string_array_fast_and_slow_paths(tmp_path, monkeypatch, case):
    """The vectorised skip and the plain loop agree on where a string array ends."""
    at, odd = ODD_STRINGS[case]
    values = [f"t{i}" for i in range(N_STRINGS)]
    if at is not None:
        values[at] = odd
    if case == "empty-before-256-byte":
        values[at + 1] = "z" * 256

    def fill(w):
        w.add_array("test.tokens", values)
        w.add_uint32("test.after", SENTINEL)

    path = write(tmp_path / f"{case}.gguf", fill)
    start = 24 + 45 + (8 + 11) + 4 + 4 + 8  # header, arch kv, key, types and count
    end = start + sum(8 + len(v.encode()) for v in values)

    fast = read_header(path).metadata
    with open(path, "rb") as f:
        buf = f.read()
    done, pos = gguf_reader._skip_strings_fast(buf, start, len(buf), N_STRINGS)
    if case == "all-short":
        assert (done, pos) == (N_STRINGS, end)  # the fast path did it all
    elif case.startswith(("70000", "nul")):
        assert done <= at  # ... and stopped at (or before) the string it cannot verify
    monkeypatch.setattr(gguf_reader, "_skip_strings_fast", lambda buf, start, limit, count, *_:
                        (0, start))
    slow = read_header(path).metadata  # the plain loop only
    for md in (fast, slow):
        arr = md["test.tokens"]
        assert (arr.offset, arr.offset + arr.nbytes, arr.count) == (start, end, N_STRINGS)
        assert md["test.after"] == SENTINEL
    assert fast["test.tokens"].load() == values


def test_nested_arrays(tmp_path):
    def fill(w):
        w.add_array("test.ints", [[1, 2], [3], [4, 5, 6]])
        w.add_array("test.strs", [["a", ""], ["ü"]])
        w.add_array("test.deep", [[[[7]]]])  # 4 levels: MAX_ARRAY_DEPTH
        w.add_uint32("test.after", SENTINEL)

    md = read_header(write(tmp_path / "nested.gguf", fill)).metadata
    assert md["test.ints"] == [[1, 2], [3], [4, 5, 6]]
    assert md["test.strs"] == [["a", ""], ["ü"]]
    assert md["test.deep"] == [[[[7]]]]
    assert md["test.after"] == SENTINEL


# --------------------------------------------------------------------------------------
# split models
# --------------------------------------------------------------------------------------

THREE_TENSORS = {"t0": np.zeros(4, np.float32), "t1": np.ones((2, 8), np.float16),
                 "t2": np.full(3, 2.0, np.float32)}


def write_split(tmp_path: Path) -> list[Path]:
    """t0, t1 in shard 1 and t2 in shard 2 (GGUFWriter's own split, as gguf-split does)."""
    write(tmp_path / "m.gguf", lambda w: w.add_uint32("llama.block_count", 1),
          tensors=THREE_TENSORS, split_max_tensors=2)
    return [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]


@pytest.mark.parametrize("which", [0, 1])
def test_split_model_merges_tensor_infos(tmp_path, which):
    shards = write_split(tmp_path)
    h = read_model(shards[which])  # either shard's name finds both
    assert h.shards == shards and h.path == shards[0] and h.has_data
    assert h.metadata["split.count"] == 2 and h.metadata["split.tensors.count"] == 3
    assert h.metadata["split.no"] == 0 and h.metadata["llama.block_count"] == 1
    assert [(t.name, t.ne, t.shard, t.offset) for t in h.tensors.values()] == [
        ("t0", (4,), 0, 0), ("t1", (8, 2), 0, 32), ("t2", (3,), 1, 0)]  # t0: 16 bytes -> 32
    assert sum(t.nbytes for t in h.tensors.values()) == 16 + 32 + 12


def test_split_model_missing_shard(tmp_path):
    shards = write_split(tmp_path)
    shards[1].unlink()
    with pytest.raises(GGUFError, match="shard 2 of 2 is missing") as e:
        read_model(shards[0])
    assert str(shards[1]) in str(e.value)


def _patch_int_value(path: Path, key: str, value: int) -> None:
    """Overwrite the integer value of ``key`` in place (same type, same size)."""
    buf = bytearray(path.read_bytes())
    at = buf.index(key.encode()) + len(key)
    (vtype,) = struct.unpack_from("<I", buf, at)
    fmt = {VT.UINT16: "<H", VT.INT32: "<i", VT.UINT32: "<I"}[vtype]
    struct.pack_into(fmt, buf, at + 4, value)
    path.write_bytes(buf)


def test_split_tensor_count_mismatch(tmp_path):
    shards = write_split(tmp_path)
    _patch_int_value(shards[0], "split.tensors.count", 4)
    with pytest.raises(GGUFError, match="split.tensors.count is 4 but the shards hold 3 tensors"):
        read_model(shards[0])


def test_split_count_mismatch(tmp_path):
    shards = write_split(tmp_path)
    _patch_int_value(shards[1], "split.count", 3)
    with pytest.raises(GGUFError, match="split.count is 3 but the file name says 2"):
        read_model(shards[0])


def test_split_tensor_in_two_shards(tmp_path):
    write(tmp_path / "d-00001-of-00002.gguf", tensors={"x": np.zeros(4, np.float32)})
    write(tmp_path / "d-00002-of-00002.gguf", tensors={"x": np.zeros(4, np.float32)})
    with pytest.raises(GGUFError, match="tensor 'x' appears in two shards"):
        read_model(tmp_path / "d-00001-of-00002.gguf")


# --------------------------------------------------------------------------------------
# the real gemma-3-270m file against gguf-py's GGUFReader
# --------------------------------------------------------------------------------------


def test_real_gemma3_matches_gguf_reader(gemma3_270m):
    """Every metadata value, tensor info and the lazily loaded tokenizer arrays agree with
    GGUFReader (which parses each of the 262k tokens in Python: ~20 s, so only once)."""
    h = read_model(gemma3_270m)
    assert (h.version, h.data_offset, len(h.tensors), h.has_data) == (3, 6_525_120, 236, True)
    tokens = h.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, LazyArray) and tokens.count == 262_144

    r = gguf.GGUFReader(gemma3_270m)
    assert (r.data_offset, r.alignment) == (h.data_offset, h.alignment)
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(h.metadata)
    for key, f in fields.items():
        ours = h.metadata[key]
        if isinstance(ours, LazyArray):
            assert ours.load() == f.contents(), key
        else:
            assert ours == f.contents(), key

    assert [t.name for t in r.tensors] == list(h.tensors)
    for rt in r.tensors:
        t = h.tensors[rt.name]
        assert (t.ne, t.type, h.data_offset + t.offset, t.nbytes) == \
            (tuple(int(d) for d in rt.shape), rt.tensor_type, rt.data_offset, rt.n_bytes), t.name
