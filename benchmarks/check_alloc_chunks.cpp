// Differential check of graphcost's ggml-alloc mirror with a maximum buffer size (chunks:
// graphcost/memory/alloc.py DynAllocator) against ggml-alloc.c itself, linked from a built
// libggml-base.so (benchmarks/check_alloc_chunks.py builds and runs this). Reads a graph as
// text on stdin (ggml_graph_text.h; weights and caches have data, so they are not
// allocated), prints the graph's leaf order, then for each "ALIGNMENT MAX_SIZE" pair on the
// command line (MAX_SIZE 0: SIZE_MAX) the compute buffer size ggml_gallocr_reserve_n_size
// reports for a buffer type with that alignment and get_max_size (get_alloc_size NULL:
// ggml_nbytes): "size ALIGNMENT MAX_SIZE BYTES", the sum of the buffer's chunks.
// With "reserve ALIGNMENT MAX_SIZE": stdin has a count, then that many graphs, reserved in
// turn by one ggml_gallocr (ggml_gallocr_reserve_n, buffers allocated: a graph reallocates
// them or not), "reserved BYTES" after each (ggml_gallocr_get_buffer_size).
#include "ggml_graph_text.h"
#include "ggml-alloc.h"

#include <cstdint>
#include <cstdlib>

static size_t g_alignment = 32;
static size_t g_max_size = SIZE_MAX;

static const char * chunk_buft_name(ggml_backend_buffer_type_t) { return "chunks"; }
static size_t chunk_buft_alignment(ggml_backend_buffer_type_t) { return g_alignment; }
static size_t chunk_buft_max_size(ggml_backend_buffer_type_t) { return g_max_size; }

static ggml_backend_buffer_t chunk_buft_alloc(ggml_backend_buffer_type_t buft, size_t size) {
    return ggml_backend_buffer_init(buft, {}, nullptr, size);  // never read or written
}

static int reserve_in_turn(ggml_backend_buffer_type * buft) {
    int n_graphs = 0;
    if (scanf("%d", &n_graphs) != 1) return 2;
    ggml_gallocr_t galloc = ggml_gallocr_new(buft);
    for (int k = 0; k < n_graphs; k++) {
        ggml_context * ctx = nullptr;
        ggml_cgraph * gf = nullptr;
        if (int rc = read_graph(&ctx, &gf)) return rc;
        if (!ggml_gallocr_reserve_n(galloc, gf, nullptr, nullptr)) return 4;
        printf("reserved %zu\n", ggml_gallocr_get_buffer_size(galloc, 0));
    }
    ggml_gallocr_free(galloc);
    return 0;
}

int main(int argc, char ** argv) {
    ggml_backend_buffer_type buft = {};
    buft.iface.get_name = chunk_buft_name;
    buft.iface.alloc_buffer = chunk_buft_alloc;
    buft.iface.get_alignment = chunk_buft_alignment;
    buft.iface.get_max_size = chunk_buft_max_size;
    if (argc == 4 && std::string(argv[1]) == "reserve") {
        g_alignment = strtoull(argv[2], nullptr, 10);
        unsigned long long m = strtoull(argv[3], nullptr, 10);
        g_max_size = m ? (size_t) m : SIZE_MAX;
        return reserve_in_turn(&buft);
    }
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    if (int rc = read_graph(&ctx, &gf)) return rc;
    printf("leafs");
    for (int i = 0; i < gf->n_leafs; i++) printf(" %d", g_ids[gf->leafs[i]]);
    printf("\n");
    for (int a = 1; a + 1 < argc; a += 2) {
        g_alignment = strtoull(argv[a], nullptr, 10);
        unsigned long long m = strtoull(argv[a + 1], nullptr, 10);
        g_max_size = m ? (size_t) m : SIZE_MAX;
        ggml_gallocr_t galloc = ggml_gallocr_new(&buft);
        size_t size = 0;
        ggml_gallocr_reserve_n_size(galloc, gf, nullptr, nullptr, &size);
        printf("size %s %llu %zu\n", argv[a], m, size);
        ggml_gallocr_free(galloc);
    }
    ggml_free(ctx);
    return 0;
}
