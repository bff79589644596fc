"""The llama.cpp graph helpers (``src/llama-graph.cpp``, ``src/llama-kv-cache.cpp``) on top
of :mod:`graphcost.graph.ggml_graph`: inputs, norms, QKV, attention with the KV cache, FFN.

Each method names the llama.cpp function it mirrors; call order inside each method is
the same as there, because creation order decides auto-names and expand order decides
node order.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from gguf import PoolingType

from graphcost.format import ggml_types as gt
from graphcost.errors import SettingsError, UnsupportedError
from graphcost.graph.ggml_graph import Graph, Tensor
from graphcost.format.model import ModelInfo, yarn_context
from graphcost.graph.settings import Resolved


@dataclass
class KVCache:
    """One ``llama_kv_cache``: per-layer K/V buffers ``cache_k_l<il>``, ``cache_v_l<il>``."""

    name: str  # "base" or "swa"
    size: int  # cells per stream (kv_size)
    n_kv: int  # cells attended this ubatch (per stream)
    layers: tuple[int, ...]
    v_trans: bool
    k: dict[int, Tensor]
    v: dict[int, Tensor]
    rot_k: bool
    rot_v: bool
    #: layers without buffers that read another layer's (gemma3n's KV sharing: the
    #: llama_kv_cache ``reuse`` callback), layer -> the layer whose K/V they read
    reuse: dict[int, int] = field(default_factory=dict)
    #: n_embd_head_k_all: the head size all its layers share, -1 if they differ
    head_k_all: int = 0
    #: llama_kv_cache::n_stream: the buffers are [n_embd_gqa, size, n_stream]
    n_stream: int = 1

    def bytes(self) -> int:
        """Bytes of all K and V buffers (what llama.cpp logs as the KV buffer size)."""
        return sum(t.nbytes for t in self.k.values()) + sum(t.nbytes for t in self.v.values())


@dataclass
class AttnInputs:
    """llm_graph_input_attn_kv (one per cache): index inputs, mask, Hadamard matrices (the
    builder makes the object first and its inputs after, each tied to it)."""

    cache: KVCache
    k_idxs: Tensor | None = None
    v_idxs: Tensor | None = None  # None: K-only (MLA) cache
    kq_mask: Tensor | None = None
    k_rot: Tensor | None = None
    v_rot: Tensor | None = None


class InputKind(enum.Enum):
    """What a graph input holds: the ``llm_graph_input_*`` class whose ``set_input``
    (``src/llama-graph.cpp``, ``src/llama-kv-cache.cpp``, ``src/llama-memory-recurrent.cpp``)
    fills it."""

    TOKENS = "tokens"            # llm_graph_input_embd: token ids (per-layer inputs too)
    EMBD = "embd"                # llm_graph_input_embd: embeddings (the token path computes)
    POS = "pos"                  # llm_graph_input_pos: positions, n_pos_per_embd per token
    OUT_IDS = "out_ids"          # llm_graph_input_out_ids: rows whose logits are kept
    K_IDXS = "k_idxs"            # llm_graph_input_attn_kv: cells the new K rows go to
    V_IDXS = "v_idxs"            # ... the new V rows (element indices when V is transposed)
    KQ_MASK = "kq_mask"          # ... causal (and sliding-window) mask over the cells
    K_ROT = "k_rot"              # ... Hadamard matrix of a quantized K cache
    V_ROT = "v_rot"              # ... Hadamard matrix of a quantized V cache
    S_COPY = "s_copy"            # llm_graph_input_rs: the cell each state is read from
    ATTN_SCALE = "attn_scale"    # llm_graph_input_attn_temp: query temperature per token
    NO_CACHE_MASK = "no_cache_mask"  # llm_graph_input_attn_no_cache: encoder mask
    MEAN = "mean"                # llm_graph_input_mean: mean pooling weights
    CLS = "cls"                  # llm_graph_input_cls: rows pooled by CLS/last


@dataclass(eq=False)
class GraphInput:
    """One input leaf the builder made, with what fills it; ``attn``: the attention inputs
    (and so the KV cache) an index, mask or rotation input belongs to."""

    kind: InputKind
    tensor: Tensor
    attn: AttnInputs | None = None


class LlmGraph:
    """State shared by the per-architecture builders (``llm_graph_context``)."""

    def __init__(self, model: ModelInfo, run: Resolved):
        self.model = model
        self.run = run
        self.g = Graph()
        self.n_tokens = run.n_tokens
        self.n_outputs = run.n_outputs
        self._weights: dict[str, Tensor] = {}
        self.caches: list[KVCache] = []
        #: res->t_inp_embd, set by build_inp_embd
        self.inp_embd: Tensor | None = None
        #: llm_graph_input_attn_kv of each cache, in the order they were built
        self.attn_inputs: list[AttnInputs] = []
        #: recurrent states (graphcost.graph.llm_recurrent.RecurrentState) of hybrid/recurrent models
        self.states: list = []
        #: every input leaf, in creation order, with its kind (what the executor fills)
        self.inputs: list[GraphInput] = []

    def new_input(self, kind: InputKind, type_: gt.GGMLType, ne, *, name: str = "",
                  attn: AttnInputs | None = None) -> Tensor:
        """A graph input leaf (``ggml_new_tensor`` + ``ggml_set_input``), registered with
        its kind."""
        t = self.g.new_tensor(type_, ne, name=name)
        self.inputs.append(GraphInput(kind, t, attn))
        return t

    # ---- weights -------------------------------------------------------------------
    @property
    def weights_read(self) -> frozenset[str]:
        """The GGUF tensor names the graph has read so far."""
        return frozenset(self._weights)

    def weight(self, name: str, required: bool = True) -> Tensor | None:
        """A GGUF tensor as a graph leaf (one object per name, so it is read once)."""
        if name in self._weights:
            return self._weights[name]
        info = self.model.tensor(name)
        if info is None:
            if required:
                raise UnsupportedError(f"{self.model.header.path}: tensor {name!r} is missing "
                                       f"(needed by the {self.model.arch} graph)")
            return None
        t = self.g._new("NONE", info.type, info.ne, name=name, role="weight")
        t.layer, t.block = None, "other"
        self._weights[name] = t
        return t

    def lw(self, il: int, short: str, required: bool = True) -> Tensor | None:
        """A per-layer weight ``blk.<il>.<short>``."""
        return self.weight(f"blk.{il}.{short}", required)

    # ---- inputs --------------------------------------------------------------------
    def build_inp_embd(self, tok_embd: Tensor, scale: float = 0.0) -> Tensor:
        """``scale``: hparams.f_embedding_scale, which llama.cpp loads only for the
        architectures that have one (Granite); 0 means none."""
        g, n_embd = self.g, self.model.n_embd
        # hparams.n_embd_inp(): deepstack models (qwen3vl) take n_embd * (1 + n_deepstack)
        n_embd_inp = n_embd * (1 + self.model.n_deepstack_layers)
        tokens = g.cb(self.new_input(InputKind.TOKENS, gt.I32, [self.n_tokens]), "inp_tokens")
        embd_in = g.cb(self.new_input(InputKind.EMBD, gt.F32, [n_embd_inp, self.n_tokens]),
                       "inp_embd")
        cur = g.get_rows(tok_embd, tokens)
        if n_embd_inp != n_embd:
            cur = g.pad(cur, [n_embd_inp - n_embd, 0, 0, 0])
        # ggml_build_forward_select: both paths are visited, the token path computes
        g.expand(cur)
        g.expand(embd_in)
        if n_embd_inp != n_embd:
            cur = g.view(cur, [n_embd, self.n_tokens], [cur.nb[1]], 0)
        #: res->t_inp_embd (qwen3vl's deepstack layers add views of it)
        self.inp_embd = cur
        if scale != 0.0:
            cur = g.scale(cur, scale)
        g.cb(cur, "embd")
        g.expand(cur)
        return cur

    def build_inp_pos(self, n_pos_per_embd: int = 1) -> Tensor:
        """build_inp_pos: I32 [n_tokens * n_pos_per_embd] (4 for multi-section rope)."""
        return self.g.cb(self.new_input(InputKind.POS, gt.I32, [self.n_tokens * n_pos_per_embd]),
                         "inp_pos")

    def build_inp_attn_scale(self) -> Tensor:
        """build_inp_attn_scale: F32 [1, 1, n_tokens] ``inp_attn_scale``, the per-token
        query temperature (llm_graph_input_attn_temp)."""
        return self.new_input(InputKind.ATTN_SCALE, gt.F32, [1, 1, self.n_tokens],
                              name="inp_attn_scale")

    def build_inp_out_ids(self) -> Tensor:
        return self.new_input(InputKind.OUT_IDS, gt.I32, [self.n_outputs], name="out_ids")

    def make_cache(self, name: str, layers: list[int], size: int, n_kv: int,
                   reuse: dict[int, int] | None = None, *, flat: bool = False) -> KVCache:
        """llama_kv_cache constructor: K/V buffers [n_embd_gqa, size, n_stream]; layers in
        ``reuse`` get none and read the buffers of the layer they map to. With MLA
        (``hparams.is_mla()``) K only: it holds the compressed KV and the rope part, and V
        is read as a view of it (``has_v = !is_mla``). ``flat``: 1-D [n_embd_gqa * size]
        buffers and no rotation, as llama_kv_cache_init made them in 2024-08."""
        m, run, g = self.model, self.run, self.g
        v_trans = not run.flash_attn if run.settings.v_trans is None else run.settings.v_trans
        has_v = not m.is_mla
        ns = run.n_stream
        k, v = {}, {}
        for il in layers:
            shape_k = [m.n_embd_k_gqa(il) * size] if flat else [m.n_embd_k_gqa(il), size, ns]
            k[il] = g.new_tensor(run.type_k, shape_k, name=f"cache_k_l{il}", role="kv")
            k[il].layer = il
            if has_v:
                # [TAG_V_CACHE_VARIABLE]: a transposed V cache has the widest row on every
                # layer (not in 2024-08's flat caches)
                n_v = m.n_embd_v_gqa(il) if not v_trans or flat else m.n_embd_v_gqa_max()
                v[il] = g.new_tensor(run.type_v, [n_v * size] if flat else [n_v, size, ns],
                                     name=f"cache_v_l{il}", role="kv")
                v[il].layer = il
        if flat:
            cache = KVCache(name, size, n_kv, tuple(layers), v_trans, k, v, False, False)
            self.caches.append(cache)
            return cache
        # llama_kv_cache ctor: attn_rot_k/v (Hadamard rotation for quantized caches), only
        # when the cache's layers share one head size (n_embd_head_k_all > 0); the % 64
        # test is on the full layers' head size (hparams.n_embd_head_k()). With MLA
        # n_embd_head_v_all stays 0, so no V rotation (and build_attn_inp_k builds no
        # rotation inputs at all)
        hk = {m.head_k(il) for il in layers}
        hv = {m.head_v(il) for il in layers}
        rot_k = len(hk) == 1 and gt.is_quantized(run.type_k) and m.head_dim_k % 64 == 0
        rot_v = (has_v and len(hv) == 1 and gt.is_quantized(run.type_v)
                 and m.head_dim_v % 64 == 0)
        cache = KVCache(name, size, n_kv, tuple(layers), v_trans, k, v, rot_k, rot_v,
                        dict(reuse or {}), hk.pop() if len(hk) == 1 else -1, ns)
        self.caches.append(cache)
        return cache

    def build_attn_inputs(self, cache: KVCache) -> AttnInputs:
        """build_input_k_idxs / v_idxs, build_attn_inp_kq_mask, build_input_k_rot / v_rot."""
        return self._attn_inputs(cache, with_v=True)

    def build_attn_inputs_k(self, cache: KVCache) -> AttnInputs:
        """build_attn_inp_k_impl (MLA, K-only cache): build_input_k_idxs and
        build_attn_inp_kq_mask; no V indices, no rotation inputs."""
        return self._attn_inputs(cache, with_v=False)

    def _attn_inputs(self, cache: KVCache, with_v: bool) -> AttnInputs:
        m, T = self.model, self.n_tokens
        inp = AttnInputs(cache)
        inp.k_idxs = self.new_input(InputKind.K_IDXS, gt.I64, [T], name="attn_inp_k_idxs",
                                    attn=inp)
        if with_v:
            # hparams.n_embd_v_gqa_max(): over every layer of the model, not only the cache's
            n_v = T if not cache.v_trans else T * m.n_embd_v_gqa_max()
            inp.v_idxs = self.new_input(InputKind.V_IDXS, gt.I64, [n_v],
                                        name="attn_inp_v_idxs", attn=inp)
        inp.kq_mask = self._kq_mask(inp)
        self.attn_inputs.append(inp)
        return inp

    def _kq_mask(self, inp: AttnInputs) -> Tensor:
        """build_attn_inp_kq_mask: [n_kv, n_tokens / n_stream, 1, n_stream] (n_stream: the
        ubatch's sequences, 1 with -kvu: Resolved.graph_streams), F16 with flash attention."""
        mask_type = gt.F16 if self.run.flash_attn else gt.F32
        ns = self.run.graph_streams
        return self.new_input(InputKind.KQ_MASK, mask_type,
                              [inp.cache.n_kv, self.n_tokens // ns, 1, ns],
                              name="attn_inp_kq_mask", attn=inp)

    def build_rot_inputs(self, inp: AttnInputs) -> None:
        if inp.cache.rot_k:
            nrot = 64
            while inp.cache.head_k_all % (nrot * 2) == 0:
                nrot *= 2
            inp.k_rot = self.new_input(InputKind.K_ROT, gt.F32, [nrot, nrot],
                                       name="attn_inp_k_rot", attn=inp)
        if inp.cache.rot_v:
            inp.v_rot = self.new_input(InputKind.V_ROT, gt.F32, [64, 64],
                                       name="attn_inp_v_rot", attn=inp)

    # ---- blocks --------------------------------------------------------------------
    def build_norm(self, cur: Tensor, mw: Tensor | None, mb: Tensor | None, il: int,
                   kind: str = "rms") -> Tensor:
        g = self.g
        cur = g.rms_norm(cur, self.model.rms_eps) if kind == "rms" else g.norm(cur, self.model.norm_eps)
        if mw is not None or mb is not None:
            g.cb(cur, "norm", il)
        if mw is not None:
            cur = g.mul(cur, mw)
            if mb is not None:
                g.cb(cur, "norm_w", il)
        if mb is not None:
            cur = g.add(cur, mb)
        return cur

    def mm(self, w: Tensor, cur: Tensor) -> Tensor:
        """build_lora_mm without adapters: one MUL_MAT."""
        return self.g.mul_mat(w, cur)

    def build_qkv(self, il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """build_qkv, separate Q/K/V weights with optional biases, reshaped to 3-D; the
        fused path when the layer has ``attn_qkv.weight``."""
        g, m, T = self.g, self.model, self.n_tokens
        wqkv = self.lw(il, "attn_qkv.weight", required=False)
        if wqkv is not None:
            return self.build_qkv_fused(il, cur, wqkv)
        q, k, v = (self.proj(il, short, cur, name)
                   for short, name in (("attn_q", "Qcur"), ("attn_k", "Kcur"), ("attn_v", "Vcur")))
        q = g.reshape(q, [m.head_k(il), m.n_head[il], T])
        k = g.reshape(k, [m.head_k(il), m.n_head_kv[il], T])
        v = g.reshape(v, [m.head_v(il), m.n_head_kv[il], T])
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        return q, k, v

    def build_qkv_fused(self, il: int, cur: Tensor, wqkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """build_qkv's fused path: :meth:`fused_qkv`, then Q/K/V as strided 3-D views of
        its rows (no copy; V is non-contiguous, so the non-FA V store CONTs it)."""
        g = self.g
        q, k, v = self.split_qkv(il, self.fused_qkv(il, cur, wqkv), per_head=True)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        return q, k, v

    def fused_qkv(self, il: int, cur: Tensor, wqkv: Tensor) -> Tensor:
        """build_qkv with a fused weight: one MUL_MAT named ``wqkv`` (+ ``attn_qkv.bias``,
        or the three separate Q/K/V biases CONCATenated, named ``wqkv_b``)."""
        g = self.g
        qkv = g.cb(self.mm(wqkv, cur), "wqkv", il)
        b = self.lw(il, "attn_qkv.bias", required=False)
        if b is None:
            # create_tensor_qkv loads separate biases only when there is no fused one
            bq, bk, bv = (self.lw(il, f"attn_{x}.bias", required=False) for x in "qkv")
            if bq is not None and bk is not None and bv is not None:
                b = g.concat(g.concat(bq, bk, 0), bv, 0)
        if b is not None:
            qkv = g.cb(g.add(qkv, b), "wqkv_b", il)
        return qkv

    def split_qkv(self, il: int, qkv: Tensor, per_head: bool) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as views of the fused projection's rows (Q, K, V in that order):
        ``per_head`` 3-D [head_dim, heads, T] (build_qkv), else 2-D [heads * head_dim, T]
        (build_qkv with ``reshape = false``)."""
        g, m, rs = self.g, self.model, gt.row_size
        T = qkv.ne[1]
        out, offs = [], 0
        for hd, heads in ((m.head_k(il), m.n_head[il]), (m.head_k(il), m.n_head_kv[il]),
                          (m.head_v(il), m.n_head_kv[il])):
            if per_head:
                out.append(g.view(qkv, [hd, heads, T], [rs(qkv.type, hd), qkv.nb[1]],
                                  rs(qkv.type, offs)))
            else:
                out.append(g.view(qkv, [hd * heads, T], [qkv.nb[1]], rs(qkv.type, offs)))
            offs += hd * heads
        return out[0], out[1], out[2]

    def rope(self, x: Tensor, pos: Tensor, factors: Tensor | None, il: int, mode: int,
             freq_base: float, freq_scale: float) -> Tensor:
        """ggml_rope_ext with the context's rope parameters (llm_graph_context: n_ctx_orig =
        cparams.n_ctx_orig_yarn, ext_factor / attn_factor / beta_fast / beta_slow =
        cparams.yarn_*, see :func:`graphcost.format.model.yarn_context`); ggml_rope_multi (the same
        ROPE op, with hparams.rope_sections) for the multi-section modes (MROPE 8, IMROPE 40)."""
        m = self.model
        extra = {"sections": m.rope_sections} if mode in (8, 40) else {}
        return self.g.rope(x, pos, factors, n_dims=m.rot(il), mode=mode, freq_base=freq_base,
                           freq_scale=freq_scale, n_ctx_orig=m.n_ctx_orig_yarn or m.n_ctx_train,
                           **yarn_context(m), **extra)

    def proj(self, il: int, short: str, cur: Tensor, name: str, bias_name: str | None = None) -> Tensor:
        """build_lora_mm(blk.il.<short>.weight, cur) cb'ed ``name``, plus the optional
        ``<short>.bias`` ADD cb'ed ``bias_name`` (default: ``name`` again)."""
        g = self.g
        t = g.cb(self.mm(self.lw(il, f"{short}.weight"), cur), name, il)
        b = self.lw(il, f"{short}.bias", required=False)
        if b is not None:
            t = g.cb(g.add(t, b), bias_name or name, il)
        return t

    def ffn_down(self, il: int, cur: Tensor, suffix: str = "") -> Tensor:
        """build_ffn's down projection: unnamed, or ``ffn_down`` then an unnamed bias ADD."""
        g = self.g
        cur = self.mm(self.lw(il, f"ffn_down{suffix}.weight"), cur)
        b = self.lw(il, f"ffn_down{suffix}.bias", required=False)
        if b is not None:
            g.cb(cur, "ffn_down", il)
            cur = g.add(cur, b)
        return cur

    def build_ffn_par(self, il: int, cur: Tensor, act: str, suffix: str = "") -> Tensor:
        """build_ffn with a parallel gate (LLM_FFN_PAR) and SILU or GELU: fused GLU split.
        ``suffix`` picks other weights (``_shexp``: ``ffn_up_shexp`` ...); the names the
        results are cb'ed with stay ``ffn_up``, ``ffn_gate``, ``ffn_swiglu``."""
        up = self.proj(il, f"ffn_up{suffix}", cur, "ffn_up", "ffn_up_b")
        gate = self.proj(il, f"ffn_gate{suffix}", cur, "ffn_gate", "ffn_gate_b")
        op, name = {"silu": ("SWIGLU", "ffn_swiglu"), "gelu": ("GEGLU", "ffn_geglu")}[act]
        cur = self.g.cb(self.g.glu_split(op, gate, up), name, il)
        return self.ffn_down(il, cur, suffix)

    #: build_ffn's activations without a parallel gate: op and the name it is cb'ed with
    FFN_SEQ_ACT = {"gelu": ("GELU", "ffn_gelu"), "silu": ("SILU", "ffn_silu"),
                   "swiglu": ("SWIGLU", "ffn_swiglu"), "geglu": ("GEGLU", "ffn_geglu")}

    def build_ffn_seq(self, il: int, cur: Tensor, act: str, suffix: str = "") -> Tensor:
        """build_ffn without a gate (LLM_FFN_SEQ): up (+ bias), activation, down (+ bias).
        ``swiglu``/``geglu`` are the one-input GLUs (up is [2F]: act(first half) * second).
        ``suffix`` picks other weights (``_shexp``: nemotron_h's shared expert)."""
        g = self.g
        if act == "relu_sqr":  # LLM_FFN_RELU_SQR: RELU (ffn_relu), then SQR (ffn_sqr(relu))
            cur = self.proj(il, f"ffn_up{suffix}", cur, "ffn_up", "ffn_up_b")
            cur = g.cb(g.unary("RELU", cur), "ffn_relu", il)
            cur = g.cb(g.sqr(cur), "ffn_sqr(relu)", il)
            return self.ffn_down(il, cur, suffix)
        if suffix:
            raise UnsupportedError(f"sequential ffn {act!r} with {suffix!r} weights is not implemented")
        if act not in self.FFN_SEQ_ACT:
            raise UnsupportedError(f"sequential ffn activation {act!r} is not implemented")
        cur = self.proj(il, "ffn_up", cur, "ffn_up", "ffn_up_b")
        op, name = self.FFN_SEQ_ACT[act]
        cur = g.glu(op, cur) if act in ("swiglu", "geglu") else g.unary(op, cur)
        g.cb(cur, name, il)
        return self.ffn_down(il, cur)

    def hadamard(self, cur: Tensor, rot: Tensor) -> Tensor:
        """llama_mul_mat_hadamard (src/llama-impl.h): rotate rows of ``rot.ne0`` elements."""
        g = self.g
        n = rot.ne[0]
        shape2 = [n, cur.n_elements // n]
        res = g.reshape(cur, shape2) if cur.is_contiguous() else g.cont(cur, shape2)
        res = g.mul_mat(rot, res)
        res.params["hint"] = "src0_is_hadamard"  # ggml_mul_mat_set_hint(res, GGML_HINT_SRC0_IS_HADAMARD)
        return g.reshape(res, cur.ne)

    # ---- attention -----------------------------------------------------------------
    @staticmethod
    def _merge_streams(g: Graph, t: Tensor) -> Tensor:
        """llama_kv_cache::cpy_k/cpy_v with n_stream > 1: the buffer reshaped to 2-D
        [n_embd_gqa, kv_size * n_stream] ("the idxs are global"); as is with one stream."""
        return g.reshape(t, [t.ne[0], t.ne[1] * t.ne[2]]) if t.ne[2] > 1 else t

    def cpy_k(self, cache: KVCache, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        g = self.g
        k_cur = g.view(k_cur, [k_cur.ne[0] * k_cur.ne[1], k_cur.ne[2]], [k_cur.nb[2]], 0)
        return g.set_rows(self._merge_streams(g, cache.k[il]), k_cur, k_idxs)

    def cpy_v(self, cache: KVCache, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        g = self.g
        n_embd_gqa = v_cur.ne[0] * v_cur.ne[1]
        T = v_cur.ne[2]
        v = cache.v[il]
        if not cache.v_trans:
            v_cur = g.view(v_cur, [n_embd_gqa, T], [v_cur.nb[2]], 0)
            return g.set_rows(self._merge_streams(g, v), v_cur, v_idxs)
        if gt.row_size(v_cur.type, n_embd_gqa) == v_cur.nb[2]:
            v_cur = g.reshape(v_cur, [n_embd_gqa, T])
        else:
            v_cur = g.cont(v_cur, [n_embd_gqa, T])
        if n_embd_gqa < v.ne[0]:  # [TAG_V_CACHE_VARIABLE]: pad to the cache's row
            v_cur = g.pad(v_cur, [v.ne[0] - n_embd_gqa, 0, 0, 0])
        v_view = g.reshape(v, [1, v.n_elements])
        v_cur = g.reshape(v_cur, [1, v_cur.n_elements])
        return g.set_rows(v_view, v_cur, v_idxs)

    def get_k(self, cache: KVCache, il: int) -> Tensor:
        """llama_kv_cache::get_k: [head_k, n_head_kv, n_kv, ns] over the streams s0..s1 the
        ubatch uses (from stream 0: the full state's and one sequence's)."""
        m, k = self.model, cache.k[cache.reuse.get(il, il)]
        rs = gt.row_size
        return self.g.view(k, [m.head_k(il), m.n_head_kv[il], cache.n_kv, self.run.graph_streams],
                           [rs(k.type, m.head_k(il)), rs(k.type, k.ne[0]),
                            rs(k.type, k.ne[0] * cache.size)], 0)

    def get_v(self, cache: KVCache, il: int) -> Tensor:
        """llama_kv_cache::get_v: as :meth:`get_k`; transposed (``v_trans``) it is
        [n_kv, n_head_kv, head_v, ns]."""
        m, v = self.model, cache.v[cache.reuse.get(il, il)]
        rs = gt.row_size
        ns = self.run.graph_streams
        if not cache.v_trans:
            return self.g.view(v, [m.head_v(il), m.n_head_kv[il], cache.n_kv, ns],
                               [rs(v.type, m.head_v(il)), rs(v.type, v.ne[0]),
                                rs(v.type, v.ne[0] * cache.size)], 0)
        return self.g.view(v, [cache.n_kv, m.n_head_kv[il], m.head_v(il), ns],
                           [rs(v.type, cache.size * m.head_v(il)), rs(v.type, cache.size),
                            rs(v.type, cache.size * v.ne[0])], 0)

    def build_attn_mha(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, kq_scale: float,
                       il: int, sinks: Tensor | None = None,
                       v_mla: Tensor | None = None) -> Tensor:
        """``sinks``: per-head attention-sink logits (gpt-oss ``attn_sinks``), added to the
        FLASH_ATTN_EXT or SOFT_MAX node after it is made, as llama.cpp does. ``v_mla``
        (MLA's ``wv_b``) decompresses the attention result from MQA back to the heads'
        value size."""
        g, m = self.g, self.model
        v_trans = v.nb[1] > v.nb[2]
        ns = k.ne[3]
        q = g.view(q, [q.ne[0], q.ne[1], q.ne[2] // ns, ns],
                   [q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // ns)], 0)
        q = g.permute(q, 0, 2, 1, 3)
        k = g.permute(k, 0, 2, 1, 3)
        v = g.permute(v, 0, 2, 1, 3)
        if self.run.flash_attn:
            if v_trans:
                v = g.transpose(v)
            # F32 K/V: no KV cache (an embedding model's non-causal attention) or -ctk f32
            if k.type == gt.F32:
                k = g.cast(k, gt.F16)
            if v.type == gt.F32:
                v = g.cast(v, gt.F16)
            cur = g.flash_attn_ext(q, k, v, mask, kq_scale, 0.0, m.attn_softcap)
            g.flash_attn_ext_add_sinks(cur, sinks)
            if v_mla is not None:  # as a matrix-matrix product with n_tokens in dim 1
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.cb(g.mul_mat(v_mla, cur), "fattn_mla", il)
                cur = g.permute(cur, 0, 2, 1, 3)
                cur = g.cont(cur)
            cur = g.reshape(cur, [cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]])
        else:
            kq = g.cb(g.mul_mat(k, q), "kq", il)
            if m.attn_softcap:  # hparams.attn_soft_cap (gemma2): cap * tanh(kq / cap)
                kq = g.cb(g.scale(kq, 1.0 / m.attn_softcap), "kq_scaled_1", il)
                kq = g.cb(g.unary("TANH", kq), "kq_tanh", il)
                kq = g.cb(g.scale(kq, m.attn_softcap), "kq_scaled_2", il)
            kq = g.soft_max_ext(kq, mask, kq_scale, 0.0)
            g.soft_max_add_sinks(kq, sinks)
            kq = g.cb(kq, "kq_soft_max", il)
            if not v_trans:
                v = g.cb(g.cont(g.transpose(v)), "v_cont", il)
            kqv = g.cb(g.mul_mat(v, kq), "kqv", il)
            if v_mla is not None:
                kqv = g.cb(g.mul_mat(v_mla, kqv), "kqv_mla", il)
            cur = g.permute(kqv, 0, 2, 1, 3)
            cur = g.cont(cur, [cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]])
        g.expand(cur)
        return cur

    def build_attn(self, inp: AttnInputs, wo: Tensor | None, wo_b: Tensor | None, q: Tensor,
                   k: Tensor | None, v: Tensor | None, kq_scale: float, il: int,
                   iswa: bool, sinks: Tensor | None = None) -> Tensor:
        """build_attn for llm_graph_input_attn_kv (``iswa=False``: expands q, v, k) and
        llm_graph_input_attn_kv_iswa (``iswa=True``: expands q, k, v). ``k``/``v`` None
        (iswa only: a gemma3n layer without KV) stores nothing and attends the cache of the
        layer it reuses."""
        g, cache = self.g, inp.cache
        if inp.k_rot is not None:
            q = self.hadamard(q, inp.k_rot)
            if k is not None:
                k = self.hadamard(k, inp.k_rot)
        if inp.v_rot is not None and v is not None:
            v = self.hadamard(v, inp.v_rot)
        for t in ((q, k, v) if iswa else (q, v, k)):
            if t is not None:
                g.expand(t)
        if k is not None:
            g.expand(self.cpy_k(cache, k, inp.k_idxs, il))
        if v is not None:
            g.expand(self.cpy_v(cache, v, inp.v_idxs, il))
        kk = self.get_k(cache, il)
        vv = self.get_v(cache, il)
        cur = g.cb(self.build_attn_mha(q, kk, vv, inp.kq_mask, kq_scale, il, sinks),
                   "kqv_out", il)
        if inp.v_rot is not None:
            cur = self.hadamard(cur, inp.v_rot)
        if wo is None:  # qwen3next gates the attention output before its projection
            return cur
        cur = self.mm(wo, cur)
        if wo_b is not None:
            cur = g.add(cur, wo_b)
        return cur

    def build_attn_k(self, inp: AttnInputs, wo: Tensor, q: Tensor, k: Tensor, v: Tensor,
                     v_mla: Tensor | None, kq_scale: float, il: int) -> Tensor:
        """build_attn for llm_graph_input_attn_k (MLA: one K-only cache): expands q, v, k,
        stores K, reads V as the first ``v.ne0`` elements of each K row, no output bias."""
        g, cache = self.g, inp.cache
        for t in (q, v, k):
            g.expand(t)
        g.expand(self.cpy_k(cache, k, inp.k_idxs, il))
        kk = self.get_k(cache, il)
        vv = g.view(kk, [v.ne[0], kk.ne[1], kk.ne[2], kk.ne[3]], kk.nb[1:], 0)
        cur = g.cb(self.build_attn_mha(q, kk, vv, inp.kq_mask, kq_scale, il, v_mla=v_mla),
                   "kqv_out", il)
        return self.mm(wo, cur)

    # ---- no KV cache (encoders: bert) ----------------------------------------------
    def build_attn_inp_no_cache(self) -> Tensor:
        """build_attn_inp_no_cache: only a mask, [n_tokens, n_tokens, 1, 1] (no KV cells:
        keys are this ubatch's tokens), F16 with flash attention, named ``self_kq_mask``.
        (The sliding-window second mask is not modelled: no encoder here has one.)"""
        T = self.n_tokens
        mask_type = gt.F16 if self.run.flash_attn else gt.F32
        return self.new_input(InputKind.NO_CACHE_MASK, mask_type, [T, T, 1, 1], name="self_kq_mask")

    def build_attn_no_cache(self, mask: Tensor, wo: Tensor, wo_b: Tensor | None, q: Tensor,
                            k: Tensor, v: Tensor, kq_scale: float, il: int) -> Tensor:
        """build_attn for llm_graph_input_attn_no_cache: expands q, k, v, then attention
        over the ubatch's own (F32) K and V, ``kqv_out``, output projection (+ bias)."""
        g = self.g
        for t in (q, k, v):
            g.expand(t)
        cur = g.cb(self.build_attn_mha(q, k, v, mask, kq_scale, il), "kqv_out", il)
        cur = self.mm(wo, cur)
        if wo_b is not None:
            cur = g.add(cur, wo_b)
        return cur

    def build_inp_mean(self) -> Tensor:
        """build_inp_mean: F32 [n_tokens, n_seqs_unq]."""
        return self.new_input(InputKind.MEAN, gt.F32, [self.n_tokens, self.run.n_seqs],
                              name="mean")

    def build_inp_cls(self) -> Tensor:
        """build_inp_cls: I32 [n_seqs_unq], the row of each sequence's CLS/last token."""
        return self.new_input(InputKind.CLS, gt.I32, [self.run.n_seqs], name="cls")

    def build_pooling(self, inp: Tensor, pooling: int, cls: Tensor | None = None,
                      cls_b: Tensor | None = None, cls_out: Tensor | None = None,
                      cls_out_b: Tensor | None = None, rank_mean: bool = False) -> Tensor:
        """llm_graph_context::build_pooling (src/llama-graph.cpp), run only with
        embeddings on. ``pooling`` is gguf.PoolingType: NONE keeps ``inp`` (renamed),
        MEAN is CONT(TRANSPOSE(inp)) x ``mean``, CLS/LAST are GET_ROWS(inp, ``cls``),
        RANK is MEAN (``rank_mean``: classifier.pooling_type MEAN) or CLS, then the
        classification head: ``cls`` MUL_MAT (+ bias) and TANH, ``cls.output`` (+ bias).
        The result is named ``result_embd_pooled``."""
        g = self.g
        if pooling == PoolingType.NONE:
            cur = inp
        elif pooling == PoolingType.MEAN or (pooling == PoolingType.RANK and rank_mean):
            if inp.ne[1] != self.n_tokens:
                # the reserve ubatch of -np N sequences rounds n_tokens up to a multiple of
                # N while n_outputs stays (graph_reserve): ggml_mul_mat's GGML_ASSERT
                raise SettingsError(
                    f"--parallel {self.run.n_seq_max}: llama.cpp aborts reserving the graph "
                    f"(mean pooling of {inp.ne[1]} output rows with a mean of {self.n_tokens} "
                    "tokens: GGML_ASSERT(ggml_can_mul_mat)); give a -ub that -np divides")
            mean = self.build_inp_mean()
            cur = g.mul_mat(g.cont(g.transpose(inp)), mean)
        elif pooling in (PoolingType.CLS, PoolingType.LAST, PoolingType.RANK):
            cur = g.get_rows(inp, self.build_inp_cls())
        else:
            raise UnsupportedError(f"{self.model.header.path}: pooling type {pooling} is not "
                                   "one llama.cpp knows (GGML_ABORT)")
        if pooling == PoolingType.RANK:
            if cls is not None:
                cur = self.mm(cls, cur)
                if cls_b is not None:
                    cur = g.add(cur, cls_b)
                cur = g.unary("TANH", cur)
            if cls_out is not None:
                cur = self.mm(cls_out, cur)
                if cls_out_b is not None:
                    cur = g.add(cur, cls_out_b)
        g.cb(cur, "result_embd_pooled")
        g.expand(cur)
        return cur

    def select_rows(self, il: int, *ts: Tensor, out_ids: Tensor) -> list[Tensor]:
        """Last layer: keep only the output rows (``ggml_get_rows(cur, inp_out_ids)``)."""
        if il != self.model.n_layer - 1:
            return list(ts)
        return [self.g.get_rows(t, out_ids) for t in ts]

    def kq_scale_default(self) -> float:
        return 1.0 / math.sqrt(self.model.head_dim_k)
