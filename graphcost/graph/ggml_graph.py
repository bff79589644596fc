"""A shape-only mirror of the ggml graph API: tensors, ops, names and node order.

This is the part of ggml (``ggml/src/ggml.c``) that decides what a llama.cpp graph looks
like, reproduced without any data:

* each op function computes the result's ``ne`` (elements per dim, ggml order), ``nb``
  (byte strides), type and sources exactly as its ggml namesake does;
* derived tensors are named as ggml names them at creation — ``"<src> (view)"``,
  ``" (reshaped)"``, ``" (permuted)"``, ``" (transposed)"``, ``" (cont)"``,
  ``"<dst> (copy of <src>)"`` — and a later :meth:`Graph.cb` rename wins, like
  llama.cpp's graph callback;
* :meth:`Graph.expand` is ``ggml_build_forward_expand``: a post-order DFS over ``src[0],
  src[1], ...`` that appends each unvisited op to the node list and each unvisited op-less
  tensor to the leaf list, naming still-unnamed ones ``node_<i>`` / ``leaf_<i>`` at that
  moment (``ggml_visit_parents_graph``).

Tensors also carry what the cost model needs and ggml does not store: their ``role``
(weight, input, kv, activation), the model layer and the block (attention, ffn, other)
that was being built when they were created.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphcost.format import ggml_types as gt
from graphcost.graph import ops
from graphcost.format.ggml_types import GGMLType
from graphcost.graph.ops import Op


@dataclass(eq=False)
class Tensor:
    """One ggml tensor: a leaf (``op == "NONE"``) or the result of an op."""

    op: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    src: list["Tensor"] = field(default_factory=list)
    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    view_src: "Tensor | None" = None
    view_offs: int = 0
    role: str = "activation"  # weight | input | kv | activation
    layer: int | None = None
    block: str = "other"  # attention | ffn | other

    @property
    def n_elements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: bytes spanned by the tensor's strides (a view's extent)."""
        blk = gt.block(self.type)[0]
        if any(n == 0 for n in self.ne):
            return 0
        if blk > 1:
            total = gt.row_size(self.type, self.ne[0])
        else:  # ggml_nbytes: one element plus the strides (a transposed view spans less)
            total = gt.type_size(self.type) + (self.ne[0] - 1) * self.nb[0]
        for i in range(1, 4):
            total += (self.ne[i] - 1) * self.nb[i]
        return total

    @property
    def data_bytes(self) -> int:
        """Bytes of the elements themselves (rows x row size): what reading it touches,
        which for a strided view (e.g. the transposed V cache) is less than its span."""
        return gt.row_size(self.type, self.ne[0]) * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def storage(self) -> "Tensor":
        """The tensor that owns the memory this one looks at (itself if not a view)."""
        t = self
        while t.view_src is not None:
            t = t.view_src
        return t

    def is_contiguous(self, n: int = 0) -> bool:
        """ggml_is_contiguous_n: dims above ``n`` must be packed; size-1 dims are ignored."""
        blk, size = gt.block(self.type)
        next_nb = size
        if self.ne[0] != blk and self.nb[0] != next_nb:
            return False
        next_nb *= self.ne[0] // blk
        for i in range(1, 4):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != next_nb:
                        return False
                    next_nb *= self.ne[i]
                else:
                    next_nb = self.ne[i] * self.nb[i]
        return True

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Tensor({self.name!r}, {self.op}, {gt.type_name(self.type)}, {list(self.ne)})"


def contiguous_nb(t: GGMLType, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Strides of a freshly allocated tensor (ggml_new_tensor_impl)."""
    nb0 = gt.type_size(t)
    nb1 = gt.row_size(t, ne[0])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def _ne4(ne) -> tuple[int, int, int, int]:
    ne = tuple(int(x) for x in ne)
    return ne + (1,) * (4 - len(ne))  # type: ignore[return-value]


class Graph:
    """Builds tensors like a ggml context and orders them like a ggml cgraph.

    ``layer`` and ``block`` are the builder's current position; every tensor created
    records them.
    """

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._visited: set[int] = set()
        self.layer: int | None = None
        self.block: str = "other"

    # ---- tensor creation -------------------------------------------------------------
    def _new(self, op: str, type_: GGMLType, ne, src=(), *, name: str = "", params=None,
             nb=None, view_src: Tensor | None = None, view_offs: int = 0, role: str = "activation") -> Tensor:
        ne4 = _ne4(ne)
        return Tensor(op=ops.check(op), type=GGMLType(type_), ne=ne4, nb=nb or contiguous_nb(type_, ne4),
                      src=[s for s in src], name=name, params=dict(params or {}),
                      view_src=view_src, view_offs=view_offs, role=role,
                      layer=self.layer, block=self.block)

    def new_tensor(self, type_: GGMLType, ne, *, name: str = "", role: str = "input") -> Tensor:
        """ggml_new_tensor_Nd: a leaf (graph input, weight or cache buffer)."""
        return self._new(Op.NONE, type_, ne, name=name, role=role)

    def cb(self, t: Tensor, name: str, il: int = -1) -> Tensor:
        """llama.cpp's graph callback: rename to ``name-il`` (or ``name`` when il < 0)."""
        t.name = f"{name}-{il}" if il >= 0 else name
        return t

    # ---- views ---------------------------------------------------------------------
    def _view(self, a: Tensor, op: str, ne, nb, offs: int, suffix: str, params=None) -> Tensor:
        return self._new(op, a.type, ne, [a], name=f"{a.name}{suffix}", nb=tuple(nb),
                         view_src=a.view_src or a, view_offs=a.view_offs + offs, params=params)

    def view(self, a: Tensor, ne, nb_upper=(), offset: int = 0) -> Tensor:
        """ggml_view_1d..4d: ``nb_upper`` are nb[1..n-1]; unspecified dims are packed."""
        ne4 = _ne4(ne)
        nb = [gt.type_size(a.type), 0, 0, 0]
        nb_upper = list(nb_upper)
        for i in range(1, 4):
            if i - 1 < len(nb_upper):
                nb[i] = nb_upper[i - 1]
            elif i == 1:
                nb[i] = gt.row_size(a.type, ne4[0])
            else:
                nb[i] = nb[i - 1] * ne4[i - 1]
        return self._view(a, Op.VIEW, ne4, nb, offset, " (view)", {"offset": offset})

    def view_tensor(self, a: Tensor) -> Tensor:
        """ggml_view_tensor: a full view, used as the result of in-place style ops."""
        return self._view(a, Op.VIEW, a.ne, a.nb, 0, " (view)")

    def reshape(self, a: Tensor, ne) -> Tensor:
        """ggml_reshape_Nd: needs a contiguous source; same memory, new shape."""
        ne4 = _ne4(ne)
        if not a.is_contiguous():
            raise ValueError(f"reshape of non-contiguous {a.name!r}")
        if ne4[0] * ne4[1] * ne4[2] * ne4[3] != a.n_elements:
            raise ValueError(f"reshape of {a.name!r} changes the element count")
        return self._view(a, Op.RESHAPE, ne4, contiguous_nb(a.type, ne4), 0, " (reshaped)")

    def permute(self, a: Tensor, ax0: int, ax1: int, ax2: int, ax3: int) -> Tensor:
        """ggml_permute: source dim i goes to position ax_i."""
        axes = (ax0, ax1, ax2, ax3)
        ne = [0] * 4
        nb = [0] * 4
        for i, ax in enumerate(axes):
            ne[ax] = a.ne[i]
            nb[ax] = a.nb[i]
        return self._view(a, Op.PERMUTE, ne, nb, 0, " (permuted)", {"axes": axes})

    def transpose(self, a: Tensor) -> Tensor:
        ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
        nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
        return self._view(a, Op.TRANSPOSE, ne, nb, 0, " (transposed)")

    # ---- copies ----------------------------------------------------------------------
    def cont(self, a: Tensor, ne=None) -> Tensor:
        """ggml_cont / ggml_cont_Nd: a packed copy (optionally reshaped)."""
        ne4 = _ne4(ne) if ne is not None else a.ne
        return self._new(Op.CONT, a.type, ne4, [a], name=f"{a.name} (cont)")

    def cpy(self, a: Tensor, b: Tensor) -> Tensor:
        """ggml_cpy: write ``a`` into ``b`` (converting type); the result is a view of b."""
        name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
        return self._new(Op.CPY, b.type, b.ne, [a, b], name=name, nb=b.nb,
                         view_src=b.view_src or b, view_offs=b.view_offs)

    def cast(self, a: Tensor, type_: GGMLType) -> Tensor:
        """ggml_cast: a new tensor of another type (op CPY)."""
        res = self._new(Op.CPY, type_, a.ne, [a], name=f"{a.name} (copy)")
        res.src.append(res)  # ggml_cast: src[1] is the result itself
        return res

    def set_rows(self, a: Tensor, b: Tensor, idx: Tensor) -> Tensor:
        """ggml_set_rows: scatter rows of ``b`` into ``a`` at ``idx``; result views ``a``."""
        v = self.view_tensor(a)
        v.op = Op.SET_ROWS.value
        v.src = [b, idx, a]
        v.params = {}
        return v

    # ---- compute ops -------------------------------------------------------------------
    def mul_mat(self, a: Tensor, b: Tensor) -> Tensor:
        """ggml_mul_mat: a [K, M, ...] x b [K, N, B2, B3] -> F32 [M, N, B2, B3]."""
        if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
            raise ValueError(f"mul_mat shapes {a.ne} x {b.ne}")
        return self._new(Op.MUL_MAT, gt.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b])

    def _binary(self, op: str, a: Tensor, b: Tensor) -> Tensor:
        for i in range(4):
            if a.ne[i] % b.ne[i]:
                raise ValueError(f"{op}: {b.ne} does not broadcast to {a.ne}")
        return self._new(op, a.type, a.ne, [a, b])

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self._binary(Op.ADD, a, b)

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        return self._binary(Op.MUL, a, b)

    def div(self, a: Tensor, b: Tensor) -> Tensor:
        return self._binary(Op.DIV, a, b)

    def concat(self, a: Tensor, b: Tensor, dim: int) -> Tensor:
        """ggml_concat: ``b`` after ``a`` along ``dim``; other dims as ``a``; type of ``a``."""
        ne = list(a.ne)
        ne[dim] += b.ne[dim]
        return self._new(Op.CONCAT, a.type, ne, [a, b], params={"dim": dim})

    def pad(self, a: Tensor, p) -> Tensor:
        """ggml_pad: ``p[i]`` zeros appended after dim i (ggml_pad_ext with lp = 0)."""
        ne = [a.ne[i] + p[i] for i in range(4)]
        return self._new(Op.PAD, a.type, ne, [a], params={"pad": tuple(p)})

    def repeat_4d(self, a: Tensor, ne) -> Tensor:
        """ggml_repeat_4d: ``a`` tiled to ``ne`` (each ne[i] a multiple of a.ne[i])."""
        ne4 = _ne4(ne)
        if any(ne4[i] % a.ne[i] for i in range(4)):
            raise ValueError(f"repeat of {a.ne} to {ne4}")
        return self._new(Op.REPEAT, a.type, ne4, [a])

    def scale(self, a: Tensor, s: float, bias: float = 0.0) -> Tensor:
        return self._new(Op.SCALE, a.type, a.ne, [a], params={"scale": s, "bias": bias})

    def scale_inplace(self, a: Tensor, s: float) -> Tensor:
        """ggml_scale_inplace: SCALE whose result is a view of ``a`` (ggml_view_tensor)."""
        v = self.view_tensor(a)
        v.op = Op.SCALE.value
        v.params = {"scale": s, "bias": 0.0}
        return v

    def sqr(self, a: Tensor) -> Tensor:
        """ggml_sqr: x*x per element (GGML_OP_SQR, not a unary sub-op)."""
        return self._new(Op.SQR, a.type, a.ne, [a])

    def rms_norm(self, a: Tensor, eps: float) -> Tensor:
        return self._new(Op.RMS_NORM, a.type, a.ne, [a], params={"eps": eps})

    def norm(self, a: Tensor, eps: float) -> Tensor:
        return self._new(Op.NORM, a.type, a.ne, [a], params={"eps": eps})

    def get_rows(self, a: Tensor, idx: Tensor) -> Tensor:
        """ggml_get_rows: rows ``idx`` of ``a`` -> [a.ne0, idx.ne0, idx.ne1, idx.ne2]."""
        t = gt.I32 if a.type == gt.I32 else gt.F32
        return self._new(Op.GET_ROWS, t, (a.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]), [a, idx])

    def rope(self, a: Tensor, pos: Tensor, freq_factors: Tensor | None, **params) -> Tensor:
        src = [a, pos] + ([freq_factors] if freq_factors is not None else [])
        return self._new(Op.ROPE, a.type, a.ne, src, params=params)

    def soft_max_ext(self, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
        src = [a] + ([mask] if mask is not None else [])
        return self._new(Op.SOFT_MAX, a.type, a.ne, src, params={"scale": scale, "max_bias": max_bias})

    def soft_max_add_sinks(self, a: Tensor, sinks: Tensor | None) -> None:
        """ggml_soft_max_add_sinks: attention sinks (F32 [n_head], one logit per head that
        joins each row's softmax) become ``src[2]``, after the mask."""
        _add_sinks(a, sinks, Op.SOFT_MAX, 2)

    def flash_attn_ext_add_sinks(self, a: Tensor, sinks: Tensor | None) -> None:
        """ggml_flash_attn_ext_add_sinks: the sinks become ``src[4]``, after the mask."""
        _add_sinks(a, sinks, Op.FLASH_ATTN_EXT, 4)

    def flash_attn_ext(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                       scale: float, max_bias: float, softcap: float) -> Tensor:
        """ggml_flash_attn_ext: result F32 [Dv, H, T, ns] (already permuted)."""
        ne = (v.ne[0], q.ne[2], q.ne[1], q.ne[3])
        src = [q, k, v] + ([mask] if mask is not None else [])
        return self._new(Op.FLASH_ATTN_EXT, gt.F32, ne, src,
                         params={"scale": scale, "max_bias": max_bias, "softcap": softcap})

    def unary(self, op: str, a: Tensor) -> Tensor:
        """ggml_silu / ggml_gelu / ggml_tanh ...: ``op`` is the ggml_op_desc name (``SILU``)."""
        if op not in ops.UNARY:
            raise ValueError(f"{op!r} is not a ggml unary op")
        return self._new(op, a.type, a.ne, [a])

    def glu_split(self, op: str, a: Tensor, b: Tensor) -> Tensor:
        """ggml_swiglu_split / ggml_geglu_split: act(a) * b, result shaped like ``a``."""
        if op not in ops.GLU:
            raise ValueError(f"{op!r} is not a ggml GLU op")
        return self._new(op, a.type, a.ne, [a, b])

    def swiglu_oai(self, a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
        """ggml_swiglu_oai (GLU op ``SWIGLU_OAI``, gpt-oss): x = min(a, limit),
        y = clamp(b, -limit, limit), x * sigmoid(alpha * x) * (y + 1); shaped like ``a``."""
        return self._new(Op.SWIGLU_OAI, a.type, a.ne, [a, b],
                         params={"alpha": alpha, "limit": limit})

    def glu(self, op: str, a: Tensor) -> Tensor:
        """ggml_swiglu / ggml_geglu (one source): act(first half) * second half."""
        if op not in ops.GLU:
            raise ValueError(f"{op!r} is not a ggml GLU op")
        return self._new(op, a.type, (a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3]), [a])

    # ---- recurrent ------------------------------------------------------------------------
    def ssm_conv(self, sx: Tensor, c: Tensor) -> Tensor:
        """ggml_ssm_conv: depthwise causal conv of sx [d_conv - 1 + n_t, d_inner, n_s] with
        c [d_conv, d_inner] -> F32 [d_inner, n_t, n_s]."""
        d_conv, d_inner = c.ne[0], c.ne[1]
        n_t = sx.ne[0] - d_conv + 1
        if sx.ne[1] != d_inner or n_t < 0:
            raise ValueError(f"ssm_conv shapes {sx.ne} x {c.ne}")
        return self._new(Op.SSM_CONV, gt.F32, (d_inner, n_t, sx.ne[2]), [sx, c])

    def ssm_scan(self, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                 ids: Tensor, K: int = 1) -> Tensor:
        """ggml_ssm_scan: selective scan of x [head_dim, n_head, n_t, n_s] from the states
        s [d_state, head_dim, n_head, rows] picked by ids I32 [n_s] -> F32 1-D
        [nelements(x) + K * d_state * head_dim * n_head * n_s] (y, then the new states)."""
        n = x.n_elements + K * s.ne[0] * s.ne[1] * s.ne[2] * ids.ne[0]
        return self._new(Op.SSM_SCAN, gt.F32, (n,), [s, x, dt, A, B, C, ids], params={"K": K})

    def gated_delta_net(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                        state: Tensor, K: int = 1) -> Tensor:
        """ggml_gated_delta_net: v [S_v, H, n_t, n_s], state [S_v, S_v, H, n_s] -> F32
        [S_v * H, n_t * n_s + K * S_v * n_s] (the outputs, then K state snapshots)."""
        S_v, H, n_t, n_s = v.ne
        if state.ne != (S_v, S_v, H, n_s) or beta.ne[0] != 1 or g.ne[0] not in (1, S_v):
            raise ValueError(f"gated_delta_net shapes v {v.ne} state {state.ne} g {g.ne} beta {beta.ne}")
        return self._new(Op.GATED_DELTA_NET, gt.F32, (S_v * H, n_t * n_s + K * S_v * n_s),
                         [q, k, v, g, beta, state], params={"K": K})

    # ---- mixture of experts ------------------------------------------------------------
    def soft_max(self, a: Tensor) -> Tensor:
        """ggml_soft_max: softmax over rows, no mask, scale 1."""
        return self.soft_max_ext(a, None, 1.0, 0.0)

    def mul_mat_id(self, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        """ggml_mul_mat_id: experts as_ [K, M, n_expert] x b [K, n_b, T] for ids I32 [k, T]
        -> F32 [M, k, T] (b's dim 1 broadcasts over the k slots)."""
        if as_.ne[0] != b.ne[0] or ids.ne[1] != b.ne[2] or ids.ne[0] % b.ne[1]:
            raise ValueError(f"mul_mat_id shapes {as_.ne} x {b.ne} for ids {ids.ne}")
        return self._new(Op.MUL_MAT_ID, gt.F32, (as_.ne[1], ids.ne[0], b.ne[2], 1), [as_, b, ids])

    def add_id(self, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
        """ggml_add_id: a [n, k, T] + row ``ids[i1, i2]`` of b [n, n_expert] (per-expert
        biases); result shaped like ``a`` (ggml_dup_tensor)."""
        if a.ne[0] != b.ne[0] or a.ne[1] != ids.ne[0] or a.ne[2] != ids.ne[1]:
            raise ValueError(f"add_id shapes {a.ne} + {b.ne} for ids {ids.ne}")
        return self._new(Op.ADD_ID, a.type, a.ne, [a, b, ids])

    def argsort(self, a: Tensor, order: str = "desc") -> Tensor:
        """ggml_argsort: I32 indices that sort each row (same shape as ``a``)."""
        return self._new(Op.ARGSORT, gt.I32, a.ne, [a], params={"order": order})

    def argsort_top_k(self, a: Tensor, k: int) -> Tensor:
        """ggml_argsort_top_k: a descending ARGSORT, then a view of its first ``k`` columns."""
        res = self.argsort(a, "desc")
        return self.view(res, [k, res.ne[1], res.ne[2], res.ne[3]], [res.nb[1], res.nb[2], res.nb[3]], 0)

    def sum_rows(self, a: Tensor) -> Tensor:
        """ggml_sum_rows: [n, r1, r2, r3] -> [1, r1, r2, r3]."""
        return self._new(Op.SUM_ROWS, a.type, (1, a.ne[1], a.ne[2], a.ne[3]), [a])

    def clamp(self, a: Tensor, lo: float, hi: float) -> Tensor:
        """ggml_clamp: a new tensor (ggml_dup_tensor, so unnamed) with values in [lo, hi]."""
        return self._new(Op.CLAMP, a.type, a.ne, [a], params={"min": lo, "max": hi})

    def fill(self, a: Tensor, c: float) -> Tensor:
        """ggml_fill: a new tensor shaped like ``a`` (ggml_dup_tensor, unnamed), every
        element ``c``; ``a`` is a source for its shape only."""
        return self._new(Op.FILL, a.type, a.ne, [a], params={"c": c})

    # ---- gemma3n (AltUp, LAuReL, activation sparsity) ----------------------------------
    def sub(self, a: Tensor, b: Tensor) -> Tensor:
        """ggml_sub: a - b (b broadcast)."""
        return self._binary("SUB", a, b)

    def sqrt(self, a: Tensor) -> Tensor:
        """ggml_sqrt: same shape."""
        return self._new("SQRT", a.type, a.ne, [a])

    def mean(self, a: Tensor) -> Tensor:
        """ggml_mean: row means, F32 [1, r1, r2, r3]."""
        return self._new("MEAN", gt.F32, (1, a.ne[1], a.ne[2], a.ne[3]), [a])

    # ---- graph order -------------------------------------------------------------------
    def expand(self, t: Tensor) -> None:
        """ggml_build_forward_expand: append ``t`` and its unvisited ancestors, post-order."""
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        if id(t) in self._visited:
            return
        self._visited.add(id(t))
        while stack:
            node, i = stack.pop()
            if i < len(node.src):
                stack.append((node, i + 1))
                s = node.src[i]
                if id(s) not in self._visited:
                    self._visited.add(id(s))
                    stack.append((s, 0))
                continue
            if node.op == Op.NONE:
                if not node.name:
                    node.name = f"leaf_{len(self.leafs)}"
                self.leafs.append(node)
            else:
                if not node.name:
                    node.name = f"node_{len(self.nodes)}"
                self.nodes.append(node)


def _add_sinks(a: Tensor, sinks: Tensor | None, op: Op, n_src: int) -> None:
    """The sinks (if any) appended to ``a`` (an ``op`` node with its mask: ``n_src``
    sources) as its last source, and flagged in its params."""
    if sinks is None:
        return
    if a.op != op or len(a.src) != n_src:
        raise ValueError(f"attention sinks need a {op} with a mask")
    a.src.append(sinks)
    a.params["sinks"] = True
