// Differential check of graphcost's transcription of Vulkan's graph_optimize
// (graphcost/memory/reorder_vulkan.py) against ggml's own code, without Vulkan: the functions
// it needs do not touch the device, but ggml-vulkan.cpp and ggml-vulkan-types.h include the
// Vulkan headers, so benchmarks/check_vulkan_reorder.py copies their text into
// vk_extracted.inc (the fusion patterns of ggml-vulkan-types.h, ggml_vk_unary_mul_op_index,
// ggml_vk_can_fuse_unary_mul and ggml_vk_graph_optimize, verbatim) and this file includes it
// beside a context stub whose device has only disable_graph_optimize (false). Reads a graph
// as text on stdin (ggml_graph_text.h), prints the add_alloc_dep (tensor, until) pairs and
// the node order ggml_vk_graph_optimize leaves.
#include "ggml_graph_text.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <set>
#include <vector>

#define VK_LOG_DEBUG(msg) ((void) 0)

struct vk_device_stub { bool disable_graph_optimize = false; };
struct ggml_backend_vk_context { vk_device_stub * device; };

#include "vk_extracted.inc"

int main() {
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    if (int rc = read_graph(&ctx, &gf)) return rc;
    vk_device_stub device;
    ggml_backend_vk_context vk = { &device };
    ggml_backend backend = {};
    backend.context = &vk;
    ggml_backend_graph_optimize_params params = { print_dep, nullptr };
    ggml_vk_graph_optimize(&backend, gf, &params);
    print_order(gf);
    ggml_free(ctx);
    return 0;
}
