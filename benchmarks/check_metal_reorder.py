"""Check graphcost's Metal graph_optimize against ggml's own C++ code, without an Apple GPU.

    python benchmarks/check_metal_reorder.py --src /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --lib ~/.cache/graphcost/llama-tools-0.3.36-build/bin

ggml-metal-common.cpp (``ggml_graph_optimize``, its memory ranges and reorder) and
ggml-metal-fusion.cpp (the fusion table, ``ggml_metal_fusion_max``,
``ggml_metal_fusion_add_alloc_deps``) are plain C++: they are compiled with
benchmarks/check_metal_reorder.cpp against ``--src`` and linked with a built
``libggml-base.so`` (``--lib``: the llama.cpp tools build, graphcost.judge.llama_tools). For
each fixture model and setting below the graph graphcost builds (one step of 7 tokens, as one
split, graph outputs flagged, the weights in a buffer of usage WEIGHTS and each KV cache or
recurrent state in a buffer of its own, K then V per layer: :func:`memory`) is rebuilt with
ggml tensors; the harness prints the allocation dependencies and the node order
ggml computes, and each node's allocation size on Metal (ggml-metal.cpp
``ggml_backend_metal_buffer_type_get_alloc_size``'s switch over ggml-metal-ops.cpp's scratch
functions, compiled too), and this script compares them with graphcost.memory.metal_fusion,
graphcost.memory.reorder and the metal spec's ``compute_alloc_size`` on the same graph. One
row per case: nodes, nodes moved, nodes with scratch, and whether the order, the
dependencies and the sizes are equal. Exit status 0 when every case is equal, 1
otherwise, 2 when the compiler, the source or the library is missing.
"""
from __future__ import annotations

import argparse
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fixtures import LLAMA64, write_llama  # noqa: E402
from fixtures_hybrid import write_qwen3next  # noqa: E402
from fixtures_moe import write_qwen3moe  # noqa: E402
from fixtures_classic import write_gpt2  # noqa: E402
from fixtures_deepseek import write_glm4moe  # noqa: E402
from graphcost.graph.build import build_graph, load_model, resolve_for  # noqa: E402
from graphcost.graph.ggml_graph import Tensor  # noqa: E402
from graphcost.graph.ops import Op  # noqa: E402
from graphcost.graph.settings import RunSettings  # noqa: E402
from graphcost.memory.alloc_deps import SplitGraph, use_counts  # noqa: E402
from graphcost.memory.backends import load as load_backend  # noqa: E402
from graphcost.memory.op_rules import compute_alloc_size  # noqa: E402
from graphcost.memory.metal_fusion import raw_pattern_deps  # noqa: E402
from graphcost.memory.plan import graph_outputs  # noqa: E402
from graphcost.memory.reorder import metal_graph_optimize  # noqa: E402

HARNESS = Path(__file__).with_suffix(".cpp")
#: (name, writer, writer arguments, run settings, tokens in the step)
CASES = [
    ("llama fa=off", write_llama, dict(n_layer=2), dict(flash_attn="off"), 7),
    ("llama fa=on", write_llama, dict(n_layer=2), dict(flash_attn="on"), 7),
    ("llama fa=on, 1 token", write_llama, dict(n_layer=2), dict(flash_attn="on"), 1),
    ("llama64 q8_0 cache", write_llama, dict(LLAMA64, n_layer=2),
     dict(flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0"), 7),
    ("llama64 q8_0 cache, 64 tokens", write_llama, dict(LLAMA64, n_layer=2),
     dict(flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0"), 64),
    ("gpt2 (layer norm + bias)", write_gpt2, dict(n_layer=2), dict(flash_attn="off"), 7),
    ("qwen3moe", write_qwen3moe, dict(n_layer=2), dict(flash_attn="on"), 7),
    ("qwen3moe, 64 tokens", write_qwen3moe, dict(n_layer=2), dict(flash_attn="on"), 64),
    ("glm4moe (sigmoid routing)", write_glm4moe, dict(n_expert=8), dict(flash_attn="on"), 7),
    ("qwen3next (gated delta net)", write_qwen3next, {}, dict(flash_attn="on"), 7),
]


def _f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def _params(t: Tensor) -> list[int]:
    """The int32 op_params the structural checks read: SOFT_MAX's scale and max_bias
    (floats 0, 1), GATED_DELTA_NET's K (int 0)."""
    if t.op == Op.SOFT_MAX:
        return [_f32_bits(t.params.get("scale", 1.0)), _f32_bits(t.params.get("max_bias", 0.0))]
    if t.op == Op.GATED_DELTA_NET:
        return [int(t.params.get("K", 1))]
    return []


def memory(bg) -> dict[int, tuple[int, int]]:
    """Where the tensors that have memory before allocation live, by id: (buffer, offset).
    Buffer 0 holds the weights, each at its own offset; buffer k >= 1 the k-th cache or
    state, its tensors per layer K then V (R then S) at offsets padded to 32 (as
    graphcost.memory.sched._cache_addresses lays out a Metal KV buffer)."""
    out: dict[int, tuple[int, int]] = {}
    for k, c in enumerate(list(bg.caches) + list(bg.states), start=1):
        first, second = (c.k, c.v) if hasattr(c, "k") else (c.r, c.s)
        off = 0
        for il in sorted(set(first) | set(second)):
            for t in (first.get(il), second.get(il)):
                if t is not None and id(t.storage) not in out:
                    out[id(t.storage)] = (k, off)
                    off += -(-t.nbytes // 32) * 32
    off = 0
    for n in bg.nodes:
        for s in n.src:
            if s is not None and s.role == "weight" and s.view_src is None and id(s) not in out:
                out[id(s)] = (0, off)
                off += -(-s.nbytes // 32) * 32
    return out


def serialize(nodes: list[Tensor], outputs: set[int],
              mem: dict[int, tuple[int, int]]) -> tuple[str, dict[int, int]]:
    """The harness's input for this node list, and id(tensor) -> its number there."""
    ids: dict[int, int] = {}
    order: list[Tensor] = []

    def visit(t: Tensor) -> None:
        if id(t) in ids:
            return
        ids[id(t)] = len(order)
        order.append(t)
        for s in t.src:
            if s is not None:
                visit(s)
        if t.view_src is not None:
            visit(t.view_src)
    for n in nodes:
        visit(n)
    lines = [str(len(order))]
    for t in order:
        p = _params(t)
        srcs = [ids[id(s)] if s is not None else -1 for s in t.src]
        vs = ids[id(t.view_src)] if t.view_src is not None else -1
        buf, offs = mem.get(id(t), (-1, 0))
        lines.append(" ".join(map(str, [ids[id(t)], t.op, int(t.type), *t.ne, *t.nb, vs, t.view_offs,
                                        int(id(t) in outputs), buf, offs, len(p), *p,
                                        len(srcs), *srcs])))
    lines.append(str(len(nodes)))
    lines.append(" ".join(str(ids[id(n)]) for n in nodes))
    return "\n".join(lines) + "\n", ids


def build(src: Path, lib: Path, out: Path) -> Path:
    """Compile the harness with the ggml-metal C++ files against ``src``. ggml-metal-ops.cpp's
    encoders call into the Objective-C device code, which cannot be built here: the symbols
    the first link misses become stubs that abort (never called: only the scratch-size
    functions run), and the harness is linked again with them."""
    g = src / "ggml"
    exe = out / "check_metal_reorder"
    metal = g / "src" / "ggml-metal"
    cmd = ["g++", "-std=c++17", "-O1", "-w", f"-I{g / 'include'}", f"-I{g / 'src'}", f"-I{metal}",
           str(HARNESS), *(str(metal / f) for f in ("ggml-metal-common.cpp", "ggml-metal-fusion.cpp",
                                                     "ggml-metal-ops.cpp")),
           f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}", "-Wl,--no-demangle", "-o", str(exe)]
    first = subprocess.run(cmd, capture_output=True, text=True)
    if first.returncode == 0:
        return exe
    missing = sorted(set(re.findall(r"undefined reference to `([^']+)'", first.stderr)))
    if not missing:
        raise RuntimeError(first.stderr)
    stubs = out / "stubs.c"
    stubs.write_text("#include <stdlib.h>\n" + "".join(
        f'void stub_{i}(void) __asm__("{name}");\nvoid stub_{i}(void) {{ abort(); }}\n'
        for i, name in enumerate(missing)))
    subprocess.run(["gcc", "-c", "-o", str(out / "stubs.o"), str(stubs)], check=True)
    subprocess.run(cmd[:-2] + [str(out / "stubs.o"), "-o", str(exe)], check=True)
    return exe


def run_harness(exe: Path, text: str) -> tuple[list[tuple[int, int]], list[int], dict[int, int]]:
    """A harness's answer for one graph: its "dep T U" pairs, its "order" and its
    "size ID BYTES" lines."""
    r = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
    deps, order, sizes = [], [], {}
    for line in r.stdout.splitlines():
        head, *rest = line.split()
        if head == "size":
            sizes[int(rest[0])] = int(rest[1])
        elif head == "dep":
            deps.append((int(rest[0]), int(rest[1])))
        elif head == "order":
            order = [int(x) for x in rest]
    return deps, order, sizes


def split_of(nodes: list[Tensor], outputs: set[int], mem: dict) -> SplitGraph:
    """The graph as one split, the weights (buffer 0 of :func:`memory`) as weights."""
    weights = {i for i, (buf, _) in mem.items() if buf == 0}
    return SplitGraph(list(nodes), None, use_counts(nodes), outputs, weights)


def ask(exe: Path, bg):
    """One built graph as one split, its weights and caches in buffers (:func:`memory`):
    (id(tensor) -> its number, the harness's (deps, order, sizes), the split for graphcost's
    side, the memory)."""
    outputs = {id(t) for t in graph_outputs(bg.nodes)}
    mem = memory(bg)
    text, ids = serialize(bg.nodes, outputs, mem)
    return ids, run_harness(exe, text), split_of(bg.nodes, outputs, mem), mem


def compare(exe: Path, bg) -> tuple[bool, bool, int, int, bool]:
    """(order equal, deps equal, nodes moved, nodes with scratch, every node's Metal alloc
    size equal) for one built graph taken as one Metal split, its weights and caches in
    buffers (:func:`memory`)."""
    nodes = bg.nodes
    ids, (c_deps, c_order, c_size), g, mem = ask(exe, bg)

    def address(t: Tensor):
        if id(t) not in mem:
            return None
        buf, off = mem[id(t)]
        return (buf, off, off + t.nbytes)
    py_deps = [(ids[id(t)], ids[id(u)]) for t, u in raw_pattern_deps(g, {})]
    py_order = [ids[id(n)] for n in metal_graph_optimize(g, address, {})]
    moved = sum(1 for a, b in zip(py_order, (ids[id(n)] for n in nodes)) if a != b)
    rule = load_backend("metal").compute_alloc_size
    py_size = {ids[id(n)]: compute_alloc_size(rule, n, {}) for n in nodes}
    scratch = sum(1 for n in nodes if py_size[ids[id(n)]] != n.nbytes)
    return py_order == c_order, py_deps == c_deps, moved, scratch, py_size == c_size


def parse_args(doc: str, argv: list[str] | None, needs: Path) -> argparse.Namespace | None:
    """--src and --lib; None (after one line on stderr) when g++, ``--src``/``needs`` or
    ``--lib``'s libggml-base.so is missing."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--src", type=Path, required=True, help="the vendored llama.cpp directory")
    ap.add_argument("--lib", type=Path, required=True, help="a directory with libggml-base.so")
    a = ap.parse_args(argv)
    if not shutil.which("g++") or not (a.src / needs).is_file() or not (a.lib / "libggml-base.so").exists():
        print(f"needs g++, --src with {needs} and --lib with libggml-base.so", file=sys.stderr)
        return None
    return a


def case_graphs(cases: list, tmp: Path):
    """(name, built graph) of each case: (name, writer, writer arguments, run settings,
    tokens), one step of that many tokens at -c 512."""
    for name, writer, kw, run_kw, tokens in cases:
        m = load_model(writer(tmp / f"{name.split()[0]}.gguf", **kw).path)
        run = resolve_for(m, RunSettings(ctx_size=512, **run_kw))
        yield name, build_graph(m, run.step(tokens, 0, tokens))


def compile_harness(harness: Path, src: Path, lib: Path, out: Path,
                    includes: dict[str, str] | None = None) -> Path:
    """g++ ``harness`` against ``src``'s ggml headers, linked with ``lib``'s libggml-base.so,
    into ``out``; ``includes``: files (name -> text) written to ``out`` first, for the
    harness to include."""
    g = src / "ggml"
    for name, text in (includes or {}).items():
        (out / name).write_text(text)
    exe = out / harness.stem
    subprocess.run(["g++", "-std=c++17", "-O1", "-w", f"-I{g / 'include'}", f"-I{g / 'src'}", f"-I{out}",
                    str(harness), f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}", "-o", str(exe)],
                   check=True)
    return exe


def copy_function(code: list[str], head: str) -> str:
    """A function's text, verbatim: from the line that starts with ``head`` to the first
    line that is ``}``."""
    start = next(i for i, ln in enumerate(code) if ln.startswith(head))
    end = next(i for i in range(start, len(code)) if code[i] == "}")
    return "\n".join(code[start:end + 1])


def run_cases(doc: str, argv: list[str] | None, needs: Path, build_exe, cases: list,
              header: str, check_case) -> int:
    """A check's main: its arguments (:func:`parse_args`), its harness built in a temporary
    directory (``build_exe(src, lib, dir)``), the header, then ``check_case(exe, name, bg)``
    (prints its rows, returns whether all are equal) for each case's graph. Exit status 0
    when every case is equal, 1 otherwise, 2 when something is missing."""
    a = parse_args(doc, argv, needs)
    if a is None:
        return 2
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_exe(a.src, a.lib, Path(tmp))
        print(header)
        for name, bg in case_graphs(cases, Path(tmp)):
            ok &= check_case(exe, name, bg)
    return 0 if ok else 1


def _check_case(exe: Path, name: str, bg) -> bool:
    same_order, same_deps, moved, scratch, same_sizes = compare(exe, bg)

    def word(b: bool) -> str:
        return "equal " if b else "DIFFERS"
    print(f"{name:36} {len(bg.nodes):6} {moved:6} {scratch:7}  {word(same_order)} "
          f"{word(same_deps)} {word(same_sizes)}")
    return same_order and same_deps and same_sizes


def main(argv: list[str] | None = None) -> int:
    return run_cases(__doc__, argv, Path("ggml/src/ggml-metal/ggml-metal-common.cpp"), build, CASES,
                     f"{'case':36} {'nodes':>6} {'moved':>6} {'scratch':>7}  order  deps   sizes",
                     _check_case)


if __name__ == "__main__":
    sys.exit(main())
