"""``-sm tensor``: llama.cpp's tensor parallelism, what each device holds.

Mirrors llama.cpp as vendored by llama-cpp-python 0.3.36:

* devices (``src/llama.cpp``, ``llama_prepare_model_devices``): every device whose buffer
  type is not the CPU's, in the registry's order (GPU backends, then the RPC servers'
  devices, which ``common/arg.cpp`` ``add_rpc_devices`` registers after the built-in
  backends), or ``-dev`` as given, become ONE model device, the Meta device
  (``ggml/src/ggml-backend-meta.cpp`` ``ggml_backend_meta_device``). Layers go to it as to
  one device (``-ngl``; ``-ts`` does not move layers), the input layer stays on the CPU;
* the refusals: ``llm_arch_supports_sm_tensor`` (``src/llama-arch.cpp``, checked in
  ``llama_model_create``), flash attention (``llama_init_from_model``, llama-context.cpp:
  auto becomes on, off is refused) and the fit (``common/fit.cpp``);
* every tensor in the Meta buffer type is split by ``llama_meta_device_get_split_state``
  (``src/llama-model.cpp``): a split axis (0: columns, 1: rows), segments and a
  granularity per segment, ``-ts`` proportions rotated by layer; MIRRORED and PARTIAL
  tensors are whole on every device. Each device allocates its slices with its own buffer
  type (``ggml_backend_meta_alloc_ctx_tensors_from_buft``: ``sum(GGML_PAD(alloc_size,
  alignment))``), and llama.cpp logs the largest as the Meta buffer's size;
* the KV cache (``cache_k_l<il>``, ``cache_v_l<il>``) is split the same way, by columns
  (whole KV heads; V is never transposed, flash attention being on);
* compute: the Meta buffer type's allocation size is the largest of its devices'
  (``ggml_backend_meta_buffer_type_get_alloc_size``) for the whole, unsplit tensor, and
  ``ggml_backend_meta_buffer_type_alloc_buffer`` allocates that size on EVERY device: each
  device's compute buffer is what one device of that kind would need (the scheduler sees a
  single Meta backend; no pipeline parallelism: that needs ``-sm layer``). Modelled for
  RPC devices (checked against real runs); other kinds are not modelled (the Meta device
  has no ``offload_op`` and no ``graph_optimize``, unlike CUDA or Metal).

Not in any buffer llama.cpp logs: ``ggml_backend_meta_graph_compute``'s all-reduce scratch,
``ceil(log2(n_devices))`` buffers per device of the largest PARTIAL node of the graph being
computed (none on one device or without a partial sum; allocated at the first compute;
2,048 bytes = 256 x 2 tokens x 4 B in the tests' 2-token prompt): not modelled.

All sizes are bytes.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import numpy as np

from graphcost.errors import GraphcostError
from graphcost.format import ggml_types as gt
from graphcost.format.model import ModelInfo

#: src/llama-arch.cpp llm_arch_supports_sm_tensor: the architectures it returns false for
#: (names as LLM_ARCH_NAMES spells them)
UNSUPPORTED_ARCHS = frozenset({
    "grok", "mpt", "plamo2", "minicpm3", "gemma3n", "mamba", "mamba2", "jamba", "falcon-h1",
    "olmo2", "olmoe", "deepseek2", "deepseek32", "hy_v4", "dots3note", "glm-dsa", "bitnet",
    "t5", "nemotron_h", "nemotron_h_moe", "granitehybrid", "minimax-01", "minimax-m2",
    "minimax-m3", "mistral4", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next",
    "qwen3tts", "qwen4exp"})
#: architectures with their own branches in llama_meta_device_get_split_state (Q-gate and
#: linear-attention segments [TAG_SPLIT_QGATE_QWEN], DeepSeek V4's grouped output, HRM's
#: mirrored caches, LFM2's mirrored conv state): not modelled here
SPECIAL_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4",
                           "dflash", "hrm_text", "lfm2", "lfm2moe"})

AXIS_0, AXIS_1 = 0, 1  # ggml_backend_meta_split_axis: split ne[0] (columns), ne[1] (rows)
MIRRORED, PARTIAL = "MIRRORED", "PARTIAL"  # whole on every device
#: llama.cpp logs the Meta device and its buffer type as "Meta()": the constructors of
#: ggml_backend_meta_device_context and ggml_backend_meta_buffer_type_context build the
#: name from their moved-from argument (an empty list)
LOGGED_NAME = "Meta()"
#: common/fit.cpp common_params_fit_impl (llama-fit-params then exits 1; llama-completion
#: warns and runs with the flags as given)
FIT_REFUSAL = ("-sm tensor: llama_params_fit is not implemented for SPLIT_MODE_TENSOR "
               "(common/fit.cpp; llama-fit-params exits 1): give -ngl and -c yourself")


def _rx(p: str) -> re.Pattern:
    return re.compile(p)


# llama_meta_device_get_split_state's patterns (std::regex_match: the whole name)
P_Q_WEIGHT = _rx(r"blk\.\d*\.attn_q.weight")
P_KV_WEIGHT = _rx(r"blk\.\d*\.attn_(k|v).weight")
P_QKV_WEIGHT = _rx(r"blk\.\d*\.attn_qkv.weight")
P_Q_BIAS = _rx(r"blk\.\d*\.attn_q\.bias")
P_KV_BIAS = _rx(r"blk\.\d*\.attn_(k|v)\.bias")
P_QKV_BIAS = _rx(r"blk\.\d*\.attn_qkv.bias")
P_QK_NORM = _rx(r"blk\.\d*\.attn_(q|k)_norm\.weight")
P_KV_CACHE = _rx(r"cache_(k|v)_l\d*")
P_IDX_CACHE = _rx(r"cache_idx_(k|v)_l\d*")
P_ATTN_SINKS = _rx(r"blk\.\d*\.attn_sinks.weight")
P_ATTN_OUT_WEIGHT = _rx(r"blk\.\d*\.attn_output.weight")
P_ATTN_OUT_BIAS = _rx(r"blk\.\d*\.attn_output.bias")
P_ATTN_GATE_WEIGHT = _rx(r"blk\.\d*\.attn_gate.weight")
P_RECURRENT = _rx(r"blk\.\d*\.ssm_.*|cache_(r|s|ple_r)_l\d*")
P_FFN_UP_WEIGHT = _rx(r"blk\.\d*\.ffn_up(_exps)?.weight")
P_FFN_UP_BIAS = _rx(r"blk\.\d*\.ffn_up(_exps)?.bias")
P_FFN_GATE_WEIGHT = _rx(r"blk\.\d*\.ffn_gate(_exps)?.weight")
P_FFN_GATE_BIAS = _rx(r"blk\.\d*\.ffn_gate(_exps)?.bias")
P_FFN_GATE_UP_WEIGHT = _rx(r"blk\.\d*\.ffn_gate_up(_exps)?.weight")
P_FFN_DOWN_WEIGHT = _rx(r"blk\.\d*\.ffn_down(_exps)?.weight")
P_FFN_DOWN_BIAS = _rx(r"blk\.\d*\.ffn_down.bias")
P_FFN_DOWN_EXPS_BIAS = _rx(r"blk\.\d*\.ffn_down_exps.bias")
P_FFN_SHEXP_WEIGHT = _rx(r"blk\.\d*\.ffn_(up|gate|down)_shexp.weight")
P_OUTPUT_WEIGHT = _rx(r"output\.weight")
P_OUTPUT_BIAS = _rx(r"output\.bias")


def _m(p: re.Pattern, name: str) -> bool:
    return p.fullmatch(name) is not None


def check_supported(model: ModelInfo, flash_attn: str) -> None:
    """llama.cpp's refusals of ``-sm tensor``, and graphcost's own where the split is not
    modelled (one line each)."""
    if model.arch in UNSUPPORTED_ARCHS:
        # llama_model_create: "LLAMA_SPLIT_MODE_TENSOR not implemented for architecture '%s'"
        raise GraphcostError(f"-sm tensor: LLAMA_SPLIT_MODE_TENSOR not implemented for "
                             f"architecture '{model.arch}' (llama.cpp refuses it too: "
                             "llm_arch_supports_sm_tensor)")
    if flash_attn == "off":
        # llama_init_from_model: auto is turned on, off refused
        raise GraphcostError("-sm tensor: SPLIT_MODE_TENSOR requires flash_attn to be enabled "
                             "(llama.cpp refuses -fa off too); use -fa on or auto")
    if model.arch in SPECIAL_ARCHS or any(model.is_recr):
        raise GraphcostError(f"-sm tensor: the tensor split of {model.arch} (its own segments "
                             "in llama_meta_device_get_split_state, or recurrent layers) is "
                             "not modelled")


# ---- the split state of one tensor ----------------------------------------------------------

@dataclass(frozen=True)
class SplitState:
    """llama_meta_device_get_split_state's answer: the axis, and per segment the elements
    of that axis on each device (``ne[segment][device]``) and its repeat count ``nr``
    (a fused tensor's parts: Q then K and V x 2)."""

    axis: int | str
    ne: tuple[tuple[int, ...], ...] = ()
    nr: tuple[int, ...] = ()

    def device_ne(self, j: int) -> int:
        """Elements along the split axis on device ``j`` (init_tensor_impl's ne[split_dim])."""
        return sum(ne[j] * nr for ne, nr in zip(self.ne, self.nr))


_AO, _SO = "attn_output.weight", "ssm_out.weight"
_DOWN, _DOWN_X = "ffn_down.weight", "ffn_down_exps.weight"
#: get_tensor_config (the non-DeepSeek-V4, non-HRM branch), in its order: the patterns, the
#: axis, the tensor whose type sets the block size (None: the tensor itself) and its fallback
_RULES: tuple[tuple[tuple[re.Pattern, ...], int | str, str | None, str | None], ...] = (
    ((P_IDX_CACHE,), MIRRORED, None, None),
    ((P_Q_WEIGHT, P_KV_WEIGHT, P_QKV_WEIGHT), AXIS_1, _AO, _SO),
    ((P_Q_BIAS, P_KV_BIAS, P_QKV_BIAS), AXIS_0, _AO, _SO),
    ((P_QK_NORM,), AXIS_1, _AO, None),  # one row ([head_dim]): MIRRORED
    ((P_KV_CACHE, P_ATTN_SINKS), AXIS_0, _AO, None),
    ((P_ATTN_OUT_WEIGHT,), AXIS_0, None, None),
    ((P_ATTN_OUT_BIAS,), MIRRORED, None, None),
    ((P_ATTN_GATE_WEIGHT,), AXIS_1, _AO, _SO),
    ((P_FFN_UP_WEIGHT, P_FFN_GATE_WEIGHT, P_FFN_GATE_UP_WEIGHT), AXIS_1, _DOWN, _DOWN_X),
    ((P_FFN_UP_BIAS, P_FFN_GATE_BIAS), AXIS_0, _DOWN, _DOWN_X),
    ((P_FFN_DOWN_WEIGHT,), AXIS_0, _DOWN, _DOWN_X),
    ((P_FFN_DOWN_BIAS,), MIRRORED, None, None),
    ((P_FFN_DOWN_EXPS_BIAS,), PARTIAL, None, None),  # a partial sum: whole on every device
    ((P_OUTPUT_WEIGHT,), AXIS_1, None, None),
    ((P_OUTPUT_BIAS,), AXIS_0, None, None),
)


def _config(name: str, ne: tuple[int, ...]) -> tuple[int | str, str | None, str | None]:
    """get_tensor_config: (axis, the tensor whose type sets the block size - ``None``: this
    one -, its fallback); everything no rule names (norms, shared experts, the tied output,
    rope factors) is MIRRORED."""
    if P_RECURRENT.fullmatch(name):
        raise GraphcostError(f"-sm tensor: the split of {name} (a recurrent layer's) is not modelled")
    for patterns, axis, ref, fallback in _RULES:
        if any(_m(p, name) for p in patterns):
            if patterns == (P_QK_NORM,) and ne[1] == 1:
                return MIRRORED, ref, fallback
            return axis, ref, fallback
    return MIRRORED, None, None


def _layer(name: str, model: ModelInfo, n_dev: int) -> tuple[int, str, int]:
    """(il, the ``blk.<il>.`` prefix, rotation): a layer's tensors and caches rotate by the
    number of earlier layers of the same kind (get_il_eff: recurrent and SWA alike), every
    other tensor by ``n_layer % n_devices``."""
    m = re.match(r"blk\.(\d+)\.", name) or re.match(r"cache_.*_l(\d+)$", name)
    if not m:
        return 0, "", model.n_layer % n_dev
    il = int(m.group(1))

    def kind(i: int) -> tuple[bool, bool]:
        return (model.recurrent(i) if i < model.n_layer else False,
                model.is_swa[i] if i < len(model.is_swa) else False)
    eff = sum(1 for i in range(il) if kind(i) == kind(il))
    return il, f"blk.{il}.", eff % n_dev


def _segments(name: str, axis: int, ne: tuple[int, ...], model: ModelInfo,
              il: int) -> list[tuple[int, int]]:
    """get_split_segments (the non-Qwen branch): (elements, repeats) per segment."""
    if _m(P_QKV_WEIGHT, name) or _m(P_QKV_BIAS, name):
        q = model.n_head[il] * model.head_k(il)
        k, v = model.n_embd_k_gqa(il), model.n_embd_v_gqa(il)
        if ne[axis] != q + k + v:
            raise GraphcostError(f"-sm tensor: {name} has {ne[axis]} rows, not Q+K+V = "
                                 f"{q + k + v} (llama.cpp asserts)")
        return [(q, 1), (k, 2)] if k == v else [(q, 1), (k, 1), (v, 1)]
    if _m(P_FFN_UP_WEIGHT, name) or _m(P_FFN_UP_BIAS, name):
        n_ff = model.n_ff[il] if il < len(model.n_ff) else 0
        return [(n_ff, 2)] if ne[axis] == 2 * n_ff else [(ne[axis], 1)]
    if _m(P_FFN_GATE_UP_WEIGHT, name):
        return [(ne[axis] // 2, 2)]  # llama.cpp asserts ne == 2 x n_ff_exp
    return [(ne[axis], 1)]


def _granularity(name: str, blck: int, model: ModelInfo, il: int, n_dev: int,
                 ne: tuple[int, ...], n_segments: int) -> list[int]:
    """get_split_granularity (a regular-attention layer): the multiple each device's share
    of a segment is rounded down to. Heads stay whole: Q by ``n_gqa`` heads (one KV head's
    group), K/V by one KV head, the output projection by the same heads' columns; FFN
    tensors by ``lcm(block, 128)``; everything else by 1."""
    n_head, n_head_kv = model.n_head[il], model.n_head_kv[il]
    hk, hv = model.head_k(il), model.head_v(il)
    n_gqa = n_head // n_head_kv if n_head_kv else 0
    n_embd_q = n_gqa * hk
    perf = blck  # "only increase granularity while it doesn't cause underutilization"
    while perf < 128 and perf * n_dev < n_embd_q:
        perf *= 2
    g_q = math.lcm(n_embd_q, perf)
    g_head = g_q // hk
    if _m(P_ATTN_SINKS, name):
        return [g_head]
    if _m(P_Q_WEIGHT, name) or _m(P_Q_BIAS, name):
        return [g_q]
    if _m(P_ATTN_OUT_WEIGHT, name):
        return [g_head * hv]
    if _m(P_ATTN_GATE_WEIGHT, name):
        return [g_head if ne[1] == n_head else g_q]
    g_kv = g_q // n_gqa if n_gqa else 0
    g_v = (g_kv // hk) * hv
    if _m(P_KV_WEIGHT, name) or _m(P_KV_BIAS, name) or _m(P_KV_CACHE, name):
        is_v = "attn_v" in name or "cache_v" in name
        return [g_v if is_v else g_kv]
    if _m(P_QKV_WEIGHT, name) or _m(P_QKV_BIAS, name):
        return [g_q, g_kv, g_v] if n_segments == 3 else [g_q, g_kv]
    if (_m(P_FFN_UP_WEIGHT, name) or _m(P_FFN_UP_BIAS, name) or _m(P_FFN_GATE_WEIGHT, name)
            or _m(P_FFN_GATE_BIAS, name) or _m(P_FFN_GATE_UP_WEIGHT, name)
            or _m(P_FFN_DOWN_WEIGHT, name) or _m(P_FFN_SHEXP_WEIGHT, name)):
        return [math.lcm(blck, 128)]
    return [1] * n_segments


def _shares(ne_s: int, g: int, ts: list[float], rot: int) -> list[int]:
    """One segment's elements per device: cumulative ``-ts`` (float32, rotated by ``rot``),
    each boundary rounded down to a multiple of ``g``, the last device taking the rest;
    without ``-ts`` (all zero) equal parts ``ne * (j + 1) / n``."""
    n = len(ts)
    scan = np.zeros(n, dtype=np.float32)
    acc = np.float32(0)
    for j in range(n):
        acc = np.float32(acc + np.float32(ts[(j + rot) % n]))
        scan[j] = acc
    out = [0] * n
    low = 0
    for j in range(n - 1):
        if scan[-1] == 0:
            high = ne_s * (j + 1) // n
        else:  # int64 * float -> float (float32), / float, truncated to int64
            high = int(np.float32(np.float32(ne_s) * scan[j]) / scan[-1])
        high -= high % g
        out[(j + rot) % n] = high - low
        low = high
    out[(n - 1 + rot) % n] = ne_s - low
    return out


def split_state(name: str, ne: tuple[int, ...], model: ModelInfo, ts: list[float]) -> SplitState:
    """llama_meta_device_get_split_state for one tensor (weight or KV cache) of the Meta
    device: ``ts`` holds one proportion per device (all 0: no ``-ts``)."""
    n_dev = len(ts)
    ne = tuple(ne) + (1,) * (4 - len(ne))
    axis, ref, fallback = _config(name, ne)
    if not isinstance(axis, int):
        return SplitState(axis)
    il, prefix, rot = _layer(name, model, n_dev)
    ref_t = None
    if ref is None:
        ref_t = model.tensors.get(name)
    else:
        ref_t = model.tensors.get(prefix + ref) or (
            model.tensors.get(prefix + fallback) if fallback else None)
        if ref_t is None:
            raise GraphcostError(f"-sm tensor: {name} has no {prefix}{ref} to split by "
                                 "(llama.cpp asserts)")
    blck = gt.block(ref_t.type)[0] if ref_t is not None else 1
    segs = _segments(name, axis, ne, model, il)
    gran = _granularity(name, blck, model, il, n_dev, ne, len(segs))
    return SplitState(axis, tuple(tuple(_shares(s, g, ts, rot)) for (s, _), g in zip(segs, gran)),
                      tuple(r for _, r in segs))


def slice_shape(ne: tuple[int, ...], state: SplitState, j: int) -> tuple[int, int, int, int]:
    """Device ``j``'s slice (init_tensor_impl): ne[axis] replaced by its share."""
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    if not isinstance(state.axis, int):
        return ne4
    a = state.axis
    return ne4[:a] + (state.device_ne(j),) + ne4[a + 1:]


def slice_nbytes(type_: gt.GGMLType, ne: tuple[int, ...], state: SplitState, j: int) -> int:
    """ggml_nbytes of device ``j``'s slice as init_tensor_impl makes it: ne[axis] replaced
    by the device's share, and every stride larger than the split axis's scaled by
    share / ne[axis] (a stride equal to it is kept: a row of one quant block)."""
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    blck, tsize = gt.block(type_)
    nb = [tsize, tsize * (ne4[0] // blck)]
    for i in range(2, 4):
        nb.append(nb[i - 1] * ne4[i - 1])
    sl = slice_shape(ne4, state, j)
    if isinstance(state.axis, int):
        a = state.axis
        nb = [x * sl[a] // ne4[a] if x > nb[a] else x for x in nb]
    if any(x <= 0 for x in sl):
        return 0
    if blck == 1:
        return tsize + sum((sl[i] - 1) * nb[i] for i in range(4))
    return sl[0] * nb[0] // blck + sum((sl[i] - 1) * nb[i] for i in range(1, 4))


def device_bytes(tensors, model: ModelInfo, ts: list[float], backends) -> list[int]:
    """Each device's buffer for these Meta tensors ((name, type, ne) triples):
    ``sum(GGML_PAD(alloc_size(slice), alignment))`` with the device's buffer type
    (ggml_backend_meta_alloc_ctx_tensors_from_buft -> ggml_backend_alloc_ctx_tensors_from_buft;
    a zero-sized slice is asked too: CUDA pads its quantized row)."""
    from graphcost.memory.placement import alloc_size
    out = [0] * len(ts)
    for name, type_, ne in tensors:
        state = split_state(name, ne, model, ts)
        for j, b in enumerate(backends):
            n = slice_nbytes(type_, ne, state, j)
            out[j] += gt.ggml_pad(alloc_size(b, type_, slice_shape(ne, state, j), n), b.alignment)
    return out


def load_aborts(tensors, model: ModelInfo, ts: list[float]) -> list[str]:
    """Weights llama.cpp cannot load (``ggml_backend_meta_buffer_set_tensor`` aborts with
    "tensor write out of bounds"): split by columns, a row of exactly one quant block (its
    row stride equals the block's, so init_tensor_impl does not scale it) and a device
    with no share, whose empty slice is still written a row per row."""
    out = []
    for name, type_, ne in tensors:
        blck = gt.block(type_)[0]
        if blck == 1 or ne[0] != blck:
            continue
        state = split_state(name, ne, model, ts)
        if state.axis == AXIS_0 and any(state.device_ne(j) == 0 for j in range(len(ts))):
            out.append(name)
    return out


# ---- the memory plan -------------------------------------------------------------------------

def meta_devices(args, flags):
    """The Meta device's devices (:func:`~graphcost.memory.placement.resolve_devices`: GPU
    kinds in the order given, then the RPC ones, or ``-dev`` as given); at least one."""
    from graphcost.memory.placement import resolve_devices
    devs = resolve_devices(args, flags)
    if not devs:
        # llama_prepare_model_devices: "LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices"
        raise GraphcostError("-sm tensor: LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices "
                             "(llama.cpp refuses it too); give --device")
    return devs


def plan_tensor_split(model: ModelInfo, settings, args, flags):
    """The per-device memory of ``-sm tensor`` (a :class:`~graphcost.memory.placement.DevicePlan`):
    the model placed on one device standing for the Meta device, then every Meta tensor and
    KV buffer split across the devices; compute as one device's (RPC only)."""
    from graphcost.graph.build import resolve_for
    from graphcost.memory.placement import (DeviceArg, DeviceMemory, DevicePlan, KVBuffer,
                                            ModelBuffer, Placement, device_memory,
                                            kv_buffers, place)
    from graphcost.memory.plan import plan_memory
    from graphcost.memory.sched import compute_buffers

    run = resolve_for(model, settings)
    check_supported(model, "off" if not run.flash_attn and not run.flash_attn_auto else "on")
    for o in flags.overrides:
        if o.target != "CPU":
            raise GraphcostError(f"-sm tensor: -ot ...={o.target}: a weight on one device "
                                 "beside the Meta device is not modelled (only =CPU)")
    devs = meta_devices(args, flags)
    kinds = {(d.backend.name, tuple(sorted(d.options.items()))) for d in devs}
    if len(kinds) > 1:
        raise GraphcostError("-sm tensor: devices of different kinds or options "
                             f"({', '.join(d.name for d in devs)}) are not modelled")
    if any(d.backend.alignment is None for d in devs):
        raise GraphcostError("-sm tensor: the devices' alignment is needed "
                             "(--device vulkan,align=N)")
    # one device of that kind stands for the Meta device in the layer placement and the
    # scheduler (the Meta buffer type's alignment and alloc size are its devices' largest)
    kind = devs[0]
    one = [DeviceArg(kind.backend.name, None, tuple(sorted(kind.options.items())))]
    one_flags = dataclasses.replace(flags, split_mode="layer", tensor_split=(), main_gpu=0,
                                    select_devices=None)
    p1 = place(model, one, one_flags)
    stand_in = p1.devices[0].name
    label = "Meta(" + ",".join(d.name for d in devs) + ")"
    # llama_init_from_model: "enabling flash_attn since it is required for SPLIT_MODE_TENSOR"
    plan = plan_memory(model, resolve_for(model, dataclasses.replace(settings, flash_attn="on")))
    caches = plan.reserves[0].graph.caches
    kv1 = kv_buffers(p1, caches, flags.no_kv_offload)
    comp = (compute_buffers(plan.reserves, p1, one_flags, model.n_layer)
            if kind.backend.name == "rpc" else None)
    rows1 = device_memory(p1, kv1, output_bytes=plan.output_buffer_bytes,
                          cpu_compute_bytes=plan.compute_buffer_bytes,
                          compute=comp.bytes_by_buft if comp is not None else None)

    ts = [float(x) for x in flags.tensor_split[:len(devs)]]
    ts += [0.0] * (len(devs) - len(ts))
    backends = [d.backend for d in devs]
    meta_w = [(w.name, model.tensors[w.name].type, tuple(model.tensors[w.name].ne))
              for w in p1.weights if w.buft.kind == "device"]
    model_j = device_bytes(meta_w, model, ts, backends)
    aborts = load_aborts(meta_w, model, ts)
    kv_j = [0] * len(devs)
    kvb = [b for b in kv1 if b.row != stand_in]
    for c in caches:
        kv_t = [(t.name, t.type, tuple(t.ne)) for il in sorted(c.k)
                if not flags.no_kv_offload and p1.dev_layer[il] == stand_in
                for t in (c.k.get(il), c.v.get(il)) if t is not None]
        if kv_t:
            per = device_bytes(kv_t, model, ts, backends)
            kv_j = [a + b for a, b in zip(kv_j, per)]
            # one buffer per cache on each device (llama.cpp logs the largest as Meta())
            kvb += [KVBuffer(c.name, d.name, per[j]) for j, d in enumerate(devs)]
    meta_comp = None if comp is None else comp.bytes_by_buft.get(stand_in, 0)

    rows = []
    for r in rows1:
        if r.device == stand_in:
            rows += [DeviceMemory(d.name, model_j[j], kv_j[j], 0, meta_comp, r.output_bytes,
                                  d.free_bytes) for j, d in enumerate(devs)]
        elif comp is None and r.device == "CPU":
            rows.append(dataclasses.replace(r, compute_bytes=None))  # the scheduler's too
        else:
            rows.append(r)
    buffers = [b for b in p1.model_buffers if b.row != stand_in]
    if meta_w:
        buffers.append(ModelBuffer(LOGGED_NAME, label, max(model_j)))  # as llama.cpp logs it
    notes = list(p1.notes)
    notes.append(f"-sm tensor: one Meta device {label} (llama.cpp logs it as {LOGGED_NAME}, "
                 "with the largest device's buffer); flash attention on")
    if comp is None:
        notes.append(f"compute buffers not modelled: the Meta device over {kind.backend.name} "
                     f"devices (it has no offload_op or graph_optimize, {kind.backend.name} "
                     "may); modelled for RPC devices")
    else:
        notes.append("compute: every device allocates the Meta compute buffer (the unsplit "
                     "graph's); the all-reduce scratch allocated at compute is not in it")
    if aborts:
        notes.append(f"llama.cpp aborts loading {aborts[0]} (and {len(aborts) - 1} more): "
                     "a row of one quant block split by columns with a device given none "
                     "(ggml_backend_meta_buffer_set_tensor: tensor write out of bounds); "
                     "the buffers above are allocated before it")
    dev_layer = [label if x == stand_in else x for x in p1.dev_layer]
    p = Placement(devs, dev_layer, label if p1.dev_output == stand_in else p1.dev_output,
                  p1.weights, buffers, p1.use_mmap, p1.repacked, p1.cpu_features, notes,
                  p1.tensor_bufts)
    return DevicePlan(plan, p, flags, kvb, rows, comp)
