"""Where llama.cpp puts a model's weights and KV cache, per device, from the header and flags.

Mirrors llama.cpp as vendored by llama-cpp-python 0.3.36:

* device list (``src/llama.cpp``, ``llama_model_load_from_file_impl``): RPC devices first,
  then GPUs; ``-sm none`` keeps only ``devices[-mg]``;
* layer placement (``src/llama-model.cpp``, ``llama_model_base::load_tensors``): the last
  ``-ngl`` of the ``n_layer + 1`` layers (the extra one is the output layer) go to the
  devices, split by ``-ts`` or by each device's free memory (cumulative fractions in
  float32, ``std::upper_bound``); the input layer (token embeddings) stays on the CPU;
* buffer-type lists (``make_cpu_buft_list``, ``make_gpu_buft_list``): a device layer
  tries the device's buffer type, then the CPU list; the CPU list is [the first device's
  pinned host type (unless ``--no-host``)] + [CPU extra types such as ``CPU_REPACK``
  (unless ``--no-repack``)] + [``CPU``];
* one tensor (``src/llama-model-loader.cpp``, ``create_tensor`` / ``select_weight_buft``):
  ``-ot`` patterns first (``std::regex_search`` over the name, first match wins; ``CPU``
  means the CPU list), otherwise the first buffer type of its layer's list that supports
  the tensor's op; a host type with mmap becomes ``CPU``; tied output embeddings and
  per-layer rope factors are duplicated, once per buffer type;
* buffers (``load_tensors``): with mmap, a device that can wrap host memory
  (``buffer_from_host_ptr``: CPU, Metal) maps the file range spanning its default-type
  tensors (``llama_model_loader::get_mapping_range``; ``CPU_Mapped``); every other buffer
  type allocates ``sum(GGML_PAD(alloc_size, alignment))``
  (``ggml-alloc.c``: ``ggml_backend_alloc_ctx_tensors_from_buft``);
* KV cache (``src/llama-kv-cache.cpp``, constructor): layer ``il``'s K and V go to
  ``dev_layer(il)``'s buffer type, or to ``CPU`` with ``-nkvo``.

Backend facts (alignment, allocation padding, host and mapped buffers, repacking rules)
come from ``specs/backends/*.yaml`` (:mod:`graphcost.memory.backends`). All sizes are bytes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import gguf
import numpy as np

from graphcost.format import ggml_types as gt
from graphcost.memory.backends import Backend, ExtraBufferType, load as load_backend
from graphcost.memory.op_rules import device_flag
from graphcost.units import parse_bytes
from graphcost.errors import GraphcostError
from graphcost.format.model import ModelInfo

if TYPE_CHECKING:
    from graphcost.memory.plan import MemoryPlan
    from graphcost.memory.sched import ComputeBuffers

#: common/common.h: LLM_FFN_EXPS_REGEX (--cpu-moe, --n-cpu-moe)
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
#: tensors llama.cpp loads in the input layer (llama-arch.cpp: LLM_TENSOR_LAYER_INPUT:
#: TOKEN_EMBD, POS_EMBD, TOKEN_TYPES, PER_LAYER_TOKEN_EMBD), named as gguf names them
INPUT_TENSORS = tuple(f"{gguf.TENSOR_NAMES[t]}.weight" for t in (
    gguf.MODEL_TENSOR.TOKEN_EMBD, gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES,
    gguf.MODEL_TENSOR.PER_LAYER_TOKEN_EMBD))
#: tensors without a block number that llama-arch.cpp files under LLM_TENSOR_LAYER_REPEATING
#: (created with bid 0: "do the norms on the first layer (not the input layer)"): layer 0's
LAYER0_TENSORS = tuple(f"{gguf.TENSOR_NAMES[t]}.weight" for t in (
    gguf.MODEL_TENSOR.TOKEN_EMBD_NORM, gguf.MODEL_TENSOR.PER_LAYER_MODEL_PROJ,
    gguf.MODEL_TENSOR.PER_LAYER_PROJ_NORM)) + (
    f"{gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_EMBD_NORM]}.bias",)
#: architectures whose ``token_embd_norm`` is the output norm (LLM_TENSOR_OUTPUT_NORM_LFM2,
#: "fix for wrong tensor name": src/models/lfm2.cpp, lfm2moe.cpp)
TOKEN_EMBD_NORM_IS_OUTPUT = frozenset({"lfm2", "lfm2moe"})
#: per-layer rope factor tensors created for every layer with TENSOR_DUPLICATED
#: (src/models/llama.cpp: ``layer.rope_freqs``; phi3: rope_factors_long/short)
ROPE_FACTORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
SPLIT_MODES = ("none", "layer", "row", "tensor")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")


def cpu_moe_override() -> "Override":
    """--cpu-moe / -cmoe: every expert tensor to the CPU (common/common.h: llm_ffn_exps_cpu_override)."""
    return Override(FFN_EXPS_REGEX, "CPU")


def n_cpu_moe_overrides(n: int) -> list["Override"]:
    """--n-cpu-moe N / -ncmoe N: the experts of layers 0..N-1 to the CPU
    (common/common.h: llm_add_n_cpu_ffn_overrides with llm_ffn_block_regex)."""
    return [Override(rf"blk\.{i}{FFN_EXPS_REGEX}", "CPU") for i in range(n)]


@dataclass(frozen=True)
class Override:
    """One ``-ot PATTERN=BUFFER_TYPE``."""

    pattern: str
    target: str


@dataclass(frozen=True)
class DeviceArg:
    """One ``--device KIND[:MEM][,NAME=VALUE...]``: a backend spec name, the free bytes it
    reports, and device options (facts of the device the header cannot give: a CUDA GPU's
    compute capability ``cc``, a Vulkan device's alignment ``align``; the backend's spec lists
    them under ``device_options``)."""

    kind: str
    free_bytes: int | None = None
    options: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class PlacementFlags:
    """llama.cpp's placement flags (names as in common/arg.cpp)."""

    n_gpu_layers: int = -1  # -ngl; < 0 (auto/all): every layer (llama_model::n_gpu_layers)
    tensor_split: tuple[float, ...] = ()  # -ts
    split_mode: str = "layer"  # -sm
    main_gpu: int = 0  # -mg
    overrides: tuple[Override, ...] = ()  # -ot, --cpu-moe, --n-cpu-moe, in order
    no_kv_offload: bool = False  # -nkvo
    repack: bool = True  # --no-repack: False
    no_host: bool = False  # --no-host
    load_mode: str = "auto"  # -lm / --mmap (mmap) / --no-mmap (none)
    cpu_features: frozenset[str] = frozenset()  # ggml CPU features: avx2, avx512, neon, ...
    #: -dev NAME,NAME (common/arg.cpp parse_device_list): exactly these devices, in this
    #: order (names as graphcost lists them: RPC0, CUDA1); () = -dev none; None = all
    select_devices: tuple[str, ...] | None = None
    op_offload: bool = True  # --no-op-offload: False (cparams.op_offload)


@dataclass(frozen=True)
class Device:
    """A device as llama.cpp names it (``CUDA0``, ``RPC1``) and its backend facts."""

    name: str
    backend: Backend
    free_bytes: int | None
    options: dict = field(default_factory=dict)  # device options (DeviceArg.options)


@dataclass(frozen=True)
class Buft:
    """A buffer type in a buft list: its name, the row it is reported in, and what it is."""

    name: str  # CPU, CPU_REPACK, CUDA_Host, RPC0, CUDA1
    row: str  # the device row: CPU, CPU_REPACK, CUDA_Host, RPC0
    kind: str  # device | host | extra | cpu
    backend: Backend
    extra: ExtraBufferType | None = None
    #: a device's options (--device KIND,NAME=VALUE) as sorted pairs: its supports_op reads them
    options: tuple[tuple[str, str], ...] = ()

    @property
    def alignment(self) -> int | None:
        return self.extra.alignment if self.extra else self.backend.alignment


@dataclass(frozen=True)
class WeightPlacement:
    """One weight tensor as created by llama.cpp: which buffer type holds it."""

    name: str
    layer: str  # input | output | repeating
    il: int | None
    op: str
    buft: Buft
    bytes: int  # GGML_PAD(alloc_size, alignment) in that buffer type; 0 if mapped


@dataclass(frozen=True)
class ModelBuffer:
    """One model buffer llama.cpp logs: ``load_tensors: NAME model buffer size = ...``."""

    name: str  # CPU_Mapped, CPU_REPACK, RPC0[...], CUDA0
    row: str
    bytes: int | None  # None: not modelled (a device-dependent alignment)


@dataclass(frozen=True)
class DeviceMemory:
    """One row: a device (or host buffer) and what llama.cpp allocates on it (bytes)."""

    device: str
    model_bytes: int | None
    kv_bytes: int | None
    recurrent_state_bytes: int
    compute_bytes: int | None  # None: not modelled
    output_bytes: int
    free_bytes: int | None = None

    def as_dict(self) -> dict:
        return {"device": self.device, "model_bytes": self.model_bytes,
                "kv_bytes": self.kv_bytes, "recurrent_state_bytes": self.recurrent_state_bytes,
                "compute_bytes": self.compute_bytes, "output_bytes": self.output_bytes,
                "free_bytes": self.free_bytes}


@dataclass(frozen=True)
class Placement:
    """Every weight's buffer type, the layer -> device map, and the buffers."""

    devices: list[Device]
    dev_layer: list[str]  # per repeating layer: device name or "CPU"
    dev_output: str
    weights: list[WeightPlacement]
    model_buffers: list[ModelBuffer]
    use_mmap: bool
    repacked: list[str]  # weights in CPU_REPACK
    cpu_features: frozenset[str]
    notes: list[str] = field(default_factory=list)
    #: the buffer type of every tensor llama.cpp creates, by (name, layer, il): a
    #: duplicated tensor (tied output, per-layer rope factors) once per creation
    tensor_bufts: dict[tuple[str, str, int | None], Buft] = field(default_factory=dict)


# ---- devices -------------------------------------------------------------------------------

def resolve_devices(args: list[DeviceArg], flags: PlacementFlags) -> list[Device]:
    """llama.cpp's model device list: RPC devices first, then the others in the given order
    (src/llama.cpp: "add RPC servers at the front"); each backend numbers its own devices
    (RPC across all servers). ``-sm none`` keeps only ``devices[-mg]``; ``-sm tensor``: the
    Meta device's devices, RPC last (graphcost.memory.tensor_split)."""
    if flags.split_mode not in SPLIT_MODES:
        raise GraphcostError(f"-sm {flags.split_mode!r}: use one of {', '.join(SPLIT_MODES)}")
    specs = [(_with_options(load_backend(a.kind), a), a) for a in args]
    for b, a in specs:
        if b.device_type == "cpu":
            raise GraphcostError(f"--device {a.kind}: the CPU is always there; list only accelerators")
        if b.device_type == "accel":
            raise GraphcostError(f"--device {a.kind}: {b.device_name} comes with the build, not as a "
                                 f"device (--device metal,{a.kind}=0 for a macOS build without it)")
    ordered = [s for s in specs if s[0].name == "rpc"] + [s for s in specs if s[0].name != "rpc"]
    if flags.split_mode == "tensor":
        # llama_prepare_model_devices builds the Meta device from the registry's devices:
        # the GPU backends, then the RPC servers' (common/arg.cpp add_rpc_devices registers
        # them after the built-in backends); the names stay each backend's count
        ordered = [s for s in specs if s[0].name != "rpc"] + [s for s in specs if s[0].name == "rpc"]
    counters: dict[str, int] = {}
    out = []
    for b, a in ordered:
        i = counters.get(b.name, 0)
        counters[b.name] = i + 1
        out.append(Device(b.device_name.format(i=i), b, a.free_bytes, dict(a.options)))
    if flags.select_devices is not None:
        # -dev: llama_prepare_model_devices takes params.devices as given (no RPC-first order)
        by_name = {d.name: d for d in out}
        if len(set(flags.select_devices)) != len(flags.select_devices):
            raise GraphcostError(f"-dev {','.join(flags.select_devices)}: a device is listed twice")
        for n in flags.select_devices:
            if n not in by_name:
                raise GraphcostError(f"-dev {n}: invalid device; use "
                                     f"{', '.join(by_name) or 'none'} (as --device lists them)")
        out = [by_name[n] for n in flags.select_devices]
    if flags.split_mode == "row":
        for d in out:
            if not d.backend.split_buffer:
                # llama-model.cpp make_gpu_buft_list: "device %s does not support split buffers"
                raise GraphcostError(f"-sm row: device {d.name} does not support split buffers "
                                     "(llama.cpp refuses it too); use -sm layer or none")
        raise GraphcostError("-sm row: split buffers (weights split by rows across devices) "
                             "are not modelled; use -sm layer or none")
    if flags.split_mode == "none" and out:
        if flags.main_gpu < 0:
            return []
        if flags.main_gpu >= len(out):
            raise GraphcostError(f"-mg {flags.main_gpu}: only {len(out)} device(s) given")
        return [out[flags.main_gpu]]
    return out


def _with_options(b: Backend, a: DeviceArg) -> Backend:
    """The backend's facts with the device's options applied: ``align`` gives a
    device-dependent alignment (Vulkan's minStorageBufferOffsetAlignment; ``map_align``,
    Vulkan_Host's minMemoryMapAlignment, is checked here and read by the scheduler);
    ``suballoc`` the buffer types' max size (Vulkan's suballocation block); ``integrated=1``
    an integrated GPU (CUDA/ROCm: no mmap by default)."""
    import dataclasses
    for k, v in a.options:
        if k not in b.options:
            known = ", ".join(sorted(b.options)) or "none"
            raise GraphcostError(f"--device {a.kind},{k}={v}: unknown option for {a.kind} "
                                 f"(options: {known})")
    opts = dict(a.options)
    for name in ("align", "map_align"):
        if name in opts:
            try:
                align = int(opts[name])
            except ValueError:
                align = 0
            if align <= 0 or align & (align - 1):
                raise GraphcostError(f"--device {a.kind},{name}={opts[name]}: use a power of 2 in bytes")
            if name == "align":
                b = dataclasses.replace(b, alignment=align)
    if "suballoc" in opts:
        # Vulkan: the suballocation block, get_max_size of its buffer types
        size = parse_bytes(opts["suballoc"], f"--device {a.kind},suballoc=")
        if size <= 0:
            raise GraphcostError(f"--device {a.kind},suballoc={opts['suballoc']}: use a size above 0")
        b = dataclasses.replace(b, max_buffer_size=size)
    if device_flag(opts, "integrated", False):
        # ggml_backend_cuda_device_get_props: caps.mmap_support = type != IGPU
        b = dataclasses.replace(b, mmap_support=False)
    return b


def split_points(devices: list[Device], tensor_split: tuple[float, ...]) -> list[float]:
    """Cumulative split fractions, float32 as llama.cpp computes them (load_tensors): from
    ``-ts`` when it has a non-zero entry, else from each device's free memory."""
    n = len(devices)
    # llama.cpp reads the first n_devices entries of -ts and ignores the rest
    ts = list(tensor_split[:n]) + [0.0] * max(0, n - len(tensor_split))
    if n == 1:
        return [1.0]  # one device: free / free (or ts / ts) = 1
    if all(x == 0 for x in ts):
        missing = [d.name for d in devices if d.free_bytes is None]
        if missing:
            raise GraphcostError(f"{', '.join(missing)}: give its free memory (--device KIND:MEM) "
                                 "or a split (-ts), as llama.cpp splits by free memory")
        ts = [float(d.free_bytes) for d in devices]
    splits = np.zeros(n, dtype=np.float32)
    acc = np.float32(0)
    for i, x in enumerate(ts):
        acc = np.float32(acc + np.float32(x))
        splits[i] = acc
    return [float(np.float32(s / acc)) for s in splits]


def layer_devices(model: ModelInfo, devices: list[Device],
                  flags: PlacementFlags) -> tuple[list[str], str]:
    """(device of each repeating layer, device of the output layer): load_tensors's
    ``get_layer_buft_list``; "CPU" where the layer stays on the CPU. The layers are
    ``n_layer_all`` (NextN/MTP blocks included), the output is layer ``n_layer_all``."""
    n_layer = model.n_layer + model.n_layer_nextn
    n_gpu = flags.n_gpu_layers if flags.n_gpu_layers >= 0 else n_layer + 1
    i_gpu_start = max(n_layer + 1 - n_gpu, 0)
    act = 0 if not devices else min(n_gpu, n_layer + 1)
    splits = split_points(devices, flags.tensor_split) if devices and act > 0 else []

    def dev(il: int) -> str:
        if il < i_gpu_start or (il - i_gpu_start) >= act:
            return "CPU"
        x = np.float32(np.float32(il - i_gpu_start) / np.float32(act))
        k = int(np.searchsorted(np.asarray(splits, dtype=np.float32), x, side="right"))
        return devices[min(k, len(devices) - 1)].name
    return [dev(il) for il in range(n_layer)], dev(n_layer)


# ---- buffer types ----------------------------------------------------------------------------

def host_buffer_backend(d: Device) -> Backend:
    """The facts of a device's pinned host buffer type (``CUDA_Host``, ``Vulkan_Host``), which
    are not the device's: the CPU buffer type's get_alignment (32) and get_alloc_size
    (ggml_nbytes), which ggml-cuda and ggml-sycl's host types take, and no max size; unless
    the device's spec gives its own under ``scheduler.host_buffer`` (Vulkan_Host:
    ``alignment`` minMemoryMapAlignment, a device option ``alignment_option``, and
    ``max_size_of_device``: the device's suballocation block)."""
    import dataclasses
    cpu = load_backend("cpu")
    host = (d.backend.scheduler or {}).get("host_buffer") or {}
    align, max_size = cpu.alignment, None
    if host:
        opt = host.get("alignment_option")
        align = int(d.options.get(opt, host["alignment"])) if opt else int(host["alignment"])
        if host.get("max_size_of_device"):
            max_size = d.backend.max_buffer_size
    return dataclasses.replace(d.backend, alignment=align, max_buffer_size=max_size,
                               alloc_padding="none", row_padding=0)


def cpu_buft_list(devices: list[Device], flags: PlacementFlags) -> list[Buft]:
    """make_cpu_buft_list: [first device's host type] + [CPU extra types] + [CPU]."""
    cpu = load_backend("cpu")
    out: list[Buft] = []
    if not flags.no_host:
        for d in devices:
            if d.backend.host_buffer:
                out.append(Buft(d.backend.host_buffer, d.backend.host_buffer, "host",
                                host_buffer_backend(d)))
                break
    if flags.repack:
        for e in cpu.extra_buffer_types:
            if not e.features <= flags.cpu_features:
                continue            # not compiled in for this CPU
            if not e.modelled:
                raise GraphcostError(f"CPU extra buffer type {e.name} (features "
                                     f"{', '.join(sorted(e.features))}) is not modelled; "
                                     "use --no-repack")
            out.append(Buft(e.name, e.name, "extra", cpu, e))
    out.append(Buft(cpu.buffer_type, "CPU", "cpu", cpu))
    return out


def device_buft(d: Device) -> Buft:
    return Buft(d.name, d.name, "device", d.backend, options=tuple(sorted(d.options.items())))


def repack_layout(e: ExtraBufferType, type_name: str, ne: tuple[int, ...], op: str,
                  features: frozenset[str]) -> bool:
    """Whether ``CPU_REPACK`` takes this weight: repack.cpp extra_buffer_type::supports_op
    (MUL_MAT on a 2-D weight, MUL_MAT_ID on a 3-D one) and
    ggml_repack_get_optimal_repack_type (the first rule whose features are present and
    whose ne[1] multiple fits)."""
    if op not in e.ops:
        return False
    ndims = max((i + 1 for i, n in enumerate(ne) if n != 1), default=1)
    if (op == "MUL_MAT" and ndims != 2) or (op == "MUL_MAT_ID" and ndims != 3):
        return False
    for rule in e.rules.get(type_name, ()):
        if rule.features <= features and ne[1] % rule.ne1_multiple == 0:
            return True
    return False


def amx_layout(e: ExtraBufferType, type_name: str, ne: tuple[int, ...], op: str) -> bool:
    """Whether ``AMX`` takes this weight: amx.cpp extra_buffer_type::supports_op on the
    MUL_MAT llama.cpp builds to test it (src1 F32, contiguous): the weight's ne[1] (the
    op's ne[0]) a multiple of :attr:`ExtraBufferType.ne1_multiple`, its type one AMX knows
    and its ne[0] a multiple of that type's alignment."""
    if op not in e.ops or type_name not in e.types:
        return False
    return ne[1] % e.ne1_multiple == 0 and ne[0] % e.types[type_name][0] == 0


def extra_alloc_size(e: ExtraBufferType, type_: gt.GGMLType, ne: tuple[int, ...],
                     nbytes: int) -> int:
    """An extra buffer type's get_alloc_size for a weight (bytes): AMX's packed rows
    (amx/mmq.cpp ggml_backend_amx_get_alloc_size: ``ne[1] * get_row_size(ne[0])``, each
    block ``block_extra`` bytes larger); ggml_nbytes otherwise (CPU_REPACK, AMX's F16)."""
    extra = e.types.get(gt.GGMLType(type_).name, (0, None))[1]
    if extra is None:
        return nbytes
    blk, size = gt.block(type_)
    return ne[1] * (ne[0] // blk) * (size + extra)


def supports(b: Buft, type_name: str, ne: tuple[int, ...], op: str,
             features: frozenset[str]) -> bool:
    """weight_buft_supported: extra types by their rules; a device type by its backend's
    ``supports_op`` on the op llama.cpp builds to test it (:func:`weight_op_tensor`);
    host and CPU types, and devices without ``supports_op`` rules (RPC), take every weight."""
    if b.kind == "extra":
        if b.extra.types:
            return amx_layout(b.extra, type_name, ne, op)
        return repack_layout(b.extra, type_name, ne, op, features)
    if b.kind == "device" and b.backend.supports_op is not None:
        t = weight_op_tensor(type_name, ne, op)
        if t is not None:
            from graphcost.memory.op_rules import evaluate
            rules, opts = b.backend.supports_op, dict(b.options)
            where = f"{b.backend.name} supports_op {op} (weight)"
            if rules.get("require") is not None and not evaluate(rules["require"], t, opts, where):
                return False
            return evaluate(rules["ops"].get(op, rules["default"]), t, opts, where)
    return True


def weight_op_tensor(type_name: str, ne: tuple[int, ...], op: str):
    """The op llama-model-loader.cpp ``weight_buft_supported`` builds around a weight ``w``
    to ask a device (those graphcost's weight_op gives): GET_ROWS with 512 I32 rows,
    MUL_MAT with an F32 ``[ne0, 512, ne2, ne3]``, ADD and MUL with an F32 ``a`` of w's
    shape; None for the others (ROPE factors, MUL_MAT_ID: taken as supported)."""
    from graphcost.graph.ggml_graph import Tensor, contiguous_nb
    w_type = gt.GGMLType[type_name]
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    w = Tensor("NONE", w_type, ne4, contiguous_nb(w_type, ne4), role="weight")

    def t(typ, shape) -> Tensor:
        return Tensor("NONE", typ, shape, contiguous_nb(typ, shape))
    if op == "GET_ROWS":
        shape = (ne4[0], 512, 1, 1)
        return Tensor("GET_ROWS", gt.GGMLType.F32, shape, contiguous_nb(gt.GGMLType.F32, shape),
                      src=[w, t(gt.GGMLType.I32, (512, 1, 1, 1))])
    if op == "MUL_MAT":
        b = t(gt.GGMLType.F32, (ne4[0], 512, ne4[2], ne4[3]))
        shape = (ne4[1], 512, ne4[2], ne4[3])
        return Tensor("MUL_MAT", gt.GGMLType.F32, shape, contiguous_nb(gt.GGMLType.F32, shape), src=[w, b])
    if op in ("ADD", "MUL"):
        a = t(gt.GGMLType.F32, ne4)
        return Tensor(op, gt.GGMLType.F32, ne4, a.nb, src=[a, w])
    return None


def alloc_size(backend: Backend, type_: gt.GGMLType, ne: tuple[int, ...], nbytes: int) -> int:
    """ggml_backend_buft_get_alloc_size for a weight or cache tensor (bytes)."""
    if backend.alloc_padding == "quantized_row_padding" and gt.is_quantized(type_):
        rem = ne[0] % backend.row_padding
        if rem:
            return nbytes + gt.row_size(type_, backend.row_padding - rem)
    return nbytes


def _index(device_name: str) -> int:
    """The number at the end of a device name (CUDA1 -> 1; CPU -> 0)."""
    digits = device_name[len(device_name.rstrip("0123456789")):]
    return int(digits) if digits else 0


# ---- weights ---------------------------------------------------------------------------------

def _layer_of(name: str, arch: str = "") -> tuple[str, int | None]:
    m = re.match(r"blk\.(\d+)\.", name)
    if m:
        return "repeating", int(m.group(1))
    if name in INPUT_TENSORS:
        return "input", None
    if name in LAYER0_TENSORS and not (arch in TOKEN_EMBD_NORM_IS_OUTPUT
                                       and name.startswith("token_embd_norm.")):
        return "repeating", 0
    return "output", None


def weight_op(name: str, ne: tuple[int, ...], layer: str) -> str:
    """The op llama.cpp tests a weight's buffer type with (llama-arch.cpp llm_tensor_info),
    as far as it matters here: GET_ROWS for input embeddings, MUL_MAT_ID for 3-D expert
    tensors, ADD for biases, ROPE for rope factors, MUL_MAT for other 2-D weights,
    MUL for the rest (norms, scales)."""
    if name in ROPE_FACTORS:
        return "ROPE"
    if layer == "input":
        return "GET_ROWS"
    if name.endswith(".bias"):
        return "ADD"
    ndims = max((i + 1 for i, n in enumerate(ne) if n != 1), default=1)
    if "_exps." in name and ndims == 3:
        return "MUL_MAT_ID"
    if ndims == 2:
        return "MUL_MAT"
    return "MUL"


def _override_buft(target: str, devices: list[Device]) -> Buft | str:
    """An -ot target: ``CPU`` (the CPU list) or a device by name (``CUDA0``, ``RPC1``).
    llama.cpp's RPC buffer-type names (``RPC0[host:port]``: the index on that server) do
    not say which device they are without the endpoints, so they are refused."""
    if target == "CPU":
        return "CPU"
    if "[" in target:
        raise GraphcostError(f"-ot ...={target}: name the device as graphcost lists it "
                             "(RPC0, RPC1, ... in --device order), not llama.cpp's "
                             "RPC<i>[host:port] buffer type")
    for d in devices:
        if d.name == target:
            return device_buft(d)
    names = ["CPU"] + [d.name for d in devices]
    raise GraphcostError(f"-ot ...={target}: unknown buffer type; use one of {', '.join(names)}")


def _has_output_head(arch: str) -> bool:
    """Whether the architecture's graph has an LM head (its spec's ``lm_head``): encoders
    such as bert have none, so no tied copy of token_embd is created for them. (gguf's
    MODEL_TENSORS is no guide: it lists no OUTPUT for gemma2 or cohere2, whose loaders
    create token_embd again as the output.)"""
    from graphcost.graph.arch_spec import load_specs
    spec = load_specs().get(arch)
    return spec is None or spec.has_lm_head


def place(model: ModelInfo, args: list[DeviceArg], flags: PlacementFlags) -> Placement:
    """Every weight's buffer type and the model and KV buffers of each device."""
    if flags.load_mode not in LOAD_MODES:
        raise GraphcostError(f"--load-mode {flags.load_mode!r}: use one of {', '.join(LOAD_MODES)}")
    if flags.split_mode == "tensor":
        # the Meta device: graphcost.memory.tensor_split, through plan_devices
        raise GraphcostError("-sm tensor: the Meta device's scheduler (its split graph) is "
                             "not modelled here; graphcost memory gives its buffers")
    devices = resolve_devices(args, flags)
    dev_layer, dev_output = layer_devices(model, devices, flags)
    cpu_list = cpu_buft_list(devices, flags)
    lists = {"CPU": cpu_list}
    for d in devices:
        lists[d.name] = [device_buft(d)] + cpu_list
    use_mmap = flags.load_mode in ("auto", "mmap", "mmap+mlock")
    if flags.load_mode == "auto" and not all(d.backend.mmap_support for d in devices):
        use_mmap = False
    overrides = []
    for o in flags.overrides:
        try:
            overrides.append((re.compile(o.pattern), _override_buft(o.target, devices)))
        except re.error as e:
            raise GraphcostError(f"-ot {o.pattern}={o.target}: bad pattern: {e}") from None
    cpu_plain = cpu_list[-1]

    def select(name: str, t, layer: str, il: int | None, op: str) -> Buft:
        list_key = {"input": "CPU", "output": dev_output}.get(layer) or dev_layer[il]
        blist = lists[list_key]
        type_name = gt.GGMLType(t.type).name  # Q4_0, Q4_K: the keys of the repack rules
        chosen: Buft | None = None
        for rx, target in overrides:
            if rx.search(name):
                if target == "CPU":  # "when overriding to a CPU buffer, consider the extra buffer types"
                    chosen = next(b for b in cpu_list
                                  if supports(b, type_name, t.ne, op, flags.cpu_features))
                else:
                    chosen = target
                break
        if chosen is None:
            chosen = next(b for b in blist if supports(b, type_name, t.ne, op, flags.cpu_features))
        if use_mmap and chosen.kind == "host":  # "avoid using a host buffer when using mmap"
            chosen = cpu_plain
        return chosen

    tensors = model.tensors
    created: list[tuple[str, object, str, int | None, str, bool]] = []  # + duplicated flag
    for name, t in tensors.items():
        if name in ROPE_FACTORS:
            for il in range(len(dev_layer)):
                created.append((name, t, "repeating", il, "ROPE", il != 0))
            continue
        layer, il = _layer_of(name, model.arch)
        if il is not None and il >= model.n_layer:
            # a NextN/MTP block: created with TENSOR_SKIP unless the MTP head is loaded
            # (src/models/glm4-moe.cpp, deepseek2.cpp, ...: ``if (!ml.load_mtp)``)
            continue
        created.append((name, t, layer, il, weight_op(name, t.ne, layer), False))
    if ("output.weight" not in tensors and "token_embd.weight" in tensors
            and _has_output_head(model.arch)):
        # tied embeddings: token_embd created again as the output (TENSOR_DUPLICATED)
        created.append(("token_embd.weight", tensors["token_embd.weight"], "output", None,
                        "MUL_MAT", True))

    weights: list[WeightPlacement] = []
    seen: set[tuple[str, str]] = set()  # (buft name, tensor name): one copy per buffer type
    tensor_bufts: dict[tuple[str, str, int | None], Buft] = {}
    for name, t, layer, il, op, dup in created:
        b = select(name, t, layer, il, op)
        tensor_bufts[(name, layer, il)] = b
        if (b.name, name) in seen:
            continue  # a duplicated tensor already in this buffer type's context is reused
        seen.add((b.name, name))
        mapped = use_mmap and b.kind in ("cpu", "device") and b.backend.buffer_from_host_ptr
        if mapped or b.alignment is None:
            nb = 0
        elif b.kind == "extra":
            nb = gt.ggml_pad(extra_alloc_size(b.extra, t.type, t.ne, t.nbytes), b.alignment)
        else:
            nb = gt.ggml_pad(alloc_size(b.backend, t.type, t.ne, t.nbytes), b.alignment)
        weights.append(WeightPlacement(name, layer, il, op, b, nb))

    buffers: list[ModelBuffer] = []
    order: list[str] = []
    groups: dict[str, list[WeightPlacement]] = {}
    for w in weights:
        if w.buft.name not in groups:
            order.append(w.buft.name)
            groups[w.buft.name] = []
        groups[w.buft.name].append(w)
    for bname in order:
        ws = groups[bname]
        b = ws[0].buft
        mapped = use_mmap and b.kind in ("cpu", "device") and b.backend.buffer_from_host_ptr
        if mapped:
            # get_mapping_range: one buffer per file (shard) spanning its tensors
            shards: dict[int, tuple[int, int]] = {}
            for w in ws:
                ti = tensors[w.name]
                lo, hi = shards.get(ti.shard, (None, 0))
                end = ti.offset + ti.nbytes
                shards[ti.shard] = (ti.offset if lo is None else min(lo, ti.offset), max(hi, end))
            label = (b.backend.mapped_buffer_name or b.name).format(i=_index(b.name))
            for shard in sorted(shards):
                lo, hi = shards[shard]
                buffers.append(ModelBuffer(label, b.row, hi - lo))
        elif b.alignment is None:
            buffers.append(ModelBuffer(b.name, b.row, None))
        else:
            buffers.append(ModelBuffer(b.name, b.row, sum(w.bytes for w in ws)))
    repacked = [w.name for w in weights if w.buft.kind == "extra"]
    notes = []
    if any(b.bytes is None for b in buffers):
        notes.append("a device with a device-dependent alignment: its model bytes are not modelled")
    return Placement(devices, dev_layer, dev_output, weights, buffers, use_mmap, repacked,
                     flags.cpu_features, notes, tensor_bufts)


@dataclass(frozen=True)
class KVBuffer:
    """One KV buffer llama.cpp logs (``llama_kv_cache: NAME KV buffer size``): one per
    cache (base, swa) and buffer type."""

    cache: str
    row: str
    bytes: int | None  # None: a device-dependent alignment (not modelled)


def _layer_buffers(placement: Placement, layers: dict[int, list], no_kv_offload: bool
                   ) -> dict[str, int | None]:
    """Bytes per row of one cache's per-layer tensors: layer ``il``'s go to dev_layer(il)'s
    buffer type, the CPU with -nkvo; one buffer per type, each tensor padded to the type's
    alignment (ggml_backend_alloc_ctx_tensors_from_buft); None: an alignment not modelled."""
    by_name = {d.name: d for d in placement.devices}
    cpu = load_backend("cpu")
    sizes: dict[str, int | None] = {}
    for il in sorted(layers):
        row = "CPU" if no_kv_offload else placement.dev_layer[il]
        backend = cpu if row == "CPU" else by_name[row].backend
        for t in layers[il]:
            if t is None:
                continue
            if backend.alignment is None or sizes.get(row, 0) is None:
                sizes[row] = None
                continue
            sizes[row] = sizes.get(row, 0) + gt.ggml_pad(alloc_size(backend, t.type, t.ne, t.nbytes),
                                                  backend.alignment)
    return sizes


def kv_buffers(placement: Placement, caches, no_kv_offload: bool) -> list[KVBuffer]:
    """Each cache layer's K and V go to dev_layer(il)'s buffer type (llama_kv_cache
    constructor), the CPU with -nkvo; one buffer per cache and type."""
    out: list[KVBuffer] = []
    for c in caches:
        layers = {il: [c.k.get(il), c.v.get(il)] for il in set(c.k) | set(c.v)}
        sizes = _layer_buffers(placement, layers, no_kv_offload)
        out += [KVBuffer(c.name, row, n) for row, n in sizes.items()]
    return out


def state_buffers(placement: Placement, states, no_kv_offload: bool) -> dict[str, int | None]:
    """The recurrent states' RS buffers per row (llama_memory_recurrent constructor:
    ``cache_r_l*`` and ``cache_s_l*`` of layer ``il`` on dev_layer(il)'s buffer type when
    offload_kqv, else the CPU's; llama.cpp logs ``llama_memory_recurrent: NAME RS buffer
    size``), summed over the states."""
    bufs: list[KVBuffer] = []
    for st in states:
        layers = {il: [st.r.get(il), st.s.get(il)] for il in set(st.r) | set(st.s)}
        bufs += [KVBuffer("rs", row, n)
                 for row, n in _layer_buffers(placement, layers, no_kv_offload).items()]
    return kv_bytes_per_row(bufs)  # summed per row as the KV buffers are


def kv_bytes_per_row(buffers: list[KVBuffer]) -> dict[str, int | None]:
    """The KV buffers summed per row (None if any of a row's is not modelled)."""
    out: dict[str, int | None] = {}
    for b in buffers:
        prev = out.get(b.row, 0)
        out[b.row] = None if prev is None or b.bytes is None else prev + b.bytes
    return out


def output_row(placement: Placement) -> str:
    """Where llama_context::output_reserve puts the logits: the output device's host
    buffer type if it has one, else the CPU."""
    for d in placement.devices:
        if d.name == placement.dev_output and d.backend.host_buffer:
            return d.backend.host_buffer
    return "CPU"


def device_memory(placement: Placement, kv: list[KVBuffer], *, output_bytes: int,
                  cpu_compute_bytes: int,
                  compute: dict[str, int] | None = None,
                  states: dict[str, int | None] | None = None) -> list[DeviceMemory]:
    """One row per device (llama.cpp's order), then CPU, then CPU extra and host buffer
    types that hold something. ``compute``: each compute buffer by buffer type name
    (:func:`graphcost.memory.sched.compute_buffers`); without it, ``cpu_compute_bytes``
    (the single-CPU plan's compute buffer) is used when there is no device, and compute
    buffers with devices are not modelled (None). ``states``: the RS buffers per row
    (:func:`state_buffers`)."""
    kv = kv_bytes_per_row(kv)
    states = states or {}
    out_row = output_row(placement)
    rows = [d.name for d in placement.devices] + ["CPU"]
    for name in ([b.row for b in placement.model_buffers] + list(kv) + list(states) + [out_row]
                 + list(compute or ())):
        if name not in rows:
            rows.append(name)
    free = {d.name: d.free_bytes for d in placement.devices}
    extra_rows = {b.row for b in placement.model_buffers
                  if any(w.buft.row == b.row and w.buft.kind == "extra" for w in placement.weights)}
    result = []
    for r in rows:
        bufs = [b.bytes for b in placement.model_buffers if b.row == r]
        model = None if any(x is None for x in bufs) else sum(bufs)
        if compute is not None:
            comp = compute.get(r, 0)
        elif not placement.devices and r == "CPU":
            comp = cpu_compute_bytes
        elif r in extra_rows:
            comp = 0  # extra buffer types hold weights only
        else:
            comp = None
        result.append(DeviceMemory(r, model, kv.get(r, 0), states.get(r, 0), comp,
                                   output_bytes if r == out_row else 0, free.get(r)))
    return result


# ---- flags as llama.cpp spells them ----------------------------------------------------------

def parse_device(spec: str) -> DeviceArg:
    """--device KIND[:MEM][,NAME=VALUE...] (KIND: a specs/backends file; MEM: the free memory
    it reports; NAME=VALUE: device options its spec lists, e.g. ``cuda:24GiB,cc=8.9``)."""
    head, *opts = spec.split(",")
    kind, _, mem = head.partition(":")
    kind = kind.strip().lower()
    backend = load_backend(kind)  # an unknown kind is one line naming the known ones
    options = []
    for o in opts:
        name, eq, value = o.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise GraphcostError(f"--device {spec}: options are NAME=VALUE after a comma, "
                                 "e.g. cuda:24GiB,cc=8.9")
        name = name.strip().lower()
        if name not in backend.options:
            known = ", ".join(sorted(backend.options)) or "none"
            raise GraphcostError(f"--device {spec}: unknown option {name!r} for {kind} "
                                 f"(options: {known})")
        if any(name == seen for seen, _ in options):
            raise GraphcostError(f"--device {spec}: option {name!r} is given twice")
        options.append((name, value.strip()))
    return DeviceArg(kind, parse_bytes(mem, f"--device {spec}:") if mem else None, tuple(options))


def parse_gpu_layers(text: str) -> int:
    """-ngl N|auto|all (common/arg.cpp): auto -> -1, all -> -2 (both: every layer)."""
    t = text.strip().lower()
    if t == "auto":
        return -1
    if t == "all":
        return -2
    try:
        return int(t)
    except ValueError:
        raise GraphcostError(f"-ngl {text!r}: use a number of layers, auto or all") from None


def parse_tensor_split(text: str | None) -> tuple[float, ...]:
    """-ts 3,1 (common/arg.cpp splits on ',' and '/')."""
    if not text:
        return ()
    try:
        vals = tuple(float(x) for x in re.split(r"[,/]+", text.strip()) if x != "")
    except ValueError:
        raise GraphcostError(f"-ts {text!r}: use proportions like 3,1") from None
    if not vals or any(v < 0 for v in vals):
        raise GraphcostError(f"-ts {text!r}: use non-negative proportions like 3,1")
    return vals


def parse_overrides(values: list[str]) -> list[Override]:
    """-ot PATTERN=BUFT[,PATTERN=BUFT...] (common/arg.cpp: parse_tensor_buffer_overrides)."""
    out = []
    for value in values:
        for item in value.split(","):
            pattern, eq, target = item.partition("=")
            if not eq or not pattern or not target:
                raise GraphcostError(f"-ot {value!r}: use PATTERN=BUFFER_TYPE, e.g. exps=CPU")
            try:
                re.compile(pattern)
            except re.error as e:
                raise GraphcostError(f"-ot {item!r}: bad pattern: {e}") from None
            out.append(Override(pattern, target))
    return out


# ---- the whole picture -----------------------------------------------------------------------

@dataclass(frozen=True)
class DevicePlan:
    """The single-CPU memory plan, the placement, and the per-device rows."""

    plan: "MemoryPlan"
    placement: Placement
    flags: PlacementFlags
    kv_buffers: list[KVBuffer]
    rows: list[DeviceMemory]
    #: the scheduler's splits and compute buffers (None: a device's not modelled)
    compute: "ComputeBuffers | None" = None

    def as_dict(self) -> list[dict]:
        return [r.as_dict() for r in self.rows]


def plan_devices(model: ModelInfo, settings, args: list[DeviceArg],
                 flags: PlacementFlags, *, no_alloc: bool = False) -> DevicePlan:
    """Place the model for these devices and flags; KV and output from the memory plan;
    compute buffers from the scheduler simulation (graphcost.memory.sched).

    ``no_alloc``: the compute buffers as llama.cpp's fit measures them (a model loaded with
    ``no_alloc``, common/fit.cpp): only the first prompt graph is sized (llama-context.cpp
    ``sched_reserve``: the generation and second prompt reserves are split-only), and
    ``ggml_backend_sched_reserve_size`` resets the scheduler after the graph callback
    (``graph_get_cb``) pinned each layer's ``norm``/``l_last``, so those pins are lost
    (seen on two RPC devices: without the pins layer 3's norm runs on RPC0 and RPC1's
    buffer is 137.55 MiB, not a real run's 135.55)."""
    import dataclasses

    from graphcost.graph.build import resolve_for
    from graphcost.memory.plan import plan_memory
    from graphcost.memory.sched import compute_buffers, flash_attn_auto_fails
    if flags.split_mode == "tensor":
        from graphcost.memory.tensor_split import FIT_REFUSAL, plan_tensor_split
        if no_alloc:
            raise GraphcostError(FIT_REFUSAL)
        return plan_tensor_split(model, settings, args, flags)
    p = place(model, args, flags)
    run = resolve_for(model, settings)
    fa_note = flash_attn_auto_fails(model, run, p, flags)
    if fa_note:
        # the cache was created for flash attention (V not transposed)
        run = resolve_for(model, dataclasses.replace(settings, flash_attn="off", v_trans=False))
        p.notes.append(fa_note)
    plan = plan_memory(model, run)
    kv = kv_buffers(p, plan.reserves[0].graph.caches, flags.no_kv_offload)
    rs = state_buffers(p, plan.reserves[0].graph.states, flags.no_kv_offload)
    comp = (compute_buffers(plan.reserves, p, flags, model.n_layer, no_alloc=no_alloc)
            if p.devices else None)
    rows = device_memory(p, kv, output_bytes=plan.output_buffer_bytes,
                         cpu_compute_bytes=plan.compute_buffer_bytes,
                         compute=comp.bytes_by_buft if comp is not None else None,
                         states=rs)
    return DevicePlan(plan, p, flags, kv, rows, comp)
