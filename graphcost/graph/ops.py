"""Every ggml op graphcost knows by name, and the groups the pipeline asks about.

One vocabulary for the graph mirror (:mod:`graphcost.graph.ggml_graph`), the cost registry
(:mod:`graphcost.cost.costs`), the allocator (:mod:`graphcost.memory.alloc`), the hardware model
(:mod:`graphcost.cost.hardware`) and the executor (:mod:`graphcost.execute.exec_ops`): a node's ``op`` is
the name ``ggml_op_desc`` prints, which for ``GGML_OP_UNARY`` and ``GGML_OP_GLU`` is the
sub-op's name (``SILU``, ``SWIGLU``), as llama.cpp's graph callback shows it.

The names are those of ggml's tables (the gguf package carries no op names):
``GGML_OP_NAME``, ``GGML_UNARY_OP_NAME`` and ``GGML_GLU_OP_NAME`` in ``ggml/src/ggml.c``
(enums ``ggml_op``, ``ggml_unary_op``, ``ggml_glu_op`` in ``ggml/include/ggml.h``), as
vendored by llama-cpp-python 0.3.36, with ``UNARY`` and ``GLU`` replaced by their sub-ops.
A graph builder that names an op not listed here fails at tensor creation
(:func:`check`), and every group set below is built from members, so a typo in either is
an error at import rather than a silently unmodelled op.
"""
from __future__ import annotations

from enum import StrEnum


class Op(StrEnum):
    """ggml op names (``ggml_op_desc``); members compare and hash equal to their strings."""

    # GGML_OP_NAME (UNARY and GLU stand for the sub-ops below)
    NONE = "NONE"
    DUP = "DUP"
    ADD = "ADD"
    ADD_ID = "ADD_ID"
    ADD1 = "ADD1"
    ACC = "ACC"
    SUB = "SUB"
    MUL = "MUL"
    DIV = "DIV"
    SQR = "SQR"
    SQRT = "SQRT"
    LOG = "LOG"
    SIN = "SIN"
    COS = "COS"
    SUM = "SUM"
    SUM_ROWS = "SUM_ROWS"
    CUMSUM = "CUMSUM"
    MEAN = "MEAN"
    ARGMAX = "ARGMAX"
    COUNT_EQUAL = "COUNT_EQUAL"
    REPEAT = "REPEAT"
    REPEAT_BACK = "REPEAT_BACK"
    CONCAT = "CONCAT"
    SILU_BACK = "SILU_BACK"
    NORM = "NORM"
    RMS_NORM = "RMS_NORM"
    RMS_NORM_BACK = "RMS_NORM_BACK"
    GROUP_NORM = "GROUP_NORM"
    L2_NORM = "L2_NORM"
    MUL_MAT = "MUL_MAT"
    MUL_MAT_ID = "MUL_MAT_ID"
    OUT_PROD = "OUT_PROD"
    SCALE = "SCALE"
    SET = "SET"
    CPY = "CPY"
    CONT = "CONT"
    RESHAPE = "RESHAPE"
    VIEW = "VIEW"
    PERMUTE = "PERMUTE"
    TRANSPOSE = "TRANSPOSE"
    GET_ROWS = "GET_ROWS"
    GET_ROWS_BACK = "GET_ROWS_BACK"
    SET_ROWS = "SET_ROWS"
    DIAG = "DIAG"
    DIAG_MASK_INF = "DIAG_MASK_INF"
    DIAG_MASK_ZERO = "DIAG_MASK_ZERO"
    SOFT_MAX = "SOFT_MAX"
    SOFT_MAX_BACK = "SOFT_MAX_BACK"
    ROPE = "ROPE"
    ROPE_BACK = "ROPE_BACK"
    CLAMP = "CLAMP"
    CONV_TRANSPOSE_1D = "CONV_TRANSPOSE_1D"
    IM2COL = "IM2COL"
    IM2COL_BACK = "IM2COL_BACK"
    IM2COL_3D = "IM2COL_3D"
    COL2IM_1D = "COL2IM_1D"
    CONV_2D = "CONV_2D"
    CONV_3D = "CONV_3D"
    CONV_2D_DW = "CONV_2D_DW"
    CONV_TRANSPOSE_2D = "CONV_TRANSPOSE_2D"
    POOL_1D = "POOL_1D"
    POOL_2D = "POOL_2D"
    POOL_2D_BACK = "POOL_2D_BACK"
    UPSCALE = "UPSCALE"
    PAD = "PAD"
    PAD_REFLECT_1D = "PAD_REFLECT_1D"
    ROLL = "ROLL"
    ARANGE = "ARANGE"
    TIMESTEP_EMBEDDING = "TIMESTEP_EMBEDDING"
    ARGSORT = "ARGSORT"
    TOP_K = "TOP_K"
    LEAKY_RELU = "LEAKY_RELU"
    TRI = "TRI"
    FILL = "FILL"
    FLASH_ATTN_EXT = "FLASH_ATTN_EXT"
    FLASH_ATTN_BACK = "FLASH_ATTN_BACK"
    SSM_CONV = "SSM_CONV"
    SSM_SCAN = "SSM_SCAN"
    WIN_PART = "WIN_PART"
    WIN_UNPART = "WIN_UNPART"
    GET_REL_POS = "GET_REL_POS"
    ADD_REL_POS = "ADD_REL_POS"
    RWKV_WKV6 = "RWKV_WKV6"
    GATED_LINEAR_ATTN = "GATED_LINEAR_ATTN"
    RWKV_WKV7 = "RWKV_WKV7"
    SOLVE_TRI = "SOLVE_TRI"
    GATED_DELTA_NET = "GATED_DELTA_NET"
    LIGHTNING_INDEXER = "LIGHTNING_INDEXER"
    DSV4_HC_COMB = "DSV4_HC_COMB"
    DSV4_HC_PRE = "DSV4_HC_PRE"
    DSV4_HC_POST = "DSV4_HC_POST"
    MAP_CUSTOM1 = "MAP_CUSTOM1"
    MAP_CUSTOM2 = "MAP_CUSTOM2"
    MAP_CUSTOM3 = "MAP_CUSTOM3"
    CUSTOM = "CUSTOM"
    CROSS_ENTROPY_LOSS = "CROSS_ENTROPY_LOSS"
    CROSS_ENTROPY_LOSS_BACK = "CROSS_ENTROPY_LOSS_BACK"
    OPT_STEP_ADAMW = "OPT_STEP_ADAMW"
    OPT_STEP_SGD = "OPT_STEP_SGD"

    # GGML_UNARY_OP_NAME
    ABS = "ABS"
    SGN = "SGN"
    NEG = "NEG"
    STEP = "STEP"
    TANH = "TANH"
    ELU = "ELU"
    RELU = "RELU"
    SIGMOID = "SIGMOID"
    GELU = "GELU"
    GELU_QUICK = "GELU_QUICK"
    SILU = "SILU"
    HARDSWISH = "HARDSWISH"
    HARDSIGMOID = "HARDSIGMOID"
    EXP = "EXP"
    EXPM1 = "EXPM1"
    SOFTPLUS = "SOFTPLUS"
    GELU_ERF = "GELU_ERF"
    XIELU = "XIELU"
    FLOOR = "FLOOR"
    CEIL = "CEIL"
    ROUND = "ROUND"
    TRUNC = "TRUNC"

    # GGML_GLU_OP_NAME
    REGLU = "REGLU"
    GEGLU = "GEGLU"
    SWIGLU = "SWIGLU"
    SWIGLU_OAI = "SWIGLU_OAI"
    GEGLU_ERF = "GEGLU_ERF"
    GEGLU_QUICK = "GEGLU_QUICK"
    SWIGLU_CLAMP = "SWIGLU_CLAMP"


def check(op: str) -> str:
    """``op`` as a plain string, or ValueError when ggml has no op of that name."""
    try:
        return Op(op).value
    except ValueError:
        raise ValueError(f"{op!r} is not a ggml op name (graphcost/graph/ops.py)") from None


#: ``ggml_op_is_empty`` (ggml-impl.h) minus NONE: ops that only reinterpret their source's
#: memory; they allocate nothing and cost nothing
VIEWS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})

#: ``ggml_op_is_empty`` (ggml-impl.h): leaves (NONE) and views
EMPTY = VIEWS | {Op.NONE}

#: the sub-ops of GGML_OP_UNARY (``enum ggml_unary_op``, ggml.h)
UNARY = frozenset({
    Op.ABS, Op.SGN, Op.NEG, Op.STEP, Op.TANH, Op.ELU, Op.RELU, Op.SIGMOID, Op.GELU,
    Op.GELU_QUICK, Op.SILU, Op.HARDSWISH, Op.HARDSIGMOID, Op.EXP, Op.EXPM1, Op.SOFTPLUS,
    Op.GELU_ERF, Op.XIELU, Op.FLOOR, Op.CEIL, Op.ROUND, Op.TRUNC,
})

#: the sub-ops of GGML_OP_GLU (``enum ggml_glu_op``, ggml.h): act(gate) * up
GLU = frozenset({
    Op.REGLU, Op.GEGLU, Op.SWIGLU, Op.SWIGLU_OAI, Op.GEGLU_ERF, Op.GEGLU_QUICK, Op.SWIGLU_CLAMP,
})

#: element-wise binary ops with broadcasting of src[1] (``ggml_add_impl`` and kin)
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})

#: ``ggml_op_can_inplace`` (ggml-alloc.c); its GGML_OP_UNARY case is every unary sub-op
INPLACE = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1,
    Op.SUB, Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.LOG, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK,
    Op.RMS_NORM, Op.RMS_NORM_BACK, Op.CLAMP, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
}) | UNARY

#: matrix products whose weight operand streams through a vec_dot kernel
MATMUL = frozenset({Op.MUL_MAT, Op.MUL_MAT_ID})
