// Differential check of graphcost's Vulkan supports_op rules (specs/backends/vulkan.yaml,
// graphcost/memory/op_rules.py) against ggml's own ggml_backend_vk_device_supports_op,
// without Vulkan: benchmarks/check_vulkan_supports_op.py copies its text, with
// ggml_vk_dim01_contiguous, ggml_vk_concat_supported,
// ggml_vk_lightning_indexer_k_type_supported and the constants of ggml-vulkan-types.h they
// read, verbatim into vk_constants.inc and vk_supports_op.inc; this file gives them a device
// with only the fields the function reads, set from the command line (NAME=VALUE, the
// device options of specs/backends/vulkan.yaml, with the same defaults; the pipelines the
// function asks for exist as ggml_vk_load_shaders would make them). Reads a graph as text
// on stdin (ggml_graph_text.h) and prints "op ID 0|1" for each node.
#include "ggml_graph_text.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>

#define UNUSED(x) (void)(x)

#include "vk_constants.inc"

struct vk_limits_stub {
    uint64_t maxStorageBufferRange = 4294967295ull;
    uint32_t maxComputeSharedMemorySize = 49152;
    uint64_t minStorageBufferOffsetAlignment = 64;
};
struct vk_properties_stub { vk_limits_stub limits; };
struct vk_pipeline_struct {};
using vk_pipeline = std::shared_ptr<vk_pipeline_struct>;
struct vk_device_struct {
    bool shader_int64 = true, buffer_device_address = true, shader_64b_indexing = false;
    uint64_t max_buffer_size = UINT64_MAX;
    vk_properties_stub properties;
    bool mul_mat_id_s[GGML_TYPE_COUNT], mul_mat_id_m[GGML_TYPE_COUNT], mul_mat_id_l[GGML_TYPE_COUNT];
    bool coopmat2 = true, subgroup_shuffle = true, subgroup_vote = true, vulkan_memory_model = true;
    uint32_t max_workgroup_size_log2 = 10, subgroup_size = 32, subgroup_size_log2 = 5;
    vk_pipeline pipeline_topk_f32[num_topk_pipelines];
    vk_pipeline pipeline_topk_radix_f32, pipeline_dsv4_hc_comb_f32;
    bool subgroup_arithmetic = true, subgroup_require_full_support = true, fp16 = true, subgroup_basic = true;
};
using vk_device = std::shared_ptr<vk_device_struct>;
static vk_device g_device = std::make_shared<vk_device_struct>();
static const vk_device & ggml_vk_get_device(size_t) { return g_device; }
struct ggml_backend_vk_device_context { size_t device; };
uint64_t vk_tensor_offset(const ggml_tensor *) { abort(); }  // LIGHTNING_INDEXER only

#include "vk_supports_op.inc"

static void configure(int argc, char ** argv) {
    vk_device_struct & d = *g_device;
    bool mmid = true;
    for (int a = 1; a < argc; a++) {
        std::string arg = argv[a];
        size_t eq = arg.find('=');
        std::string k = arg.substr(0, eq);
        unsigned long long v = strtoull(arg.c_str() + eq + 1, nullptr, 0);
        if (k == "storage_range") d.properties.limits.maxStorageBufferRange = v;
        else if (k == "max_buffer") d.max_buffer_size = v;
        else if (k == "int64_indexing") d.shader_64b_indexing = v;
        else if (k == "bda") d.shader_int64 = d.buffer_device_address = v;
        else if (k == "mul_mat_id") mmid = v;
        else if (k == "subgroup_shuffle") d.subgroup_shuffle = d.subgroup_vote = v;
        else if (k == "coopmat2") d.coopmat2 = v;
        else if (k == "subgroup_arithmetic") d.subgroup_arithmetic = v;
        else if (k == "subgroup_basic") d.subgroup_basic = v;
        else if (k == "full_subgroups") d.subgroup_require_full_support = v;
        else if (k == "subgroup_size") { d.subgroup_size = v; d.subgroup_size_log2 = (uint32_t) log2f((float) v); }
        else if (k == "memory_model") d.vulkan_memory_model = v;
        else if (k == "shared_memory") d.properties.limits.maxComputeSharedMemorySize = v;
        else if (k == "fp16") d.fp16 = v;
        else { fprintf(stderr, "unknown option %s\n", k.c_str()); exit(2); }
    }
    for (int t = 0; t < GGML_TYPE_COUNT; t++) d.mul_mat_id_s[t] = d.mul_mat_id_m[t] = d.mul_mat_id_l[t] = mmid;
    // ggml_vk_load_shaders: the radix-select top-k always; a top-k pipeline per size up to the
    // workgroup; the HC comb pipeline with basic subgroups, shuffle, full subgroups, >= 16 lanes
    d.pipeline_topk_radix_f32 = std::make_shared<vk_pipeline_struct>();
    for (uint32_t i = 0; i < num_topk_pipelines && i <= d.max_workgroup_size_log2; i++) {
        d.pipeline_topk_f32[i] = std::make_shared<vk_pipeline_struct>();
    }
    if (d.subgroup_basic && d.subgroup_shuffle && d.subgroup_require_full_support && d.subgroup_size >= 16) {
        d.pipeline_dsv4_hc_comb_f32 = std::make_shared<vk_pipeline_struct>();
    }
}

int main(int argc, char ** argv) {
    configure(argc, argv);
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    if (int rc = read_graph(&ctx, &gf)) return rc;
    ggml_backend_vk_device_context dctx = { 0 };
    ggml_backend_device dev = {};
    dev.context = &dctx;
    for (int i = 0; i < gf->n_nodes; i++) {
        printf("op %d %d\n", g_ids[gf->nodes[i]], (int) ggml_backend_vk_device_supports_op(&dev, gf->nodes[i]));
    }
    ggml_free(ctx);
    return 0;
}
