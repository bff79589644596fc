"""The core spec statements: the ones most architectures use, each one llama-graph helper
of :mod:`graphcost.graph.llm_graph` or one ggml op (``specs/arch/*.yaml`` call them by name).

Each is ``fn(builder, args)``, registered with :func:`graphcost.graph.spec_builder.statement`
like the statements of the other modules in this package.
"""
from __future__ import annotations

from typing import Any, Callable

from graphcost.graph.arch_spec import MULTI_ROPE_MODES
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("embed")
def s_embed(sb: SpecBuilder, a: dict) -> None:
    scale = sb.expr(a["scale"]) if "scale" in a else 0.0
    sb.vars[a.get("out", "inpL")] = sb.b.build_inp_embd(sb.b.weight("token_embd.weight"), scale)


@statement("positions")
def s_positions(sb: SpecBuilder, a: dict) -> None:
    n_pos = 4 if sb.rope_mode in MULTI_ROPE_MODES else 1  # hparams.n_pos_per_embd()
    sb.vars[a.get("out", "inp_pos")] = sb.b.build_inp_pos(n_pos)


@statement("attention_inputs")
def s_attention_inputs(sb: SpecBuilder, a: dict) -> None:
    b, m, run = sb.b, sb.m, sb.b.run
    reuse = sb.kv_reuse()  # layers without KV of their own (gemma3n, gemma4)
    if m.n_swa > 0:
        base = b.make_cache("base", [il for il in range(m.n_layer)
                                     if not m.is_swa[il] and il not in reuse],
                            run.kv_size, run.n_kv,
                            {il: r for il, r in reuse.items() if not m.is_swa[il]})
        swa = b.make_cache("swa", [il for il in range(m.n_layer)
                                   if m.is_swa[il] and il not in reuse],
                           run.kv_size_swa, run.n_kv_swa,
                           {il: r for il, r in reuse.items() if m.is_swa[il]})
        sb.inp_attn = b.build_attn_inputs(base)
        sb.inp_attn_swa = b.build_attn_inputs(swa)
        b.build_rot_inputs(sb.inp_attn)
        b.build_rot_inputs(sb.inp_attn_swa)
    else:
        cache = b.make_cache("base", [il for il in range(m.n_layer) if il not in reuse],
                             run.kv_size, run.n_kv, reuse)
        sb.inp_attn = b.build_attn_inputs(cache)
        b.build_rot_inputs(sb.inp_attn)


@statement("out_ids")
def s_out_ids(sb: SpecBuilder, a: dict) -> None:
    sb.vars[a.get("out", "out_ids")] = sb.b.build_inp_out_ids()


@statement("set")
def s_set(sb: SpecBuilder, a: dict) -> None:
    for dst, src in a.items():
        sb.vars[dst] = sb.var(src)


@statement("block")
def s_block(sb: SpecBuilder, a: Any) -> None:
    sb.g.block = a


@statement("norm")
def s_norm(sb: SpecBuilder, a: dict) -> None:
    kind = a.get("kind", "rms")
    t = sb.b.build_norm(sb.var(a["x"]), sb.weight(a.get("weight")),
                        sb.weight(a.get("bias")),
                        a.get("norm_layer", -1 if sb.il is None else sb.il), kind)
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("qkv")
def s_qkv(sb: SpecBuilder, a: dict) -> None:
    q, k, v = sb.b.build_qkv(sb.il, sb.var(a.get("x", "cur")))
    sb.vars.update(Qcur=q, Kcur=k, Vcur=v)


@statement("rope")
def s_rope(sb: SpecBuilder, a: dict) -> None:
    """``base: ctx`` uses the graph context's freq_base/freq_scale on every layer (the
    plain ``freq_base, freq_scale`` of src/models/*.cpp), else ``get_rope_freq_base``."""
    mode = sb.rope_mode
    if mode is None:
        raise GraphcostError(sb.where("rope statement in an architecture with rope: none"))
    m, il = sb.m, sb.il
    if a.get("base") == "ctx":
        fb, fs = m.rope_freq_base, m.rope_freq_scale
    elif m.n_swa > 0 and m.is_swa[il]:
        # llama_model::get_rope_freq_base/scale
        fb, fs = m.rope_freq_base_swa, m.rope_freq_scale_swa
    else:
        fb, fs = m.rope_freq_base, m.rope_freq_scale
    factors = sb.weight(a["factors"]) if "factors" in a else None
    if "factors_var" in a:  # a tensor chosen at build time (statement rope_factors)
        factors = sb.var(a["factors_var"])
    t = sb.b.rope(sb.var(a["x"]), sb.var(a.get("pos", "inp_pos")), factors, il, mode, fb, fs)
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("cb")
def s_cb(sb: SpecBuilder, a: dict) -> None:
    for var, name in a.items():
        sb.cb(sb.var(var), name)


@statement("scale")
def s_scale(sb: SpecBuilder, a: dict) -> None:
    t = sb.g.scale(sb.var(a["x"]), sb.expr(a["by"]))
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("attention")
def s_attention(sb: SpecBuilder, a: dict) -> None:
    il = sb.il
    swa = sb.inp_attn_swa is not None
    inp = sb.inp_attn_swa if swa and sb.m.is_swa[il] else sb.inp_attn
    if inp is None:
        raise GraphcostError(sb.where("attention before attention_inputs"))
    t = sb.b.build_attn(inp, sb.weight(a.get("wo", "attn_output")),
                        sb.weight(a.get("wo_bias", "attn_output.bias?")),
                        sb.var(a.get("q", "Qcur")), sb.var(a.get("k", "Kcur")),
                        sb.var(a.get("v", "Vcur")), sb.expr(a.get("kq_scale", 1.0)),
                        il, iswa=swa, sinks=sb.weight(a.get("sinks")))
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("select_rows")
def s_select_rows(sb: SpecBuilder, a: list) -> None:
    ts = sb.b.select_rows(sb.il, *(sb.var(v) for v in a), out_ids=sb.var("out_ids"))
    sb.vars.update(zip(a, ts))


def _binary(sb: SpecBuilder, op: Callable[[Tensor, Tensor], Tensor], a: dict) -> None:
    t = op(sb.var(a["a"]), sb.var(a["b"]))
    sb.vars[a["out"]] = sb.cb(t, a.get("cb"))


@statement("add")
def s_add(sb: SpecBuilder, a: dict) -> None:
    _binary(sb, sb.g.add, a)


@statement("mul")
def s_mul(sb: SpecBuilder, a: dict) -> None:
    _binary(sb, sb.g.mul, a)


@statement("ffn")
def s_ffn(sb: SpecBuilder, a: dict) -> None:
    kind = a.get("kind", "par")
    if kind == "seq":  # no gate: up (+b), act, down (+b)
        t = sb.b.build_ffn_seq(sb.il, sb.var(a.get("x", "cur")), a.get("act", "gelu"),
                               a.get("suffix", ""))
    elif kind != "par":
        raise UnsupportedError(sb.where(f"ffn kind {kind!r} is not implemented yet"))
    else:
        t = sb.b.build_ffn_par(sb.il, sb.var(a.get("x", "cur")), a.get("act", "silu"),
                               a.get("suffix", ""))
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("lm_head")
def s_lm_head(sb: SpecBuilder, a: dict) -> None:
    out = sb.b.weight("output.weight", required=False) or sb.b.weight("token_embd.weight")
    t = sb.b.mm(out, sb.var(a.get("x", "cur")))
    bias = sb.b.weight("output.bias", required=False)
    if bias is not None:
        t = sb.g.add(t, bias)
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("softcap")
def s_softcap(sb: SpecBuilder, a: dict) -> None:
    c = sb.expr(a["by"])
    if c == 0.0:
        return
    t = sb.g.scale(sb.var(a["x"]), 1.0 / c)
    t = sb.g.unary("TANH", t)
    t = sb.g.scale(t, c)
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("expand")
def s_expand(sb: SpecBuilder, a: Any) -> None:
    sb.g.expand(sb.var(a))
