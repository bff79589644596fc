"""The file: GGUF reading (local, partial, remote), ggml type facts, the model metadata.

First stage of the pipeline (file -> metadata -> graph -> costs/memory/speed -> reports);
imports nothing from the later stages."""
