"""The weight types real files of the 2026 families use are read and costed: MXFP4
(gpt-oss experts), the IQ types, TQ1_0/TQ2_0 and BF16.

For each type a one-layer llama GGUF carries ``attn_q`` [256, 256] of that type (written by
gguf-py's quantizer where it has one, as all-zero blocks for the IQ types); the decode
graph's ``Qcur-0`` MUL_MAT is costed exactly. Block sizes below are written out from the
block structs of ``ggml/src/ggml-common.h`` as an independent check of the gguf package's
``GGML_QUANT_SIZES`` that graphcost uses; each type's activation format is
``type_traits_cpu[type].vec_dot_type`` of ``ggml/src/ggml-cpu/ggml-cpu.c``.
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures as F
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import UnsupportedError
from graphcost.format.ggml_types import vec_dot_type
from graphcost.graph.settings import RunSettings

QK_K = 256
# (type, elements per block, bytes per block (ggml-common.h), vec_dot_type)
TYPES = [
    (QT.IQ1_S, QK_K, 2 + QK_K // 8 + QK_K // 32 * 2, QT.Q8_K),     # d, qs[32], qh u16[8]: 50
    (QT.IQ1_M, QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32, QT.Q8_K),  # qs[32] qh[16] scales[8]: 56
    (QT.IQ2_XXS, QK_K, 2 + QK_K // 8 * 2, QT.Q8_K),                 # d, qs u16[32]: 66
    (QT.IQ2_XS, QK_K, 2 + QK_K // 8 * 2 + QK_K // 32, QT.Q8_K),     # + scales[8]: 74
    (QT.IQ2_S, QK_K, 2 + QK_K // 4 + QK_K // 32 + QK_K // 32, QT.Q8_K),  # qs[64] qh[8] sc[8]: 82
    (QT.IQ3_XXS, QK_K, 2 + 3 * QK_K // 8, QT.Q8_K),                 # d, qs[96]: 98
    (QT.IQ3_S, QK_K, 2 + QK_K // 4 + QK_K // 32 + QK_K // 8 + QK_K // 64, QT.Q8_K),  # 110
    (QT.IQ4_NL, 32, 2 + 16, QT.Q8_0),                               # d, qs[16]: 18
    (QT.IQ4_XS, QK_K, 2 + 2 + QK_K // 64 + QK_K // 2, QT.Q8_K),     # d, scales_h, l[4], qs: 136
    (QT.TQ1_0, QK_K, (QK_K - 4 * QK_K // 64) // 5 + QK_K // 64 + 2, QT.Q8_K),  # 48 + 4 + d: 54
    (QT.TQ2_0, QK_K, QK_K // 4 + 2, QT.Q8_K),                       # qs[64], d: 66
    (QT.MXFP4, 32, 1 + 16, QT.Q8_0),                                # e8m0 exponent, qs[16]: 17
    (QT.BF16, 1, 2, QT.BF16),
]
# activation formats: block_q8_0 (d f16 + 32 int8 = 34 B per 32), block_q8_K (d f32 +
# 256 int8 + 16 int16 bsums = 292 B per 256)
VDT_BLOCK = {QT.Q8_0: (32, 34), QT.Q8_K: (QK_K, 4 + QK_K + 16 * 2), QT.BF16: (1, 2)}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("types")
    return {t: F.write_llama(d / f"{t.name}.gguf", n_layer=1, weight_types={"attn_q": t})
            for t, *_ in TYPES}


@pytest.mark.parametrize("qtype,blk,size,vdt", TYPES, ids=[t.name for t, *_ in TYPES])
def test_type_is_read_and_matmul_costed_exactly(paths, qtype, blk, size, vdt):
    model = load_model(paths[qtype])
    info = model.tensor("blk.0.attn_q.weight")
    assert info.type == qtype and info.nbytes == 256 // blk * size * 256
    assert vec_dot_type(qtype) == vdt
    a = analyze_graph(build_graph(model, RunSettings(ctx_size=512, tokens=1)))
    assert a.unmodelled == []
    c = next(nc.cost for nc in a.nodes if nc.node.name == "Qcur-0" and nc.node.op == "MUL_MAT")
    macs = 256 * 256                      # W [256, 256] x x [256, 1]: 65,536 multiply-adds
    vblk, vsize = VDT_BLOCK[vdt]
    if vblk == 1:                         # BF16: x converted element by element, no scales
        assert c.ops == {"mul": macs, "add": macs, "cvt": 256}
        assert c.work == 256 * 2          # x as BF16: 512 B
    else:
        pairs = macs // vblk              # block pairs: 2,048 (Q8_0) or 256 (Q8_K)
        # + d_w * d_x * isum (2 mul, 1 add) per pair; quantizing x: 256 max, 256 mul,
        # one div per block, 256 cvt
        assert c.ops == {"mul": macs + 2 * pairs + 256, "add": macs + pairs, "max": 256,
                         "div": 256 // vblk, "cvt": 256}
        assert c.work == 256 // vblk * vsize   # 272 B (Q8_0) or 292 B (Q8_K)
    assert c.read["weights"] == 256 // blk * size * 256   # every row of W once
    assert c.write == 256 * 4


def test_executor_refuses_an_unsupported_weight_type_in_one_line(paths):
    from graphcost.execute.weights import refuse_unsupported_weights
    model = load_model(paths[QT.IQ2_XXS])
    supported = (QT.F32, QT.F16, QT.Q8_0, QT.Q4_0, QT.Q4_K, QT.Q6_K)   # the llama fixture's others
    refuse_unsupported_weights(load_model(paths[QT.BF16]), supported + (QT.BF16,))
    with pytest.raises(UnsupportedError) as e:
        refuse_unsupported_weights(model, supported)
    msg = str(e.value)
    assert "\n" not in msg and "'blk.0.attn_q.weight' is iq2_xxs" in msg
    assert str(paths[QT.IQ2_XXS].path) in msg
