"""Interpret an :class:`~graphcost.arch_spec.ArchSpec` into a graph.

Each statement maps to one llama-graph helper in :mod:`graphcost.llm_graph` (or one ggml
op); statements read and write named variables. Weight names are short: in a layer,
``attn_norm`` means ``blk.<il>.attn_norm.weight``; elsewhere ``output_norm`` means
``output_norm.weight``; a leading ``/`` names a model-level tensor from inside a layer
(``/rope_freqs``); ``x.bias`` names the bias instead of the weight; a trailing ``?`` marks
an optional tensor.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .arch_spec import ArchSpec, evaluate, rope_mode
from .errors import GraphcostError, UnsupportedError
from .ggml_graph import Tensor
from .llm_graph import AttnInputs, LlmGraph


#: statements defined outside this module (``@statement("name")``), e.g. in
#: :mod:`graphcost.statements_moe`; each is ``fn(builder, args)``.
STATEMENTS: dict[str, Callable[["SpecBuilder", Any], None]] = {}


def statement(name: str):
    """Register a spec statement implemented in another module."""
    def deco(fn):
        if name in STATEMENTS:
            raise ValueError(f"statement {name!r} registered twice")
        STATEMENTS[name] = fn
        return fn
    return deco


class SpecBuilder:
    def __init__(self, b: LlmGraph, spec: ArchSpec):
        self.b, self.g, self.m, self.spec = b, b.g, b.model, spec
        self.vars: dict[str, Any] = {}
        self.il: int | None = None
        m = self.m
        self.names = {
            "n_embd": m.n_embd, "n_head": m.n_head[0], "n_head_kv": m.n_head_kv[0],
            "head_dim": m.head_dim_k, "head_dim_v": m.head_dim_v, "n_layer": m.n_layer,
            "n_rot": m.n_rot, "attn_scale": m.attn_scale,
            "final_logit_softcap": m.final_logit_softcap,
            "embedding_scale": m.embedding_scale, "n_ff": m.n_ff[0],
            "residual_scale": m.residual_scale, "logit_scale": m.logit_scale,
            "rope_finetuned": float(m.rope_finetuned),
            # deepseek2 / glm4moe: leading dense layers; MLA ranks and head sizes
            "n_layer_dense_lead": m.n_layer_dense_lead,
            "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
            "head_dim_k_mla": m.head_dim_k_mla or m.head_dim_k,
            "head_dim_v_mla": m.head_dim_v_mla or m.head_dim_v,
            "n_vocab": m.n_vocab,
            "n_ff_shexp": m.n_ff_shexp, "n_moe_layer_step": m.n_moe_layer_step,
            "il": -1,  # the layer being built (-1 outside the layers)
        }
        self.inp_attn: AttnInputs | None = None
        self.inp_attn_swa: AttnInputs | None = None

    # ---- helpers -----------------------------------------------------------------------
    def where(self, stmt: str) -> str:
        return f"{self.spec.path}: {stmt}"

    def var(self, name: str) -> Any:
        if name not in self.vars:
            raise GraphcostError(self.where(f"variable {name!r} is used before it is set"))
        return self.vars[name]

    def weight(self, short: str | None) -> Tensor | None:
        if short is None:
            return None
        optional = short.endswith("?")
        short = short.rstrip("?")
        suffix = "bias" if short.endswith(".bias") else "weight"
        base = short[: -len(".bias")] if suffix == "bias" else short
        if base.startswith("/") or self.il is None:
            full = f"{base.lstrip('/')}.{suffix}"
        else:
            full = f"blk.{self.il}.{base}.{suffix}"
        return self.b.weight(full, required=not optional)

    def cb(self, t: Tensor, name: str | None, layer: int | None = None) -> Tensor:
        if name is not None:
            il = self.il if layer is None else layer
            self.g.cb(t, name, -1 if il is None else il)
        return t

    def expr(self, e: Any) -> float:
        return evaluate(e, self.names, str(self.spec.path))

    # ---- statements --------------------------------------------------------------------
    def s_embed(self, a: dict) -> None:
        scale = self.expr(a["scale"]) if "scale" in a else 0.0
        self.vars[a.get("out", "inpL")] = self.b.build_inp_embd(self.b.weight("token_embd.weight"), scale)

    def s_positions(self, a: dict) -> None:
        self.vars[a.get("out", "inp_pos")] = self.b.build_inp_pos()

    def s_attention_inputs(self, a: dict) -> None:
        b, m, run = self.b, self.m, self.b.run
        if m.n_swa > 0:
            base = b.make_cache("base", [il for il in range(m.n_layer) if not m.is_swa[il]],
                                run.kv_size, run.n_kv)
            swa = b.make_cache("swa", [il for il in range(m.n_layer) if m.is_swa[il]],
                               run.kv_size_swa, run.n_kv_swa)
            self.inp_attn = b.build_attn_inputs(base)
            self.inp_attn_swa = b.build_attn_inputs(swa)
            b.build_rot_inputs(self.inp_attn)
            b.build_rot_inputs(self.inp_attn_swa)
        else:
            cache = b.make_cache("base", list(range(m.n_layer)), run.kv_size, run.n_kv)
            self.inp_attn = b.build_attn_inputs(cache)
            b.build_rot_inputs(self.inp_attn)

    def s_out_ids(self, a: dict) -> None:
        self.vars[a.get("out", "out_ids")] = self.b.build_inp_out_ids()

    def s_set(self, a: dict) -> None:
        for dst, src in a.items():
            self.vars[dst] = self.var(src)

    def s_block(self, a: Any) -> None:
        self.g.block = a

    def s_norm(self, a: dict) -> None:
        kind = a.get("kind", "rms")
        t = self.b.build_norm(self.var(a["x"]), self.weight(a.get("weight")),
                              self.weight(a.get("bias")),
                              a.get("norm_layer", -1 if self.il is None else self.il), kind)
        self.vars[a.get("out", a["x"])] = self.cb(t, a.get("cb"))

    def s_qkv(self, a: dict) -> None:
        q, k, v = self.b.build_qkv(self.il, self.var(a.get("x", "cur")))
        self.vars.update(Qcur=q, Kcur=k, Vcur=v)

    def s_rope(self, a: dict) -> None:
        mode = rope_mode(self.spec)
        if mode is None:
            raise GraphcostError(self.where("rope statement in an architecture with rope: none"))
        m, il = self.m, self.il
        if m.n_swa > 0 and m.is_swa[il]:
            fb, fs = m.rope_freq_base_swa, 1.0  # llama_model::get_rope_freq_base/scale
        else:
            fb, fs = m.rope_freq_base, m.rope_freq_scale
        factors = self.weight(a["factors"]) if "factors" in a else None
        if "factors_var" in a:  # a tensor chosen at build time (statement rope_factors)
            factors = self.var(a["factors_var"])
        t = self.b.rope(self.var(a["x"]), self.var(a.get("pos", "inp_pos")), factors, il, mode, fb, fs)
        self.vars[a.get("out", a["x"])] = self.cb(t, a.get("cb"))

    def s_cb(self, a: dict) -> None:
        for var, name in a.items():
            self.cb(self.var(var), name)

    def s_scale(self, a: dict) -> None:
        t = self.g.scale(self.var(a["x"]), self.expr(a["by"]))
        self.vars[a.get("out", a["x"])] = self.cb(t, a.get("cb"))

    def s_attention(self, a: dict) -> None:
        il = self.il
        swa = self.inp_attn_swa is not None
        inp = self.inp_attn_swa if swa and self.m.is_swa[il] else self.inp_attn
        if inp is None:
            raise GraphcostError(self.where("attention before attention_inputs"))
        t = self.b.build_attn(inp, self.weight(a.get("wo", "attn_output")),
                              self.weight(a.get("wo_bias", "attn_output.bias?")),
                              self.var(a.get("q", "Qcur")), self.var(a.get("k", "Kcur")),
                              self.var(a.get("v", "Vcur")), self.expr(a.get("kq_scale", 1.0)),
                              il, iswa=swa)
        self.vars[a.get("out", "cur")] = self.cb(t, a.get("cb"))

    def s_select_rows(self, a: list) -> None:
        ts = self.b.select_rows(self.il, *(self.var(v) for v in a), out_ids=self.var("out_ids"))
        self.vars.update(zip(a, ts))

    def _binary(self, op: Callable[[Tensor, Tensor], Tensor], a: dict) -> None:
        t = op(self.var(a["a"]), self.var(a["b"]))
        self.vars[a["out"]] = self.cb(t, a.get("cb"))

    def s_add(self, a: dict) -> None:
        self._binary(self.g.add, a)

    def s_mul(self, a: dict) -> None:
        self._binary(self.g.mul, a)

    def s_ffn(self, a: dict) -> None:
        kind = a.get("kind", "par")
        if kind == "seq":  # no gate: up (+b), act, down (+b)
            t = self.b.build_ffn_seq(self.il, self.var(a.get("x", "cur")), a.get("act", "gelu"))
        elif kind != "par":
            raise UnsupportedError(self.where(f"ffn kind {kind!r} is not implemented yet"))
        else:
            t = self.b.build_ffn_par(self.il, self.var(a.get("x", "cur")), a.get("act", "silu"),
                                     *(a.get(w, f"ffn_{w}") for w in ("up", "gate", "down")))
        self.vars[a.get("out", "cur")] = self.cb(t, a.get("cb"))

    def s_lm_head(self, a: dict) -> None:
        out = self.b.weight("output.weight", required=False) or self.b.weight("token_embd.weight")
        t = self.b.mm(out, self.var(a.get("x", "cur")))
        bias = self.b.weight("output.bias", required=False)
        if bias is not None:
            t = self.g.add(t, bias)
        self.vars[a.get("out", "cur")] = self.cb(t, a.get("cb"))

    def s_softcap(self, a: dict) -> None:
        c = self.expr(a["by"])
        if c == 0.0:
            return
        t = self.g.scale(self.var(a["x"]), 1.0 / c)
        t = self.g.unary("TANH", t)
        t = self.g.scale(t, c)
        self.vars[a.get("out", a["x"])] = self.cb(t, a.get("cb"))

    def s_expand(self, a: Any) -> None:
        self.g.expand(self.var(a))

    # ---- driver ------------------------------------------------------------------------
    def run(self, stmts: list[dict]) -> None:
        for s in stmts:
            (key, args), = s.items()
            method = getattr(self, f"s_{key}", None)
            if method is not None:
                method(args if args is not None else {})
            elif key in STATEMENTS:
                STATEMENTS[key](self, args if args is not None else {})
            else:
                raise GraphcostError(self.where(f"unknown statement {key!r}"))

    def build(self) -> None:
        m, g = self.m, self.g
        for tensor, why in self.spec.unsupported_tensors.items():
            if m.tensor(tensor) is not None:
                raise UnsupportedError(f"{m.header.path}: {m.arch} with {why} is not modelled yet")
        g.block = "other"
        self.run(self.spec.prologue)
        for il in range(m.n_layer):
            self.il = il
            self.names["il"] = il
            g.layer = il
            g.block = "other"
            self.run(self.spec.layer)
        self.il = None
        self.names["il"] = -1
        g.layer = None
        g.block = "other"
        self.run(self.spec.epilogue)


def build_from_spec(b: LlmGraph, spec: ArchSpec) -> None:
    SpecBuilder(b, spec).build()


__all__ = ["build_from_spec", "SpecBuilder", "STATEMENTS", "statement", "math"]
