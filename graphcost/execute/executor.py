"""Run graphcost's own graph node by node on the Numba kernels, with a KV cache kept
across steps: the executor behind ``graphcost profile`` and the numerics tests.

What it runs is exactly :func:`graphcost.graph.build.build_graph`'s node list (the nodes the
analyzer costs); each op is compiled once per graph shape by :mod:`graphcost.execute.exec_ops`.

Memory:

* **weights** are memory-mapped from the GGUF (``np.memmap`` at the shard's
  ``data_offset`` + the tensor's offset); matmuls decode them block by block, nothing is
  dequantized into a copy. A header-only file runs on random data of the right types
  (:func:`random_weights`);
* **KV cache** leaves (``cache_k_l<il>``, ``cache_v_l<il>``) are zeroed buffers that live
  as long as the executor; ``SET_ROWS`` writes the new rows at the indices in
  ``attn_inp_k_idxs`` / ``attn_inp_v_idxs``;
* **recurrent state** (``cache_r_l<il>``, ``cache_s_l<il>`` of llama_memory_recurrent:
  conv and SSM/delta-net state, one cell for one sequence) lives beside the KV cache;
  the graph gathers it through ``rs_s_copy`` and copies the new state back (CPY into
  views of it); timing reruns of a step restore it first (:meth:`Executor.step`);
* **activations**: small node outputs (:data:`graphcost.execute.exec_ops.PREALLOC_MAX_BYTES`)
  are allocated once per plan and rewritten every run, larger ones are the arrays the
  kernels return, one per node and run; views, reshapes and permutes are strided numpy
  views of their storage (``view_offs``, ``nb``), made once when the storage is fixed.
  What leaves a run (logits, captured values) is copied.

A node whose sources are all fixed arrays is *bound* when the plan is compiled: its
kernel arguments are prepared once and a run is one call of the compiled numba overload
(:meth:`graphcost.execute.exec_ops.KernelNode.bind`, :func:`graphcost.execute.exec_ops.resolve_entry`).

Graph inputs are filled like llama.cpp's ``set_input`` (``src/llama-graph.cpp``,
``src/llama-kv-cache.cpp``) for one sequence: tokens, positions, output ids, the KV cells
chosen by ``find_slot`` (``k_idxs``; ``v_idxs`` as element indices ``j*kv_size + cell``
when V is transposed), the causal mask (0 / -inf, F16 with flash attention) with
sliding-window masking (``LLAMA_SWA_TYPE_STANDARD``: cell masked when ``p1 - p0 >=
n_swa``) for the SWA cache, and the Hadamard matrices of quantized caches.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Callable, Iterable

import numpy as np

from graphcost.format import ggml_types as gt
from graphcost.graph import ops
from graphcost.graph.build import BuiltGraph, build_graph, load_model, resolve_for
from graphcost.errors import GGUFError, SettingsError, UnsupportedError
from graphcost.execute.exec_ops import (Ctx, compile_node, flat_bytes, resolve_entry, shape_strides, tensor_view, unsupported_ops, weight_types)
from graphcost.graph.ggml_graph import Tensor
from graphcost.format.gguf_reader import read_header
from graphcost.format.model import YARN_UNREAD_KEYS
from graphcost.graph.llm_graph import KVCache
from graphcost.format.model import ModelInfo
from graphcost.graph.ops import Op
from graphcost.graph.flavour import flavour
from graphcost.graph.settings import RunSettings, n_kv_for

#: numerics modes (see graphcost.execute.exec_ops)
NUMERICS = ("ggml", "fast")
#: fraction of available memory random weights may take before tensors of a type share one buffer
RANDOM_WEIGHTS_MEMORY_FRACTION = 0.5


# ---------------------------------------------------------------------------- weights


#: per block type, a scale magnitude that keeps random decoded weights around 0.02
_RANDOM_SCALE = {
    gt.GGMLType.Q4_0: 3e-3, gt.GGMLType.Q4_1: 3e-3, gt.GGMLType.Q5_0: 1.5e-3,
    gt.GGMLType.Q5_1: 1.5e-3, gt.GGMLType.Q8_0: 2e-4, gt.GGMLType.Q2_K: 2e-3,
    gt.GGMLType.Q3_K: 2e-4, gt.GGMLType.Q4_K: 1e-4, gt.GGMLType.Q5_K: 5e-5,
    gt.GGMLType.Q6_K: 2e-5,
}


def _random_raw(t: gt.GGMLType, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Flat bytes of a tensor of type ``t`` whose values are small and finite, drawn in
    float32 (never a float64 copy of the tensor: that would be 2-8x its size)."""
    n = int(np.prod(ne))
    if t == gt.F32:
        vec = len([d for d in ne if d > 1]) <= 1            # norm weights, biases: around 1
        v = rng.standard_normal(n, dtype=np.float32)
        v *= np.float32(0.05 if vec else 0.02)
        if vec:
            v += np.float32(1.0)
        return v.view(np.uint8)
    if t == gt.F16:
        v = rng.standard_normal(n, dtype=np.float32)
        v *= np.float32(0.02)
        return v.astype(np.float16).view(np.uint8)
    if t == gt.GGMLType.BF16:
        f = rng.standard_normal(n, dtype=np.float32)
        f *= np.float32(0.02)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blk, size = gt.block(t)
    n_blocks = n // blk
    if t == gt.GGMLType.MXFP4:
        # E8M0 scale byte first: 2^(e - 128) times codes up to 12 -> |w| <= 0.05
        raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        raw[:, 0] = rng.integers(118, 121, size=n_blocks, dtype=np.uint8)
        return raw.reshape(-1)
    offsets, scale = gt.f16_scale_offsets(t), _RANDOM_SCALE.get(t)
    if not offsets or scale is None:
        raise UnsupportedError(f"random weights of type {gt.type_name(t)}")
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in offsets:
        d = ((rng.random(n_blocks, dtype=np.float32) * 0.5 + 0.5) * scale).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def pos_input(positions: np.ndarray, size: int) -> np.ndarray:
    """``inp_pos`` for text tokens (llm_graph_input_pos::set_input): the positions, or
    with 4 per token (n_pos_per_embd 4: MROPE/IMROPE) the tracks ``(p, p, p, 0)`` one
    after another."""
    if size == len(positions):
        return positions
    if size != 4 * len(positions):
        raise AssertionError(f"inp_pos has {size} values for {len(positions)} tokens")
    return np.concatenate([positions] * 3 + [np.zeros_like(positions)])


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def attn_temp(positions: np.ndarray, scale: float, length: int,
              offset: float = 0.0) -> np.ndarray:
    """``inp_attn_scale`` per token (llm_graph_input_attn_temp::set_input,
    src/llama-graph.cpp): ``log(floor((pos + offset) / length) + 1) * scale + 1``, the
    division in float32 and the rest in double, as there (llama4 sets offset 1, the others
    0)."""
    if scale == 0.0 or length == 0:
        raise UnsupportedError("inp_attn_scale needs attention.temperature_scale and "
                               "attention.temperature_length (llama.cpp asserts both non-zero)")
    q = (positions.astype(np.float32) + np.float32(offset)) / np.float32(length)
    return (np.log(np.floor(q).astype(np.float64) + 1.0) * np.float64(np.float32(scale))
            + 1.0).astype(np.float32)


class RandomWeights(Mapping):
    """Random bytes for the tensors of a header-only file, drawn when the graph first
    asks for a tensor: a tensor the graph never uses costs nothing.

    Each tensor gets its own buffer while all drawn so far fit in
    RANDOM_WEIGHTS_MEMORY_FRACTION of the available memory; past that, tensors of one
    type share one buffer (as big as the largest of them asked for so far), which keeps
    a 100-GB model runnable but lets caches serve reads that would come from memory:
    timings are then optimistic (:attr:`note` says which happened)."""

    def __init__(self, model: ModelInfo, seed: int = 0):
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.budget = RANDOM_WEIGHTS_MEMORY_FRACTION * _available_memory()
        self.drawn: dict[str, np.ndarray] = {}
        self.own_bytes = 0
        self.pools: dict[gt.GGMLType, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.drawn:
            t = self.model.tensors[name]
            if self.own_bytes + t.nbytes <= self.budget:
                self.drawn[name] = _random_raw(t.type, t.ne, self.rng)
                self.own_bytes += t.nbytes
            else:
                pool = self.pools.get(t.type)
                if pool is None or pool.nbytes < t.nbytes:
                    pool = self.pools[t.type] = _random_raw(t.type, t.ne, self.rng)
                self.drawn[name] = pool[:t.nbytes]
        return self.drawn[name]

    def __contains__(self, name: object) -> bool:  # drawn so far (Mapping's would draw it)
        return name in self.drawn

    def __iter__(self):
        return iter(self.drawn)

    def __len__(self) -> int:
        return len(self.drawn)

    @property
    def note(self) -> str:
        used = sum(self.model.tensors[n].nbytes for n in self.drawn)
        if not self.pools:
            return (f"header-only file: weights are random ({used / 2**20:.0f} MiB for the "
                    f"{len(self.drawn)} tensors the graph uses)")
        pooled = sum(p.nbytes for p in self.pools.values())
        return (f"header-only file: weights are random and, past {self.own_bytes / 2**20:.0f} MiB, "
                f"tensors of one type share a buffer ({pooled / 2**20:.0f} MiB shared for "
                f"{used / 2**20:.0f} MiB of weights): timings are optimistic")


def random_weights(model: ModelInfo, seed: int = 0) -> RandomWeights:
    """The random weights of a header-only file (drawn lazily, see :class:`RandomWeights`)."""
    return RandomWeights(model, seed)


def check_runnable(model: ModelInfo, settings: RunSettings | None = None) -> None:
    """Refuse, before any kernel is loaded, what the executor cannot run: a partial file
    (header whole, tensor data cut short: random data for the missing part would be
    neither the model nor a clean header-only run; costs and memory need only the header,
    so analyze, memory and check accept it), and settings whose KV cache does not fit in
    the available memory (``-c 2**30``)."""
    if model.header.partial is not None:
        raise GGUFError(model.header.path, None,
                        f"tensor data is cut short ({model.header.partial}): running the "
                        "graph needs the whole file; analyze, memory and check need only "
                        "the header")
    if settings is not None:
        bg = build_graph(model, settings)  # resolves the settings: refuses what llama.cpp does
        kv = sum(c.bytes() for c in bg.caches)
        if kv > _available_memory():
            raise SettingsError(f"--ctx-size {settings.ctx_size}: the KV cache needs "
                                f"{kv / 2**30:.1f} GiB, more than the "
                                f"{_available_memory() / 2**30:.1f} GiB of memory available")


def mapped_weights(model: ModelInfo) -> dict[str, np.ndarray]:
    """Each tensor's bytes, memory-mapped read-only from its shard (no copy)."""
    header = model.header
    shards = header.shards or [header.path]
    maps, offsets = [], []
    for i, p in enumerate(shards):
        maps.append(np.memmap(p, dtype=np.uint8, mode="r"))
        offsets.append(header.data_offset if i == 0 else read_header(p).data_offset)
    out = {}
    for t in model.tensors.values():
        start = offsets[t.shard] + t.offset
        out[t.name] = maps[t.shard][start:start + t.nbytes]
    return out


# ---------------------------------------------------------------------------- KV cells


@dataclass
class CellState:
    """The cells of one ``llama_kv_cache`` for one sequence (``llama_kv_cells``): the
    position each cell holds (-1: empty) and the search head (``v_heads``)."""

    size: int
    n_swa: int = 0                     # > 0: sliding-window cache (standard SWA)
    pos: np.ndarray = field(init=False)
    head: int = 0

    def __post_init__(self) -> None:
        self.pos = np.full(self.size, -1, dtype=np.int64)

    def masked_swa(self, p0: np.ndarray | int, p1: int):
        """llama_hparams::is_masked_swa for LLAMA_SWA_TYPE_STANDARD."""
        return (p1 - p0 >= self.n_swa) if self.n_swa > 0 else np.zeros_like(p0, dtype=bool)

    @property
    def used(self) -> int:
        return int((self.pos >= 0).sum())

    def used_max_p1(self) -> int:
        filled = np.nonzero(self.pos >= 0)[0]
        return int(filled[-1]) + 1 if filled.size else 0

    def n_kv(self) -> int:
        """llama_kv_cache::get_n_kv: attended cells, padded to 256."""
        return n_kv_for(self.used_max_p1(), self.size)

    def find_slot(self, n: int) -> np.ndarray:
        """llama_kv_cache::find_slot (cont = false) for ``n`` tokens of sequence 0."""
        if n > self.size:
            raise SettingsError(f"{n} tokens do not fit a KV cache of {self.size} cells")
        head = 0 if self.head > self.used + 2 * n else self.head
        seq_max = int(self.pos.max()) if self.used else -1
        idxs: list[int] = []
        tested = 0
        while len(idxs) < n:
            if tested >= self.size:
                raise SettingsError(f"the KV cache ({self.size} cells) is full")
            if head >= self.size:
                head = 0
            p = int(self.pos[head])
            if p < 0 or bool(self.masked_swa(p, seq_max + 1)):
                idxs.append(head)
            head += 1
            tested += 1
        return np.array(idxs, dtype=np.int64)

    def apply(self, idxs: np.ndarray, positions: np.ndarray) -> None:
        """llama_kv_cache::apply_ubatch: store positions, purge older overwritten ones."""
        old = self.pos[idxs]
        max_rm = int(old.max()) if (old >= 0).any() else -1
        self.pos[idxs] = positions
        if max_rm >= 0:
            # keep [pos_min, pos_max] complete: drop positions <= the ones overwritten
            stale = (self.pos >= 0) & (self.pos <= max_rm)
            self.pos[stale] = -1
        self.head = int(idxs[-1]) + 1

    def mask(self, n_kv: int, positions: np.ndarray) -> np.ndarray:
        """kq_mask rows [T, n_kv]: 0 where token i sees cell j, -inf elsewhere."""
        p0 = self.pos[:n_kv][None, :]
        p1 = positions[:, None]
        keep = (p0 >= 0) & (p0 <= p1)
        if self.n_swa > 0:
            keep &= ~(p1 - p0 >= self.n_swa)
        return np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)


def hadamard(n: int) -> np.ndarray:
    """ggml_gen_hadamard (src/llama-kv-cache.cpp): orthonormal Walsh-Hadamard, F32 [n, n]."""
    h = np.zeros((n, n), dtype=np.float32)
    h[0, 0] = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    s = 1
    while s < n:
        blk = h[:s, :s].copy()
        h[s:2 * s, :s] = blk
        h[:s, s:2 * s] = blk
        h[s:2 * s, s:2 * s] = -blk
        s *= 2
    return h


# ---------------------------------------------------------------------------- plans


COMPUTE, VIEW, FIXED, BOUND = 0, 1, 2, 3


@dataclass
class Step:
    """One executable node: its index, compiled function and value slots."""

    index: int
    node: Tensor
    fn: Callable | None       # None for a view
    srcs: tuple[int, ...]
    slot: int
    storage: int              # slot of the tensor owning the memory (views, SET_ROWS, CPY)
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: object
    kind: int = 0             # COMPUTE, VIEW (made per run), FIXED (view of fixed memory)
    #                           or BOUND (``call`` computes it from fixed arrays)
    call: Callable | None = None


@dataclass
class Plan:
    """A built graph compiled for execution (one per ubatch shape)."""

    graph: BuiltGraph
    steps: list[Step]
    n_slots: int
    fixed: dict[int, np.ndarray]          # slot -> value of weights, caches, input buffers
    fixed_raw: dict[int, np.ndarray]      # slot -> flat bytes of the same
    inputs: dict[str, list[tuple[Tensor, np.ndarray, object]]]   # kind -> (leaf, array, cache)
    needs_raw: set[int]                   # node slots that views or writers look through
    slot_of: dict[int, int]
    resolved: bool = False                # bound calls go to the compiled overloads


@dataclass
class NodeTiming:
    """Nanoseconds per executed node of one run (``None`` for views)."""

    ns: list[int | None]
    wall_ns: int


@dataclass
class StepResult:
    """What one ``llama_decode`` of a ubatch produced."""

    n_tokens: int
    past: int
    logits: np.ndarray                       # [n_outputs, n_vocab] float32
    timings: list[NodeTiming]
    captured: dict[int, np.ndarray] = field(default_factory=dict)   # node index -> value copy
    graph: BuiltGraph | None = None
    warmup_ns: int | None = None             # wall time of the untimed first run, if any


def _refuse_unsupported_weights(model: ModelInfo, supported) -> None:
    """One line naming the first tensor whose type the kernels cannot read (MXFP4, the IQ
    and TQ types ...), before any graph is compiled; analysis still costs such files."""
    bad = [t for t in model.tensors.values() if t.type not in supported]
    if bad:
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        kinds = ", ".join(sorted({gt.type_name(t.type) for t in bad}))
        raise UnsupportedError(
            f"{model.header.path}: tensor {bad[0].name!r} is {gt.type_name(bad[0].type)}"
            f"{more}; the executor's kernels do not run {kinds} (they run "
            f"{', '.join(gt.type_name(t) for t in supported)}); `graphcost analyze` costs it")


class Executor:
    """Runs a model's llama.cpp graph step by step on the kernels, keeping the KV cache.

    ``settings`` fixes the context (``ctx_size``, ``ubatch_size``, flash attention, cache
    types, ``llama_cpp`` flavour); ``tokens``/``past``/``outputs`` are per step."""

    def __init__(self, model: ModelInfo | str | os.PathLike, settings: RunSettings = RunSettings(),
                 *, numerics: str = "ggml", seed: int = 0, threads: int | None = None):
        from graphcost.execute.kernels_loader import load_kernels

        if numerics not in NUMERICS:
            raise SettingsError(f"numerics {numerics!r}: use one of {', '.join(NUMERICS)}")
        if not flavour(settings.llama_cpp).executable:
            raise UnsupportedError(f"the executor runs the head graph, not --llama-cpp "
                                   f"{settings.llama_cpp}")
        self.model = model if isinstance(model, ModelInfo) else load_model(model)
        unread = [k.format(arch=self.model.arch) for k in YARN_UNREAD_KEYS
                  if k.format(arch=self.model.arch) in self.model.header.metadata]
        if self.model.rope_scaling_type == "yarn" and unread:
            raise UnsupportedError(f"{self.model.header.path}: YaRN with {unread[0]} is not "
                                   "executed (the rope's YaRN factors assume its default)")
        self.settings = settings
        self.numerics = numerics
        import numba
        if threads is not None:
            numba.set_num_threads(threads)
        self.threads = numba.get_num_threads()
        t0 = time.perf_counter()
        self.K = load_kernels()
        self.kernels_import_s = time.perf_counter() - t0
        _refuse_unsupported_weights(self.model, weight_types(self.K))
        self.ctx = Ctx(self.K, numerics)
        self.rng = np.random.default_rng(seed)
        self._notes: list[str] = []
        check_runnable(self.model, settings)
        #: the context, resolved once; each step is a ubatch of it (Resolved.step)
        self.run = resolve_for(self.model, settings)
        if self.model.header.has_data:
            self.weights = mapped_weights(self.model)
        else:
            self.weights = random_weights(self.model, seed)
        self.kv: dict[str, np.ndarray] = {}          # cache tensor name -> bytes
        self.cells: dict[str, CellState] = {}        # cache name -> cells
        self.past = 0
        self._plans: dict[tuple, Plan] = {}

    @property
    def notes(self) -> list[str]:
        """What a reader of the timings should know (random weights, and how drawn)."""
        extra = [self.weights.note] if isinstance(self.weights, RandomWeights) else []
        return self._notes + extra

    # ---- state -----------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the sequence: empty cells, zeroed cache (llama_memory_clear)."""
        for buf in self.kv.values():
            buf[:] = 0
        self.cells.clear()
        self.past = 0

    # ---- compilation -------------------------------------------------------------------
    def plan(self, n_tokens: int, n_outputs: int = 1) -> Plan:
        """The compiled graph for a ubatch of ``n_tokens`` at the current ``past``; graphs
        differ only by their shape (tokens, outputs, attended cells), so plans are cached."""
        run = self.run.step(n_tokens, self.past, n_outputs)
        key = (n_tokens, n_outputs, run.n_kv, run.n_kv_swa)
        if key not in self._plans:
            self._plans[key] = self._compile(build_graph(self.model, run))
        return self._plans[key]

    def _compile(self, bg: BuiltGraph) -> Plan:
        bad = unsupported_ops(bg.nodes)
        if bad:
            raise UnsupportedError(f"{self.model.header.path}: the executor has no kernel for "
                                   f"op(s) {', '.join(bad)}")
        slot_of: dict[int, int] = {}

        def slot(t: Tensor) -> int:
            if id(t) not in slot_of:
                slot_of[id(t)] = len(slot_of)
            return slot_of[id(t)]

        fixed: dict[int, np.ndarray] = {}
        fixed_raw: dict[int, np.ndarray] = {}
        # the cache whose cells each index/mask input describes (llm_graph_input_attn_kv)
        cache_of = {id(t): inp.cache for inp in bg.attn_inputs
                    for t in (inp.k_idxs, inp.v_idxs, inp.kq_mask)}
        inputs: dict[str, list] = {}
        for leaf in bg.leafs:
            s = slot(leaf)
            if leaf.role == "weight":
                raw = self.weights[leaf.name]
            elif leaf.role == "kv":
                if leaf.name not in self.kv:
                    self.kv[leaf.name] = np.zeros(leaf.nbytes, dtype=np.uint8)
                raw = self.kv[leaf.name]
            else:
                raw = np.zeros(leaf.nbytes, dtype=np.uint8)
            fixed_raw[s] = raw
            fixed[s] = tensor_view(raw, leaf, 0)
        for leaf in bg.leafs:
            if leaf.role == "input":
                kind, cache = self._input_kind(leaf, cache_of)
                inputs.setdefault(kind, []).append((leaf, fixed[slot_of[id(leaf)]], cache))

        steps: list[Step] = []
        needs_raw: set[int] = set()
        for i, n in enumerate(bg.nodes):
            srcs = tuple(slot(s) for s in n.src)
            storage = n.storage
            st_slot = slot(storage) if storage is not n else slot(n)
            shape, strides, dtype = shape_strides(n)
            fn = None if n.op in ops.EMPTY \
                else compile_node(n, self.ctx)
            if storage is not n and storage.op != Op.NONE:
                needs_raw.add(st_slot)
            offset = n.view_offs if n.is_view else 0
            kind = COMPUTE if fn is not None else VIEW
            if storage is not n and st_slot in fixed_raw:
                # a view of weights, cache, inputs or a preallocated output: the same
                # array every run
                fixed[slot(n)] = tensor_view(fixed_raw[st_slot], n, offset)
                if fn is None:
                    kind = FIXED
            out = getattr(fn, "out", None)
            if out is not None and storage is n:
                # allocated once (exec_ops.KernelNode): rewritten by every run
                fixed[slot(n)] = out
                fixed_raw[slot(n)] = flat_bytes(out)
            call = None
            if fn is not None and hasattr(fn, "bind") and all(s in fixed for s in srcs) \
                    and (out is not None or slot(n) in fixed):
                call = fn.bind(*(fixed[s] for s in srcs))
                if call is not None:
                    kind = BOUND
            steps.append(Step(i, n, fn, srcs, slot(n), st_slot, offset, shape, strides,
                              np.dtype(dtype), kind, call))
        return Plan(bg, steps, len(slot_of), fixed, fixed_raw, inputs, needs_raw, slot_of)

    def _input_kind(self, leaf: Tensor, cache_of: dict[int, KVCache]
                    ) -> tuple[str, KVCache | None]:
        name = leaf.name
        name = leaf.params.get("input", name)   # an unnamed input says what it holds
        if name == "self_kq_mask":
            raise UnsupportedError(f"{self.model.header.path}: {self.model.arch}'s attention "
                                   "without a KV cache (self_kq_mask: an encoder's "
                                   "non-causal attention, pooling) is not executed")
        if name in ("inp_tokens", "inp_pos", "out_ids", "inp_embd", "attn_inp_k_rot",
                    "attn_inp_v_rot", "rs_s_copy", "inp_attn_scale"):
            return name, None
        if name in ("attn_inp_k_idxs", "attn_inp_v_idxs", "attn_inp_kq_mask") \
                and id(leaf) in cache_of:
            return name, cache_of[id(leaf)]
        raise UnsupportedError(f"graph input {name!r} ({gt.type_name(leaf.type)} {list(leaf.ne)}) "
                               "has no filler in the executor")

    # ---- inputs ------------------------------------------------------------------------
    def _fill_inputs(self, plan: Plan, tokens: np.ndarray, positions: np.ndarray,
                     out_ids: np.ndarray) -> None:
        bg = plan.graph
        T = len(tokens)
        slots: dict[str, np.ndarray] = {}
        for c in bg.caches:
            cells = self.cells.get(c.name)
            if cells is None:
                n_swa = self.model.n_swa if c.name == "swa" else 0
                cells = self.cells[c.name] = CellState(c.size, n_swa)
            idxs = cells.find_slot(T)
            cells.apply(idxs, positions)
            if cells.n_kv() != c.n_kv:
                raise AssertionError(f"cache {c.name}: cells give n_kv {cells.n_kv()}, "
                                     f"the graph {c.n_kv}")
            slots[c.name] = idxs
        for kind, entries in plan.inputs.items():
            for leaf, arr, cache in entries:
                flat = arr.reshape(-1)
                if kind == "inp_tokens":
                    flat[:] = tokens
                elif kind == "inp_pos":
                    flat[:] = pos_input(positions, flat.size)
                elif kind == "out_ids":
                    flat[:] = out_ids
                elif kind == "inp_embd":
                    pass
                elif kind == "attn_inp_k_idxs":
                    flat[:] = slots[cache.name]
                elif kind == "attn_inp_v_idxs":
                    idx = slots[cache.name]
                    if cache.v_trans:
                        n_embd_v = leaf.ne[0] // T      # n_embd_v_gqa_max
                        j = np.arange(n_embd_v, dtype=np.int64)
                        flat[:] = (j[None, :] * cache.size + idx[:, None]).reshape(-1)
                    else:
                        flat[:] = idx
                elif kind == "attn_inp_kq_mask":
                    m = self.cells[cache.name].mask(leaf.ne[0], positions)
                    arr[0, 0, :T, :] = m.astype(arr.dtype)
                elif kind == "rs_s_copy":
                    # llama_memory_recurrent_context::s_copy: the cell each used cell's
                    # state comes from (src0); one sequence in cell 0 reads cell 0
                    flat[:] = np.arange(flat.size, dtype=flat.dtype)
                elif kind in ("attn_inp_k_rot", "attn_inp_v_rot"):
                    arr[0, 0] = hadamard(leaf.ne[0])
                elif kind == "inp_attn_scale":
                    # the hparams the spec's attn_temp_input gives the input
                    p = leaf.params
                    flat[:] = attn_temp(positions, p["temp_scale"], p["temp_floor"],
                                        p["temp_offset"])

    # ---- running -----------------------------------------------------------------------
    def run_plan(self, plan: Plan, *, capture: Iterable[int] = (),
                 timer: Callable[[], int] = time.perf_counter_ns
                 ) -> tuple[list, NodeTiming, dict[int, np.ndarray]]:
        """Execute every node once (inputs already filled); values of ``capture`` indices
        are copied out. Returns (values by slot, timing, captured values)."""
        vals: list = [None] * plan.n_slots
        for s, v in plan.fixed.items():
            vals[s] = v
        raws: dict[int, np.ndarray] = dict(plan.fixed_raw)
        ns: list[int | None] = []
        append = ns.append
        captured = set(capture)
        cap: dict[int, np.ndarray] = {}
        needs_raw = plan.needs_raw
        new_view = np.ndarray
        t_start = timer()
        for st in plan.steps:
            kind = st.kind
            if kind == BOUND:
                call = st.call
                t0 = timer()
                call()
                append(timer() - t0)
            elif kind == VIEW:
                vals[st.slot] = new_view(st.shape, dtype=st.dtype, buffer=raws[st.storage],
                                         offset=st.offset, strides=st.strides)
                append(None)
            elif kind == FIXED:
                append(None)
            else:
                args = [vals[s] for s in st.srcs]
                t0 = timer()
                res = st.fn(*args)
                append(timer() - t0)
                if res is not None:          # None: it wrote into fixed memory (cache rows)
                    if res.shape != st.shape or res.dtype != st.dtype or not res.flags.c_contiguous:
                        res = tensor_view(flat_bytes(np.ascontiguousarray(res)), st.node, 0)
                    vals[st.slot] = res
                    if st.slot in needs_raw:
                        raws[st.slot] = flat_bytes(res)
            if captured and st.index in captured:
                cap[st.index] = np.array(vals[st.slot], copy=True)
        wall = timer() - t_start
        if not plan.resolved:        # every bound kernel has run (compiled) once
            for st in plan.steps:
                if st.call is not None:
                    st.call = resolve_entry(st.call)
            plan.resolved = True
        return vals, NodeTiming(ns, wall), cap

    def step(self, tokens: Iterable[int], *, n_outputs: int = 1, repeat: int = 1,
             capture: Iterable[str | int] = (), warmup: bool = False,
             on_run: Callable[[bool], None] | None = None) -> StepResult:
        """``llama_decode`` of one ubatch: ``tokens`` at positions ``past..``; logits of the
        last ``n_outputs`` tokens. ``repeat`` runs the graph that many times for timing
        (idempotent for the KV cache; a recurrent state is restored before each rerun); ``warmup`` adds one untimed run first; ``on_run(timed)`` is called
        after every run (progress bars)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise SettingsError("a step needs at least one token")
        # checked as Python ints: numpy would overflow on an id above int64 first
        if min(tokens) < 0 or max(tokens) >= self.model.n_vocab:
            raise SettingsError(f"token ids must be in [0, {self.model.n_vocab})")
        tokens = np.asarray(tokens, dtype=np.int32)
        T = len(tokens)
        plan = self.plan(T, n_outputs)
        positions = np.arange(self.past, self.past + T, dtype=np.int32)
        out_ids = np.arange(T - n_outputs, T, dtype=np.int32)
        self._fill_inputs(plan, tokens, positions, out_ids)
        idx = _capture_indices(plan.graph, capture)
        # a recurrent state is read and rewritten by every run (unlike KV rows, which a
        # rerun writes again identically): each timed or warm-up run starts from the
        # state before the step, so the last run leaves the state of one decode
        names = [t.name for st in plan.graph.states for t in (*st.r.values(), *st.s.values())]
        before = [(self.kv[n], self.kv[n].copy()) for n in names] \
            if warmup or repeat > 1 else []

        def restore():
            for buf, saved in before:
                np.copyto(buf, saved)
        warmup_ns = None
        if warmup:
            warmup_ns = self.run_plan(plan)[1].wall_ns
            if on_run:
                on_run(False)
        timings = []
        vals, cap = None, {}
        for r in range(max(1, repeat)):
            if r > 0 or warmup:
                restore()
            vals, timing, c = self.run_plan(plan, capture=idx if r == 0 else ())
            timings.append(timing)
            cap = cap or c
            if on_run:
                on_run(True)
        out = plan.steps[-1]
        logits = np.array(vals[out.slot], dtype=np.float32).reshape(-1, plan.graph.model.n_vocab) \
            if out.node.ne[0] == self.model.n_vocab else np.array(vals[out.slot]).reshape(-1)
        res = StepResult(T, self.past, logits, timings, cap, plan.graph, warmup_ns)
        self.past += T
        return res


def _capture_indices(bg: BuiltGraph, capture: Iterable[str | int]) -> list[int]:
    want = list(capture)
    names = {w for w in want if isinstance(w, str)}
    out = [w for w in want if isinstance(w, int)]
    out += [i for i, n in enumerate(bg.nodes) if n.name in names]
    return sorted(set(out))


def greedy(ex: Executor, prompt: list[int], n_steps: int) -> tuple[list[int], list[StepResult]]:
    """Prompt in one ubatch, then ``n_steps`` greedy single-token decodes (argmax)."""
    res = [ex.step(prompt)]
    out = []
    for _ in range(n_steps):
        tok = int(np.argmax(res[-1].logits[-1]))
        out.append(tok)
        res.append(ex.step([tok]))
    return out, res


__all__ = ["Executor", "CellState", "StepResult", "NodeTiming", "Plan", "greedy", "hadamard",
           "random_weights", "RandomWeights", "mapped_weights", "check_runnable", "NUMERICS"]
