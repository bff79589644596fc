"""Check graphcost's ggml-alloc mirror with a maximum buffer size (a compute buffer split
into chunks, as for Vulkan's 1 GiB suballocation block) against ggml-alloc.c itself.

    python benchmarks/check_alloc_chunks.py --src /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --lib ~/.cache/graphcost/llama-tools-0.3.36-build/bin

benchmarks/check_alloc_chunks.cpp is compiled against ``--src``'s headers and linked with a
built ``libggml-base.so`` (``--lib``: the llama.cpp tools build), whose ggml-alloc.c does the
allocating. For each fixture model and setting below, graphcost's graph of one step (as one
buffer type; weights and caches with memory of their own: check_metal_reorder.memory),
in its built order and in the order ggml_vk_graph_optimize gives it
(graphcost.memory.reorder_vulkan), goes to the harness, which reports the buffer size
``ggml_gallocr_reserve_n_size`` gives for each (alignment, max size) of :data:`LIMITS`;
graphcost.memory.alloc.allocate does the same with ``max_sizes``. One row per case and
order: nodes, the largest single tensor, and whether every size is equal; then one row for
sched_reserve's sequence (the case's graph, a 1-token graph, the case's graph again, reserved
in turn on one allocator, ``ggml_gallocr_reserve_n``): whether the buffer size after each
equals graphcost.memory.alloc.reserved_chunks's, for every limit. Exit status 0 when all
are, 1 otherwise, 2 when the compiler, the source or the library is missing.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from check_metal_reorder import compile_harness, memory, run_cases, serialize, split_of  # noqa: E402
from fixtures import write_llama  # noqa: E402
from fixtures_classic import write_gpt2  # noqa: E402
from fixtures_moe import write_qwen3moe  # noqa: E402
from graphcost.graph.build import build_graph  # noqa: E402
from graphcost.memory.alloc import allocate, reserved_chunks  # noqa: E402
from graphcost.memory.plan import graph_outputs  # noqa: E402
from graphcost.memory.reorder_vulkan import vulkan_graph_optimize  # noqa: E402

HARNESS = Path(__file__).with_suffix(".cpp")
#: (alignment, max size; 0: SIZE_MAX): no chunks, then chunks from several to one per tensor
LIMITS = [(64, 0), (64, 4 << 20), (64, 1 << 20), (64, 256 << 10), (32, 100_000), (64, 4096)]
#: (name, writer, writer arguments, run settings, tokens in the step)
CASES = [
    ("llama fa=off, 512 tokens", write_llama, dict(n_layer=2), dict(flash_attn="off"), 512),
    ("llama fa=on, 512 tokens", write_llama, dict(n_layer=2), dict(flash_attn="on"), 512),
    ("llama fa=off, 7 tokens", write_llama, dict(n_layer=2), dict(flash_attn="off"), 7),
    ("gpt2, 256 tokens", write_gpt2, dict(n_layer=2), dict(flash_attn="off"), 256),
    ("qwen3moe, 64 tokens", write_qwen3moe, dict(n_layer=2), dict(flash_attn="on"), 64),
]


def build(src: Path, lib: Path, out: Path) -> Path:
    return compile_harness(HARNESS, src, lib, out)


class Graph:
    """One graph as the harness and graphcost's allocator see it: its text, graph outputs,
    tensors with memory of their own, and the leaf order ggml builds (asked of the harness)."""

    def __init__(self, exe: Path, bg, nodes) -> None:
        self.nodes = nodes
        self.outputs = {id(t) for t in graph_outputs(nodes)}
        self.mem = memory(bg)
        self.text, ids = serialize(nodes, self.outputs, self.mem)
        by_id = {ids[id(x)]: x for t in nodes for x in [t, *t.src, t.view_src] if x is not None}
        out = run(exe, [], self.text)
        self.leafs = [by_id[int(x)] for x in out[0].split()[1:]]

    def chunks(self, align: int, max_size: int) -> tuple[int, ...]:
        """graphcost's chunk sizes for a buffer type of this alignment and max size (0: none)."""
        a = allocate(self.nodes, self.leafs, outputs=[t for t in self.nodes if id(t) in self.outputs],
                     inputs=(), external=lambda t: id(t) in self.mem, alignment=align,
                     max_sizes=[max_size or None])
        return a.chunk_sizes[0]


def run(exe: Path, args: list[str], text: str) -> list[str]:
    return subprocess.run([str(exe), *args], input=text, capture_output=True, text=True,
                          check=True).stdout.splitlines()


def compare(exe: Path, g: Graph) -> tuple[bool, list[tuple[int, int, int, int]]]:
    """Whether ggml's buffer size equals graphcost's for every limit of :data:`LIMITS`; and the
    rows (alignment, max size, ggml's bytes, graphcost's bytes)."""
    c_sizes = {}
    for line in run(exe, [str(x) for lim in LIMITS for x in lim], g.text):
        head, *rest = line.split()
        if head == "size":
            c_sizes[int(rest[0]), int(rest[1])] = int(rest[2])
    rows = [(align, m, c_sizes[align, m], sum(g.chunks(align, m))) for align, m in LIMITS]
    return all(c == p for *_, c, p in rows), rows


def compare_reserves(exe: Path, graphs: list[Graph]) -> bool:
    """sched_reserve's graphs in turn on one allocator, for every limit: after each, ggml's
    buffer size (ggml_gallocr_reserve_n then ggml_gallocr_get_buffer_size) equals the sum of
    graphcost.memory.alloc.reserved_chunks over the graphs so far."""
    text = f"{len(graphs)}\n" + "".join(g.text for g in graphs)
    for align, m in LIMITS:
        c = [int(ln.split()[1]) for ln in run(exe, ["reserve", str(align), str(m)], text)]
        chunks = [g.chunks(align, m) for g in graphs]
        if c != [sum(reserved_chunks(chunks[:k + 1])) for k in range(len(graphs))]:
            return False
    return True


def _check_case(exe: Path, name: str, bg) -> bool:
    """Both orders of one case's graph, a row each; then, on the built order, the reserve
    sequence prompt (the case), generation (1 token), prompt."""
    sg = split_of(bg.nodes, {id(t) for t in graph_outputs(bg.nodes)}, memory(bg))
    ok = True
    for order, nodes in (("built", list(bg.nodes)), ("vulkan", vulkan_graph_optimize(sg, None, {}))):
        same, rows = compare(exe, Graph(exe, bg, nodes))
        ok &= same
        largest = max(t.nbytes for t in nodes)
        sizes = " ".join(f"{c}" if c == p else f"{c}!={p}" for *_, c, p in rows)
        print(f"{name:34} {order:9} {len(nodes):6} {largest:9}  {'equal  ' if same else 'DIFFERS'} {sizes}")
    gen = build_graph(bg.model, bg.run.step(1, 0, 1))
    prompt = Graph(exe, bg, list(bg.nodes))
    same = compare_reserves(exe, [prompt, Graph(exe, gen, list(gen.nodes)), prompt])
    print(f"{name:34} {'reserve':9} {'':6} {'':9}  {'equal  ' if same else 'DIFFERS'} "
          "prompt, generation, prompt")
    return ok and same


def main(argv: list[str] | None = None) -> int:
    return run_cases(__doc__, argv, Path("ggml/src/ggml-alloc.c"), build, CASES,
                     f"{'case':34} {'order':9} {'nodes':>6} {'largest':>9}  sizes (ggml = graphcost, "
                     "by max size)", _check_case)


if __name__ == "__main__":
    sys.exit(main())
