"""Bad GGUF input fails with one line naming the file, or loads; never anything else.

The bad files are made here, in ``tmp_path``, from real headers: the three header-only
examples, a small full fixture (``tests/fixtures.py``) and the header of the real
gemma-3-270m file (skipped if absent). :func:`layout` is a small walker, independent of
``graphcost.gguf_reader``, that lists every field of a header with its offset; the
mutations aim at those fields, so every structural boundary is hit (inside the magic,
the version, the counts, a key, a value type, a string length, the tokenizer array, a
tensor info's name, dims, type id and offset), not just random bytes.

For every file ``load_model`` must either return (a flipped byte in a float may still
parse) or raise :class:`GraphcostError` whose ``str()`` is one line containing the path;
a case marked ``must_fail`` must raise. Any other exception fails the test. The peak
allocation of each load is bounded with ``tracemalloc`` (no allocation sized by an
unchecked count). A few end-to-end checks run ``python -m graphcost analyze BAD.gguf``.
"""
from __future__ import annotations

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

from fixtures import write_llama
from graphcost.build import load_model
from graphcost.errors import GraphcostError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
EXAMPLE_FILES = {
    "llama31-8b": EXAMPLES / "llama-3.1-8b-instruct-q4_k_m.gguf",
    "mistral-large": EXAMPLES / "mistral-large-2407-q4_0.gguf",
    "gemma3-4b": EXAMPLES / "gemma-3-4b-it-q4_k_m.gguf",
}
SOURCES = [*EXAMPLE_FILES, "fixture-llama", "gemma3-270m-real"]
#: peak bytes one load may allocate; the real gemma3 header (262k tokens) needs ~18 MB
PEAK_LIMIT = 64 << 20
HUGE_U64 = (2**63, 2**40, 0xFFFFFFFF, 2**64 - 1)
#: ggml type ids that no longer exist (4, 5: Q4_2/Q4_3; 31: Q4_0_4_4) or never did
BAD_TENSOR_TYPES = (4, 5, 31, 99, 0xFFFFFFFF)
BAD_VALUE_TYPES = (13, 99, 0xFFFFFFFF)

# GGUF value type id -> struct format (gguf/constants.py GGUFValueType)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


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


def layout(buf: bytes) -> Layout:
    """Walk a well-formed GGUF v3 header. Long string arrays record only a few items."""
    fields: list[Field] = []
    pos = 0
    alignment = 32

    def take(fmt: str, kind: str, where: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        (v,) = struct.unpack_from(fmt, buf, pos)
        fields.append(Field(pos, size, kind, where))
        pos += size
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
        if vt == _STRING:
            return string("kv string", where)
        if vt != _ARRAY:
            return take(_SCALAR[vt], "kv scalar", where)
        item = take("<I", "kv array item type", where)
        n = take("<Q", "kv array count", where)
        if item == _STRING:
            for j in range(n):
                if j in (0, 1, n // 2, n - 1):
                    string("kv array string", f"{where} item {j}")
                else:
                    pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        elif item == _ARRAY:
            for j in range(n):
                value(_ARRAY, f"{where} item {j}")
        else:
            fields.append(Field(pos, n * struct.calcsize(_SCALAR[item]), "kv array data", where))
            pos += n * struct.calcsize(_SCALAR[item])
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
        n_dims = take("<I", "tensor n_dims", where)
        for _ in range(n_dims):
            take("<Q", "tensor dim", where)
        take("<I", "tensor type", where)
        take("<Q", "tensor offset", where)
    return Layout(fields, pos, -(-pos // alignment) * alignment)


def sample(fields: list[Field], per_kind: int = 3) -> list[Field]:
    """The first, middle and last instance of every kind of field."""
    by_kind: dict[str, list[Field]] = defaultdict(list)
    for f in fields:
        by_kind[f.kind].append(f)
    out = []
    for same in by_kind.values():
        picks = sorted({0, len(same) // 2, len(same) - 1})[:per_kind]
        out += [same[i] for i in picks]
    return out


# --------------------------------------------------------------------------------------
# bad files: a cut or a patch of a base header
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
        return base[:self.at] + self.patch + base[self.at + len(self.patch):]


def truncations(lay: Layout, size: int) -> list[Bad]:
    """Cuts at every byte of the fixed header, and at, just inside and at the last byte of
    sampled fields of every kind; any cut before the end of the tensor infos must fail."""
    cuts: dict[int, str] = {n: "fixed header" for n in range(0, 25)}
    for f in sample(lay.fields):
        for n in (f.start, f.start + 1, f.end - 1):
            if f.start <= n < f.end:
                cuts.setdefault(n, f"{f.kind} of {f.where}")
    for n in np.linspace(25, lay.ti_end - 1, 16).astype(int).tolist():
        cuts.setdefault(n, "evenly spaced")
    if size > lay.data_offset:  # a full file: cuts inside the tensor data must fail too
        for n in (lay.data_offset + 1, (lay.data_offset + size) // 2, size - 1):
            cuts.setdefault(n, "tensor data")
    return [Bad(f"cut@{n} ({what})", cut=n, must_fail=not lay.ti_end <= n <= lay.data_offset,
                expect="" if n else "empty file")
            for n, what in sorted(cuts.items())]


def flips(lay: Layout, base: bytes, seed: int, n_random: int = 40) -> list[Bad]:
    """A flipped byte / high bit / low bit in sampled fields, plus seeded random flips."""
    out = []
    for f in sample(lay.fields):
        for at, mask, how in ((f.start, 0xFF, "byte"), (f.end - 1, 0x80, "high bit"),
                              (f.start, 0x01, "low bit")):
            out.append(Bad(f"flip {how} @{at} ({f.kind} of {f.where})", at=at,
                           patch=bytes([base[at] ^ mask]), must_fail=f.kind == "magic"))
    rng = np.random.default_rng(seed)
    for at, mask in zip(rng.integers(0, lay.ti_end, n_random).tolist(),
                        rng.integers(1, 256, n_random).tolist()):
        out.append(Bad(f"flip {mask:#04x} @{at} (random)", at=at, patch=bytes([base[at] ^ mask]),
                       must_fail=at < 4))
    return out


_COUNT_KINDS = ("tensor count", "kv count", "kv key length", "kv string length",
                "kv array count", "kv array string length", "tensor name length")


def huge_counts(lay: Layout, base: bytes) -> list[Bad]:
    """Counts and lengths overwritten with values no file could hold (must fail); dims and
    offsets overwritten too (a huge dim or offset may be a legal header-only claim)."""
    out = []
    for f in sample(lay.fields):
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


def bad_type_ids(lay: Layout) -> list[Bad]:
    """Unknown tensor type ids and unknown metadata value types."""
    out = []
    for f in sample(lay.fields):
        if f.kind == "tensor type":
            out += [Bad(f"tensor type {v} ({f.where})", at=f.start, patch=struct.pack("<I", v),
                        expect=f"unknown type id {v}") for v in BAD_TENSOR_TYPES]
        elif f.kind in ("kv value type", "kv array item type"):
            out += [Bad(f"{f.kind} {v} ({f.where})", at=f.start, patch=struct.pack("<I", v),
                        expect=f"unknown value type {v}") for v in BAD_VALUE_TYPES]
    return out


FAMILIES: dict[str, Callable[[Layout, bytes, int], list[Bad]]] = {
    "truncate": lambda lay, base, seed: truncations(lay, len(base)),
    "flip": lambda lay, base, seed: flips(lay, base, seed),
    "huge-count": lambda lay, base, seed: huge_counts(lay, base),
    "bad-type-id": lambda lay, base, seed: bad_type_ids(lay),
}


# --------------------------------------------------------------------------------------
# the base headers and the check applied to every bad file
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bases(request, tmp_path_factory) -> Callable[[str], tuple[bytes, Layout]]:
    """name -> (bytes, layout) of a well-formed base file, built once per session."""
    cache: dict[str, tuple[bytes, Layout]] = {}

    def get(name: str) -> tuple[bytes, Layout]:
        if name not in cache:
            if name in EXAMPLE_FILES:
                buf = EXAMPLE_FILES[name].read_bytes()
            elif name == "fixture-llama":  # a full file: header, padding and tensor data
                p = tmp_path_factory.mktemp("base") / "tiny-llama.gguf"
                write_llama(p, n_layer=2)
                buf = p.read_bytes()
            else:  # the real gemma3 270m header (6.5 MB: 262k tokens, scores, types)
                real = Path(request.getfixturevalue("gemma3_270m"))
                with open(real, "rb") as f:
                    head = f.read(8 << 20)
                buf = head[:layout(head).data_offset]
            cache[name] = (buf, layout(buf))
        return cache[name]

    return get


def check_load(path: Path, bad: Bad) -> str | None:
    """None if ``load_model(path)`` behaved, else what went wrong."""
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    try:
        load_model(path)
        problem = "loaded without an error" if bad.must_fail else None
    except GraphcostError as e:
        msg = str(e)
        if len(msg.splitlines()) != 1 or not msg.strip():
            problem = f"message is not one line: {msg!r}"
        elif str(path) not in msg:
            problem = f"message does not name the file: {msg!r}"
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


def run_bad_files(base: bytes, bads: list[Bad], tmp_path: Path, stem: str) -> list[str]:
    """Write each bad file, load it, and return the problems (one line each)."""
    problems = []
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        for i, bad in enumerate(bads):
            path = tmp_path / f"{stem}-{i:04d}.gguf"
            path.write_bytes(bad.apply(base))
            problem = check_load(path, bad)
            if problem:
                problems.append(f"{bad.name}: {problem}")
            path.unlink()
    finally:
        if not tracing:
            tracemalloc.stop()
    return problems


# --------------------------------------------------------------------------------------
# the mutation families, on every base header
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_base_file_loads(bases, source, tmp_path):
    """The unmutated bases load (else every 'may succeed' case below proves nothing)."""
    buf, lay = bases(source)
    assert lay.ti_end <= lay.data_offset <= len(buf)
    path = tmp_path / f"{source}.gguf"
    path.write_bytes(buf)
    assert load_model(path).n_layer > 0


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("source", SOURCES)
def test_bad_files(bases, source, family, tmp_path):
    base, lay = bases(source)
    bads = FAMILIES[family](lay, base, SOURCES.index(source))
    assert len(bads) >= 20  # the family really produced files
    problems = run_bad_files(base, bads, tmp_path, f"{source}-{family}")
    assert not problems, f"{len(problems)} of {len(bads)} bad files misbehaved:\n" + \
        "\n".join(problems[:30])


def test_at_least_300_bad_files(bases):
    """The issue asks for at least a few hundred bad files; the examples alone give more."""
    n = 0
    for source in EXAMPLE_FILES:
        base, lay = bases(source)
        n += sum(len(make(lay, base, 0)) for make in FAMILIES.values())
    assert n >= 300
