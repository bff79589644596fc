"""Check graphcost's Vulkan ``supports_op`` rules (specs/backends/vulkan.yaml) against ggml's
own ``ggml_backend_vk_device_supports_op``, without a Vulkan GPU or the Vulkan headers.

    python benchmarks/check_vulkan_supports_op.py --src /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --lib ~/.cache/graphcost/llama-tools-0.3.36-build/bin

The function and the helpers it calls are copied verbatim from ``--src`` (:func:`extract`)
and compiled by benchmarks/check_vulkan_supports_op.cpp beside a stub device holding only
the fields the function reads, set from the device options (:data:`OPTIONS`). For each
fixture graph (check_metal_reorder's cases) and each option set, every node is asked of
both; one row per case and option set: nodes, nodes Vulkan refuses, and whether every
answer is equal (a node graphcost reports as not modelled is counted apart). Exit status 0
when all are, 1 otherwise, 2 when the compiler, the source or the library is missing.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from check_metal_reorder import (CASES, compile_harness, copy_function, memory,  # noqa: E402
                                 run_cases, serialize)
from graphcost.memory.backends import load as load_backend  # noqa: E402
from graphcost.memory.op_rules import Unmodelled, evaluate  # noqa: E402
from graphcost.memory.plan import graph_outputs  # noqa: E402

HARNESS = Path(__file__).with_suffix(".cpp")
#: device option sets (specs/backends/vulkan.yaml device_options), the defaults first
OPTIONS = [{}, {"subgroup_shuffle": "0", "coopmat2": "0"}, {"subgroup_shuffle": "0"},
           {"storage_range": "100000"}, {"storage_range": "100000", "int64_indexing": "1"},
           {"max_buffer": "100000", "int64_indexing": "1"}, {"mul_mat_id": "0"},
           {"memory_model": "0"}, {"full_subgroups": "0"}, {"subgroup_basic": "0"},
           {"shared_memory": "512"}]
#: ggml-vulkan.cpp functions copied, by the start of their definition
FUNCTIONS = ("bool ggml_vk_concat_supported(", "bool ggml_vk_lightning_indexer_k_type_supported(",
             "bool ggml_vk_dim01_contiguous(", "static bool ggml_backend_vk_device_supports_op(")


def extract(src: Path) -> tuple[str, str]:
    """(the constants: ggml-vulkan-types.h's ``num_*`` pipeline counts and
    ``lightning_indexer_k_types``; the :data:`FUNCTIONS` of ggml-vulkan.cpp), verbatim."""
    vk = src / "ggml" / "src" / "ggml-vulkan"
    types = (vk / "ggml-vulkan-types.h").read_text()
    consts = re.findall(r"^static constexpr uint32_t num_\w+ = \d+;$", types, re.M)
    consts += re.findall(r"^static constexpr std::array<ggml_type, \d+> lightning_indexer_k_types = .*?};$",
                         types, re.M | re.S)
    code = (vk / "ggml-vulkan.cpp").read_text().splitlines()
    return "\n".join(consts) + "\n", "\n\n".join(copy_function(code, h) for h in FUNCTIONS) + "\n"


def build(src: Path, lib: Path, out: Path) -> Path:
    consts, funcs = extract(src)
    return compile_harness(HARNESS, src, lib, out,
                           {"vk_constants.inc": consts, "vk_supports_op.inc": funcs})


def graphcost_supports(node, options: dict) -> bool | None:
    """The vulkan spec's require rule, then the op's rule (None: not modelled)."""
    rules = load_backend("vulkan").supports_op
    try:
        return (evaluate(rules["require"], node, options, "vulkan")
                and evaluate(rules["ops"].get(str(node.op), rules["default"]), node, options, "vulkan"))
    except Unmodelled:
        return None


def _check_case(exe: Path, name: str, bg) -> bool:
    nodes = bg.nodes
    text, ids = serialize(nodes, {id(t) for t in graph_outputs(nodes)}, memory(bg))
    ok = True
    for opts in OPTIONS:
        args = [f"{k}={v}" for k, v in opts.items()]
        out = subprocess.run([str(exe), *args], input=text, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        c = {int(ln.split()[1]): ln.split()[2] == "1" for ln in out if ln.startswith("op ")}
        py = {ids[id(n)]: graphcost_supports(n, opts) for n in nodes}
        diff = [k for k in py if py[k] is not None and py[k] != c[k]]
        unmodelled = sum(1 for v in py.values() if v is None)
        refused = sum(1 for v in c.values() if not v)
        ok &= not diff
        label = ",".join(args) or "defaults"
        print(f"{name:30} {label:44} {len(nodes):5} {refused:7} {unmodelled:4}  "
              f"{'equal' if not diff else 'DIFFERS: ' + ', '.join(f'{nodes[i].op} {nodes[i].name}' for i in range(len(nodes)) if ids[id(nodes[i])] in diff[:3])}")
    return ok


def main(argv: list[str] | None = None) -> int:
    return run_cases(__doc__, argv, Path("ggml/src/ggml-vulkan/ggml-vulkan.cpp"), build, CASES,
                     f"{'case':30} {'options':44} {'nodes':>5} {'refused':>7} {'n/m':>4}  answers",
                     _check_case)


if __name__ == "__main__":
    sys.exit(main())
