"""Bad GGUF input fails with one line naming the file, or loads; never anything else.

The bad files are made here, in ``tmp_path``, from real headers: the three header-only
examples, a small full fixture (``tests/fixtures.py``) and the header of the real
gemma-3-270m file (skipped if absent). :func:`layout` is a small walker, independent of
``graphcost.format.gguf_reader``, that lists every field of a header with its offset; the
mutation families aim at those fields, so every structural boundary is hit (inside the
magic, the version, the counts, a key, a value type, a string length, the tokenizer
arrays, a tensor info's name, dims, type id and offset), not just random bytes. The
targeted cases then make each named kind of damage once, with the message it must give.

For every file ``load_model`` must either return (a flipped byte in a float may still
parse) or raise :class:`GraphcostError` whose ``str()`` is one line containing the path;
a case that must fail must raise. Any other exception fails the test. ``tracemalloc``
bounds the peak allocation of each load: no allocation sized by an unchecked count.
A few end-to-end checks run ``python -m graphcost analyze BAD.gguf``.
"""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tracemalloc
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from fixtures import write_llama
from graphcost.format.gguf_reader import read_model
from graphcost.graph.build import load_model
from graphcost.errors import GraphcostError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = {
    "llama31-8b": EXAMPLES / "llama-3.1-8b-instruct-q4_k_m.gguf",
    "mistral-large": EXAMPLES / "mistral-large-2407-q4_0.gguf",
    "gemma3-4b": EXAMPLES / "gemma-3-4b-it-q4_k_m.gguf",
}
#: peak bytes one load may allocate; the real gemma3 header (262k tokens) needs ~18 MB
PEAK_LIMIT = 64 << 20
HUGE_U64 = (2**63, 2**40, 0xFFFFFFFF, 2**64 - 1)
#: ggml type ids that no longer exist (4, 5: Q4_2/Q4_3; 31: Q4_0_4_4) or never did
BAD_TENSOR_TYPES = (4, 5, 31, 99, 0xFFFFFFFF)
BAD_VALUE_TYPES = (13, 99, 0xFFFFFFFF)

_SCALAR = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I",
           VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q",
           VT.FLOAT64: "<d"}


# --------------------------------------------------------------------------------------
# an independent header walker: every field with its offset
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    start: int
    size: int
    kind: str  # "tensor dim", "kv key length", ... (the same for every instance)
    where: str  # "tensor 3 'blk.0.attn_q.weight'": which instance

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class Layout:
    fields: list[Field]
    ti_end: int  # end of the tensor infos
    data_offset: int  # ti_end rounded up to the alignment

    def find(self, kind: str, where: str = "", nth: int = 0) -> Field:
        """The ``nth`` field of ``kind`` whose ``where`` contains ``where``."""
        return [f for f in self.fields if f.kind == kind and where in f.where][nth]


def layout(buf: bytes) -> Layout:
    """Walk a well-formed GGUF v3 header. Long string arrays record only a few items."""
    fields: list[Field] = []
    pos = 0
    alignment = 32

    def take(fmt: str, kind: str, where: str):
        nonlocal pos
        (v,) = struct.unpack_from(fmt, buf, pos)
        fields.append(Field(pos, struct.calcsize(fmt), kind, where))
        pos += struct.calcsize(fmt)
        return v

    def string(kind: str, where: str) -> bytes:
        nonlocal pos
        n = take("<Q", f"{kind} length", where)
        if n:
            fields.append(Field(pos, n, f"{kind} bytes", where))
        pos += n
        return buf[pos - n:pos]

    def value(vt: int, where: str):
        nonlocal pos
        if vt == VT.STRING:
            return string("kv string", where)
        if vt != VT.ARRAY:
            return take(_SCALAR[vt], "kv scalar", where)
        item = take("<I", "kv array item type", where)
        n = take("<Q", "kv array count", where)
        if item == VT.STRING:
            for j in range(n):
                if j in (0, 1, n // 2, n - 1):
                    string("kv array string", f"{where} item {j}")
                else:
                    pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        elif item == VT.ARRAY:
            for j in range(n):
                value(VT.ARRAY, f"{where} item {j}")
        else:
            size = n * struct.calcsize(_SCALAR[item])
            fields.append(Field(pos, size, "kv array data", where))
            pos += size
        return None

    take("<I", "magic", "header")
    take("<I", "version", "header")
    n_tensors = take("<Q", "tensor count", "header")
    n_kv = take("<Q", "kv count", "header")
    for i in range(n_kv):
        key = string("kv key", f"kv {i}").decode()
        where = f"kv {i} {key!r}"
        v = value(take("<I", "kv value type", where), where)
        if key == "general.alignment":
            alignment = v
    for i in range(n_tensors):
        name = string("tensor name", f"tensor {i}").decode()
        where = f"tensor {i} {name!r}"
        for _ in range(take("<I", "tensor n_dims", where)):
            take("<Q", "tensor dim", where)
        take("<I", "tensor type", where)
        take("<Q", "tensor offset", where)
    return Layout(fields, pos, -(-pos // alignment) * alignment)


# --------------------------------------------------------------------------------------
# the bases, and how hard each is mutated
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A base file and its mutation budget (tracemalloc makes every load ~10x slower)."""

    picks: tuple[str, ...] = ("first", "middle", "last")  # instances of each kind of field
    kinds: str = ""  # only kinds of field starting with this
    n_random: int = 20  # random byte flips
    families: tuple[str, ...] = ("truncate", "flip", "huge-count", "bad-type-id")


SOURCES = {
    "llama31-8b": Source(),
    "gemma3-4b": Source(),
    # llama31's structure with 795 tensors: cuts and counts only, at the ends
    "mistral-large": Source(picks=("first", "last"),
                            families=("truncate", "huge-count", "bad-type-id")),
    "fixture-llama": Source(n_random=40),  # a full file: header, padding, data; eager arrays
    # the real 6.5 MB header: aimed at its lazy 262k-item tokenizer arrays (the middle
    # 'kv array string' is the first token, the last one the last token)
    "gemma3-270m-real": Source(picks=("middle", "last"), kinds="kv array", n_random=10),
}


def sample(fields: list[Field], src: Source) -> list[Field]:
    """The first / middle / last instance of every kind of field."""
    by_kind: dict[str, list[Field]] = defaultdict(list)
    for f in fields:
        if f.kind.startswith(src.kinds):
            by_kind[f.kind].append(f)
    out = []
    for same in by_kind.values():
        at = {"first": 0, "middle": len(same) // 2, "last": len(same) - 1}
        out += [same[i] for i in sorted({at[p] for p in src.picks})]
    return out


# --------------------------------------------------------------------------------------
# bad files: a cut or a patch of a base file
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    name: str
    cut: int | None = None  # keep only the first `cut` bytes
    at: int = 0  # ... or overwrite bytes at `at` with `patch`
    patch: bytes = b""
    must_fail: bool = True
    expect: str = ""  # a substring of the message, when the failure is known

    def apply(self, base: bytes) -> bytes:
        if self.cut is not None:
            return base[:self.cut]
        return put(base, self.at, self.patch)


def put(buf: bytes, at: int, data: bytes) -> bytes:
    return buf[:at] + data + buf[at + len(data):]


def truncations(lay: Layout, base: bytes, src: Source) -> list[Bad]:
    """Cuts at every byte of the fixed header, and at, just inside and at the last byte of
    sampled fields of every kind; any cut before the end of the tensor infos must fail,
    a cut inside the tensor data of a full file loads (a partial download: the header is
    whole; tests/test_hostile_input.py checks what each command does with it)."""
    cuts: dict[int, str] = {n: "fixed header" for n in range(0, 25)}
    for f in sample(lay.fields, src):
        for n in (f.start, f.start + 1, f.end - 1):
            if f.start <= n < f.end:
                cuts.setdefault(n, f"{f.kind} of {f.where}")
    for n in np.linspace(25, lay.ti_end - 1, 16).astype(int).tolist():
        cuts.setdefault(n, "evenly spaced")
    if len(base) > lay.data_offset:
        for n in (lay.data_offset + 1, (lay.data_offset + len(base)) // 2, len(base) - 1):
            cuts.setdefault(n, "tensor data")
    return [Bad(f"cut@{n} ({what})", cut=n, must_fail=n < lay.ti_end)
            for n, what in sorted(cuts.items())]


_COUNT_KINDS = ("tensor count", "kv count", "kv key length", "kv string length",
                "kv array count", "kv array string length", "tensor name length")


def flips(lay: Layout, base: bytes, src: Source) -> list[Bad]:
    """A flipped first byte and top bit in sampled fields (and the low bit of counts: off
    by one), plus seeded random flips. Only a flip in the magic must fail: others may
    leave a file that still parses."""
    out = []
    for f in sample(lay.fields, src):
        how_to = [(f.start, 0xFF, "byte"), (f.end - 1, 0x80, "high bit")]
        if f.kind in _COUNT_KINDS:
            how_to.append((f.start, 0x01, "low bit"))
        for at, mask, how in how_to:
            out.append(Bad(f"flip {how} @{at} ({f.kind} of {f.where})", at=at,
                           patch=bytes([base[at] ^ mask]), must_fail=f.kind == "magic"))
    rng = np.random.default_rng(len(base))
    for at, mask in zip(rng.integers(0, lay.ti_end, src.n_random).tolist(),
                        rng.integers(1, 256, src.n_random).tolist()):
        out.append(Bad(f"flip {mask:#04x} @{at} (random)", at=at, patch=bytes([base[at] ^ mask]),
                       must_fail=at < 4))
    return out


def huge_counts(lay: Layout, base: bytes, src: Source) -> list[Bad]:
    """Counts and lengths overwritten with values no file could hold (must fail); n_dims,
    dims and offsets too (a 2**40 dim or a huge offset may be a legal header-only claim)."""
    out = []
    for f in sample(lay.fields, src):
        if f.kind in _COUNT_KINDS:
            out += [Bad(f"{f.kind}={v:#x} ({f.where})", at=f.start, patch=struct.pack("<Q", v))
                    for v in HUGE_U64]
        elif f.kind == "tensor n_dims":
            out += [Bad(f"n_dims={v} ({f.where})", at=f.start, patch=struct.pack("<I", v),
                        expect="dimensions") for v in (0, 5, 0xFFFFFFFF)]
        elif f.kind == "tensor dim":
            out += [Bad(f"dim={v:#x} ({f.where})", at=f.start, patch=struct.pack("<Q", v),
                        must_fail=v >= 2**62) for v in (2**63, 2**40, 2**64 - 1)]
            out.append(Bad(f"dim=0 ({f.where})", at=f.start, patch=bytes(8),
                           expect="zero dimension"))
        elif f.kind == "tensor offset":
            (off,) = struct.unpack_from("<Q", base, f.start)
            out.append(Bad(f"offset+1 ({f.where})", at=f.start, patch=struct.pack("<Q", off + 1),
                           expect="not aligned"))
            out += [Bad(f"offset={v:#x} ({f.where})", at=f.start, patch=struct.pack("<Q", v),
                        must_fail=False) for v in (2**63, 2**64 - 32)]
    return out


def bad_type_ids(lay: Layout, base: bytes, src: Source) -> list[Bad]:
    """Unknown tensor type ids and unknown metadata value types."""
    out = []
    for f in sample(lay.fields, src):
        if f.kind == "tensor type":
            out += [Bad(f"tensor type {v} ({f.where})", at=f.start, patch=struct.pack("<I", v),
                        expect=f"unknown type id {v}") for v in BAD_TENSOR_TYPES]
        elif f.kind in ("kv value type", "kv array item type"):
            out += [Bad(f"{f.kind} {v} ({f.where})", at=f.start, patch=struct.pack("<I", v),
                        expect=f"unknown value type {v}") for v in BAD_VALUE_TYPES]
    return out


FAMILIES: dict[str, Callable[[Layout, bytes, Source], list[Bad]]] = {
    "truncate": truncations,
    "flip": flips,
    "huge-count": huge_counts,
    "bad-type-id": bad_type_ids,
}


# --------------------------------------------------------------------------------------
# loading a bad file
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bases(request, tmp_path_factory) -> Callable[[str], tuple[bytes, Layout]]:
    """name -> (bytes, layout) of a well-formed base file, built once per session."""
    cache: dict[str, tuple[bytes, Layout]] = {}

    def get(name: str) -> tuple[bytes, Layout]:
        if name not in cache:
            if name in EXAMPLE_FILES:
                buf = EXAMPLE_FILES[name].read_bytes()
            elif name == "fixture-llama":
                p = tmp_path_factory.mktemp("base") / "tiny-llama.gguf"
                write_llama(p, n_layer=2)
                buf = p.read_bytes()
            else:  # the real file's header: everything before the tensor data
                with open(request.getfixturevalue("gemma3_270m"), "rb") as f:
                    head = f.read(8 << 20)
                buf = head[:layout(head).data_offset]
            cache[name] = (buf, layout(buf))
        return cache[name]

    return get


def check_load(path: Path, bad: Bad, named: Path | None = None) -> str | None:
    """None if ``load_model(path)`` behaved, else what went wrong. ``named``: the file the
    message must name (default ``path``). Call with tracemalloc tracing."""
    named = named or path
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        load_model(path)
        problem = "loaded without an error" if bad.must_fail else None
    except GraphcostError as e:
        msg = str(e)
        if len(msg.splitlines()) != 1 or not msg.strip():
            problem = f"message is not one line: {msg!r}"
        elif str(named) not in msg:
            problem = f"message does not name {named.name}: {msg!r}"
        elif bad.expect not in msg:
            problem = f"message lacks {bad.expect!r}: {msg!r}"
        else:
            problem = None
    except Exception as e:  # noqa: BLE001 - any other exception is what this test hunts
        problem = f"{type(e).__name__}: {e}"
    peak = tracemalloc.get_traced_memory()[1] - before
    if problem is None and peak > PEAK_LIMIT:
        problem = f"peak allocation {peak:,} bytes > {PEAK_LIMIT:,}"
    return problem


@pytest.fixture
def traced():
    """Trace allocations for the test (if the session does not already)."""
    if tracemalloc.is_tracing():
        yield
        return
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


# --------------------------------------------------------------------------------------
# the mutation families, on every base
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", list(SOURCES))
def test_base_file_loads(bases, source, tmp_path):
    """The unmutated bases load (else every 'may succeed' case proves nothing)."""
    buf, lay = bases(source)
    assert lay.ti_end <= lay.data_offset <= len(buf)
    path = tmp_path / f"{source}.gguf"
    path.write_bytes(buf)
    assert load_model(path).n_layer > 0


@pytest.mark.parametrize("source,family", [(s, f) for s, src in SOURCES.items()
                                           for f in src.families])
def test_bad_files(bases, source, family, tmp_path, traced):
    base, lay = bases(source)
    bads = FAMILIES[family](lay, base, SOURCES[source])
    problems = []
    for i, bad in enumerate(bads):
        path = tmp_path / f"{source}-{family}-{i:04d}.gguf"
        path.write_bytes(bad.apply(base))
        problem = check_load(path, bad)
        if problem:
            problems.append(f"{bad.name}: {problem}")
        path.unlink()
    assert not problems, f"{len(problems)} of {len(bads)} bad files misbehaved:\n" + \
        "\n".join(problems[:30])


def test_at_least_300_bad_files(bases):
    """The issue asks for a few hundred bad files; the examples and fixture alone give more."""
    n = 0
    for name in (*EXAMPLE_FILES, "fixture-llama"):
        base, lay = bases(name)
        n += sum(len(FAMILIES[f](lay, base, SOURCES[name])) for f in SOURCES[name].families)
    assert n >= 300


# --------------------------------------------------------------------------------------
# targeted cases: each kind of damage once, with the message it must give
# --------------------------------------------------------------------------------------


def _s(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv_str(key: str | bytes, val: str | bytes) -> bytes:
    return _s(key) + struct.pack("<I", VT.STRING) + _s(val)


def kv_u32(key: str, val: int) -> bytes:
    return _s(key) + struct.pack("<II", VT.UINT32, val)


def gguf_bytes(kvs: list[bytes], pad: bool = True) -> bytes:
    """A raw GGUF v3 header with no tensors from already-encoded kv pairs, padded to 32."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    return out + bytes(-len(out) % 32 if pad else 0)


#: what model_info needs for arch llama (no tensors: the header is all it reads)
LLAMA_KVS = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 1),
             kv_u32("llama.embedding_length", 64), kv_u32("llama.attention.head_count", 4),
             kv_u32("llama.vocab_size", 10)]


def nested_array(depth: int) -> bytes:
    """A value of type ARRAY holding one array ... ``depth`` levels down, then one u8."""
    inner = struct.pack("<IQB", VT.UINT8, 1, 7)
    for _ in range(depth - 1):
        inner = struct.pack("<IQ", VT.ARRAY, 1) + inner
    return struct.pack("<I", VT.ARRAY) + inner


def lazy_strings_cut_in_last(n: int = 5000) -> bytes:
    """LLAMA_KVS plus ``n`` (> EAGER_ARRAY_LIMIT) token strings, cut inside the last one."""
    items = b"".join(_s(f"tok{i}") for i in range(n))
    arr = _s("tokenizer.ggml.tokens") + struct.pack("<IIQ", VT.ARRAY, VT.STRING, n) + items
    return gguf_bytes(LLAMA_KVS[:-1] + [arr], pad=False)[:-3]


def _edit(source: str, edit: Callable[[bytes, Layout], bytes]) -> Callable:
    return lambda bases: edit(*bases(source))


def _same_length_pair(lay: Layout, kind: str) -> tuple[Field, Field]:
    """Two instances of ``kind`` with the same size (to copy one over the other)."""
    seen: dict[int, Field] = {}
    for f in lay.fields:
        if f.kind == kind:
            if f.size in seen:
                return seen[f.size], f
            seen[f.size] = f
    raise AssertionError(f"no two {kind} of the same length")


def _copy_over(buf: bytes, lay: Layout, kind: str) -> bytes:
    a, b = _same_length_pair(lay, kind)
    return put(buf, b.start, buf[a.start:a.end])


L31, G4, FX = "llama31-8b", "gemma3-4b", "fixture-llama"
ARCH = "'general.architecture'"


def _u32_at(kind: str, value: int, where: str = "") -> Callable[[bytes, Layout], bytes]:
    return lambda b, lay: put(b, lay.find(kind, where).start, struct.pack("<I", value))


def _u64_at(kind: str, value: int, where: str = "") -> Callable[[bytes, Layout], bytes]:
    return lambda b, lay: put(b, lay.find(kind, where).start, struct.pack("<Q", value))


# id -> (make: bases -> file bytes, expected message part)
TARGETED: dict[str, tuple[Callable, str]] = {
    "empty-file": (lambda bases: b"", "empty file"),
    "three-bytes": (lambda bases: b"GGU", "truncated: magic"),
    "text-file": (lambda bases: b"this is not a model\n" * 20, "not a GGUF file"),
    "magic-GGML": (_edit(L31, lambda b, lay: put(b, 0, b"GGML")), "not a GGUF file"),
    "version-1": (_edit(L31, lambda b, lay: put(b, 4, struct.pack("<I", 1))), "version 1"),
    "version-4": (_edit(L31, lambda b, lay: put(b, 4, struct.pack("<I", 4))), "version 4"),
    "version-big-endian": (_edit(L31, lambda b, lay: put(b, 4, struct.pack(">I", 3))),
                           "big-endian"),
    "cut-in-tensor-infos": (_edit(L31, lambda b, lay: b[:lay.ti_end - 100]), "truncated"),
    "cut-in-last-lazy-string": (lambda bases: lazy_strings_cut_in_last(),
                                "truncated: string 4999 of 'tokenizer.ggml.tokens'"),
    "tensor-count-2**63": (_edit(L31, _u64_at("tensor count", 2**63)),
                           "tensor count 9223372036854775808 is larger than the file"),
    "kv-count-2**40": (_edit(L31, _u64_at("kv count", 2**40)), "metadata count"),
    "key-length-0xFFFFFFFF": (_edit(L31, _u64_at("kv key length", 0xFFFFFFFF)), "truncated"),
    "string-length-2**63": (_edit(L31, _u64_at("kv string length", 2**63)), "truncated"),
    "array-count-2**63": (_edit(FX, _u64_at("kv array count", 2**63, "tokens")),
                          "the file cannot hold them"),
    "array-count-2**40-floats": (_edit(FX, _u64_at("kv array count", 2**40, "scores")),
                                 "the file cannot hold them"),
    "n_dims-0": (_edit(L31, _u32_at("tensor n_dims", 0)), "has 0 dimensions"),
    "n_dims-5": (_edit(L31, _u32_at("tensor n_dims", 5)), "has 5 dimensions"),
    "zero-dim": (_edit(L31, _u64_at("tensor dim", 0)), "zero dimension"),
    "2**62-elements": (_edit(L31, lambda b, lay: put(b, lay.find("tensor dim").start,
                                                     struct.pack("<QQ", 2**31, 2**31))),
                       "more than ggml can address"),
    "row-not-whole-blocks": (_edit(L31, _u64_at("tensor dim", 100, "blk.0.attn_q.weight")),
                             "is not a multiple of the q4_K block size 256"),
    "tensor-type-4": (_edit(L31, _u32_at("tensor type", 4)), "unknown type id 4"),
    "tensor-type-31": (_edit(L31, _u32_at("tensor type", 31)), "unknown type id 31"),
    "tensor-type-99": (_edit(L31, _u32_at("tensor type", 99)), "unknown type id 99"),
    "value-type-13": (_edit(L31, _u32_at("kv value type", 13)), "unknown value type 13"),
    "array-item-type-99": (_edit(FX, _u32_at("kv array item type", 99, "tokens")),
                           "unknown value type 99"),
    "misaligned-offset": (_edit(L31, _u64_at("tensor offset", 1)), "not aligned to 32"),
    "overlapping-tensors": (_edit(L31, lambda b, lay: put(  # tensor 1 at tensor 0's offset
        b, lay.find("tensor offset", nth=1).start, bytes(8))), "overlaps tensor"),
    "duplicate-key": (_edit(L31, lambda b, lay: _copy_over(b, lay, "kv key bytes")),
                      "duplicate metadata key"),
    "duplicate-tensor-name": (_edit(L31, lambda b, lay: _copy_over(b, lay, "tensor name bytes")),
                              "duplicate tensor name"),
    "key-not-utf8": (_edit(L31, lambda b, lay: put(b, lay.find("kv key bytes", "kv 1").start,
                                                   b"\xc3\x28")), "not valid UTF-8"),
    "tensor-name-not-utf8": (_edit(L31, lambda b, lay: put(b, lay.find("tensor name bytes").start,
                                                           b"\xff")), "not valid UTF-8"),
    # a newline pulled into a key or tensor name must not split the message
    "key-with-newline": (_edit(L31, lambda b, lay: _u32_at("kv value type", 99, "kv 1")(
        put(b, lay.find("kv key bytes", "kv 1").start + 3, b"\n"), lay)),
        "unknown value type 99 for type of 'gen\\nral.type'"),
    "tensor-name-with-newline": (_edit(L31, lambda b, lay: _u32_at("tensor type", 99)(
        put(b, lay.find("tensor name bytes").start, b"\n"), lay)), "unknown type id 99"),
    # "llama" -> "bogus", "gemma3" -> "nosuch": same lengths, so the rest of the file holds
    "arch-unknown": (_edit(L31, lambda b, lay: put(b, lay.find("kv string bytes", ARCH).start,
                                                   b"bogus")),
                     "architecture 'bogus' is not supported (supported: "),
    "arch-unknown-gemma3-file": (_edit(G4, lambda b, lay: put(
        b, lay.find("kv string bytes", ARCH).start, b"nosuch")), "architecture 'nosuch'"),
    "arch-not-utf8": (_edit(L31, lambda b, lay: put(b, lay.find("kv string bytes", ARCH).start,
                                                    b"\xff")), "not valid UTF-8"),
    "arch-missing": (lambda bases: gguf_bytes(LLAMA_KVS[1:]),
                     "'general.architecture' is missing"),
    "arch-not-a-string": (lambda bases: gguf_bytes([kv_u32("general.architecture", 7)]),
                          "'general.architecture' must be a string, got 7"),
    "tokens-not-an-array": (lambda bases: gguf_bytes(
        LLAMA_KVS[:-1] + [kv_u32("tokenizer.ggml.tokens", 5)]), "cannot tell the vocabulary"),
    "block-count-0": (lambda bases: gguf_bytes(
        [LLAMA_KVS[0], kv_u32("llama.block_count", 0)] + LLAMA_KVS[2:]), "block_count 0"),
    "alignment-48": (lambda bases: gguf_bytes(LLAMA_KVS + [kv_u32("general.alignment", 48)]),
                     "general.alignment 48 is not a power of two"),
    "alignment-a-string": (lambda bases: gguf_bytes(
        LLAMA_KVS + [kv_str("general.alignment", "32")]), "general.alignment '32'"),
    "arrays-nested-5-deep": (lambda bases: gguf_bytes(
        LLAMA_KVS + [_s("nested") + nested_array(5)]), "nested deeper than 4"),
}


@pytest.mark.parametrize("case", list(TARGETED))
def test_targeted(case, bases, tmp_path, traced):
    make, expect = TARGETED[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(make(bases))
    assert check_load(path, Bad(case, expect=expect)) is None


def test_nested_arrays_4_deep_load(tmp_path):
    """The depth limit is not off by one: 4 levels (MAX_ARRAY_DEPTH) are still read (the
    header reader's limit; the file has no tensors, which load_model refuses)."""
    path = tmp_path / "nested4.gguf"
    path.write_bytes(gguf_bytes(LLAMA_KVS + [_s("nested") + nested_array(4)]))
    assert read_model(path).metadata["nested"] == [[[[7]]]]


@pytest.mark.parametrize("case", ["no-such-file", "a-directory", "missing-shard"])
def test_bad_paths(case, tmp_path, traced):
    if case == "no-such-file":
        path = named = tmp_path / "absent.gguf"
        expect = "cannot open"
    elif case == "a-directory":
        path = named = tmp_path / "dir.gguf"
        path.mkdir()
        expect = "cannot open"
    else:
        path = tmp_path / "model-00001-of-00002.gguf"
        shutil.copy(EXAMPLE_FILES[L31], path)
        named = tmp_path / "model-00002-of-00002.gguf"
        expect = "shard 2 of 2 is missing"
    assert check_load(path, Bad(case, expect=expect), named=named) is None


# --------------------------------------------------------------------------------------
# end to end: the CLI prints one line and exits with 2
# --------------------------------------------------------------------------------------

CLI_CASES = ["cut-in-tensor-infos", "tensor-count-2**63", "arch-unknown", "version-4",
             "text-file", "key-with-newline"]


@pytest.mark.skipif(not (ROOT / "graphcost" / "__main__.py").exists(),
                    reason="graphcost/__main__.py (the CLI) does not exist yet")
@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_bad_file(case, bases, tmp_path):
    make, expect = TARGETED[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(make(bases))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRAPHCOST_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", str(path)],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), r.stderr
    assert str(path) in lines[0] and expect in lines[0]
