"""What llama.cpp's ``--fit`` (``llama-fit-params``) chooses for given free device memory.

Mirrors ``common/fit.cpp`` of llama.cpp as vendored by llama-cpp-python 0.3.36
(``common_params_fit_impl``, ``common_fit_params``) and the line ``tools/fit-params/
fit-params.cpp`` prints. llama.cpp measures every candidate configuration by loading the
model with ``no_alloc`` (``common_get_device_memory_data_impl``: weights without mmap,
``llama_get_memory_breakdown``: model + context + compute bytes per device; host buffer
types are not counted against any device). Here a candidate is measured by a
:data:`Measure` callable; :func:`graphcost_measure` is graphcost's own placement and
memory plan (:func:`graphcost.memory.placement.plan_devices`, ``-lm none``), and a device
whose compute buffer is not modelled makes the fit :class:`Undecided` (never counted as 0).

The steps (names as in fit.cpp):

1. measure the given parameters (an unset context: the training context, times the number
   of KV streams with ``-np N``: it is measured again at that context); nothing changes
   when every device keeps its margin (``-fitt``, default 1024 MiB);
2. if the devices together miss their margins and the context is unset, interpolate
   linearly between the minimum context (``-fitc``, default 4096) and the training context,
   rounded down to a multiple of 256 per stream; with several devices the target keeps
   ``(nd + 1) * model_per_layer / (2, or 6 for MoE)`` spare; one device: done;
3. (only if ``-ngl``, ``-ts`` and ``-ot`` are unset) fill layers back to front, last device
   first, by false position (``LAYER_FRACTION_MOE``: a MoE model's expert tensors stay on
   the CPU), each device to the most layers whose memory stays within ``free - margin``;
4. for a MoE model whose dense weights fit, convert those dense-only layers to full layers
   front to back, then try one more layer whose up (then gate) or only attention part
   fits, overflowing to the next device (or the CPU).

Without devices (a CPU-only machine: llama.cpp's ``nd == 0``) the host's buffers (the
buffer types ``ggml_backend_buft_is_host`` says are host: ``CPU``, not ``CPU_REPACK``) are
measured against the host's *total* memory (the CPU device's ``ggml_backend_dev_memory``:
``sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE)``) with the first margin; only step 2
runs, and where reducing the context does not fit, the fit gives up ("was unable to fit
model into system memory by reducing context").

All sizes are bytes; arithmetic is C's (int64, truncating division, uint32 wrap) where
llama.cpp's is.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from graphcost.errors import GraphcostError
from graphcost.format.ggml_types import ggml_pad
from graphcost.graph.settings import INT32_MAX
from graphcost.memory.placement import DeviceArg, Override, PlacementFlags
from graphcost.units import MiB

#: common/common.h: fit_params_target default (1024 MiB per device)
DEFAULT_MARGIN = 1024 * MiB
#: common/common.h: fit_params_min_ctx default
DEFAULT_MIN_CTX = 4096
#: ``-c 0`` sets fit_params_min_ctx to UINT32_MAX (common/arg.cpp): no context reduction
UINT32_MAX = 2**32 - 1
#: src/llama.cpp: llama_max_devices()
MAX_DEVICES = 16
#: round a reduced context down to this many cells per stream ("round down context for CUDA")
CTX_ALIGN = 256

#: common_layer_fraction_t: which part of a partial layer overflows (the regex of the rest)
LAYER_FRACTION_ATTN = "ATTN"  # attention stays: ffn_(gate|up|gate_up|down).* overflow
LAYER_FRACTION_UP = "UP"      # attention + up stay
LAYER_FRACTION_GATE = "GATE"  # attention + up + gate stay
LAYER_FRACTION_MOE = "MOE"    # everything but the sparse MoE weights stays

#: fit.cpp get_overflow_pattern (``{il}``: the layer index)
OVERFLOW_PATTERNS = {
    LAYER_FRACTION_ATTN: r"blk\.{il}\.ffn_(gate|up|gate_up|down).*",
    LAYER_FRACTION_UP: r"blk\.{il}\.ffn_(gate|gate_up|down).*",
    LAYER_FRACTION_GATE: r"blk\.{il}\.ffn_down.*",
    LAYER_FRACTION_MOE: r"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps",
}
#: fit.cpp: pattern_moe_all (every expert tensor, for the "dense weights only" measurement)
PATTERN_MOE_ALL = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"


class Undecided(GraphcostError):
    """A measurement needs a figure graphcost does not model (e.g. a device's compute
    buffer): the fit cannot say what llama.cpp would choose."""


class FitFailure(Exception):
    """llama.cpp's fit gives up (``common_params_fit_exception``; llama-fit-params exits 1)."""


@dataclass(frozen=True)
class DeviceUse:
    """One device's projected use (llama_memory_breakdown_data): model, context (KV and
    recurrent state) and compute bytes."""

    model: int
    context: int
    compute: int

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute


@dataclass(frozen=True)
class Candidate:
    """What the fit varies: the context and the placement parameters (n_gpu_layers: -1 is
    llama.cpp's default, every layer)."""

    n_ctx: int  # 0: the model's training context
    n_gpu_layers: int
    tensor_split: tuple[float, ...]
    overrides: tuple[Override, ...]


#: measure(candidate) -> one DeviceUse per device, in llama.cpp's device order; without
#: devices, one DeviceUse: the host's (fit.cpp ``dmds.back()``)
Measure = Callable[[Candidate], list[DeviceUse]]
#: the row name of the host when there are no devices (common_memory_breakdown_print)
HOST = "Host"


@dataclass
class LayerSplit:
    """fit.cpp ``ngl_t``: layers on one device, how many of them partial, and which part of
    the first partial layer overflows."""

    n_layer: int = 0
    n_part: int = 0
    overflow_type: str = LAYER_FRACTION_MOE

    def n_full(self) -> int:
        return self.n_layer - self.n_part

    def copy(self) -> "LayerSplit":
        return LayerSplit(self.n_layer, self.n_part, self.overflow_type)


@dataclass(frozen=True)
class FitInputs:
    """What llama.cpp's fit reads besides the measurements."""

    devices: tuple[str, ...]  # names, llama.cpp's order (CUDA0, RPC1, ...); () CPU-only
    free: tuple[int, ...]  # bytes free per device (ggml_backend_dev_memory); CPU-only:
    # (the host's total memory,)
    margins: tuple[int, ...]  # bytes to keep free per device (-fitt); CPU-only: the first
    n_layer: int  # hp_ngl: llama_model_n_layer
    n_ctx_train: int  # hp_nct
    n_expert: int  # hp_nex
    n_ctx: int = 0  # -c (0: unset, the fit may reduce it)
    n_ctx_min: int = DEFAULT_MIN_CTX  # -fitc (UINT32_MAX after -c 0)
    n_gpu_layers: int = -1  # -ngl as given (-1: unset)
    tensor_split: tuple[float, ...] = ()  # -ts as given
    overrides: tuple[Override, ...] = ()  # -ot, -cmoe, -ncmoe as given
    split_mode: str = "layer"
    #: -np (cparams.n_seq_max); without -kvu (llama-fit-params has none) each sequence is
    #: a KV stream (fit.cpp: n_streams)
    n_seq: int = 1
    #: -kvu (cparams.kv_unified, llama-server's --fit): one stream whatever -np is
    kv_unified: bool = False


@dataclass
class FitResult:
    """The parameters llama.cpp's fit sets, or why it gave up; ``log`` follows its trace."""

    status: str  # "fit" (llama-fit-params prints the line) or "fail" (it exits 1)
    n_ctx: int
    n_gpu_layers: int
    tensor_split: tuple[float, ...]
    overrides: tuple[Override, ...]
    layers: list[LayerSplit] | None = None  # per device, when layers were distributed
    projected: list[int] | None = None  # bytes used per device by the chosen parameters
    free: tuple[int, ...] = ()
    margins: tuple[int, ...] = ()
    devices: tuple[str, ...] = ()
    reason: str = ""
    log: list[str] = field(default_factory=list)

    def args_line(self) -> str:
        """The line llama-fit-params prints (tools/fit-params/fit-params.cpp)."""
        out = f"-c {self.n_ctx} -ngl {self.n_gpu_layers}"
        ts = list(self.tensor_split[:MAX_DEVICES])
        while len(ts) > 1 and ts[-1] == 0.0:
            ts.pop()
        if len(ts) > 1:
            out += " -ts " + ",".join(str(int(x) & 0xFFFFFFFF) for x in ts)
        if self.overrides:
            out += ' -ot "' + ",".join(f"{o.pattern}={o.target}" for o in self.overrides) + '"'
        return out

    def as_dict(self) -> dict:
        return {
            "status": self.status, "reason": self.reason or None,
            "n_ctx": self.n_ctx, "n_gpu_layers": self.n_gpu_layers,
            "tensor_split": list(self.tensor_split),
            "overrides": [{"pattern": o.pattern, "target": o.target} for o in self.overrides],
            "devices": [
                {"device": d, "free_bytes": f, "margin_bytes": m,
                 "projected_bytes": None if self.projected is None else self.projected[i],
                 "layers": None if self.layers is None else self.layers[i].n_layer,
                 "overflowing_layers": None if self.layers is None else self.layers[i].n_part}
                for i, (d, f, m) in enumerate(zip(self.devices, self.free, self.margins))],
            "args": self.args_line() if self.status == "fit" else None,
        }


# ---- C arithmetic -----------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    """C integer division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _u32(x: int) -> int:
    return x & 0xFFFFFFFF


# ---- the search -----------------------------------------------------------------------------

def fit(inputs: FitInputs, measure: Measure) -> FitResult:
    """llama.cpp's ``common_fit_params`` for these inputs: the parameters it would set
    (status "fit") or why it gives up (status "fail"). Raises :class:`Undecided` when a
    measurement is not modelled."""
    log: list[str] = []
    state = {"n_ctx": inputs.n_ctx, "ngl": inputs.n_gpu_layers, "ts": inputs.tensor_split,
             "ot": inputs.overrides, "layers": None, "projected": None}
    try:
        _fit_impl(inputs, measure, state, log)
        status, reason = "fit", ""
    except FitFailure as e:
        status, reason = "fail", str(e)
        log.append(f"failed to fit params to free device memory: {e}")
    nd = len(inputs.devices)
    return FitResult(status, state["n_ctx"], state["ngl"], tuple(state["ts"]), tuple(state["ot"]),
                     state["layers"], state["projected"], inputs.free[:max(nd, 1)],
                     inputs.margins[:max(nd, 1)], inputs.devices or (HOST,), reason, log)


def _fit_impl(inp: FitInputs, measure: Measure, state: dict, log: list[str]) -> None:
    """common_params_fit_impl, step by step (common/fit.cpp); ``state`` holds the
    parameters as llama.cpp leaves them (it writes them even when it then gives up)."""
    if inp.split_mode == "tensor":
        raise FitFailure("llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort")
    nd = len(inp.devices)  # 0: the host alone, one entry in free, margins, measurements
    hp_ngl, hp_nct, hp_nex = inp.n_layer, inp.n_ctx_train, inp.n_expert
    n_streams = 1 if inp.kv_unified else max(1, inp.n_seq)
    n_ctx_auto = inp.n_ctx == 0
    margins = list(inp.margins[:max(nd, 1)])

    def cand(n_ctx: int, ngl: int, ts, ot) -> Candidate:
        return Candidate(n_ctx, ngl, tuple(ts), tuple(ot))

    # step 1: the given parameters
    dmds_full = measure(cand(state["n_ctx"], inp.n_gpu_layers, inp.tensor_split, inp.overrides))
    n_ctx_max = min(hp_nct * n_streams, UINT32_MAX)
    n_ctx_min_total = min(inp.n_ctx_min * n_streams, UINT32_MAX)
    if n_ctx_auto:
        state["n_ctx"] = n_ctx_max
        if n_streams > 1:
            log.append(f"context size unset and KV cache not unified -> using {n_ctx_max} "
                       f"for {n_streams} sequences")
            dmds_full = measure(cand(n_ctx_max, inp.n_gpu_layers, inp.tensor_split,
                                     inp.overrides))
    free = list(inp.free[:max(nd, 1)])
    used = [d.total for d in dmds_full]
    projected_free = [f - u for f, u in zip(free, used)]
    sum_free, sum_used = sum(free), sum(used)
    sum_projected_free = sum(projected_free)
    sum_model = sum(d.model for d in dmds_full)
    state["projected"] = used
    if nd == 0:
        log.append(f"projected to use {sum_used // MiB} MiB of host memory vs. "
                   f"{sum_free // MiB} MiB of total host memory")
    else:
        log.append(f"projected to use {sum_used // MiB} MiB of device memory vs. "
                   f"{sum_free // MiB} MiB of free device memory")
    if all(pf >= m for pf, m in zip(projected_free, margins)):
        log.append("targets for free memory can be met on all devices, no changes needed")
        return

    # step 2: reduce the context
    global_surplus = sum_projected_free - sum(margins)
    if global_surplus < 0:
        log.append(f"cannot meet free memory targets, need to use {-global_surplus // MiB} "
                   "MiB less in total")
        if n_ctx_auto:
            if n_ctx_max > n_ctx_min_total:
                sum_used_target = sum_free - sum(margins)
                if nd > 1:
                    n_div = min(_u32(inp.n_gpu_layers), hp_ngl)
                    if n_div == 0:
                        raise GraphcostError("fit: with -ngl 0 llama.cpp's fit divides by zero "
                                             "(model_per_layer in common_params_fit_impl)")
                    model_per_layer = _cdiv(sum_model, n_div)
                    sum_used_target -= (nd + 1) * model_per_layer // (2 if hp_nex == 0 else 6)
                state["n_ctx"] = n_ctx_min_total
                dmds_min = measure(cand(n_ctx_min_total, inp.n_gpu_layers, inp.tensor_split,
                                        inp.overrides))
                used_min = sum(d.total for d in dmds_min)
                if sum_used_target > used_min:
                    n_ctx = state["n_ctx"] + _cdiv((n_ctx_max - n_ctx_min_total)
                                                   * (sum_used_target - used_min),
                                                   sum_used - used_min)
                    n_ctx = _u32(n_ctx)
                    align = CTX_ALIGN * n_streams
                    state["n_ctx"] = max(n_ctx - n_ctx % align, n_ctx_min_total)
                    log.append(f"context size reduced from {n_ctx_max} to {state['n_ctx']}")
                    if nd <= 1:
                        log.append("entire model can be fit by reducing context")
                        return
                    log.append("entire model should be fit across devices by reducing context")
                else:
                    log.append(f"context size reduced from {n_ctx_max} to {state['n_ctx']}")
            elif inp.n_ctx_min == UINT32_MAX:
                log.append(f"user has requested full context size of {n_ctx_max} -> no change")
            else:
                log.append(f"default model context size is {n_ctx_max} which is <= the min. "
                           f"context size of {n_ctx_min_total} -> no change")
        else:
            log.append(f"context size set by user to {inp.n_ctx} -> no change")
    if nd == 0:
        raise FitFailure("was unable to fit model into system memory by reducing context, abort")

    if inp.n_gpu_layers != -1:
        raise FitFailure(f"n_gpu_layers already set by user to {inp.n_gpu_layers}, abort")
    if nd > 1:
        if any(x != 0.0 for x in inp.tensor_split[:nd]):
            raise FitFailure("model_params::tensor_split already set by user, abort")
        if inp.split_mode == "row":
            raise FitFailure("changing weight allocation for LLAMA_SPLIT_MODE_ROW not "
                             "implemented, abort")
    if inp.overrides:
        raise FitFailure("model_params::tensor_buft_overrides already set by user, abort")

    n_ctx = state["n_ctx"]

    def params_for(ngl_per_device: list[LayerSplit], overflow_bufts: list[str]):
        """set_ngl_tensor_split_tbo: n_gpu_layers, tensor_split and the overrides."""
        ngl = sum(n.n_layer for n in ngl_per_device)
        ts = tuple(float(n.n_layer) for n in ngl_per_device) if nd > 1 else inp.tensor_split
        il0 = hp_ngl + 1 - ngl
        ot: list[Override] = []
        for idx, n in enumerate(ngl_per_device):
            il0 += n.n_full()
            for il in range(il0, il0 + n.n_part):
                kind = n.overflow_type if il == il0 else LAYER_FRACTION_MOE
                ot.append(Override(OVERFLOW_PATTERNS[kind].format(il=il),
                                   overflow_bufts[idx] if il == il0 else "CPU"))
            il0 += n.n_part
        return ngl, ts, tuple(ot)

    def memory_for(ngl_per_device: list[LayerSplit], overflow_bufts: list[str]) -> list[int]:
        ngl, ts, ot = params_for(ngl_per_device, overflow_bufts)
        return [d.total for d in measure(cand(n_ctx, ngl, ts, ot))]

    def commit(ngl_per_device: list[LayerSplit], overflow_bufts: list[str], mem: list[int]):
        state["ngl"], state["ts"], state["ot"] = params_for(ngl_per_device, overflow_bufts)
        state["layers"] = [n.copy() for n in ngl_per_device]
        state["projected"] = list(mem)

    # step 3: dense layers back to front (a MoE model's experts in system memory)
    global_surplus_cpu_moe = 0
    if hp_nex > 0:
        moe = measure(cand(n_ctx, inp.n_gpu_layers, inp.tensor_split,
                           (Override(PATTERN_MOE_ALL, "CPU"),)))
        for i in range(nd):
            global_surplus_cpu_moe += free[i] - (moe[i].total + margins[i])
        log.append(f"with only dense weights in device memory there is a total "
                   f"{'surplus' if global_surplus_cpu_moe > 0 else 'deficit'} of "
                   f"{abs(global_surplus_cpu_moe) // MiB} MiB")

    targets = [free[i] - margins[i] for i in range(nd)]
    overflow_bufts = ["CPU"] * nd
    ngl_per_device = [LayerSplit() for _ in range(nd)]
    mem = memory_for(ngl_per_device, overflow_bufts)

    def copy(v: list[LayerSplit]) -> list[LayerSplit]:
        return [n.copy() for n in v]

    for id_ in range(nd - 1, -1, -1):
        n_unassigned = hp_ngl + 1 - sum(ngl_per_device[j].n_layer for j in range(id_ + 1, nd))
        high = copy(ngl_per_device)
        high[id_].n_layer = n_unassigned
        if hp_nex > 0:
            high[id_].n_part = high[id_].n_layer if id_ < nd - 1 else high[id_].n_layer - 1
        if high[id_].n_layer > 0:
            mem_high = memory_for(high, overflow_bufts)
            if mem_high[id_] > targets[id_]:
                delta = high[id_].n_layer - ngl_per_device[id_].n_layer
                while delta > 1:
                    step = _u32(_cdiv(delta * (targets[id_] - mem[id_]), mem_high[id_] - mem[id_]))
                    step = min(max(step, 1), delta - 1)
                    test = copy(ngl_per_device)
                    test[id_].n_layer += step
                    if hp_nex:
                        # the first layer is the output layer which must always be full
                        test[id_].n_part += (step - 1 if id_ == nd - 1 and test[id_].n_part == 0
                                             else step)
                    mem_test = memory_for(test, overflow_bufts)
                    if mem_test[id_] <= targets[id_]:
                        ngl_per_device, mem = test, mem_test
                    else:
                        high, mem_high = test, mem_test
                    delta = high[id_].n_layer - ngl_per_device[id_].n_layer
            else:
                ngl_per_device, mem = high, mem_high
        log.append(f"  - {inp.devices[id_]}: {ngl_per_device[id_].n_layer} layers, "
                   f"{mem[id_] // MiB} MiB used, {(free[id_] - mem[id_]) // MiB} MiB free")
    if hp_nex == 0 or global_surplus_cpu_moe <= 0:
        commit(ngl_per_device, overflow_bufts, mem)
        return

    # step 4: a MoE model whose dense weights fit: dense-only layers in the back become
    # full layers in the front, device by device, with overflow to the next device
    id_dense_start = nd
    for id_ in range(nd - 1, -1, -1):
        if ngl_per_device[id_].n_layer > 0:
            id_dense_start = id_
            continue
        break
    id_ = 0
    while id_ <= id_dense_start and id_dense_start < nd:
        high = copy(ngl_per_device)
        for jd in range(id_dense_start, nd):
            move = high[jd].n_layer if jd < nd - 1 else high[jd].n_layer - 1
            high[id_].n_layer += move
            high[jd].n_layer -= move
            high[jd].n_part = 0
        id_dense_start_high = nd - 1
        mem_high = memory_for(high, overflow_bufts)
        if mem_high[id_] > targets[id_]:
            delta = high[id_].n_full() - ngl_per_device[id_].n_full()
            while delta > 1:
                step = _u32(_cdiv(delta * (targets[id_] - mem[id_]), mem_high[id_] - mem[id_]))
                step = min(max(step, 1), delta - 1)
                test = copy(ngl_per_device)
                id_dense_start_test = id_dense_start
                n_converted = 0
                while id_dense_start_test < nd:
                    n_convert = min(step - n_converted, test[id_dense_start_test].n_part)
                    test[id_dense_start_test].n_layer -= n_convert
                    test[id_dense_start_test].n_part -= n_convert
                    test[id_].n_layer += n_convert
                    n_converted += n_convert
                    if test[id_dense_start_test].n_part > 0:
                        break
                    id_dense_start_test += 1
                mem_test = memory_for(test, overflow_bufts)
                if mem_test[id_] <= targets[id_]:
                    ngl_per_device, mem, id_dense_start = test, mem_test, id_dense_start_test
                else:
                    high, mem_high, id_dense_start_high = test, mem_test, id_dense_start_test
                delta = high[id_].n_full() - ngl_per_device[id_].n_full()
        else:
            ngl_per_device, mem, id_dense_start = high, mem_high, id_dense_start_high

        # try to fit at least part of one more layer
        if ngl_per_device[id_dense_start].n_layer > (0 if id_ < nd - 1 else 1):
            test = copy(ngl_per_device)
            id_dense_start_test = id_dense_start
            test[id_dense_start_test].n_layer -= 1
            test[id_dense_start_test].n_part -= 1
            test[id_].n_layer += 1
            test[id_].n_part += 1
            if test[id_dense_start_test].n_part == 0:
                id_dense_start_test += 1
            test[id_].overflow_type = LAYER_FRACTION_UP
            bufts_test = list(overflow_bufts)
            if id_ < nd - 1:
                bufts_test[id_] = inp.devices[id_ + 1]

            def fits(m: list[int]) -> bool:
                return m[id_] < targets[id_] and (id_ + 1 == nd or m[id_ + 1] < targets[id_ + 1])

            mem_test = memory_for(test, bufts_test)
            if fits(mem_test):
                ngl_per_device, overflow_bufts, mem = copy(test), bufts_test, mem_test
                id_dense_start = id_dense_start_test
                test[id_].overflow_type = LAYER_FRACTION_GATE
                mem_test = memory_for(test, bufts_test)
                if fits(mem_test):
                    ngl_per_device, overflow_bufts, mem = copy(test), bufts_test, mem_test
                    id_dense_start = id_dense_start_test
            else:
                test[id_].overflow_type = LAYER_FRACTION_ATTN
                mem_test = memory_for(test, bufts_test)
                if fits(mem_test):
                    ngl_per_device, overflow_bufts, mem = copy(test), bufts_test, mem_test
                    id_dense_start = id_dense_start_test
        log.append(f"  - {inp.devices[id_]}: {ngl_per_device[id_].n_layer} layers "
                   f"({ngl_per_device[id_].n_part} overflowing), {mem[id_] // MiB} MiB used, "
                   f"{(free[id_] - mem[id_]) // MiB} MiB free")
        id_ += 1
    commit(ngl_per_device, overflow_bufts, mem)


# ---- graphcost's measurement ----------------------------------------------------------------

def graphcost_measure(model, settings, args: list[DeviceArg], flags: PlacementFlags,
                      compute: Callable[[Candidate], list[int]] | None = None) -> Measure:
    """Measure a candidate with graphcost's own plan, as llama.cpp measures it: weights
    without mmap (``common_get_device_memory_data_impl`` sets ``LLAMA_LOAD_MODE_NONE``),
    per device model + context (KV, recurrent state) + compute bytes; rows of host buffer
    types (CPU, CPU_REPACK, CUDA_Host) count against no device. Without devices, one
    measurement: the host's, the rows whose buffer type is host (``CPU``; ``CPU_REPACK`` is
    not: ggml-cpu/repack.cpp leaves ``is_host`` unset). A figure that is not modelled
    raises :class:`Undecided`. ``compute`` (per device, llama.cpp's order; without devices
    the host's alone) replaces graphcost's compute buffers: the proof feeds llama.cpp's own
    to check the search alone.

    ``settings.n_seq_max`` > 1 (``-np N``): without ``-kvu`` N KV streams of
    ``GGML_PAD(n_ctx / N, 256)`` cells, a recurrent state cell per sequence, and reserve
    graphs of N sequences (graphcost.graph.settings.resolve, graphcost.memory.plan)."""
    from graphcost.memory.placement import plan_devices
    cache: dict[Candidate, list[DeviceUse]] = {}

    def measure(c: Candidate) -> list[DeviceUse]:
        if c in cache:
            return cache[c]
        what = f"-c {c.n_ctx or model.n_ctx_train} -ngl {c.n_gpu_layers}"
        f = replace(flags, n_gpu_layers=c.n_gpu_layers, tensor_split=c.tensor_split,
                    overrides=c.overrides, load_mode="none")
        dp = plan_devices(model, replace(settings, ctx_size=c.n_ctx), args, f, no_alloc=True)
        rows = {r.device: r for r in dp.rows}
        given = compute(c) if compute is not None else None
        names = [d.name for d in dp.placement.devices] or ["CPU"]
        out = []
        for i, name in enumerate(names):
            r = rows[name]
            if given is not None:
                r = replace(r, compute_bytes=given[i])
            for part, v in (("model", r.model_bytes), ("KV", r.kv_bytes),
                            ("compute", r.compute_bytes)):
                if v is None:
                    raise Undecided(f"cannot decide: {name}'s {part} buffer is not modelled "
                                    f"({what}); llama.cpp's fit counts it")
            out.append(DeviceUse(r.model_bytes, r.kv_bytes + r.recurrent_state_bytes,
                                 r.compute_bytes))
        cache[c] = out
        return out
    return measure


def fit_inputs(model, args: list[DeviceArg], flags: PlacementFlags, *, n_ctx: int,
               margins: Sequence[int], n_ctx_min: int, host_total: int | None = None,
               n_seq: int = 1, kv_unified: bool = False) -> FitInputs:
    """The fit's inputs for these devices and flags (devices in llama.cpp's order).
    Without devices (none given, or ``-dev none``): the host's total memory ``host_total``
    (bytes; default: this machine's, as llama.cpp's CPU device reports it) is the budget."""
    from graphcost.memory.placement import LOAD_MODES, resolve_devices
    if flags.load_mode not in LOAD_MODES:  # checked here: the measurements use "none"
        raise GraphcostError(f"--load-mode {flags.load_mode!r}: use one of {', '.join(LOAD_MODES)}")
    if flags.split_mode == "tensor":
        from graphcost.memory.tensor_split import FIT_REFUSAL
        raise GraphcostError(FIT_REFUSAL)
    devices = resolve_devices(args, flags)
    if devices and host_total is not None:
        raise GraphcostError("--host-memory goes without devices (llama.cpp fits the host's "
                             "memory only when no device is used)")
    if not devices:
        if host_total is None:
            from graphcost.memory.backends import host_total_memory
            host_total = host_total_memory()
        if host_total is None:
            raise GraphcostError("fit: without devices llama.cpp fits the host's buffers into "
                                 "its total memory: give --host-memory MEM")
        return FitInputs((), (host_total,), tuple(margins[:1]), model.n_layer,
                         model.n_ctx_train, model.n_expert, n_ctx, n_ctx_min,
                         flags.n_gpu_layers, flags.tensor_split, flags.overrides,
                         flags.split_mode, n_seq, kv_unified)
    missing = [d.name for d in devices if d.free_bytes is None]
    if missing:
        raise GraphcostError(f"fit: give the free memory of {', '.join(missing)} "
                             "(--device KIND:MEM, e.g. cuda:24GiB)")
    return FitInputs(tuple(d.name for d in devices), tuple(d.free_bytes for d in devices),
                     tuple(margins[:len(devices)]), model.n_layer, model.n_ctx_train,
                     model.n_expert, n_ctx, n_ctx_min, flags.n_gpu_layers, flags.tensor_split,
                     flags.overrides, flags.split_mode, n_seq, kv_unified)


def parse_fit_target(text: str | None) -> list[int]:
    """-fitt MiB0,MiB1,... (common/arg.cpp): split on ',' and '/'; one value is broadcast;
    otherwise the first entries are set and the rest keep 1024 MiB; bytes per device."""
    margins = [DEFAULT_MARGIN] * MAX_DEVICES
    if text is None:
        return margins
    import re
    parts = re.split(r"[,/]+", text)
    if len(parts) >= MAX_DEVICES:
        raise GraphcostError(f"-fitt {text!r}: got {len(parts)} input configs, but llama.cpp "
                             f"has at most {MAX_DEVICES - 1} here")
    vals = []
    for p in parts:
        if not re.fullmatch(r"\s*\+?[0-9]+", p):
            raise GraphcostError(f"-fitt {text!r}: use MiB per device, e.g. 1024 or 2048,512")
        vals.append(int(p) * MiB)
    if len(vals) == 1:
        return [vals[0]] * MAX_DEVICES
    margins[:len(vals)] = vals
    return margins


# ---- the largest context that fits ------------------------------------------------------------

@dataclass(frozen=True)
class MaxContext:
    """``memory --max-ctx``: the largest context (cells, a multiple of llama.cpp's n_ctx
    padding) whose every device row fits the free memory given for it; 0 if none does."""

    n_ctx: int
    limit: int  # the largest context searched (the training context, padded; <= INT32_MAX)
    tried: tuple[tuple[int, bool], ...]  # (n_ctx, fits) in the order measured

    def as_dict(self) -> dict:
        return {"max_ctx": self.n_ctx, "searched_up_to": self.limit,
                "tried": [{"n_ctx": n, "fits": f} for n, f in self.tried]}


def largest_context(n_ctx_train: int, fits: Callable[[int], bool], pad_to: int = CTX_ALIGN) -> MaxContext:
    """Binary search over contexts ``k * pad_to`` (llama_context pads n_ctx to 256 cells, so
    every ``-c`` in ``(256 (k-1), 256 k]`` allocates as ``256 k``) up to the training context
    padded the same way, and no further than the largest ``-c`` llama.cpp accepts
    (INT32_MAX: common/arg.cpp reads it with std::stoi; a 10M-token training context times
    ``-np 256`` is above it). Exact when memory does not shrink as the context grows (the
    KV cache is linear in it; the compute buffers grow with n_kv)."""
    hi = max(1, min(ggml_pad(n_ctx_train, pad_to), INT32_MAX) // pad_to)
    limit = hi * pad_to
    tried: list[tuple[int, bool]] = []

    def ok(k: int) -> bool:
        r = fits(k * pad_to)
        tried.append((k * pad_to, r))
        return r

    if ok(hi):
        return MaxContext(limit, limit, tuple(tried))
    lo = 0  # invariant: lo fits (0: nothing known to fit), hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return MaxContext(lo * pad_to, limit, tuple(tried))


def largest_device_context(model, settings, args: list[DeviceArg],
                           flags: PlacementFlags) -> MaxContext:
    """``memory --max-ctx``: :func:`largest_context` over :func:`device_fits`. With ``-np N``
    and no ``-kvu`` the context holds N streams: it is searched up to N x the training
    context in steps of 256 N cells (each stream a multiple of 256, as fit.cpp rounds)."""
    streams = 1 if settings.kv_unified else max(1, settings.n_seq_max)
    return largest_context(model.n_ctx_train * streams, device_fits(model, settings, args, flags),
                           pad_to=CTX_ALIGN * streams)


def device_fits(model, settings, args: list[DeviceArg], flags: PlacementFlags) -> Callable[[int], bool]:
    """fits(n_ctx): every device given with a free memory holds its model, KV, recurrent,
    compute and output bytes at this context (flags as given: mmap, -ngl, -ot, ...).
    A figure that is not modelled raises :class:`Undecided`."""
    from graphcost.memory.placement import plan_devices, resolve_devices
    budgets = {d.name: d.free_bytes for d in resolve_devices(args, flags) if d.free_bytes is not None}
    if not budgets:
        raise GraphcostError("--max-ctx: give at least one device with its free memory "
                             "(--device KIND:MEM, e.g. cuda:24GiB)")

    def fits(n_ctx: int) -> bool:
        dp = plan_devices(model, replace(settings, ctx_size=n_ctx), args, flags)
        for r in dp.rows:
            if r.device not in budgets:
                continue
            parts = {"model": r.model_bytes, "KV": r.kv_bytes, "compute": r.compute_bytes}
            for what, v in parts.items():
                if v is None:
                    raise Undecided(f"cannot decide: {r.device}'s {what} buffer is not "
                                    f"modelled (-c {n_ctx}); it grows with the context")
            total = (r.model_bytes + r.kv_bytes + r.recurrent_state_bytes + r.compute_bytes
                     + r.output_bytes)
            if total > budgets[r.device]:
                return False
        return True
    return fits
