"""Models for timing llama.cpp: tiny llama GGUFs and header-only GGUFs made whole.

Speed does not need trained weights, only files llama.cpp loads and runs. The header-only
examples are made whole with random data of each tensor's type (:func:`fill_tiled`):
decode with all-zero data ran faster than with the real file's data, random data ran at
its speed (benchmarks/value_check.py; docs/speed.md, "Values"). The tiny models keep zero
weights (their 64-wide matmuls are a negligible part of a step). Neither has a real
vocabulary: ``tokenizer.ggml.model`` is ``"none"``, for which llama.cpp's vocabulary loader
(src/llama-vocab.cpp, ``llama_vocab::impl::load``) adds ``<arch>.vocab_size`` dummy tokens
-- all llama-bench needs, as it feeds random token ids. Write them in a temporary
directory and delete them after (graphcost.calibrate does).
"""
from __future__ import annotations

import struct
from pathlib import Path

from graphcost.errors import UnsupportedError
from graphcost.format.gguf_reader import read_header

_KEY = b"tokenizer.ggml.model"


def make_whole(src: str | Path, dst: str | Path, *, vocab_none: bool = True,
               data: str = "random", seed: int = 0) -> Path:
    """Write ``dst``: ``src``'s header (tokenizer model ``"none"`` if ``vocab_none``) and
    tensor data of the size its tensor infos give: ``data="random"``, every tensor
    :func:`fill_tiled`'s random values; ``"zero"``, zeros (sparse: no disk blocks). Tensor
    offsets are relative to the data section, so they stay valid; the header is padded to
    the file's alignment again. Returns ``dst``."""
    if data not in ("random", "zero"):
        raise ValueError(f"data={data!r}: 'random' or 'zero'")
    import gguf

    string = int(gguf.GGUFValueType.STRING)
    h = read_header(src)
    with open(src, "rb") as f:
        head = f.read(h.data_offset)
    data_size = max((t.offset + t.nbytes for t in h.tensors.values()), default=0)
    if vocab_none:
        key = struct.pack("<Q", len(_KEY)) + _KEY
        at = head.index(key) + len(key)
        vtype, n = struct.unpack_from("<IQ", head, at)
        if vtype != string:
            raise ValueError(f"{src}: tokenizer.ggml.model is not a string")
        end = at + 12 + n
        body = head[:at] + struct.pack("<IQ", string, 4) + b"none" + head[end:]
        # the old padding is still at the end of body; cut it at the tensor-info end
        ti_end = len(body) - (h.data_offset - _tensor_info_end(head, h))
        body = body[:ti_end]
        head = body + b"\0" * ((-len(body)) % h.alignment)
    dst = Path(dst)
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data_size)
    if data == "random":
        fill_tiled(dst, seed)
    return dst


#: bytes of random blocks drawn per tensor type; tensors of that type repeat them
POOL_BYTES = 8 << 20


def fill_tiled(path: str | Path, seed: int = 0) -> Path:
    """Overwrite every tensor of the whole GGUF ``path`` with random values of its type
    (graphcost.execute.weights.random_raw: random quant bits, finite f16 scales), in place.

    Drawing 5 GB of random numbers takes minutes, so per type one pool of about
    POOL_BYTES (an odd number of blocks) is drawn and the tensors of that type repeat it,
    each starting where the previous one stopped: as a block's size has at most 2^4 in
    it, a 4 KiB page's content repeats only every lcm(pool, 4096) >= 256 pools (2 GiB),
    and no page is all zeros. 1-D F32/F16 tensors (norms, biases) are drawn whole
    (random_raw: around 1). A type random_raw cannot draw is an UnsupportedError naming
    the file and the tensor."""
    import numpy as np

    from graphcost.execute.weights import random_raw
    from graphcost.format import ggml_types as gt

    h = read_header(path)
    rng = np.random.default_rng(seed)
    pools: dict[int, memoryview] = {}
    cursor: dict[int, int] = {}
    with open(path, "r+b") as f:
        for t in sorted(h.tensors.values(), key=lambda t: t.offset):
            f.seek(h.data_offset + t.offset)
            if len([d for d in t.ne if d > 1]) <= 1 and t.type in (gt.F32, gt.F16):
                f.write(random_raw(t.type, t.ne, rng).tobytes())
                continue
            if t.type not in pools:
                blk, size = gt.block(t.type)
                n = (POOL_BYTES // size) | 1
                try:
                    pool = random_raw(t.type, (blk, n), rng).tobytes()
                except UnsupportedError as e:
                    raise UnsupportedError(f"{path}: {t.name}: {e}") from None
                pools[t.type] = memoryview(pool + pool)      # any window <= pool: one slice
                cursor[t.type] = 0
            pool, left = pools[t.type], t.nbytes
            period = len(pool) // 2
            while left:
                k = min(left, period)
                at = cursor[t.type]
                f.write(pool[at:at + k])
                cursor[t.type] = (at + k) % period
                left -= k
    return Path(path)


def _tensor_info_end(head: bytes, h) -> int:
    """Offset where the tensor-info section ends (before the alignment padding): the
    furthest end of any tensor info (u64 name length, name, u32 n_dims, u64 ne[n_dims],
    u32 type, u64 offset)."""
    ends = []
    for t in h.tensors.values():
        nm = struct.pack("<Q", len(t.name)) + t.name.encode()
        j = head.rfind(nm) + len(nm)
        nd = struct.unpack_from("<I", head, j)[0]
        ends.append(j + 4 + 8 * nd + 4 + 8)
    return max(ends)


def write_tiny_llama(path: str | Path, *, n_layer: int, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, n_vocab: int = 300,
                     weight_type: str = "Q8_0", types: dict[str, str] | None = None) -> Path:
    """A llama-architecture GGUF with zero weights of ``weight_type`` (``types``: by tensor
    kind, e.g. ``{"attn_k": "F16"}``; F32 norms), a ``"none"`` tokenizer and ``n_vocab``
    dummy tokens, written with gguf.GGUFWriter. Matmul rows (``n_embd``, ``n_ff``) must be
    multiples of the types' block sizes."""
    import gguf
    import numpy as np

    types = dict(types or {})
    hd = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"graphcost-calibration-llama-{n_layer}x{n_embd}")
    w.add_context_length(8192)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("none")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    def matrix(name: str, ne0: int, ne1: int) -> None:
        kind = name.split(".")[-2]                       # blk.0.attn_k.weight -> attn_k
        tname = types.get(kind, weight_type)
        qt = gguf.GGMLQuantizationType[tname]
        if qt in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, np.zeros((ne1, ne0), np.float32 if tname == "F32" else np.float16))
            return
        blck, tsize = gguf.GGML_QUANT_SIZES[qt]
        if ne0 % blck:
            raise ValueError(f"{name}: row length {ne0} is not a multiple of {tname}'s "
                             f"block of {blck}")
        w.add_tensor(name, np.zeros((ne1, ne0 // blck * tsize), np.uint8), raw_dtype=qt)

    def vector(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, np.float32))

    matrix("token_embd.weight", n_embd, n_vocab)
    vector("output_norm.weight", n_embd)
    matrix("output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", n_embd)
        matrix(p + "attn_q.weight", n_embd, n_head * hd)
        matrix(p + "attn_k.weight", n_embd, n_head_kv * hd)
        matrix(p + "attn_v.weight", n_embd, n_head_kv * hd)
        matrix(p + "attn_output.weight", n_head * hd, n_embd)
        vector(p + "ffn_norm.weight", n_embd)
        matrix(p + "ffn_gate.weight", n_embd, n_ff)
        matrix(p + "ffn_up.weight", n_embd, n_ff)
        matrix(p + "ffn_down.weight", n_ff, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
