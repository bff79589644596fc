"""Memory: ggml-alloc's plan of the compute buffer, the KV cache and recurrent state, device placement.

Third stage, beside :mod:`graphcost.cost`: reads graphs, never builds reports."""
