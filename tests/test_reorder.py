"""The node reorders of graph_optimize (graphcost/memory/reorder.py REORDERS): Metal's
ggml_graph_optimize (used for Metal's compute buffers; worked cases in
tests/test_devices_metal.py; checked against ggml's own C++ code, compiled from the vendored
source, when the llama.cpp tools are built) and Vulkan's ggml_vk_graph_optimize
(transcribed from ggml-vulkan.cpp, used for Vulkan's compute buffers: worked cases in
tests/test_devices_vulkan.py), worked by hand on small graphs, and checked on whole model graphs to be orders
ggml could run."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import write_llama
from fixtures_moe import write_qwen3moe
from graphcost.format import ggml_types as gt
from graphcost.graph.build import build_graph, load_model, resolve_for
from graphcost.graph.settings import RunSettings
from graphcost.memory.alloc_deps import SplitGraph, collect, use_counts
from graphcost.memory.reorder import REORDERS
from test_devices_cuda import tensor

T = gt.GGMLType


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """7-token graphs (as one split) of a 2-layer llama and qwen3moe, -fa on and off."""
    d = tmp_path_factory.mktemp("reorder")
    out = {}
    for name, writer in (("llama", write_llama), ("qwen3moe", write_qwen3moe)):
        m = load_model(writer(d / f"{name}.gguf", n_layer=2).path)
        for fa in ("on", "off"):
            out[name, fa] = build_graph(m, resolve_for(m, RunSettings(ctx_size=512, flash_attn=fa))
                                        .step(7, 0, 7)).nodes
    return out


def _split(nodes):
    return SplitGraph(list(nodes), None, use_counts(nodes), set(), set())


@pytest.mark.parametrize("backend", ["metal", "vulkan"])
@pytest.mark.parametrize("model,fa", [("llama", "on"), ("llama", "off"), ("qwen3moe", "on"),
                                      ("qwen3moe", "off")])
def test_reorders_are_orders_ggml_can_run(graphs, backend, model, fa):
    """Each reorder is a permutation of the split in which every node comes after the nodes
    it reads, and it does move nodes (the graphs have independent Q, K and V products)."""
    nodes = graphs[model, fa]
    order = REORDERS[backend](_split(nodes), lambda t: None, {})
    assert sorted(map(id, order)) == sorted(map(id, nodes))
    pos = {id(n): i for i, n in enumerate(order)}
    assert all(pos[id(s)] < pos[id(n)] for n in order for s in n.src if id(s) in pos)
    assert order != list(nodes)
    assert REORDERS[backend](_split(nodes), lambda t: None, {"graph_optimize": "0"}) == list(nodes)


def test_vulkan_reorder_worked_example():
    """ggml_vk_graph_optimize on a = RMS_NORM(x), b = a * wn, c = w1 @ b, d = SCALE(c),
    e = w2 @ b. Round 1 from a: b reads a, but RMS_NORM then MUL is a pair it fuses, so b
    joins; c, d, e read b (unused, not the pair) and stay: [a, b]. Round 2 from c: d reads
    c (MUL_MAT then SCALE is no pair), e reads only b and w2, now done: [c, e]. Round 3: d."""
    x = tensor(T.F32, (64, 4))
    wn, w1, w2 = tensor(T.F32, (64,)), tensor(T.F32, (64, 64)), tensor(T.F32, (64, 64))
    a = tensor(T.F32, (64, 4), "RMS_NORM", [x], eps=1e-6)
    b = tensor(T.F32, (64, 4), "MUL", [a, wn])
    c = tensor(T.F32, (64, 4), "MUL_MAT", [w1, b])
    d = tensor(T.F32, (64, 4), "SCALE", [c], scale=0.5)
    e = tensor(T.F32, (64, 4), "MUL_MAT", [w2, b])
    assert REORDERS["vulkan"](_split([a, b, c, d, e]), lambda t: None, {}) == [a, b, c, e, d]


def test_vulkan_reorder_on_a_layer(graphs):
    """The first rounds of layer 0 (llama, 7 tokens, -fa off): GET_ROWS alone, with the V
    cache's reshape (a view reading nothing unused); RMS_NORM + MUL; the Q, V and K
    products (each reads only attn_norm-0) with their reshapes; RoPE(Q) with the V cache
    write; then ROPE + VIEW + SET_ROWS of K kept together (a fusion pattern)."""
    order = REORDERS["vulkan"](_split(graphs["llama", "off"]), lambda t: None, {})
    names = [(n.op, n.name) for n in order]
    assert names[:7] == [("GET_ROWS", "embd"), ("RESHAPE", "cache_v_l0 (reshaped)"),
                         ("RMS_NORM", "norm-0"), ("MUL", "attn_norm-0"), ("MUL_MAT", "Qcur-0"),
                         ("MUL_MAT", "Vcur-0"), ("MUL_MAT", "Kcur-0")]
    k = names.index(("ROPE", "Kcur-0"))
    assert names[k + 1:k + 3] == [("VIEW", "Kcur-0 (view)"), ("SET_ROWS", "cache_k_l0 (view)")]
    assert names.index(("SET_ROWS", "cache_v_l0 (reshaped) (view)")) < k


def test_vulkan_topk_moe_keeps_its_logits(graphs):
    """The top-k routing (SOFT_MAX .. RESHAPE: topk_moe_early_softmax_norm) is kept whole,
    its external source, the logits, alive until its last node (add_alloc_dep)."""
    nodes = graphs["qwen3moe", "on"]
    g = _split(nodes)
    REORDERS["vulkan"](g, lambda t: None, {})
    name = {id(n): n.name for n in nodes}
    assert {name[k]: [t.name for t in v] for k, v in collect(g.deps).items()} == {
        "ffn_moe_weights_norm-0 (reshaped)": ["ffn_moe_logits-0"],
        "ffn_moe_weights_norm-1 (reshaped)": ["ffn_moe_logits-1"]}


def _ggml_source_and_lib():
    """The llama.cpp source the tools were built from (their CMakeCache.txt) and the
    directory with libggml-base.so, or the reason to skip."""
    import shutil

    from graphcost.judge.llama_tools import bin_dir
    lib = bin_dir()
    cache = lib.parent / "CMakeCache.txt"
    if not shutil.which("g++") or not (lib / "libggml-base.so").exists() or not cache.is_file():
        return None, f"needs g++ and the llama.cpp tools build with libggml-base.so in {lib}"
    for line in cache.read_text().splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:INTERNAL="):
            src = Path(line.split("=", 1)[1])
            if (src / "ggml" / "src" / "ggml-metal" / "ggml-metal-common.cpp").is_file():
                return (src, lib), None
    return None, f"{cache}: no llama.cpp source with ggml-metal"


def run_ggml_check(name: str, capsys):
    """Run benchmarks/NAME.py against the tools build's source and libggml-base.so (skipped
    when not built); asserts exit 0; returns the module and its table's rows."""
    import importlib.util
    found, why = _ggml_source_and_lib()
    if found is None:
        pytest.skip(why)
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    src, lib = found
    assert check.main(["--src", str(src), "--lib", str(lib)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    return check, [ln for ln in out.splitlines()[1:] if ln.strip()]


def test_metal_reorder_equals_ggmls_own_code(capsys):
    """benchmarks/check_metal_reorder.py: ggml-metal-common.cpp, ggml-metal-fusion.cpp and
    ggml-metal-ops.cpp's scratch sizes (plain C++) compiled against the vendored source and
    run on graphcost's graphs in 10 cases (llama with and without flash attention, 1 and 7
    tokens, a q8_0 cache at 7 and 64 tokens, gpt2's layer norms, three MoE routings,
    qwen3next's gated delta net; weights and caches in buffers): every node order, every
    allocation dependency and every node's Metal allocation size equals graphcost's."""
    check, rows = run_ggml_check("check_metal_reorder", capsys)
    assert len(rows) == len(check.CASES) == 10
    assert all(ln.split()[-3:] == ["equal", "equal", "equal"] for ln in rows), rows


def test_vulkan_reorder_equals_ggmls_own_code(capsys):
    """benchmarks/check_vulkan_reorder.py: ggml_vk_graph_optimize, ggml_vk_can_fuse_unary_mul,
    ggml_vk_unary_mul_op_index and the fusion patterns, copied verbatim from the vendored
    ggml-vulkan source (which needs no Vulkan call, only the Vulkan headers its files
    include) and compiled against libggml-base.so, run on the same 10 graphs: every node
    order and every allocation dependency (the top-k MoE routings of qwen3moe and glm4moe,
    qwen3next's) equals graphcost's."""
    check, rows = run_ggml_check("check_vulkan_reorder", capsys)
    assert len(rows) == len(check.CASES) == 10
    assert all(ln.split()[-2:] == ["equal", "equal"] for ln in rows), rows
    assert sum(int(ln.split()[-3]) for ln in rows) == 2 + 2 + 4 + 4  # deps: the MoE cases
