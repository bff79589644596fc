"""The graph llama.cpp builds: run settings, the ggml mirror, per-family specs and statements.

Second stage: takes :mod:`graphcost.format`'s model, gives a list of nodes."""
