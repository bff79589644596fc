"""Numba CPU kernels that run graphcost's graph: one module per op family.

Each module holds the numba kernel(s) and the numpy reference they are validated
against (``tests/test_kernels.py``); ``benchmarks/bench_kernels.py`` times them.

=================  =========================================================
``quants``         block layouts of F32..Q6_K, row decoders, activation quantizers
``vec_dot``        row x vector on the fly (float32 math), the decode hot loop
``vec_dot_ggml``   ggml's integer block dots against quantized activations (scalar)
``vec_dot_simd``   the same dots with byte SIMD: what mul_mat_ggml runs for quant types
``matmul``         mul_mat (matrix-vector and tiled) and mul_mat_ggml
``mxfp4``          MXFP4 weights (gpt-oss experts): decode, mul_mat, mul_mat_ggml (Q8_0 dots)
``get_rows``       gather + decode rows (embeddings)
``elementwise``    add/sub/mul/div (ggml repeat), scale, silu, gelu, tanh, GLUs
``norm``           rms_norm, norm
``rope``           rope_ext NORMAL/NEOX with YaRN and freq_factors
``softmax``        soft_max_ext with mask, ALiBi, sinks
``attention``      flash_attn_ext (online softmax, F16/F32 K/V, GQA)
``cache``          set_rows into F32/F16/BF16/Q8_0 caches, cpy, cont
``ssm``            ssm_conv, ssm_scan (Mamba-2), gated_delta_net (qwen3next)
``bits``           F16/BF16 conversions and the LLVM helpers the loops rely on
``simd``           a numba vector type and the byte dot products (vpdpbusd, ...)
``stream``         a plain streaming read: the bandwidth matvecs are judged against
=================  =========================================================

Use the modules by name: ``K = load_kernels(); K.matmul.mul_mat(...)``,
``K.norm.rms_norm(...)``. Installed as ``graphcost/_bundled/kernels``; load with
``graphcost.execute.kernels_loader.load_kernels()`` (imports here are relative only).
All kernels are ``numba.njit(cache=True)``: the first call of each compiles (seconds),
later processes load the cache from ``__pycache__``.
"""
from . import (attention, bits, cache, elementwise, gemm, get_rows, matmul, mxfp4, norm, quants,
               rope, simd, softmax, ssm, stream, vec_dot, vec_dot_ggml, vec_dot_simd)

__all__ = ["attention", "bits", "cache", "elementwise", "gemm", "get_rows", "matmul", "mxfp4",
           "norm", "quants", "rope", "simd", "softmax", "ssm", "stream", "vec_dot", "vec_dot_ggml",
           "vec_dot_simd"]
