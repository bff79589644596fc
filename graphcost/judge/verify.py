"""``graphcost verify``: run the llama.cpp that is installed on the model and list where
graphcost's graph and buffers differ from it, node by node and buffer by buffer.

llama.cpp is llama-cpp-python's (:mod:`graphcost.judge.oracle`, one subprocess per question).
A header-only or partial file is padded into a sparse temporary copy (its tensor bytes
read as zeros: llama.cpp does not look at the values to build a graph or size its
buffers, and the copy costs no disk). What is compared:

* the graph of one ubatch (``cb_eval`` records: order, name, op, type, ne, source names),
  every node that differs;
* the buffers llama.cpp logs when it creates the context and frees it: the compute
  buffer (to its 4-decimal MiB), every KV cache's buffer (2 decimals) and cells, the
  output buffer (2 decimals).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from graphcost.errors import GraphcostError
from graphcost.format.ggml_types import ggml_pad
from graphcost.units import mib

if TYPE_CHECKING:
    from graphcost.graph.llm_graph import KVCache
    from graphcost.memory.plan import MemoryPlan



@dataclass(frozen=True)
class BufferRow:
    """One buffer compared, each side as llama.cpp prints it (MiB)."""

    buffer: str
    ours: str
    theirs: str

    @property
    def equal(self) -> bool:
        return self.ours == self.theirs


@dataclass
class Verification:
    """The outcome: graph differences (readable lines) and the buffer table."""

    nodes: int                      # graphcost's node count
    llama_nodes: int
    graph_differences: list[str]
    buffers: list[BufferRow]

    @property
    def equal(self) -> bool:
        return not self.graph_differences and all(b.equal for b in self.buffers)


def graph_records(bg) -> list[dict]:
    """A built graph in the oracle's record format (:func:`graphcost.judge.oracle.capture_graph`)."""
    from graphcost.format.ggml_types import type_name
    return [{"index": i, "name": n.name, "op": n.op, "type": type_name(n.type),
             "ne": list(n.ne), "src": [x.name for x in n.src]} for i, n in enumerate(bg.nodes)]


def graph_differences(ours: list[dict], theirs: list[dict], limit: int | None = None) -> list[str]:
    """Every node whose record differs, then a count mismatch; ``limit`` caps the lines
    (a last line says how many more)."""
    out = []
    for a, b in zip(ours, theirs):
        if a != b:
            fields = [k for k in ("name", "op", "type", "ne", "src") if a.get(k) != b.get(k)]
            out.append(f"node {a['index']}: " + "; ".join(
                f"{k} {a.get(k)!r} (llama.cpp {b.get(k)!r})" for k in fields))
    if len(ours) != len(theirs):
        more = ours if len(ours) > len(theirs) else theirs
        who = "graphcost" if more is ours else "llama.cpp"
        out.append(f"graphcost has {len(ours)} nodes, llama.cpp {len(theirs)}; {who} goes on "
                   f"with {more[min(len(ours), len(theirs))]['name']!r}")
    if limit is not None and len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


def first_difference(ours: list[dict], theirs: list[dict]) -> str | None:
    """None when equal; else the first differing node with llama.cpp's nodes around it."""
    for a, b in zip(ours, theirs):
        if a != b:
            lo = max(0, a["index"] - 3)
            ctx = "\n".join(f"  llama.cpp {r}" for r in theirs[lo:a["index"] + 2])
            return f"node {a['index']} differs:\n  graphcost {a}\n  llama.cpp {b}\ncontext:\n{ctx}"
    diffs = graph_differences(ours, theirs)
    return diffs[0] if diffs else None


def buffer_rows(plan: MemoryPlan, caches: list[KVCache], log: dict) -> list[BufferRow]:
    """graphcost's memory plan and KV caches against llama.cpp's parsed log."""
    rows = []
    exact = log.get("compute_buffer_exact") or []
    if exact:
        rows.append(BufferRow("CPU compute buffer (MiB)", mib(plan.compute_buffer_bytes, 4),
                              f"{exact[-1]['mib']:.4f}"))
    else:
        rows.append(BufferRow("CPU compute buffer (MiB)", mib(plan.compute_buffer_bytes, 2),
                              f"{log['compute_buffer_mib']:.2f}"))
    ours_kv, theirs_kv = caches, log.get("kv_caches", [])
    for i in range(max(len(ours_kv), len(theirs_kv))):
        a = ours_kv[i] if i < len(ours_kv) else None
        b = theirs_kv[i] if i < len(theirs_kv) else None
        label = f"KV cache {i}" + (f" ({b['which']})" if b and b.get("which") else "")
        rows.append(BufferRow(f"{label} cells", str(a.size) if a else "-",
                              str(b["cells"]) if b else "-"))
        rows.append(BufferRow(f"{label} buffer (MiB)", mib(a.bytes(), 2) if a else "-",
                              f"{b['buffer_mib']:.2f}" if b else "-"))
    if "output_buffer_mib" in log:
        rows.append(BufferRow("output buffer (MiB)", mib(plan.output_buffer_bytes, 2),
                              f"{log['output_buffer_mib']:.2f}"))
    return rows


def _with_token_list(src: Path, dest: Path, n_vocab: int) -> None:
    """Rewrite the sparse copy ``src`` as ``dest`` with a made-up SentencePiece vocabulary of
    ``n_vocab`` tokens: llama.cpp refuses a file whose tokenizer arrays were stripped (as
    in the header-only examples), and neither the graph nor the buffers depend on the
    tokens' text. Every other key and every tensor (name, shape, type, offset) is kept."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dest, None)
    for f in r.fields.values():
        if f.name.startswith(("GGUF.", "tokenizer.")):
            continue
        if f.name == gguf.Keys.General.ALIGNMENT:
            w.data_alignment = int(f.contents())
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    toks += [f"t{i}" for i in range(n_vocab - len(toks))]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (n_vocab - 259))
    end = 0
    for t in r.tensors:
        w.add_tensor_info(t.name, tuple(int(d) for d in reversed(t.shape)), np.dtype(np.float32),
                          int(t.n_bytes), raw_dtype=t.tensor_type)
        end = max(end, int(t.data_offset) - r.data_offset + int(t.n_bytes))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    size = dest.stat().st_size
    data = ggml_pad(size, w.data_alignment)
    with open(dest, "r+b") as out:
        out.truncate(data + end)


@contextlib.contextmanager
def with_tensor_data(header, n_vocab: int) -> Iterator[Path]:
    """The model's first file, with every shard whole: the file itself when its tensor
    bytes are present, else sparse copies padded with zeros in a temporary directory (a
    single file without its tokenizer arrays also gets a made-up vocabulary)."""
    if header.has_data:
        yield Path(header.path)
        return
    from graphcost.format.gguf_reader import read_header
    with tempfile.TemporaryDirectory(prefix="graphcost-verify-") as d:
        first = None
        for shard in header.shards or [header.path]:
            h = read_header(shard)
            end = max((h.data_offset + t.offset + t.nbytes for t in h.tensors.values()),
                      default=h.data_offset)
            dest = Path(d) / Path(shard).name
            with open(shard, "rb") as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
                out.truncate(max(end, h.file_size))   # a hole: no disk used
            first = first or dest
        if "tokenizer.ggml.tokens" not in header.metadata and len(header.shards or [0]) <= 1:
            _with_token_list(first, Path(d) / "with-vocab.gguf", n_vocab)
            first = Path(d) / "with-vocab.gguf"
        yield first


def verify(model_path: str | os.PathLike, settings, *, timeout: float = 900.0) -> Verification:
    """Build graphcost's graph and memory plan for ``settings`` and ask llama.cpp for its
    graph and buffers with the same settings (flash attention as ``settings`` resolves
    it); raises :class:`GraphcostError` when llama-cpp-python is missing or llama.cpp
    cannot run the model."""
    from graphcost.graph.build import build_graph, load_model
    from graphcost.memory.plan import plan_for
    from graphcost.judge.oracle import (OracleError, capture_graph, capture_log, llama_cpp_available, llama_cpp_unavailable_reason)

    if not llama_cpp_available():
        raise GraphcostError("verify needs llama-cpp-python (pip install llama-cpp-python): "
                             + llama_cpp_unavailable_reason())
    model = load_model(model_path)
    bg = build_graph(model, settings)
    plan = plan_for(bg)
    run = bg.run
    kw = dict(n_ctx=run.n_ctx, n_ubatch=run.n_ubatch, n_batch=run.n_batch,
              flash_attn=run.flash_attn, type_k=settings.cache_type_k.lower(),
              type_v=settings.cache_type_v.lower(), swa_full=settings.swa_full, past=run.past,
              tokens=run.n_tokens, n_outputs=run.n_outputs, embeddings=settings.embeddings,
              n_seq_max=run.n_seq_max, kv_unified=settings.kv_unified, timeout=timeout)
    with with_tensor_data(model.header, model.n_vocab) as path:
        try:
            theirs = capture_graph(path, **kw)
            log = capture_log(path, **kw)
        except OracleError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "failed"
            raise GraphcostError(f"{model_path}: llama.cpp could not run it: {first}") from None
    ours = graph_records(bg)
    return Verification(len(ours), len(theirs), graph_differences(ours, theirs),
                        buffer_rows(plan, bg.caches, log))


def render_verification(v: Verification, limit: int = 40) -> str:
    """Plain text: the graph verdict with the differing nodes, then the buffer table."""
    lines = []
    if v.graph_differences:
        shown = v.graph_differences[:limit]
        lines.append(f"graph: DIFFERS ({len(v.graph_differences)} differences; graphcost "
                     f"{v.nodes} nodes, llama.cpp {v.llama_nodes})")
        lines += [f"  {d}" for d in shown]
        if len(v.graph_differences) > limit:
            lines.append(f"  ... and {len(v.graph_differences) - limit} more")
    else:
        lines.append(f"graph: equal ({v.nodes} nodes, node for node)")
    w = max(len(b.buffer) for b in v.buffers)
    lines.append(f"{'buffer':{w}s}  {'graphcost':>12s}  {'llama.cpp':>12s}")
    for b in v.buffers:
        lines.append(f"{b.buffer:{w}s}  {b.ours:>12s}  {b.theirs:>12s}  "
                     f"{'equal' if b.equal else 'DIFFERS'}")
    lines.append("verdict: " + ("equal" if v.equal else "differs"))
    return "\n".join(lines) + "\n"
