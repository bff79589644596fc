"""Run graphcost's own graph node by node on the Numba kernels, with a KV cache kept
across steps: the executor behind ``graphcost profile`` and the numerics tests.

What it runs is exactly :func:`graphcost.graph.build.build_graph`'s node list (the nodes the
analyzer costs); each op is compiled once per graph shape by :mod:`graphcost.execute.exec_ops`.
The parts, one module each:

* :mod:`graphcost.execute.weights`: the weights, memory-mapped from the GGUF (no copy) or,
  for a header-only file, random bytes of the right types;
* :mod:`graphcost.execute.kv_cells`: the cells of each KV cache (``llama_kv_cells``);
* :mod:`graphcost.execute.plan`: a graph compiled for execution, and one run of it;
* :mod:`graphcost.execute.inputs`: the graph inputs filled for a ubatch (``set_input``).

The executor keeps what lives across steps: the cache buffers (``cache_k_l<il>``,
``cache_v_l<il>``, zeroed at first use; ``SET_ROWS`` writes the new rows at the cells the
inputs name), the recurrent states (``cache_r_l<il>``, ``cache_s_l<il>`` of
llama_memory_recurrent: conv and SSM/delta-net state, one cell for one sequence; the graph
gathers them through ``rs_s_copy`` and copies the new state back; timing reruns of a step
restore them first, :meth:`Executor.step`), the cells, and one plan per ubatch shape.
Kernels run on the executor's thread count only inside :meth:`Executor.step`
(:func:`graphcost.execute.threads.kernel_threads`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from graphcost.errors import GGUFError, SettingsError, UnsupportedError
from graphcost.execute.exec_ops import Ctx, weight_types
from graphcost.execute.inputs import fill_inputs, place_ubatch
from graphcost.execute.kv_cells import CellState
from graphcost.execute.plan import NodeTiming, Plan, compile_plan, run_plan
from graphcost.execute.threads import check_threads, kernel_threads
from graphcost.execute.weights import (RandomWeights, available_memory, mapped_weights,
                                       random_weights, refuse_unsupported_weights)
from graphcost.format.model import YARN_UNREAD_KEYS, ModelInfo
from graphcost.graph.build import BuiltGraph, build_graph, load_model, resolve_for
from graphcost.graph.settings import Resolved, RunSettings

#: numerics modes (see graphcost.execute.exec_ops)
NUMERICS = ("ggml", "fast")


def check_runnable(model: ModelInfo, settings: RunSettings | Resolved | None = None) -> None:
    """Refuse, before any kernel is loaded, what the executor cannot run: a partial file
    (header whole, tensor data cut short: random data for the missing part would be
    neither the model nor a clean header-only run; costs and memory need only the header,
    so analyze, memory and check accept it), and settings whose KV cache does not fit in
    the available memory (``-c 2**30``). ``settings`` may be already resolved for ``model``."""
    if model.header.partial is not None:
        raise GGUFError(model.header.path, None,
                        f"tensor data is cut short ({model.header.partial}): running the "
                        "graph needs the whole file; analyze, memory and check need only "
                        "the header")
    if settings is not None:
        bg = build_graph(model, settings)  # resolves the settings: refuses what llama.cpp does
        kv = sum(c.bytes() for c in bg.caches)
        if kv > available_memory():
            ctx = bg.run.settings.ctx_size
            raise SettingsError(f"--ctx-size {ctx}: the KV cache needs "
                                f"{kv / 2**30:.1f} GiB, more than the "
                                f"{available_memory() / 2**30:.1f} GiB of memory available")


@dataclass
class StepResult:
    """What one ``llama_decode`` of a ubatch produced."""

    n_tokens: int
    past: int
    logits: np.ndarray                       # [n_outputs, n_vocab] float32
    timings: list[NodeTiming]                # one per timed run (node times if time_nodes)
    captured: dict[int, np.ndarray] = field(default_factory=dict)   # node index -> value copy
    graph: BuiltGraph | None = None
    warmup_ns: int | None = None             # wall time of the untimed first run, if any


class Executor:
    """Runs a model's llama.cpp graph step by step on the kernels, keeping the KV cache.

    ``settings`` fixes the context (``ctx_size``, ``ubatch_size``, flash attention, cache
    types, ``llama_cpp`` flavour); ``tokens``/``past``/``outputs`` are per step.
    ``threads``: the kernels' thread count during :meth:`step` (default: Numba's now)."""

    def __init__(self, model: ModelInfo | str | os.PathLike,
                 settings: RunSettings | Resolved = RunSettings(),
                 *, numerics: str = "ggml", seed: int = 0, threads: int | None = None):
        from graphcost.execute.kernels_loader import load_kernels

        if numerics not in NUMERICS:
            raise SettingsError(f"numerics {numerics!r}: use one of {', '.join(NUMERICS)}")
        self.model = model if isinstance(model, ModelInfo) else load_model(model)
        #: the context, resolved once (here, or by the caller); each step is a ubatch of
        #: it (Resolved.step)
        self.run = (settings if isinstance(settings, Resolved)
                    else resolve_for(self.model, settings))
        if not self.run.flavour.executable:
            raise UnsupportedError(f"the executor runs the head graph, not --llama-cpp "
                                   f"{self.run.flavour.name}")
        unread = [k.format(arch=self.model.arch) for k in YARN_UNREAD_KEYS
                  if k.format(arch=self.model.arch) in self.model.header.metadata]
        if self.model.rope_scaling_type == "yarn" and unread:
            raise UnsupportedError(f"{self.model.header.path}: YaRN with {unread[0]} is not "
                                   "executed (the rope's YaRN factors assume its default)")
        self.numerics = numerics
        self.threads = check_threads(threads)
        self.K = load_kernels()
        refuse_unsupported_weights(self.model, weight_types(self.K))
        self.ctx = Ctx(self.K, numerics)
        check_runnable(self.model, self.run)
        self.weights = (mapped_weights(self.model) if self.model.header.has_data
                        else random_weights(self.model, seed))
        self.kv: dict[str, np.ndarray] = {}          # cache tensor name -> bytes
        self.cells: dict[str, CellState] = {}        # cache name -> cells
        self.past = 0
        self._plans: dict[tuple, Plan] = {}

    @property
    def notes(self) -> list[str]:
        """What a reader of the timings should know (random weights, and how drawn)."""
        return [self.weights.note] if isinstance(self.weights, RandomWeights) else []

    def reset(self) -> None:
        """Forget the sequence: empty cells, zeroed cache (llama_memory_clear)."""
        for buf in self.kv.values():
            buf[:] = 0
        self.cells.clear()
        self.past = 0

    def checkpoint(self) -> Callable[[], None]:
        """A function that puts the sequence back where it is now (``past``, the cells,
        the recurrent states; a cache buffer made since is zeroed again), so that the
        next step can be run again as it was (``profile`` runs each replayed step twice,
        untimed and node-timed). The KV rows a step wrote stay: the rerun writes the same
        rows at the same cells (:meth:`step`'s reruns rely on the same)."""
        past = self.past
        cells = {k: (c.pos.copy(), c.head) for k, c in self.cells.items()}
        states = [(self.kv[n], self.kv[n].copy())
                  for n in {n for p in self._plans.values() for n in _state_names(p.graph)}]
        had = set(self.kv)

        def back() -> None:
            self.past = past
            for k in list(self.cells):
                if k not in cells:
                    del self.cells[k]
            for k, (pos, head) in cells.items():
                self.cells[k].restore(pos, head)
            for buf, saved in states:
                np.copyto(buf, saved)
            for n in set(self.kv) - had:
                self.kv[n][:] = 0
        return back

    def plan(self, n_tokens: int, n_outputs: int = 1) -> Plan:
        """The compiled graph for a ubatch of ``n_tokens`` at the current ``past``; graphs
        differ only by their shape (tokens, outputs, attended cells), so plans are cached."""
        u = self.run.ubatch(n_tokens, self.past, n_outputs)       # checked, as step()
        key = (n_tokens, u["n_outputs"], u["n_kv"], u["n_kv_swa"])
        plan = self._plans.get(key)
        if plan is None:
            run = self.run.step(n_tokens, self.past, n_outputs)
            plan = self._plans[key] = compile_plan(build_graph(self.model, run), self.ctx,
                                                   self.weights, self.kv)
        return plan

    def step(self, tokens: Iterable[int], *, n_outputs: int = 1, repeat: int = 1,
             capture: Iterable[str | int] = (), warmup: bool = False, time_nodes: bool = False,
             on_run: Callable[[bool], None] | None = None) -> StepResult:
        """``llama_decode`` of one ubatch: ``tokens`` at positions ``past..``; logits of the
        last ``n_outputs`` tokens. ``repeat`` runs the graph that many times for timing
        (idempotent for the KV cache; a recurrent state is restored before each rerun);
        ``warmup`` adds one untimed run first; ``time_nodes`` reads the clock around every
        kernel call of the timed runs (:class:`~graphcost.execute.plan.NodeTiming`; without
        it a run reads the clock twice, for its wall time); ``on_run(timed)`` is called after
        every run (progress bars). The kernels run on :attr:`threads` threads for this
        call only."""
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
        fill_inputs(plan.inputs, place_ubatch(plan.graph, self.cells, tokens, positions, out_ids))
        idx = _capture_indices(plan.graph, capture)
        # a recurrent state is read and rewritten by every run (unlike KV rows, which a
        # rerun writes again identically): each timed or warm-up run starts from the
        # state before the step, so the last run leaves the state of one decode
        before = [(self.kv[n], self.kv[n].copy()) for n in _state_names(plan.graph)] \
            if warmup or repeat > 1 else []

        def restore():
            for buf, saved in before:
                np.copyto(buf, saved)
        warmup_ns = None
        timings = []
        vals, cap = None, {}
        with kernel_threads(self.threads):
            if warmup:
                warmup_ns = run_plan(plan, timed=False)[1].wall_ns
                if on_run:
                    on_run(False)
            for r in range(max(1, repeat)):
                if r > 0 or warmup:
                    restore()
                vals, timing, c = run_plan(plan, capture=idx if r == 0 else (),
                                           timed=time_nodes)
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


def _state_names(bg: BuiltGraph) -> list[str]:
    """The cache buffers of ``bg``'s recurrent states (``cache_r_l<il>``, ``cache_s_l<il>``)."""
    return [t.name for st in bg.states for t in (*st.r.values(), *st.s.values())]


def _capture_indices(bg: BuiltGraph, capture: Iterable[str | int]) -> list[int]:
    want = list(capture)
    if not want:        # every step asks: skip the walk over the graph's nodes
        return []
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


__all__ = ["Executor", "StepResult", "greedy", "check_runnable", "NUMERICS"]
