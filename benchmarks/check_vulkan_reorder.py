"""Check graphcost's Vulkan graph_optimize (graphcost.memory.reorder_vulkan) against ggml's own
C++ code, without a Vulkan GPU or the Vulkan headers.

    python benchmarks/check_vulkan_reorder.py --src /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --lib ~/.cache/graphcost/llama-tools-0.3.36-build/bin

``ggml_vk_graph_optimize`` and what it calls (``ggml_vk_can_fuse_unary_mul``,
``ggml_vk_unary_mul_op_index``, the fusion patterns of ggml-vulkan-types.h) use no Vulkan
call, but their files include the Vulkan headers: their text is copied verbatim from
``--src`` (:func:`extract`) into an include file that benchmarks/check_vulkan_reorder.cpp
compiles beside a stub context, linked with a built ``libggml-base.so`` (``--lib``:
``ggml_can_fuse_subgraph_ext`` and the rest of ggml). For each fixture model and setting
(check_metal_reorder's cases: graphcost's graph of one step as one split), the harness
prints the allocation dependencies and the node order ggml computes, and this script
compares them with graphcost's. One row per case: nodes, nodes moved, dependencies, and
whether the order and the dependencies are equal. Exit status 0 when every case is equal, 1
otherwise, 2 when the compiler, the source or the library is missing.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from check_metal_reorder import CASES, ask, compile_harness, copy_function, run_cases  # noqa: E402
from graphcost.memory.reorder_vulkan import vulkan_graph_optimize  # noqa: E402

HARNESS = Path(__file__).with_suffix(".cpp")
#: the functions of ggml-vulkan.cpp copied, by the start of their definition
FUNCTIONS = ("int ggml_vk_unary_mul_op_index(", "static bool ggml_vk_can_fuse_unary_mul(",
             "void ggml_vk_graph_optimize(")


def extract(src: Path) -> str:
    """The fusion patterns (every top-level ``static constexpr std::initializer_list``) of
    ggml-vulkan-types.h and the :data:`FUNCTIONS` of ggml-vulkan.cpp (from their first line to
    the first ``}`` at the start of a line), verbatim."""
    vk = src / "ggml" / "src" / "ggml-vulkan"
    types = (vk / "ggml-vulkan-types.h").read_text()
    parts = re.findall(r"^static constexpr std::initializer_list<.*?};$", types, re.M | re.S)
    code = (vk / "ggml-vulkan.cpp").read_text().splitlines()
    parts += [copy_function(code, head) for head in FUNCTIONS]
    return "\n\n".join(parts) + "\n"


def build(src: Path, lib: Path, out: Path) -> Path:
    return compile_harness(HARNESS, src, lib, out, {"vk_extracted.inc": extract(src)})


def compare(exe: Path, bg) -> tuple[bool, bool, int, int]:
    """(order equal, deps equal, nodes moved, dependencies) for one built graph taken as one
    Vulkan split, its weights and caches in buffers."""
    nodes = bg.nodes
    ids, (c_deps, c_order, _), g, _ = ask(exe, bg)
    py_order = [ids[id(n)] for n in vulkan_graph_optimize(g, None, {})]
    py_deps = [(ids[id(t)], ids[id(u)]) for t, u in g.deps]
    moved = sum(1 for a, b in zip(py_order, (ids[id(n)] for n in nodes)) if a != b)
    return py_order == c_order, py_deps == c_deps, moved, len(c_deps)


def _check_case(exe: Path, name: str, bg) -> bool:
    same_order, same_deps, moved, n_deps = compare(exe, bg)

    def word(b: bool) -> str:
        return "equal " if b else "DIFFERS"
    print(f"{name:36} {len(bg.nodes):6} {moved:6} {n_deps:5}  {word(same_order)} {word(same_deps)}")
    return same_order and same_deps


def main(argv: list[str] | None = None) -> int:
    return run_cases(__doc__, argv, Path("ggml/src/ggml-vulkan/ggml-vulkan.cpp"), build, CASES,
                     f"{'case':36} {'nodes':>6} {'moved':>6} {'deps':>5}  order  deps", _check_case)


if __name__ == "__main__":
    sys.exit(main())
