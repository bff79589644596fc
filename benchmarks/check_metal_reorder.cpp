// Differential check of graphcost's transcription of Metal's graph_optimize against ggml's own
// code (benchmarks/check_metal_reorder.py builds and runs this; no Apple GPU needed: the two
// files below are plain C++). Reads a graph as text on stdin, rebuilds it with ggml tensors
// (no data), expands it node by node (ggml_build_forward_expand: use counts as ggml counts
// them), then prints ggml_metal_fusion_add_alloc_deps's (tensor, until) pairs and the node
// order ggml_graph_optimize leaves (ggml-metal-common.cpp, ggml-metal-fusion.cpp), and
// before them each node's compute allocation size on Metal (ggml-metal-ops.cpp's scratch;
// the encoders there, which call into Objective-C, are never called: the build links them
// against stubs that abort).
//
// Input: a graph as text (ggml_graph_text.h).
#include "ggml_graph_text.h"
#include "ggml-metal-common.h"
#include "ggml-metal-device.h"
#include "ggml-metal-fusion.h"
#include "ggml-metal-ops.h"

#include <cstring>

// only FULL-mode fusion checks ask for Metal buffers: never called here
struct ggml_metal_buffer_id ggml_metal_buffer_get_id(ggml_metal_buffer_t, const struct ggml_tensor *) {
    GGML_ABORT("ggml_metal_buffer_get_id: not in structural mode");
}

// ggml-metal.cpp ggml_backend_metal_buffer_type_get_alloc_size (static there), its switch as
// written, over ggml-metal-ops.cpp's scratch functions
static size_t metal_alloc_size(const ggml_tensor * tensor) {
    size_t res = ggml_nbytes(tensor);
    switch (tensor->op) {
        case GGML_OP_MUL_MAT_ID:
            res += ggml_metal_op_mul_mat_id_extra_tpe(tensor);
            res += ggml_metal_op_mul_mat_id_extra_ids(tensor);
            res += ggml_metal_op_mul_mat_id_extra_amax(tensor);
            break;
        case GGML_OP_FLASH_ATTN_EXT:
            res += ggml_metal_op_flash_attn_ext_extra_pad(tensor);
            res += ggml_metal_op_flash_attn_ext_extra_blk(tensor);
            res += ggml_metal_op_flash_attn_ext_extra_tmp(tensor);
            res += ggml_metal_op_flash_attn_ext_extra_kv_f16(tensor);
            res += ggml_metal_op_flash_attn_ext_extra_idx(tensor);
            break;
        case GGML_OP_CUMSUM:
        case GGML_OP_ARGSORT:
            res *= 2;
            break;
        case GGML_OP_TOP_K:
            res = 2*sizeof(int32_t)*ggml_nelements(tensor->src[0]);
            break;
        default:
            break;
    }
    return res;
}

int main() {
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    if (int rc = read_graph(&ctx, &gf)) return rc;
    for (int i = 0; i < gf->n_nodes; i++) {
        printf("size %d %zu\n", g_ids[gf->nodes[i]], metal_alloc_size(gf->nodes[i]));
    }
    ggml_metal_fusion_add_alloc_deps(nullptr, print_dep, gf);
    ggml_graph_optimize(gf);
    print_order(gf);
    ggml_free(ctx);
    return 0;
}
