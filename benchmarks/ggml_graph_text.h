// A graph as text, rebuilt with ggml tensors (no data), for the differential checks in
// benchmarks/ (check_metal_reorder.cpp, check_alloc_chunks.cpp; the text is written by
// check_metal_reorder.py's serialize).
//
// Input: n_tensors, then one line per tensor:
//   id op type ne0..3 nb0..3 view_src_id view_offs output_flag buffer offset
//   n_params params... n_src srcs...
// (op: a ggml op name, or a unary/glu sub-op name; buffer: -1 none, 0 the weights (usage
// WEIGHTS: ggml_is_constant), k >= 1 the k-th KV/state buffer, the tensor at ``offset`` in it;
// params: int32 op_params from 0; a source -1: none) then n_nodes and the node ids in order,
// expanded node by node (ggml_build_forward_expand: use counts as ggml counts them; the
// order must come out as given).
#pragma once

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend-impl.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

static bool op_from_name(const std::string & name, ggml_op & op, int & sub) {
    sub = -1;
    for (int i = 0; i < GGML_OP_COUNT; i++) {
        if (name == ggml_op_name((ggml_op) i)) { op = (ggml_op) i; return true; }
    }
    for (int i = 0; i < GGML_UNARY_OP_COUNT; i++) {
        if (name == ggml_unary_op_name((ggml_unary_op) i)) { op = GGML_OP_UNARY; sub = i; return true; }
    }
    for (int i = 0; i < GGML_GLU_OP_COUNT; i++) {
        if (name == ggml_glu_op_name((ggml_glu_op) i)) { op = GGML_OP_GLU; sub = i; return true; }
    }
    return false;
}

static std::map<const ggml_tensor *, int> g_ids;

// buffers only as ggml_mem_range_from_tensor and ggml_is_constant see them: an identity, a
// usage, a type whose get_alloc_size is NULL (ggml_nbytes, as Metal's for a leaf)
static ggml_backend_buffer_type g_buft = {};
static std::map<int, ggml_backend_buffer *> g_bufs;
static char g_base[1];  // a distinct address the offsets count from (never dereferenced)

static ggml_backend_buffer * buffer(int k) {
    if (!g_bufs.count(k)) {
        auto * b = new ggml_backend_buffer{};
        b->buft = &g_buft;
        b->usage = k == 0 ? GGML_BACKEND_BUFFER_USAGE_WEIGHTS : GGML_BACKEND_BUFFER_USAGE_ANY;
        g_bufs[k] = b;
    }
    return g_bufs[k];
}

// add_alloc_dep as the checks print it: "dep TENSOR UNTIL"
static void print_dep(void *, ggml_tensor * t, ggml_tensor * until) {
    printf("dep %d %d\n", g_ids[t], g_ids[until]);
}

// the graph's node order: "order ID..."
static void print_order(const ggml_cgraph * gf) {
    printf("order");
    for (int i = 0; i < gf->n_nodes; i++) printf(" %d", g_ids[gf->nodes[i]]);
    printf("\n");
}

// Read a graph from stdin into a new context; 0 on success, 2 on bad input, 3 when the
// expanded order differs from the given one.
static int read_graph(ggml_context ** pctx, ggml_cgraph ** pgf) {
    int n_tensors = 0;
    if (scanf("%d", &n_tensors) != 1) return 2;
    ggml_init_params ip = { (size_t) (n_tensors + 16) * ggml_tensor_overhead() + ggml_graph_overhead_custom(65536, false) + (1 << 20), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> ts(n_tensors, nullptr);
    std::vector<std::vector<int>> srcs(n_tensors);
    std::vector<int> view_srcs(n_tensors, -1);
    for (int k = 0; k < n_tensors; k++) {
        int id, type, out, n_params, n_src, buf; char opname[64]; long long ne[4], nb[4], view_offs, offs; int view_src;
        if (scanf("%d %63s %d %lld %lld %lld %lld %lld %lld %lld %lld %d %lld %d %d %lld %d", &id, opname, &type,
                  &ne[0], &ne[1], &ne[2], &ne[3], &nb[0], &nb[1], &nb[2], &nb[3], &view_src, &view_offs, &out,
                  &buf, &offs, &n_params) != 17) return 2;
        int64_t ne64[4] = { ne[0], ne[1], ne[2], ne[3] };
        ggml_tensor * t = ggml_new_tensor(ctx, (ggml_type) type, 4, ne64);
        for (int i = 0; i < 4; i++) t->nb[i] = (size_t) nb[i];
        ggml_op op; int sub;
        if (!op_from_name(opname, op, sub)) { fprintf(stderr, "unknown op %s\n", opname); return 2; }
        t->op = op;
        for (int i = 0; i < n_params; i++) { int v; if (scanf("%d", &v) != 1) return 2; t->op_params[i] = v; }
        if (sub >= 0) t->op_params[0] = sub;
        if (out) t->flags |= GGML_TENSOR_FLAG_OUTPUT;
        if (buf >= 0) {
            t->buffer = buffer(buf);
            t->data = g_base + offs;
        }
        if (scanf("%d", &n_src) != 1) return 2;
        for (int i = 0; i < n_src; i++) { int s; if (scanf("%d", &s) != 1) return 2; srcs[id].push_back(s); }
        view_srcs[id] = view_src;
        t->view_offs = (size_t) view_offs;
        ts[id] = t;
        g_ids[t] = id;
    }
    for (int id = 0; id < n_tensors; id++) {
        for (size_t i = 0; i < srcs[id].size(); i++) ts[id]->src[i] = srcs[id][i] >= 0 ? ts[srcs[id][i]] : nullptr;
        ts[id]->view_src = view_srcs[id] >= 0 ? ts[view_srcs[id]] : nullptr;
    }
    int n_nodes = 0;
    if (scanf("%d", &n_nodes) != 1) return 2;
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, 65536, false);
    for (int i = 0; i < n_nodes; i++) {
        int id; if (scanf("%d", &id) != 1) return 2;
        ggml_build_forward_expand(gf, ts[id]);
        if (gf->n_nodes != i + 1 || gf->nodes[i] != ts[id]) { fprintf(stderr, "node %d: expand order differs\n", i); return 3; }
    }
    *pctx = ctx;
    *pgf = gf;
    return 0;
}
