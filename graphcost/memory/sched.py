"""ggml's backend scheduler: which device runs each node, the graph splits, the copies
of split inputs, and each backend's compute buffer.

Mirrors ``ggml/src/ggml-backend.cpp`` as vendored by llama-cpp-python 0.3.36:

* ``ggml_backend_sched_split_graph``: pass 1 assigns nodes and leaves from the buffers
  of their own memory, of their view source, graph inputs to the CPU (the last
  backend), and ops with a weight source to the weight's backend
  (``ggml_backend_sched_backend_id_from_cur``; ROPE and FLASH_ATTN_EXT excepted; an op
  whose weight is in host memory goes to a device whose ``offload_op`` accepts it);
  pass 2 expands device assignments down and up, then every assignment down and up,
  over non-view nodes; pass 3 gives still unassigned nodes the backend with the most
  supported inputs and upgrades nodes to higher-priority backends sharing their buffer
  type; pass 4 gives sources their consumer's backend (views their source's); pass 5
  cuts the node list where the backend changes (or where a weight on another,
  incompatible backend is read) and makes, per split, one copy of each source that lives
  on another backend whose buffer this backend cannot read (``n_copies`` copies with
  pipeline parallelism, flagged input and output);
* the graph handed to the allocator (``graph_copy``): per split, for each input a view
  node keeping the source alive until the copy and the copy itself, then the split's
  nodes; with pipeline parallelism every graph input and split-input copy first, as
  leaves; ``ggml_gallocr_reserve_n`` then allocates it with one buffer per backend buffer
  type (:func:`graphcost.memory.alloc.allocate`);
* llama.cpp's side (``src/llama-context.cpp``): the backends are the model's devices in
  order, then the CPU, whose compute buffer type is the first device's host buffer type
  if it has one; pipeline parallelism (``n_copies = GGML_SCHED_MAX_COPIES = 4``) is on
  with more than one device, every layer and the output offloaded
  (``n_gpu_layers > n_layer``), ``-sm layer``, the KV cache offloaded and no ``-ot``,
  when every device has async compute and events; the graph callback
  (``graph_get_cb``) pins each layer's ``norm`` to that layer's device when a ubatch
  has fewer than 32 tokens or everything is offloaded, and with ``-nkvo`` the attention
  output (``kqv_out``) to the CPU (``build_attn_mha``); ``sched_reserve`` allocates
  the prompt, generation and prompt graphs, and each buffer keeps its largest size.

Backend facts come from ``specs/backends`` (:mod:`graphcost.memory.backends`): which ops
a device runs (``supports_op``, rules evaluated by :mod:`graphcost.memory.op_rules`;
CUDA and HIP also refuse an op whose source lives in another device's buffer), which
ops it takes from the CPU (``offload_op``: CUDA's batch >= 32), the bytes its buffer type
gives each compute tensor (``get_alloc_size``: CUDA pads quantized rows to 512 elements
and sizes FLASH_ATTN_EXT with its F16 K/V copies), and what its ``graph_optimize`` does
(CUDA: allocation dependencies for its MoE fusions, :mod:`graphcost.memory.alloc_deps`,
added to the allocator's graph after the node they wait for; Metal: those of its fusion
table, then ``ggml_graph_optimize``'s node reorder, :mod:`graphcost.memory.reorder`, which
the allocator sees; Vulkan: ``ggml_vk_graph_optimize``'s reorder and the allocation
dependencies of its top-k MoE patterns, and a 1 GiB max size that splits its compute
buffers into chunks, :func:`graphcost.memory.alloc.reserved_chunks`). A device's spec may name ACCEL backends llama_context adds before the CPU
(Metal's macOS build: BLAS). A device whose facts are missing, or whose graph meets a rule
graphcost does not model (:class:`graphcost.memory.op_rules.Unmodelled`), has its compute
buffers reported as not modelled, with the reason in the placement's notes. The CPU is
taken to run every op the graphs use. All sizes are bytes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from graphcost.errors import GraphcostError
from graphcost.format import ggml_types as gt
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import VIEWS, Op
from graphcost.memory.alloc import Allocation, allocate, reserved_chunks
from graphcost.memory.alloc_deps import RULES as ALLOC_DEP_RULES
from graphcost.memory.alloc_deps import SplitGraph, collect, dep_nodes, use_counts
from graphcost.memory.op_rules import Unmodelled, compute_alloc_size, device_flag, evaluate
from graphcost.memory.placement import (ROPE_FACTORS, Buft, Placement, PlacementFlags,
                                        _layer_of, host_buffer_backend)

#: ggml-backend.cpp: GGML_SCHED_MAX_COPIES (copies of inputs with pipeline parallelism)
MAX_COPIES = 4
#: llama-context.cpp graph_get_cb: below this many tokens, norms are pinned to their layer
PIN_NORM_BELOW_TOKENS = 32
#: ggml_is_view_op (ggml-backend.cpp): VIEW, RESHAPE, PERMUTE, TRANSPOSE
VIEW_OPS = VIEWS
#: ops not sent to their weight's backend (backend_id_from_cur: "the rope freqs / sinks
#: tensor is too small to choose a backend based on it")
_NOT_OFFLOADED = frozenset({Op.ROPE, Op.FLASH_ATTN_EXT})


@dataclass(frozen=True)
class SchedBackend:
    """One backend of the scheduler, in priority order (the CPU last)."""

    name: str  # RPC0, CUDA0, CPU
    buft: str  # its compute buffer type: RPC0, CUDA0, CPU, CUDA_Host
    alignment: int
    is_cpu: bool
    offload_min_batch: int | None = None  # offload_op: ops with >= this batch; None: never
    kind: str = "cpu"  # the backend spec: cpu, cuda, rpc, ...
    #: supports_op rules ({"default", "ops"}); None: every op (the CPU, RPC's all_ops)
    supports: dict | None = None
    #: get_alloc_size for compute tensors (op_rules.compute_alloc_size); None: ggml_nbytes
    alloc_rule: dict | None = None
    options: dict = field(default_factory=dict)  # device options (cc, ...)
    own_device_sources: bool = False  # ops reading another device's buffer are unsupported
    #: graph_optimize's add_alloc_dep rule (graphcost.memory.alloc_deps.RULES), if any
    alloc_deps: str | None = None
    #: graph_optimize's node reorder (graphcost.memory.reorder.REORDERS), if any
    reorder: str | None = None
    #: offload_op takes only these ops (Metal: MUL_MAT, MUL_MAT_ID); None: any op
    offload_ops: frozenset | None = None
    #: a host buffer type this device also reads (an integrated CUDA GPU: CUDA_Host)
    reads_host: str | None = None
    #: an ACCEL backend that reads every host buffer type but CPU_REPACK (BLAS:
    #: ggml_backend_buft_is_host) and shares the CPU buffer type
    reads_host_buffers: bool = False
    #: its compute buffer type's get_max_size (None: SIZE_MAX): larger buffers are chunked
    max_size: int | None = None

    def alloc_size(self, t: Tensor) -> int:
        """ggml_backend_buft_get_alloc_size of this backend's compute buffer type."""
        return compute_alloc_size(self.alloc_rule, t, self.options)


@dataclass
class Split:
    """One graph split: nodes ``i_start:i_end`` (of :attr:`Schedule.nodes`) run on
    ``backend``; ``inputs`` are the tensors copied into it from other backends."""

    backend: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Schedule:
    """One graph as the scheduler splits and allocates it."""

    backends: list[SchedBackend]
    nodes: list[Tensor]  # the graph's nodes (sources replaced by their copies)
    node_backend: list[int]  # per node
    splits: list[Split]
    n_copies: int
    alloc: Allocation
    #: per backend: bytes of its compute buffer for this graph (0 when it shares an
    #: earlier backend's buffer type: ggml_gallocr_get_buffer_size)
    buffer_bytes: list[int]
    #: per backend: the chunk sizes behind ``buffer_bytes`` (empty when shared)
    buffer_chunks: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def copy_bytes(self) -> int:
        """Bytes copied between backends to run this graph once (every split input)."""
        return sum(t.nbytes for s in self.splits for t in s.inputs)

    def device_of(self, i: int) -> str:
        return self.backends[self.node_backend[i]].name


def pipeline_parallel(placement: Placement, flags: PlacementFlags, n_layer: int) -> bool:
    """llama_context's condition for pipeline parallelism (llama-context.cpp, constructor)."""
    devs = placement.devices
    n_layer = len(placement.dev_layer)  # llama.cpp compares with n_layer_all
    n_gpu = flags.n_gpu_layers if flags.n_gpu_layers >= 0 else n_layer + 1
    return (len(devs) > 1 and n_gpu > n_layer and flags.split_mode == "layer"
            and not flags.no_kv_offload and not flags.overrides
            and all(d.backend.scheduler and d.backend.scheduler.get("async_events") for d in devs)
            and all(a.scheduler and a.scheduler.get("async_events") for a in accel_backends(placement)))


def accel_backends(placement: Placement) -> list:
    """The ACCEL backends llama_context adds after the model's devices (llama-context.cpp:
    "add ACCEL backends (such as BLAS)"): those a device's spec names under
    ``scheduler.accel`` (the build it implies: Metal's macOS build has BLAS), unless a device
    option turns them off (``metal,blas=0``)."""
    from graphcost.memory.backends import load as load_backend
    names: list[str] = []
    for d in placement.devices:
        for name in (d.backend.scheduler or {}).get("accel", ()):
            if name not in names and device_flag(d.options, name, True):
                names.append(name)
    return [load_backend(n) for n in names]


def unmodelled_devices(placement: Placement) -> str | None:
    """Why the scheduler cannot be simulated for these devices (None: it can)."""
    for d in placement.devices:
        b = d.backend
        s = b.scheduler
        if not s:
            return (f"{d.name}: the {b.name} backend's scheduler facts (supports_op, offload_op, "
                    "graph_optimize) are not in specs/backends")
        if s.get("not_modelled"):
            return f"{d.name}: {s['not_modelled']}"
        if b.alignment is None:
            return f"{d.name}: its buffer alignment is device-dependent (give --device {b.name},align=N)"
        if b.supports_op is None and not s.get("all_ops"):
            return f"{d.name}: the {b.name} backend's supports_op is not in specs/backends"
    return None


def backends_for(placement: Placement) -> list[SchedBackend] | None:
    """llama_context's backend list: the devices, then the CPU (compute buffer type: the
    first device's host buffer type if any). None when a device's scheduler facts are
    not in its spec (its compute buffer is then not modelled: :func:`unmodelled_devices`)."""
    if unmodelled_devices(placement) is not None:
        return None
    out = []
    for d in placement.devices:
        s = d.backend.scheduler
        out.append(SchedBackend(d.name, d.name, d.backend.alignment, False,
                                s.get("offload_min_batch"), kind=d.backend.name,
                                supports=None if s.get("all_ops") else d.backend.supports_op,
                                alloc_rule=d.backend.compute_alloc_size, options=dict(d.options),
                                own_device_sources=bool(s.get("own_device_sources")),
                                alloc_deps=s.get("graph_optimize_alloc_deps"),
                                reorder=s.get("graph_optimize_reorder"),
                                offload_ops=(frozenset(s["offload_ops"]) if s.get("offload_ops")
                                             else None),
                                reads_host=(d.backend.host_buffer if s.get("integrated_reads_host")
                                            and device_flag(d.options, "integrated", False)
                                            else None),
                                max_size=d.backend.max_buffer_size))
    for a in accel_backends(placement):
        out.append(SchedBackend(a.device_name, a.buffer_type, a.alignment, False, None,
                                kind=a.name, supports=a.supports_op,
                                reads_host_buffers=bool(a.scheduler.get("reads_host_buffers"))))
    out.append(_cpu_backend(placement))
    return out


def _cpu_backend(placement: Placement) -> SchedBackend:
    """The CPU backend, whose compute buffer type is the first device's host buffer type if
    it has one (llama_context: "use the host buffer of the first device CPU"), with that
    type's alignment and max size (:func:`graphcost.memory.placement.host_buffer_backend`:
    the CPU's, or Vulkan_Host's minMemoryMapAlignment and suballocation block)."""
    from graphcost.memory.backends import load as load_backend
    if not placement.devices or not placement.devices[0].backend.host_buffer:
        return SchedBackend("CPU", "CPU", load_backend("cpu").alignment, True)
    host = host_buffer_backend(placement.devices[0])
    return SchedBackend("CPU", host.host_buffer, host.alignment, True, max_size=host.max_buffer_size)


class _Scheduler:
    """ggml_backend_sched_split_graph over graphcost's node and leaf lists."""

    def __init__(self, backends: list[SchedBackend], bufs: dict[int, str],
                 n_copies: int, op_offload: bool = True) -> None:
        self.backends = backends
        self.bufs = bufs  # id(tensor) -> buffer type name of its memory (weights, KV)
        self.weights: set[int] = set()  # ids of tensors in weight buffers
        self.n_copies = n_copies
        self.op_offload = op_offload
        self.tb: dict[int, int] = {}  # hv_tensor_backend_ids
        self.cpu = len(backends) - 1
        self._supported: dict[tuple[int, int], bool] = {}

    # ---- backend facts ----
    def supports_buft(self, b: int, buft: str) -> bool:
        """ggml_backend_supports_buft: a device its own buffer type (an integrated CUDA GPU
        also the pinned host type); the CPU every host buffer type
        (ggml_backend_cpu_device_supports_buft); BLAS every host type but CPU_REPACK."""
        be = self.backends[b]
        if be.is_cpu:
            return buft not in self._device_bufts
        if be.reads_host_buffers:
            return buft not in self._device_bufts and buft != "CPU_REPACK"
        return buft == be.buft or (be.reads_host is not None and buft == be.reads_host)

    def supports_op(self, b: int, t: Tensor) -> bool:
        """ggml_backend_supports_op: the device's rules (specs/backends ``supports_op``); RPC:
        every op (ggml_backend_rpc_device_supports_op); the CPU: every op the graphs use
        (ggml_backend_cpu_device_supports_op). With ``own_device_sources`` (CUDA), an op
        with a source in another device's buffer of the same backend is refused."""
        be = self.backends[b]
        if be.supports is None:
            return True
        key = (b, id(t))
        hit = self._supported.get(key)
        if hit is not None:
            return hit
        ok = True
        if be.own_device_sources:
            for s in t.src:
                buft = self.bufs.get(id(s))
                if buft is not None and buft != be.buft and any(
                        o.buft == buft and o.kind == be.kind for o in self.backends):
                    ok = False
        if ok and be.supports.get("require") is not None:
            ok = evaluate(be.supports["require"], t, be.options, f"{be.kind} supports_op")
        if ok:
            rule = be.supports["ops"].get(str(t.op), be.supports["default"])
            ok = evaluate(rule, t, be.options, f"{be.kind} supports_op {t.op}")
        self._supported[key] = ok
        return ok

    def offload_op(self, b: int, t: Tensor) -> bool:
        """ggml_backend_dev_offload_op: get_op_batch_size >= the device's minimum (CUDA,
        ROCm, Vulkan, SYCL; Metal only for the ops its spec lists)."""
        m = self.backends[b].offload_min_batch
        if m is None:
            return False
        if self.backends[b].offload_ops is not None and t.op not in self.backends[b].offload_ops:
            return False
        if t.op == Op.GET_ROWS:
            batch = 0
        elif t.op == Op.MUL_MAT:
            batch = t.ne[1]
        elif t.op in (Op.MUL_MAT_ID, Op.ROPE):
            batch = t.ne[2]
        else:
            batch = t.ne[1] * t.ne[2] * t.ne[3]
        return batch >= m

    @property
    def _device_bufts(self) -> set[str]:
        return {b.buft for b in self.backends if not b.is_cpu and not b.reads_host_buffers}

    # ---- ggml-backend.cpp helpers ----
    def buffer(self, t: Tensor) -> str | None:
        """The buffer type of a tensor's memory (``view_src->buffer`` for a view)."""
        return self.bufs.get(id(t.storage))

    def get(self, t: Tensor | None) -> int:
        return -1 if t is None else self.tb.get(id(t), -1)

    def from_buffer(self, t: Tensor, op: Tensor) -> int:
        """ggml_backend_sched_backend_from_buffer."""
        buft = self.buffer(t)
        if buft is None:
            return -1
        for i in range(len(self.backends)):
            if self.supports_buft(i, buft) and self.supports_op(i, op):
                return i
        return -1

    def from_cur(self, t: Tensor) -> int:
        """ggml_backend_sched_backend_id_from_cur."""
        b = self.from_buffer(t, t)
        if b != -1:
            return b
        if t.view_src is not None:
            b = self.from_buffer(t.view_src, t)
            if b != -1:
                return b
        if self.buffer(t) is not None:
            raise GraphcostError(f"scheduler: pre-allocated tensor {t.name} in a buffer "
                                 f"({self.buffer(t)}) that cannot run {t.op}")
        if t.role == "input":
            return self.cpu
        if t.op not in _NOT_OFFLOADED:
            for s in t.src:
                if id(s) in self.weights:
                    sb = self.from_buffer(s, t)
                    if self.op_offload and sb == self.cpu and self.buffer(s) != "CPU_REPACK":
                        for b in range(sb):
                            if self.supports_op(b, t) and self.offload_op(b, t):
                                return b
                    return sb
        return -1

    def buffer_supported(self, t: Tensor, b: int) -> bool:
        """ggml_backend_sched_buffer_supported."""
        buft = self.buffer(t)
        if buft is None:
            tb = self.get(t)
            if tb == -1 and t.view_src is not None:
                tb = self.get(t.view_src)
            if tb != -1:
                buft = self.backends[tb].buft
        return buft is not None and self.supports_buft(b, buft)

    # ---- the passes ----
    def split(self, nodes: list[Tensor], leafs: list[Tensor], pinned: dict[int, int]
              ) -> tuple[list[Split], dict[tuple[int, int], list[Tensor]]]:
        tb = self.tb
        tb.update(pinned)
        cpu = self.cpu
        # pass 1: pre-allocated inputs, graph inputs, weights
        for t in list(leafs) + list(nodes):
            if self.get(t) == -1:
                tb[id(t)] = self.from_cur(t)
        work = [n for n in nodes if n.op not in VIEW_OPS]
        # pass 2: expand devices down and up (skipping the CPU), then everything
        for order, skip_cpu in ((work, True), (work[::-1], True), (work, False), (work[::-1], False)):
            cur = -1
            for n in order:
                b = self.get(n)
                if b != -1:
                    cur = -1 if (skip_cpu and b == cpu) else b
                elif cur != -1 and self.supports_op(cur, n):
                    tb[id(n)] = cur
        # pass 3: unassigned nodes to the backend with the most supported inputs;
        # upgrades to a higher-priority backend with the same buffer type
        for n in work:
            b = self.get(n)
            if b == -1:
                best = -1
                for c in range(len(self.backends)):
                    if not self.supports_op(c, n):
                        continue
                    k = sum(1 for s in n.src
                            if (self.get(s) != -1 or self.get(s.view_src) != -1)
                            and self.buffer_supported(s, c))
                    if k > best:
                        best = k
                        tb[id(n)] = c
            else:
                for c in range(b):
                    if (self.backends[c].buft == self.backends[b].buft and self.supports_op(c, n)
                            and all(self.buffer_supported(s, c) for s in n.src)):
                        tb[id(n)] = c
                        break
        # pass 4: sources from their consumer (views from their source)
        for n in nodes:
            if n.view_src is not None and self.get(n) == -1:
                tb[id(n)] = self.get(n.view_src)
            for s in n.src:
                if self.get(s) == -1:
                    tb[id(s)] = self.get(s.view_src) if s.view_src is not None else self.get(n)
            for c in range(len(self.backends)):
                if self.get(n) != -1:
                    break
                if self.supports_op(c, n):
                    tb[id(n)] = c
        # pass 5: splits and the copies of their inputs
        copies: dict[tuple[int, int], list[Tensor]] = {}
        splits: list[Split] = []
        first = next((i for i, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(self.get(nodes[first]) if first < len(nodes) else cpu, 0)
        splits.append(split)
        cur = split.backend
        for i in range(first, len(nodes)):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            nb = self.get(n)
            new_split = False
            if nb == cur and split.inputs:
                for s in n.src:
                    if (id(s) in self.weights and self.get(s) != cur
                            and not self.buffer_supported(s, cur)):
                        new_split = True
                        break
            if nb != cur or new_split:
                split.i_end = i
                split = Split(nb, i)
                splits.append(split)
                cur = nb
            for j, s in enumerate(n.src):
                sb = self.get(s)
                if sb != cur and not self.buffer_supported(s, cur):
                    key = (id(s), cur)
                    if key not in copies:
                        name = f"{self.backends[cur].name}#{s.name}"
                        copies[key] = [dataclasses.replace(
                            s, op=Op.NONE, src=[], view_src=None, view_offs=0, params={},
                            role="activation", name=f"{name}#{c}") for c in range(self.n_copies)]
                        for c in copies[key]:
                            tb[id(c)] = cur
                        split.inputs.append(s)
                    n.src[j] = copies[key][0]
        split.i_end = len(nodes)
        return splits, copies


def _pins(nodes: list[Tensor], placement: Placement, backends: list[SchedBackend],
          n_tokens: int, flags: PlacementFlags, full_offload: bool) -> dict[int, int]:
    """ggml_backend_sched_set_tensor_backend calls llama.cpp makes while building the graph:
    ``norm``/``l_last`` of layer il on dev_layer(il) (graph_get_cb), and with -nkvo the
    attention output on the CPU (build_attn_mha, in its non-flash branch only: there the
    output is the ``ggml_cont_2d`` of kqv; flash attention's is a reshape, not pinned)."""
    index = {b.name: i for i, b in enumerate(backends)}
    cpu = len(backends) - 1
    out: dict[int, int] = {}
    for n in nodes:
        base, _, il = n.name.rpartition("-")
        if not il.isdigit():
            continue
        il_ = int(il)
        if (base in ("norm", "l_last") and (n_tokens < PIN_NORM_BELOW_TOKENS or full_offload)
                and il_ < len(placement.dev_layer)):
            out[id(n)] = index.get(placement.dev_layer[il_], cpu)
        if flags.no_kv_offload and base == "kqv_out" and n.op == Op.CONT:
            out[id(n)] = cpu
    return out


def _weight_key(w: Tensor, consumer: Tensor, arch: str) -> tuple[str, str, int | None]:
    """Which created tensor a graph weight is (placement.tensor_bufts' key): the tied
    output's token_embd is the output layer's copy, rope factors the consumer layer's."""
    if w.name in ROPE_FACTORS:
        return (w.name, "repeating", consumer.layer)
    layer, il = _layer_of(w.name, arch)
    if layer == "input" and consumer.op in (Op.MUL_MAT, Op.MUL_MAT_ID):
        return (w.name, "output", None)
    return (w.name, layer, il)


def _buft_key(b: Buft) -> str:
    """The buffer type a scheduler sees: a device's, a pinned host type's (CUDA_Host), or
    the CPU's (CPU_REPACK apart)."""
    if b.kind in ("device", "host"):
        return b.name
    return "CPU_REPACK" if b.kind == "extra" else "CPU"


def schedule(bg, placement: Placement, flags: PlacementFlags,
             backends: list[SchedBackend], n_copies: int, *, pins: bool = True,
             no_alloc: bool = False) -> Schedule:
    """Split and allocate one built graph (``graphcost.graph.build.BuiltGraph``) the way
    ggml_backend_sched_reserve does for these devices and flags; ``pins=False``: without
    the graph callback's ggml_backend_sched_set_tensor_backend calls (lost to
    ggml_backend_sched_reserve_size's reset, as llama.cpp's fit measures); ``no_alloc``:
    the KV cache and recurrent states in dummy buffers (a model loaded with ``no_alloc``:
    llama_kv_cache sets ``t->buffer`` and leaves ``t->data`` NULL), which a backend's
    reorder sees as every tensor of a cache at address 0."""
    from graphcost.memory.plan import graph_outputs
    bufs: dict[int, str] = {}
    weight_ids: set[int] = set()
    # KV caches: dev_layer(il)'s buffer, the CPU with -nkvo;
    # recurrent states likewise (llama_memory_recurrent: dev_layer(il) when offload_kqv)
    for c in list(bg.caches) + list(bg.states):
        pairs = (list(c.k.items()) + list(c.v.items())) if hasattr(c, "k") else \
            (list(c.r.items()) + list(c.s.items()))
        for il, t in pairs:
            row = "CPU" if flags.no_kv_offload else placement.dev_layer[il]
            bufs[id(t)] = row
    addresses = _cache_addresses(bg, placement, flags, no_alloc)
    # weights: a graph tensor that llama.cpp creates more than once (tied output,
    # per-layer rope factors) becomes one tensor per buffer type
    clones: dict[tuple[int, str], Tensor] = {}
    remap: dict[int, Tensor] = {}
    new_nodes: list[Tensor] = []
    extra_leafs: list[Tensor] = []
    for n in bg.nodes:
        srcs = []
        for s in n.src:
            if s.role == "weight" and s.view_src is None:
                key = _weight_key(s, n, bg.model.arch)
                b = placement.tensor_bufts.get(key)
                if b is None:
                    raise GraphcostError(f"scheduler: no placement for weight {s.name} ({key})")
                bk = _buft_key(b)
                ck = (id(s), bk)
                if ck not in clones:
                    first = not any(k[0] == id(s) for k in clones)
                    c = s if first else dataclasses.replace(s)
                    if not first:
                        extra_leafs.append(c)
                    clones[ck] = c
                    bufs[id(c)] = bk
                    weight_ids.add(id(c))
                srcs.append(clones[ck])
            else:
                srcs.append(remap.get(id(s), s))
        vs = remap.get(id(n.view_src), n.view_src) if n.view_src is not None else None
        c = dataclasses.replace(n, src=srcs, view_src=vs)
        # ggml_cast's result is its own src[1] (ggml.c ggml_cast: ``result->src[1] =
        # result``): the copy must name itself, not the node it copies (the allocator
        # would see a second tensor and allocate it beside the cast)
        c.src = [c if x is n else x for x in c.src]
        remap[id(n)] = c
        new_nodes.append(c)
    leafs = list(bg.leafs) + extra_leafs
    for t in bg.leafs:  # weights no node reads still have their buffer
        if t.role == "weight" and id(t) not in weight_ids:
            b = placement.tensor_bufts.get(_weight_key(t, t, bg.model.arch))
            if b is not None:
                bufs[id(t)] = _buft_key(b)
                weight_ids.add(id(t))

    sched = _Scheduler(backends, bufs, n_copies, flags.op_offload)
    sched.weights = weight_ids
    n_layer = len(placement.dev_layer)  # n_layer_all
    n_gpu = flags.n_gpu_layers if flags.n_gpu_layers >= 0 else n_layer + 1
    pinned = _pins(new_nodes, placement, backends, bg.run.n_tokens, flags,
                   n_gpu > n_layer) if pins else {}
    uses = use_counts(new_nodes)  # before the scheduler puts copies in as sources
    splits, copies = sched.split(new_nodes, leafs, pinned)
    deps = _graph_optimize(splits, new_nodes, backends, uses, weight_ids,
                           lambda t: addresses.get(id(t)))

    # graph_copy: per split, [input dependency, input copy] per input, then its nodes
    gc_nodes: list[Tensor] = []
    gc_bufs: list[int] = []
    buf_index: dict[str, int] = {}
    backend_buf = []
    for b in backends:
        backend_buf.append(buf_index.setdefault(b.buft, len(buf_index)))
    alignments = [0] * len(buf_index)
    alloc_sizes: list = [None] * len(buf_index)
    max_sizes: list = [None] * len(buf_index)
    for b in backends:
        alignments[buf_index[b.buft]] = b.alignment
        max_sizes[buf_index[b.buft]] = b.max_size
        if b.alloc_rule:
            alloc_sizes[buf_index[b.buft]] = b.alloc_size
    for sp in splits:
        for inp in sp.inputs:
            dep = dataclasses.replace(inp, op=Op.NONE, src=[inp], view_src=inp.storage,
                                      name=f"{inp.name} (dep)")
            gc_nodes.append(dep)
            gc_bufs.append(backend_buf[max(sched.get(inp), 0)])
            gc_nodes.append(copies[(id(inp), sp.backend)][0])
            gc_bufs.append(backend_buf[sp.backend])
        for i in range(sp.i_start, sp.i_end):
            gc_nodes.append(new_nodes[i])
            gc_bufs.append(backend_buf[max(sched.get(new_nodes[i]), 0)])
            for dep in dep_nodes(new_nodes[i], deps.get(id(new_nodes[i]), [])):
                gc_nodes.append(dep)  # after `until`, on this split's backend
                gc_bufs.append(backend_buf[sp.backend])
    gc_leafs: list[Tensor] = []
    leaf_bufs: list[int] = []
    flagged_in = [t for t in leafs if t.role == "input"]
    flagged_out = graph_outputs(new_nodes)
    if n_copies > 1:
        for t in list(flagged_in):  # pass 6: every graph input, n_copies times
            for c in [t] + [dataclasses.replace(t, name=f"{t.name}#{k}") for k in range(1, n_copies)]:
                gc_leafs.append(c)
                leaf_bufs.append(backend_buf[sched.get(t)])
                flagged_out.append(c)
                if c is not t:
                    flagged_in.append(c)
        for sp in splits:
            for inp in sp.inputs:
                for c in copies[(id(inp), sp.backend)]:
                    gc_leafs.append(c)
                    leaf_bufs.append(backend_buf[sp.backend])
                    flagged_in.append(c)
                    flagged_out.append(c)
    for t in leafs:
        gc_leafs.append(t)
        b = sched.get(t)
        leaf_bufs.append(backend_buf[b if b != -1 else len(backends) - 1])
    external_ids = set(bufs)

    def external(t: Tensor) -> bool:
        return id(t) in external_ids or t.role in ("weight", "kv")

    alloc = allocate(gc_nodes, gc_leafs, outputs=flagged_out, inputs=flagged_in,
                     external=external, node_buffers=gc_bufs, leaf_buffers=leaf_bufs,
                     alignments=alignments, alloc_sizes=alloc_sizes, max_sizes=max_sizes)
    sizes = []
    chunks: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for i, b in enumerate(backends):
        k = backend_buf[i]
        sizes.append(0 if k in seen else alloc.buffer_sizes[k])
        chunks.append(() if k in seen else alloc.chunk_sizes[k])
        seen.add(k)
    return Schedule(backends, new_nodes, [sched.get(n) for n in new_nodes], splits,
                    n_copies, alloc, sizes, chunks)


def _graph_optimize(splits: list[Split], nodes: list[Tensor], backends: list[SchedBackend],
                    uses: dict[int, int], weight_ids: set[int], address) -> dict[int, list[Tensor]]:
    """ggml_backend_sched_split_graph: each split's graph handed to its backend's
    graph_optimize: the allocation dependencies it adds, by ``until`` node id
    (:mod:`graphcost.memory.alloc_deps`), computed on the split as built; then its node
    reorder (:mod:`graphcost.memory.reorder`), written back into ``nodes`` in place (the
    split keeps its range), as ggml permutes the graph view's window."""
    from graphcost.memory.plan import graph_outputs
    from graphcost.memory.reorder import REORDERS
    pairs: list = []
    outputs = {id(t) for t in graph_outputs(nodes)}
    for sp in splits:
        be = backends[sp.backend]
        if not be.alloc_deps and not be.reorder:
            continue
        g = SplitGraph(nodes[sp.i_start:sp.i_end], nodes[sp.i_end] if sp.i_end < len(nodes) else None,
                       uses, outputs, weight_ids)
        if be.alloc_deps:
            rule = ALLOC_DEP_RULES.get(be.alloc_deps)
            if rule is None:
                raise GraphcostError(f"{be.kind}: unknown graph_optimize_alloc_deps {be.alloc_deps!r}")
            rule(g, be.options)  # its add_alloc_dep calls go to g.deps
        if be.reorder:
            reorder = REORDERS.get(be.reorder)
            if reorder is None:
                raise GraphcostError(f"{be.kind}: unknown graph_optimize_reorder {be.reorder!r}")
            nodes[sp.i_start:sp.i_end] = reorder(g, address, be.options)
        pairs += g.deps
    return collect(pairs)


def _cache_addresses(bg, placement: Placement, flags: PlacementFlags,
                     no_alloc: bool) -> dict[int, tuple[tuple[str, str], int, int]]:
    """Where each KV cache and recurrent-state tensor lives, by tensor id: (its buffer, first
    byte, end byte). One buffer per cache and buffer type, its tensors in creation order (per
    layer K then V, or R then S: llama_kv_cache / llama_memory_recurrent constructors), each
    at the running offset padded to the type's alignment
    (ggml_backend_alloc_ctx_tensors_from_buft); with ``no_alloc`` every tensor at 0 (data
    NULL in a dummy buffer). The end is the begin plus get_alloc_size."""
    from graphcost.memory.backends import load as load_backend
    from graphcost.memory.placement import alloc_size
    by_name = {d.name: d.backend for d in placement.devices}
    out: dict[int, tuple[tuple[str, str], int, int]] = {}
    for c in list(bg.caches) + list(bg.states):
        kv = hasattr(c, "k")
        first, second = (c.k, c.v) if kv else (c.r, c.s)
        offset: dict[str, int] = {}
        for il in sorted(set(first) | set(second)):
            row = "CPU" if flags.no_kv_offload else placement.dev_layer[il]
            backend = by_name.get(row) or load_backend("cpu")
            for t in (first.get(il), second.get(il)):
                if t is None or id(t.storage) in out:
                    continue
                size = alloc_size(backend, t.type, t.ne, t.nbytes)
                begin = 0 if no_alloc else offset.get(row, 0)
                out[id(t.storage)] = ((getattr(c, "name", "state"), row), begin, begin + size)
                offset[row] = offset.get(row, 0) + gt.ggml_pad(size, backend.alignment or 1)
    return out


@dataclass(frozen=True)
class ComputeBuffers:
    """sched_reserve's compute buffers: per backend, the largest over its graphs."""

    backends: list[SchedBackend]
    schedules: list[tuple[str, Schedule]]  # (reserve graph label, its schedule)
    n_copies: int

    @property
    def bytes_by_buft(self) -> dict[str, int]:
        """Compute buffer bytes by buffer type name (as llama.cpp logs them: the sum of the
        buffer's chunks, ggml_vbuffer_size)."""
        return {buft: sum(c) for buft, c in self.chunks_by_buft.items()}

    @property
    def chunks_by_buft(self) -> dict[str, tuple[int, ...]]:
        """Each compute buffer's chunks after sched_reserve's graphs in turn: prompt,
        generation, prompt again (:func:`graphcost.memory.alloc.reserved_chunks`; one chunk:
        the largest size)."""
        out: dict[str, tuple[int, ...]] = {}
        for i, b in enumerate(self.backends):
            if b.buft not in out:
                graphs = [s.buffer_chunks[i] for _, s in self.schedules]
                if self.schedules[0][0] == "prompt":
                    graphs.append(graphs[0])  # "reserve again with pp graph" (the same graph)
                out[b.buft] = reserved_chunks(graphs)
        return out

    def n_splits(self, label: str) -> int:
        return len(next(s for lab, s in self.schedules if lab == label).splits)


def compute_buffers(reserves, placement: Placement, flags: PlacementFlags,
                    n_layer: int, *, no_alloc: bool = False) -> ComputeBuffers | None:
    """Schedule each reserve graph (``MemoryPlan.reserves``) and size every backend's
    compute buffer; None when a device's scheduler facts are not modelled. ``no_alloc``
    (llama.cpp's fit): only the first prompt graph, without the graph callback's pins."""
    backends = backends_for(placement)
    if backends is None:
        _note(placement, unmodelled_devices(placement))
        return None
    n_copies = MAX_COPIES if pipeline_parallel(placement, flags, n_layer) else 1
    if no_alloc:
        reserves = reserves[:1]
    try:
        scheds = [(r.label, schedule(r.graph, placement, flags, backends, n_copies,
                                     pins=not no_alloc, no_alloc=no_alloc))
                  for r in reserves]
    except Unmodelled as e:
        _note(placement, str(e))
        return None
    return ComputeBuffers(backends, scheds, n_copies)


def _note(placement: Placement, reason: str | None) -> None:
    """Record why the compute buffers are not modelled (once) in the placement's notes."""
    line = f"compute buffers not modelled: {reason}"
    if reason and line not in placement.notes:
        placement.notes.append(line)


def schedule_step(bg, args, flags: PlacementFlags) -> Schedule | str:
    """The scheduler's view of one analyzed graph (``analyze --device ...``): each node's
    backend and the tensors copied between backends in that step; or, when a device's
    scheduler facts or a rule its graph meets are not modelled, the reason (one line)."""
    from graphcost.memory.placement import place
    p = place(bg.model, args, flags)
    backends = backends_for(p)
    if backends is None:
        return unmodelled_devices(p) or "not modelled"
    n_copies = MAX_COPIES if pipeline_parallel(p, flags, bg.model.n_layer) else 1
    try:
        return schedule(bg, p, flags, backends, n_copies)
    except Unmodelled as e:
        return str(e)


def schedule_dict(s: Schedule) -> dict:
    """One schedule as plain data: splits (backend, node range, inputs) and bytes copied."""
    return {"n_copies": s.n_copies, "n_splits": len(s.splits), "copy_bytes": s.copy_bytes,
            "splits": [{"backend": s.backends[sp.backend].name, "nodes": [sp.i_start, sp.i_end],
                        "inputs": [{"name": t.name, "bytes": t.nbytes} for t in sp.inputs]}
                       for sp in s.splits]}


def flash_attn_auto_fails(model, settings, placement: Placement, flags: PlacementFlags) -> str | None:
    """``-fa auto`` with devices (llama_context::resolve_fused_ops): a one-token probe graph
    with flash attention is scheduled, and if any layer's FLASH_ATTN_EXT runs on another
    device than the layer's, llama.cpp turns flash attention off. Returns that warning (the
    first mismatch), or None when flash attention stays on (or was not auto). ``settings``:
    RunSettings, or already resolved for ``model``."""
    from graphcost.graph.build import build_graph, resolve_for
    from graphcost.graph.settings import Resolved
    run = settings if isinstance(settings, Resolved) else resolve_for(model, settings)
    if not run.flash_attn_auto or not placement.devices:
        return None
    backends = backends_for(placement)
    if backends is None:
        return None
    # auto is on (run.flash_attn): the probe is one token with every cell attended
    bg = build_graph(model, run.step(1, run.n_ctx - 1, 1, memory_full=True))
    n_copies = MAX_COPIES if pipeline_parallel(placement, flags, model.n_layer) else 1
    try:
        s = schedule(bg, placement, flags, backends, n_copies)
    except Unmodelled as e:
        _note(placement, f"-fa auto: the probe graph: {e}")
        return None
    for i, n in enumerate(s.nodes):
        if n.op == Op.FLASH_ATTN_EXT and n.layer is not None:
            dev, want = s.device_of(i), placement.dev_layer[n.layer]
            if dev != want:
                return (f"-fa auto: layer {n.layer} is on {want} but its flash attention on "
                        f"{dev}: llama.cpp turns flash attention off (resolve_fused_ops)")
    return None
