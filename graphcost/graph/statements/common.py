"""Small statements several families share: a plain matmul, a unary op, a division, the
attention temperature input and qwen3vl's deepstack addition.

* ``mm``          -- ``build_lora_mm(w, x)`` of one weight, cb'ed (qwen2moe's
  ``ffn_shexp_gate_inp``: the shared expert's gate, a 1-D weight, so [1, n_tokens];
  deepseek2's MLA projections ``attn_q_a``, ``attn_kv_a_mqa``, ``attn_k_b`` ...);
* ``unary``       -- ``ggml_silu`` / ``ggml_sigmoid`` / ... of a variable;
* ``div``         -- ``ggml_div`` (qwen2moe builds its sigmoid as ``silu(x) / x``);
* ``attn_temp_input`` -- ``build_inp_attn_scale`` (llama4, mistral3, deepseek2): F32
  [1, 1, n_tokens] ``inp_attn_scale``, built when ``attention.temperature_scale`` is
  non-zero;
* ``refuse``      -- refuse a file on a hyperparameter test, in one line;
* ``deepstack``   -- qwen3vl: for ``il < n_deepstack_layers``, ``cur + view(t_inp_embd)``
  of the ``il + 1``-th slice of the padded input embedding, cb'ed ``deepstack_out``.
"""
from __future__ import annotations

from graphcost.graph import ops
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("mm")
def mm(sb: SpecBuilder, a: dict) -> None:
    """``{w: ffn_gate_inp_shexp, x: cur, cb: name, out: var}``: one MUL_MAT, no bias."""
    t = sb.b.mm(sb.weight(a["w"]), sb.var(a.get("x", "cur")))
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("unary")
def unary(sb: SpecBuilder, a: dict) -> None:
    """``{op: SILU, x: var, cb: name, out: var}``: any sub-op of GGML_OP_UNARY."""
    op = str(a.get("op", "")).upper()
    if op not in ops.UNARY:
        raise GraphcostError(sb.where(f"unary op {a.get('op')!r} is not a ggml unary op "
                                      f"(graphcost/graph/ops.py UNARY)"))
    t = sb.g.unary(op, sb.var(a["x"]))
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("div")
def div(sb: SpecBuilder, a: dict) -> None:
    """``{a: var, b: var, cb: name, out: var}``: ``ggml_div(a, b)`` (b broadcast)."""
    t = sb.g.div(sb.var(a["a"]), sb.var(a["b"]))
    sb.vars[a["out"]] = sb.cb(t, a.get("cb"))


@statement("attn_temp_input")
def attn_temp_input(sb: SpecBuilder, a: dict) -> None:
    """``{out: inp_attn_scale, always?, scale?, floor?, offset?}``:
    llm_graph_context::build_inp_attn_scale when ``hparams.f_attn_temp_scale != 0`` (else
    the variable is not set). llama.cpp refuses a file with a temperature scale but no
    original context length (mistral3's load_arch_hparams); so do we. ``always: 1``
    builds it whatever the file says (llama4; deepseek2 under its own
    ``attn_temp_scale != 0`` test: its floor scale is attention.temperature_length, which
    llama.cpp does not check at load).

    The input carries the hparams llm_graph_input_attn_temp::set_input fills it with, as
    ``params`` ``temp_scale`` / ``temp_floor`` / ``temp_offset`` (f_attn_temp_scale,
    n_attn_temp_floor_scale, f_attn_temp_offset): ``scale`` (default the file's
    attention.temperature_scale), ``floor`` (a number, or the ModelInfo field holding it;
    default ``n_ctx_orig_yarn``, mistral3's), ``offset`` (default 0); llama4.cpp
    hard-codes 0.1, 8192 and 1."""
    m = sb.m
    if not a.get("always"):
        if m.attn_temp_scale == 0.0:
            return
        if m.n_ctx_orig_yarn == 0:
            raise GraphcostError(f"{m.header.path}: {m.arch}.attention.temperature_scale "
                                 f"needs {m.arch}.context_length (n_ctx_orig_yarn, the "
                                 f"temperature floor scale); llama.cpp refuses the model")
    floor = a.get("floor", "n_ctx_orig_yarn")
    t = sb.b.build_inp_attn_scale()
    t.params = {"temp_scale": float(a.get("scale", m.attn_temp_scale)),
                "temp_floor": int(getattr(m, floor) if isinstance(floor, str) else floor),
                "temp_offset": float(a.get("offset", 0.0))}
    sb.vars[a.get("out", "inp_attn_scale")] = t


@statement("deepstack")
def deepstack(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: cur}``: qwen3vl.cpp's ``if (il < n_deepstack_layers)``: add the
    layer's slice of the (padded) input embedding, ``ggml_view_2d(t_inp_embd, n_embd,
    n_tokens, nb1, (il + 1) * n_embd * 4)``; with tokens that slice is the zero padding."""
    m, il, b = sb.m, sb.il, sb.b
    if il >= m.n_deepstack_layers:
        return
    src = b.inp_embd
    if src is None:
        raise GraphcostError(sb.where("deepstack before embed"))
    # t_inp_embd is itself a view [n_embd, T] of the padded rows (row stride nb[1])
    ds = sb.g.view(src, [m.n_embd, b.n_tokens], [src.nb[1]], (il + 1) * m.n_embd * 4)
    try:
        t = sb.g.add(sb.var(a.get("x", "cur")), ds)
    except ValueError:  # the last layer kept only the output rows: ggml_add asserts
        raise GraphcostError(f"{m.header.path}: {m.arch}.n_deepstack_layers = "
                             f"{m.n_deepstack_layers} reaches the last layer, whose rows were "
                             f"cut to the outputs; llama.cpp aborts there") from None
    sb.vars[a.get("out", "cur")] = sb.cb(t, "deepstack_out")


@statement("refuse")
def refuse(sb: SpecBuilder, a: dict) -> None:
    """``{test: expr, why: text}``: refuse the file in one line when ``test`` holds (a
    configuration llama.cpp loads but then aborts on)."""
    if sb.expr(a["test"]):
        raise UnsupportedError(f"{sb.m.header.path}: {sb.m.arch} with {a['why']}")
