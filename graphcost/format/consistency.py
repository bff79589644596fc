"""The header's consistency, checked once, up front, before any graph is built.

llama.cpp's loader refuses a file whose tensors contradict its hyperparameters
(``llama_model_loader::create_tensor``: "tensor 'X' has wrong shape; expected ..., got
..."), whose ``rope.dimension_count`` is not the head size for llama and falcon
(``llama_model::load_hparams``: "invalid n_rot"), or whose expert counts break its
asserts. Without these checks a hostile or broken header reaches the graph builder and
fails deep inside it ("reshape of 'Qcur-0' changes the element count"); here it fails in
one line naming the key and the tensor.

Shapes are checked for the tensor kinds whose shape llama.cpp gives the same way in every
architecture graphcost models (``src/llama-model.cpp``, ``load_tensors``):
``token_embd``/``output`` ``{n_embd, n_vocab}``; ``attn_q`` ``{n_embd, n_head *
head_dim_k}`` (twice that for the gated queries of ``GATED_Q``; a hybrid's recurrent layers'
``attn_*`` tensors are its recurrent block's and not checked here); ``attn_k``/``attn_v`` ``{n_embd, n_head_kv * head_dim}``; ``attn_qkv``
``{n_embd, n_head * head_dim_k + n_head_kv * (head_dim_k + head_dim_v)}``; ``attn_output``
``{n_head * head_dim_v, n_embd}`` (MLA: the ``_mla`` head sizes for ``attn_q`` and
``attn_output``; NextN/MTP blocks, outside the trunk graph, are not checked); ``ffn_gate``/``ffn_down`` ``{n_embd, n_ff}``/``{n_ff,
n_embd}``; ``ffn_up`` ``{n_embd, n_ff}`` (phi3 fuses gate and up: ``{n_embd, 2 n_ff}``);
``ffn_gate_inp`` ``{n_embd, n_expert}``; the expert tensors' ``n_embd`` and ``n_expert``
dims; layer norms ``{n_embd}``; a bias is as long as its weight's output. Norm weights
must be F32: llama.cpp's converters write every 1-D tensor as F32 and graphcost costs and
runs them as such.
"""
from __future__ import annotations

import re
from typing import Iterable

from gguf import Keys

from graphcost.format import ggml_types as gt
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.format.gguf_reader import TensorInfo
from graphcost.format.model import ModelInfo

#: llama_token is int32_t (include/llama.h): a vocabulary past it cannot be addressed
MAX_VOCAB = 2**31 - 1
#: LLAMA_MAX_EXPERTS (src/llama-hparams.h)
MAX_EXPERTS = 1024
#: architectures whose n_rot must equal the head size (llama_model::load_hparams)
ROT_EQUALS_HEAD = ("llama", "falcon")
#: architectures whose attn_q holds a query and an output gate per head: {n_embd, 2 n_head
#: head_dim} (create_tensor_qkv(..., n_embd_head_k * n_head * 2, ...) in src/models/<arch>.cpp)
GATED_Q = ("qwen3next", "qwen35", "qwen35moe")
#: layer norms as long as the embedding (gguf tensor names)
_EMBD_NORMS = ("attn_norm", "attn_norm_2", "ffn_norm", "post_attention_norm", "post_ffw_norm")
_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _ne4(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (4 - len(ne))


def check_hparams(m: ModelInfo) -> None:
    """Raise one line for the first hyperparameter of ``m`` llama.cpp's load_hparams
    refuses, or a block tensor past block_count; return if there is none. (Run before
    :func:`graphcost.graph.created_tensors.refuse_uncreated_tensors`, which evaluates the
    loader's branches on these hyperparameters, and :func:`check_tensors`.)"""
    path = m.header.path
    key = lambda template: template.format(arch=m.arch)  # noqa: E731

    if m.n_vocab > MAX_VOCAB:
        raise GraphcostError(f"{path}: vocabulary of {m.n_vocab} tokens ({key(Keys.LLM.VOCAB_SIZE)!r}) "
                             f"is more than llama.cpp's int32 token ids can address ({MAX_VOCAB})")
    if m.n_rot > m.head_dim_k:
        raise GraphcostError(f"{path}: {key(Keys.Rope.DIMENSION_COUNT)!r} = {m.n_rot} is larger "
                             f"than the head size {m.head_dim_k}")
    if m.n_swa > 0 and any(m.is_swa) and m.rot(m.is_swa.index(True)) > m.head_k(m.is_swa.index(True)):
        raise GraphcostError(f"{path}: {key(Keys.Rope.DIMENSION_COUNT_SWA)!r} = "
                             f"{m.rot(m.is_swa.index(True))} is larger than the sliding-window "
                             f"layers' head size {m.head_k(m.is_swa.index(True))}")
    if m.arch in ROT_EQUALS_HEAD and m.n_rot != m.head_dim_k:
        raise GraphcostError(f"{path}: {key(Keys.Rope.DIMENSION_COUNT)!r} = {m.n_rot}: {m.arch} "
                             f"needs the head size {m.head_dim_k} (llama.cpp: invalid n_rot)")
    if m.n_expert > MAX_EXPERTS:
        raise GraphcostError(f"{path}: {key(Keys.LLM.EXPERT_COUNT)!r} = {m.n_expert} is above "
                             f"llama.cpp's LLAMA_MAX_EXPERTS ({MAX_EXPERTS})")
    n_blocks = m.n_layer + m.n_layer_nextn
    for t in m.tensors.values():
        mt = _BLK.match(t.name)
        if mt is not None and int(mt.group(1)) >= n_blocks:
            raise GraphcostError(f"{path}: tensor {t.name!r} is in layer {mt.group(1)}, but "
                                 f"{key(Keys.LLM.BLOCK_COUNT)!r} = {n_blocks}")


def check_tensors(m: ModelInfo) -> None:
    """Raise one line for the first tensor of ``m`` whose shape contradicts the
    hyperparameters or whose experts have no expert_used_count (llama.cpp checks the shapes
    of the tensors it creates: run after
    :func:`graphcost.graph.created_tensors.refuse_uncreated_tensors`, which checks the
    shapes of the tensors it meets before a fault of its own, in the loader's order); return
    if there is none."""
    path = m.header.path
    key = lambda template: template.format(arch=m.arch)  # noqa: E731
    check_shapes(m, m.tensors)
    for il in range(m.n_layer):
        if m.tensor(f"blk.{il}.ffn_gate_inp.weight") is not None and not m.n_expert_used[il]:
            raise GraphcostError(f"{path}: layer {il} has experts (ffn_gate_inp) but "
                                 f"{key(Keys.LLM.EXPERT_USED_COUNT)!r} gives it 0")


def check_shapes(m: ModelInfo, names: Iterable[str]) -> None:
    """Raise one line for the first of the tensors ``names`` (in that order; names the
    file lacks are skipped) whose shape contradicts the hyperparameters, as llama.cpp's
    create_tensor does for each tensor it creates ("has wrong shape"), or whose type
    graphcost does not model (a norm weight not F32); return if there is none."""
    path = m.header.path
    key = lambda template: template.format(arch=m.arch)  # noqa: E731

    def expect(t: TensorInfo, ne: tuple[int, ...], why: str) -> None:
        if _ne4(t.ne) != _ne4(ne):
            raise GraphcostError(f"{path}: tensor {t.name!r} has shape {list(t.ne)}, the "
                                 f"hyperparameters say {list(ne)} ({why})")

    E, V = m.n_embd, m.n_vocab
    for name in ("token_embd.weight", "output.weight"):
        t = m.tensor(name)
        if t is not None:
            expect(t, (E, V), f"n_embd {E} = {key(Keys.LLM.EMBEDDING_LENGTH)!r}, "
                              f"n_vocab {V}")
    for t in (m.tensors[n] for n in names if n in m.tensors):
        if "norm" in t.name and t.name.endswith(".weight") and t.type != gt.F32:
            raise UnsupportedError(f"{path}: norm weight {t.name!r} is {t.type_name}; graphcost "
                                   "models F32 norm weights (as llama.cpp's converters write them)")
        if t.name == "output_norm.weight":
            expect(t, (E,), f"n_embd {E}")
        mt = _BLK.match(t.name)
        if mt is None:
            continue
        il, kind, part = int(mt.group(1)), mt.group(2), mt.group(3)
        if il >= m.n_layer:
            continue  # a NextN/MTP block: not in the trunk graph graphcost builds
        if part == "bias":
            w = m.tensor(f"blk.{il}.{kind}.weight")
            if w is not None and len(w.ne) == 2 and kind not in _EMBD_NORMS:
                expect(t, (w.ne[1],), f"one value per output of {w.name!r}")
            continue
        _check_layer_tensor(m, t, il, kind, expect)


def _check_layer_tensor(m: ModelInfo, t: TensorInfo, il: int, kind: str, expect) -> None:
    E = m.n_embd
    hq, hkv = m.n_head[il], m.n_head_kv[il]
    dk, dv = m.head_k(il), m.head_v(il)  # per layer: gemma4's sliding layers differ
    heads = f"n_head {hq}, n_head_kv {hkv}, head size {dk}"
    ff = m.n_ff[il]
    # MLA (deepseek2): Q and the output projection use the decompressed head sizes
    # (key_length_mla / value_length_mla), the cache the compressed ones
    q_head = m.head_dim_k_mla or dk
    o_head = m.head_dim_v_mla or dv
    if m.recurrent(il) and kind.startswith("attn_") and kind not in _EMBD_NORMS:
        return  # a hybrid's recurrent block (qwen3next's attn_qkv/attn_gate) has its own sizes
    if kind == "attn_q":
        expect(t, (E, (2 if m.arch in GATED_Q else 1) * hq * q_head),
               f"n_head {hq}, head size {q_head}")
    elif kind == "attn_k":
        expect(t, (E, hkv * dk), heads)
    elif kind == "attn_v":
        expect(t, (E, hkv * dv), heads)
    elif kind == "attn_qkv":
        expect(t, (E, hq * dk + hkv * (dk + dv)), heads)
    elif kind == "attn_output":
        expect(t, (hq * o_head, E), f"n_head {hq}, value head size {o_head}")
    elif kind in _EMBD_NORMS:
        expect(t, (E,), f"n_embd {E}")
    elif kind in ("ffn_gate", "ffn_down") and ff:
        expect(t, (E, ff) if kind == "ffn_gate" else (ff, E), f"n_embd {E}, n_ff {ff}")
    elif kind == "ffn_up" and ff:
        if _ne4(t.ne) != _ne4((E, 2 * ff)):
            expect(t, (E, ff), f"n_embd {E}, n_ff {ff}")
    elif kind == "ffn_gate_inp":
        expect(t, (E, m.n_expert), f"n_embd {E}, expert_count {m.n_expert}")
    elif kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        # nemotron_h: experts work in a moe_latent_size space when the file has one
        latent = m.header.metadata.get(Keys.LLM.MOE_LATENT_SIZE.format(arch=m.arch))
        ee, what = ((latent, f"moe_latent_size {latent}") if isinstance(latent, int) and latent > 0
                    else (E, f"n_embd {E}"))
        n_ff_exp = t.ne[1] if kind != "ffn_down_exps" else t.ne[0]
        want = (n_ff_exp, ee, m.n_expert) if kind == "ffn_down_exps" else (ee, n_ff_exp, m.n_expert)
        expect(t, want, f"{what}, expert_count {m.n_expert}")
