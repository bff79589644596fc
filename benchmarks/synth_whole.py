"""Make a header-only GGUF whole for llama-bench: same header, zero tensor data.

The header-only examples (``examples/*.gguf``) keep only ``tokenizer.ggml.model`` of the
tokenizer; llama.cpp's vocabulary loader (src/llama-vocab.cpp, ``llama_vocab::impl::load``)
refuses a file without ``tokenizer.ggml.tokens`` unless the model is ``"none"``, in which
case it adds ``<arch>.vocab_size`` dummy tokens -- which is all llama-bench needs (it feeds
random token ids). So the copy has ``tokenizer.ggml.model = "none"``, the header is padded
to the file's alignment again, and the file is extended (sparse: no disk blocks) to the
data size the tensor infos give. Tensor offsets are relative to the data section, so they
stay valid. Use a temporary directory and delete the file after.
"""
from __future__ import annotations

import struct
import sys
from pathlib import Path

from graphcost.format.gguf_reader import read_header

_KEY = b"tokenizer.ggml.model"
_STRING = 8                       # GGUFValueType.STRING


def make_whole(src: str | Path, dst: str | Path, *, vocab_none: bool = True) -> Path:
    """Write ``dst``: ``src``'s header (tokenizer model ``"none"`` if ``vocab_none``) and
    zero (sparse) tensor data of the size its tensor infos give. Returns ``dst``."""
    h = read_header(src)
    head = Path(src).read_bytes()[:h.data_offset]
    data_size = max(t.offset + t.nbytes for t in h.tensors.values())
    if vocab_none:
        key = struct.pack("<Q", len(_KEY)) + _KEY
        at = head.index(key) + len(key)
        vtype, n = struct.unpack_from("<IQ", head, at)
        assert vtype == _STRING, "tokenizer.ggml.model is not a string"
        end = at + 12 + n
        body = head[:at] + struct.pack("<IQ", _STRING, 4) + b"none" + head[end:]
        # the old padding is still at the end of body; recompute it from the tensor-info end
        ti_end = len(body) - (h.data_offset - _tensor_info_end(head, h))
        body = body[:ti_end]
        body += b"\0" * ((-len(body)) % h.alignment)
        head = body
    dst = Path(dst)
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(len(head) + data_size)
    return dst


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




def fill_random(path: str | Path, seed: int = 0) -> Path:
    """Overwrite every tensor of the whole file ``path`` with small finite random values
    (graphcost.execute.executor._random_raw: the executor's random weights), in place."""
    import numpy as np

    from graphcost.execute.executor import _random_raw

    h = read_header(path)
    rng = np.random.default_rng(seed)
    with open(path, "r+b") as f:
        for t in h.tensors.values():
            f.seek(h.data_offset + t.offset)
            f.write(_random_raw(t.type, t.ne, rng).tobytes())
    return Path(path)


if __name__ == "__main__":
    print(make_whole(sys.argv[1], sys.argv[2]))
