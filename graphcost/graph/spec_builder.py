"""Interpret an :class:`~graphcost.graph.arch_spec.ArchSpec` into a graph.

Each statement maps to one llama-graph helper in :mod:`graphcost.graph.llm_graph` (or one ggml
op); statements read and write named variables. Every statement, core or not, is a
function ``fn(builder, args)`` in one registry (:data:`STATEMENTS`, filled with
:func:`statement` by the modules of :mod:`graphcost.graph.statements`; the core ones are in
:mod:`graphcost.graph.statements.core`). Weight names are short: in a layer,
``attn_norm`` means ``blk.<il>.attn_norm.weight``; elsewhere ``output_norm`` means
``output_norm.weight``; a leading ``/`` names a model-level tensor from inside a layer
(``/rope_freqs``); ``x.bias`` names the bias instead of the weight; a trailing ``?`` marks
an optional tensor.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from graphcost.format.hparam_expr import evaluate
from graphcost.format.model import expr_names
from graphcost.graph.arch_spec import ArchSpec, rope_mode, statement_list
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import AttnInputs, LlmGraph


#: every spec statement by name (``@statement("name")``); each is ``fn(builder, args)``
STATEMENTS: dict[str, Callable[["SpecBuilder", Any], None]] = {}


def statement(name: str):
    """Register a spec statement; a name registered twice is an error."""
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
        #: names an expression may use; in a layer also il, is_swa (hparams.is_swa(il))
        self.names = expr_names(m)
        self.inp_attn: AttnInputs | None = None
        self.inp_attn_swa: AttnInputs | None = None
        #: llama_model_rope_type: the spec's mode, or ``hparams.rope_with_sections`` (glm4:
        #: mrope) when the file sets rope sections (llama_hparams::use_mrope)
        self.rope_mode = rope_mode(spec)
        with_sections = spec.hparams.get("rope_with_sections")
        if with_sections is not None and m.rope_sections[0] > 0 and m.rope_sections[1] > 0:
            self.rope_mode = rope_mode(spec, str(with_sections))

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
        # ``x.bias`` / ``x.scale`` (a per-tensor or per-expert weight scale, gemma4's
        # ``ffn_gate_inp.scale``, ``ffn_down_exps.scale``) name the other parts of a weight
        suffix = next((s for s in ("bias", "scale") if short.endswith("." + s)), "weight")
        base = short[: -len(suffix) - 1] if suffix != "weight" else short
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

    def sizes(self, exprs: list, what: str, minimum: int = 1) -> list[int]:
        """Integer sizes (elements, strides, offsets) from expressions over the
        hyperparameters, ``n_tokens`` (the ubatch's) and, in a layer, its ``n_head`` and
        ``n_head_kv``; each must be an integer >= ``minimum``."""
        names = {**self.names, "n_tokens": self.b.n_tokens}
        if self.il is not None:  # per-layer head counts
            names.update(n_head=self.m.n_head[self.il], n_head_kv=self.m.n_head_kv[self.il])
        out = []
        for e in exprs:
            v = evaluate(e, names, str(self.spec.path))
            if v != int(v) or v < minimum:
                raise GraphcostError(self.where(f"{what} {e!r} is {v}, not an integer >= {minimum}"))
            out.append(int(v))
        return out

    def shape_op(self, a: dict, what: str, op: Callable[[Tensor, list[int]], Tensor]) -> None:
        """``{x, ne: [...], cb, out}``: ``op(x, ne)`` (a reshape, a repeat) with sizes from
        :meth:`sizes`; a shape ``op`` refuses is one line naming the statement."""
        ne = self.sizes(a["ne"], f"{what} size")
        x = self.var(a["x"])
        try:
            t = op(x, ne)
        except ValueError as err:
            raise GraphcostError(self.where(f"{what} of {a['x']} to {ne}: {err}")) from None
        self.vars[a.get("out", a["x"])] = self.cb(t, a.get("cb"))

    def kv_reuse(self) -> dict[int, int]:
        """Layers without KV and the layer whose cache each reads: with hparams
        ``n_layer_kv_from_start`` N (an expression; gemma3n: 20, gemma4: n_layer -
        n_kv_shared_layers), layer il >= N reads N - 2 if it is a sliding-window layer,
        else N - 1 (llama_model::create_memory's ``reuse``)."""
        m = self.m
        n = int(self.expr(self.spec.hparams.get("n_layer_kv_from_start", -1)))
        if n < 0:
            return {}
        return {il: n - (2 if m.is_swa[il] else 1) for il in range(n, m.n_layer)}

    # ---- driver ------------------------------------------------------------------------
    def run_branch(self, what: str, stmts: Any) -> None:
        """Run a branch of a control statement (``if: then``, ``when: else`` ...), checked
        as a list of statements first."""
        self.run(statement_list(stmts, what, self.spec.path))

    def run(self, stmts: list[dict]) -> None:
        for s in stmts:
            (key, args), = s.items()
            fn = STATEMENTS.get(key)
            if fn is None:
                raise GraphcostError(self.where(f"unknown statement {key!r}"))
            fn(self, args if args is not None else {})

    def build(self) -> None:
        m, g = self.m, self.g
        for tensor, why in self.spec.unsupported_tensors.items():
            if m.tensor(tensor) is not None:
                raise UnsupportedError(f"{m.header.path}: {m.arch} with {why} is not modelled yet")
        g.block = "other"
        self.run(self.spec.prologue)
        for il in range(m.n_layer):
            self.il = il
            self.names.update(il=il, is_swa=float(m.n_swa > 0 and m.is_swa[il]))
            g.layer = il
            g.block = "other"
            self.run(self.spec.layer)
        self.il = None
        del self.names["il"], self.names["is_swa"]
        g.layer = None
        g.block = "other"
        self.run(self.spec.epilogue)
        self.refuse_unread_scales()

    def refuse_unread_scales(self) -> None:
        """llama.cpp multiplies every weight scale a file carries (``<weight>.scale``: NVFP4
        conversions; llama_model_base's generic ``*_s`` tensors, build_lora_mm's and
        build_lora_mm_id's ``w_s``) into its product. A trunk scale this family's statements
        did not read would leave a MUL out of the graph: refuse the file in one line."""
        m, read = self.m, self.b.weights_read
        for name in m.header.tensors:
            if not name.endswith(".scale") or name in read:
                continue
            parts = name.split(".")
            if parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= m.n_layer:
                continue  # a NextN/MTP block's: outside the trunk graph
            raise UnsupportedError(f"{m.header.path}: {m.arch} with the weight scale "
                                   f"{name!r} is not modelled (graphcost's {m.arch} graph "
                                   "does not multiply it in)")


def build_from_spec(b: LlmGraph, spec: ArchSpec) -> None:
    # the statement modules import this one to register themselves: load them here, once
    importlib.import_module(f"{__package__}.statements")
    SpecBuilder(b, spec).build()


__all__ = ["build_from_spec", "SpecBuilder", "STATEMENTS", "statement"]
