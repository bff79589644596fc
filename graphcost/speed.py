"""``graphcost speed``: what llama-bench would print for a model on a hardware profile.

llama-bench (tools/llama-bench/llama-bench.cpp) runs, for every combination of its list
flags, a ``pp`` test (``-p`` prompt tokens) and a ``tg`` test (``-n`` generated tokens),
each after ``-d`` tokens of context, with ``n_ctx = p + n + d``:

* ``test_prompt``: ``llama_decode`` of up to ``-b`` tokens at a time, which llama.cpp splits
  into ubatches of ``-ub`` tokens; only the batch's last token has an output
  (``common_batch_get_one``), so every other ubatch computes no logits;
* ``test_gen``: ``-n`` decodes of one token each, at positions ``d, d+1, ...``;
* the reported rate is tokens / seconds of the timed part (the depth is filled before).

Each ubatch is one graph; graphcost builds it (same nodes as llama.cpp), counts what the
CPU backend does with it (:mod:`graphcost.cost.speed_model`) and prices the counts with
the profile's coefficients. Graphs with the same shape are built once, and a test's
counts are summed in closed form over its runs of ubatches (:class:`Predictor`): a few
graphs per ubatch shape are built, and the work does not grow with ``-p``, ``-n``, ``-d``,
``-b`` or ``-ub``.
"""
from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

from graphcost.cost.speed_model import (N_KV_SWITCHES, SpeedModel, counts, cpu_placement,
                                        fa_expand, fa_pairs, fa_pairs_sum, fa_window,
                                        from_profile)
from graphcost.errors import GraphcostError
from graphcost.graph.build import build_graph, resolve_for
from graphcost.graph.settings import INT32_MAX, Rows, RunSettings
from graphcost.cost.analysis import analyze_graph

#: llama-bench's defaults (cmd_params_defaults)
DEFAULTS = {"n_prompt": [512], "n_gen": [128], "n_depth": [0], "n_batch": [2048],
            "n_ubatch": [512], "flash_attn": ["auto"], "type_k": ["f16"], "type_v": ["f16"],
            "reps": 5}
FA_VALUES = {"0": "off", "1": "on", "off": "off", "on": "on", "auto": "auto"}


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test instance (a row of its output)."""

    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    flash_attn: str            # on | off | auto
    type_k: str
    type_v: str
    threads: int

    @property
    def name(self) -> str:
        """llama-bench's ``test`` column: ``pp512``, ``tg128 @ d4096``."""
        s = f"pp{self.n_prompt}" if self.n_gen == 0 else f"tg{self.n_gen}"
        return s + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def n_ctx(self) -> int:
        return self.n_prompt + self.n_gen + self.n_depth


def instances(p: list[int], n: list[int], d: list[int], b: list[int], ub: list[int],
              fa: list[str], ctk: list[str], ctv: list[str], t: list[int]) -> list[BenchTest]:
    """llama-bench's ``get_cmd_params_instances`` order: n_batch, n_ubatch, type_k, type_v,
    flash_attn, threads, depth; then the pp tests, then the tg tests (0 skips one)."""
    out = []
    for nb, nub, tk, tv, f, nt, nd in itertools.product(b, ub, ctk, ctv, fa, t, d):
        out += [BenchTest(x, 0, nd, nb, nub, f, tk, tv, nt) for x in p if x]
        out += [BenchTest(0, x, nd, nb, nub, f, tk, tv, nt) for x in n if x]
    for test in out:
        # llama-bench: ``cparams.n_ctx = n_prompt + n_gen + n_depth``, int arithmetic
        if test.n_ctx > INT32_MAX:
            raise GraphcostError(f"-p {test.n_prompt} -n {test.n_gen} -d {test.n_depth}: the "
                                 f"context p + n + d = {test.n_ctx} is above {INT32_MAX} "
                                 "(llama-bench's n_ctx is a 32-bit int)")
    return out


def steps(t: BenchTest) -> list[tuple[int, int, bool]]:
    """The ubatches of the timed part of ``t``: (tokens, past, has output)."""
    out = []
    if t.n_prompt:
        done = 0
        while done < t.n_prompt:                         # test_prompt: batches of -b
            nb = min(t.n_batch, t.n_prompt - done)
            ub = min(t.n_ubatch, t.n_batch)
            for s in range(0, nb, ub):                   # llama_decode: ubatches of -ub
                k = min(ub, nb - s)
                out.append((k, t.n_depth + done + s, s + k == nb))
            done += nb
    for i in range(t.n_gen):                             # test_gen: one token at a time
        out.append((1, t.n_depth + i, True))
    return out


@dataclass(frozen=True)
class Run:
    """Ubatches of a test that differ only in position: all ``tokens`` tokens, ``output``
    (each has the output row) or not. Ubatch ``m < cells.length`` (``j, k = m % cells.row,
    m // cells.row``) is number ``index + j * index_step + k * row_index_step`` of the test's
    list (:func:`steps`) and leaves ``cells.at(m)`` filled cells: one arithmetic run
    (``cells.rows == 1``) or rows of them (a prompt's full batches)."""

    index: int
    index_step: int
    row_index_step: int
    tokens: int
    output: bool
    cells: Rows

    def position(self, m: int) -> int:
        k, j = divmod(m, self.cells.row)
        return self.index + j * self.index_step + k * self.row_index_step

    def past(self, m: int) -> int:
        return self.cells.at(m) - self.tokens


def step_runs(t: BenchTest) -> list[Run]:
    """:func:`steps` as at most five :class:`Run`, whatever ``-p``, ``-n``, ``-d``, ``-b``
    and ``-ub``: every full batch of ``-b`` tokens has the same ``per`` ubatches (``per - 1``
    of ``-ub`` tokens without output, then the last, with the output), so the full batches
    are the rows (a row per batch) of their ubatches without output, plus a run of their
    last ubatches; the last, shorter batch is a run and its last ubatch; the generation is a
    run. Along each the filled cells and the index only grow."""
    out = []
    idx = 0
    if t.n_prompt:
        ub = min(t.n_ubatch, t.n_batch)
        full, rest = divmod(t.n_prompt, t.n_batch)
        per = -(-t.n_batch // ub)                        # ubatches of a full batch
        last = t.n_batch - (per - 1) * ub                # tokens of its last ubatch
        if full and per > 1:                             # row k: batch k, past d + k b
            out.append(Run(0, 1, per, ub, False,
                           Rows(t.n_depth + ub, ub, per - 1, t.n_batch, full)))
        if full:
            out.append(Run(per - 1, per, 0, last, True,
                           Rows(t.n_depth + (per - 1) * ub + last, t.n_batch, full)))
        idx = full * per
        if rest:
            r_per = -(-rest // ub)
            past = t.n_depth + full * t.n_batch
            if r_per > 1:
                out.append(Run(idx, 1, 0, ub, False, Rows(past + ub, ub, r_per - 1)))
            out.append(Run(idx + r_per - 1, 0, 0, rest - (r_per - 1) * ub, True,
                           Rows(past + rest, 0, 1)))
            idx += r_per
    if t.n_gen:
        out.append(Run(idx, 1, 0, 1, True, Rows(t.n_depth + 1, 1, t.n_gen)))
    return out


@dataclass
class Prediction:
    test: BenchTest
    seconds: float
    tokens: int
    counts: Counter

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


class Predictor:
    """Counts the graphs of llama-bench tests for one model, in closed form.

    A graph's counts depend on its position only through the cells each cache attends
    (``get_n_kv``: ``n_kv``, ``n_kv_swa``); for one ubatch shape they are affine in those
    cells between the switches of :data:`~graphcost.cost.speed_model.N_KV_SWITCHES`
    (attention reads and MACs grow with the cells, the rest is constant). A test's ubatches
    come in arithmetic runs (:func:`step_runs`); each run is cut where a graph crosses a
    switch or a cache fills (:meth:`_pieces`, a bisection: a few cuts whatever its length),
    and the pieces of one shape on one side of every switch lie on one line in cells. That
    line is built at its two ends and checked at its middle (:meth:`_solve`: a point that
    differs, or a slope that is not whole per padding step, cuts the pieces apart and
    halves them, down to single graphs); a piece's summed counts are then ``count x (counts
    at the line's start) + (slope per cell) x (its summed cells - count x start)``, its
    summed cells being :meth:`~graphcost.graph.settings.Resolved.kv_cells_sum` (a floor
    sum). All in integers: equal to the ubatch-by-ubatch sum, and the work does not grow
    with ``-p``, ``-n``, ``-d``, ``-b`` or ``-ub`` (at most five runs, a few pieces each).
    ``progress(line)`` is called every :data:`PROGRESS_EVERY` builds. Weights are placed
    (repacked or not) for ``features``, ggml CPU feature names
    (:func:`~graphcost.cost.speed_model.placement_features`: given, else the calibration's,
    else the profile's CPU's, else this machine's): ``placement``
    (:class:`~graphcost.cost.speed_model.CpuPlacement`) holds them, where they come from,
    the repacked weights and whether the tiled K-quant path is there."""

    def __init__(self, model, speed: SpeedModel, features=None, progress=None):
        self.model = model
        self.speed = speed
        self.placement = cpu_placement(speed, model, features)
        self.progress = progress
        self.built = 0
        self._cache: dict[tuple, Counter] = {}

    def _resolve(self, t: BenchTest, tokens: int, past: int):
        """``t``'s context resolved for this model, at one ubatch (one output row)."""
        return resolve_for(self.model, RunSettings(
            ctx_size=t.n_ctx, batch_size=t.n_batch, ubatch_size=t.n_ubatch,
            flash_attn=t.flash_attn, cache_type_k=t.type_k, cache_type_v=t.type_v,
            tokens=tokens, past=past, outputs=1))

    @staticmethod
    def _key(t: BenchTest, base, tokens: int, past: int, output: bool) -> tuple:
        """A ubatch's graph: its shape and the cells each cache attends (``base``: ``t``'s
        resolved context, :meth:`_resolve`), and the threads (the tiled path's chunks)."""
        run = base.step(tokens, past, 1)
        return (tokens, output, run.n_kv, run.n_kv_swa, t.flash_attn, t.type_k, t.type_v,
                run.n_ctx, run.n_ubatch, t.threads)

    def _build(self, key: tuple, where: tuple) -> Counter:
        """The counts of ``key``'s graph, built at ``where`` = (test, tokens, past)."""
        if key not in self._cache:
            t, tokens, past = where
            a = analyze_graph(build_graph(self.model, self._resolve(t, tokens, past)))
            self._cache[key] = counts(a, self.placement.repacked, outputs=key[1],
                                      tiled_threads=t.threads if self.placement.tiled else None,
                                      live=False)
            self.built += 1
            if self.progress and self.built % PROGRESS_EVERY == 0:
                self.progress(f"{self.built} graphs built so far (a graph per ubatch shape "
                              "and line of KV lengths)")
        return self._cache[key]

    def step_counts(self, t: BenchTest, tokens: int, past: int, output: bool) -> Counter:
        """The counts of one ubatch of ``t``, built (no interpolation): the per-step mode
        (the reference the closed form is tested against)."""
        key = self._key(t, self._resolve(t, tokens, past), tokens, past, output)
        c = self._build(key, (t, tokens, past))
        return fa_expand(c, {k: v * fa_pairs(k.split(":")[1], tokens, past, self._window(k))
                             for k, v in c.items() if k.startswith("fa_units:")})

    def _window(self, units_key: str) -> int:
        """The sliding window of an ``fa_units:<path>:<cache>`` count's cache."""
        return fa_window(self.model, units_key.split(":")[2])

    def _pieces(self, t: BenchTest, base, run: Run) -> list["_Piece"]:
        """``run`` (a :class:`Run`) cut where its graphs change side of a switch
        or a cache fills (:func:`_side`; monotone along a run, the cells only grow): the
        cut points are found by galloping and bisection, a few key evaluations each."""
        n = run.cells.length

        def side(m):
            return _side(self._key(t, base, run.tokens, run.past(m), run.output), base)

        out, lo = [], 0
        while lo < n:
            s, last, step = side(lo), lo, 1
            while last + step < n and side(last + step) == s:
                last, step = last + step, step * 2
            hi = min(last + step, n)                # side(hi) differs (or hi == n)
            while hi - last > 1:
                mid = (last + hi) // 2
                if side(mid) == s:
                    last = mid
                else:
                    hi = mid
            out.append(_Piece(self, t, base, run, lo, last + 1))
            lo = last + 1
        return out

    def _solve(self, pieces: list["_Piece"]) -> list[tuple[int, Counter]]:
        """The summed counts of ``pieces`` (one shape, one side of every switch: points on
        one line in cells), each with the index of its first ubatch. The line through the
        lowest and highest point is built; the point nearest its middle is built and must
        equal the interpolation, key for key in the same order, and the slope must be whole
        per padding step, else the pieces are solved one by one, and a single piece is
        halved at that point."""
        axis = _axis(pieces)
        lo = min(pieces, key=lambda p: p.s(p.lo, axis))
        hi = max(pieces, key=lambda p: p.s(p.hi - 1, axis))
        ka, kb = lo.key(lo.lo), hi.key(hi.hi - 1)
        sa, sb = _cells(ka)[axis], _cells(kb)[axis]
        a = lo.build(lo.lo)
        if sa == sb:                                 # one graph
            return [(p.first, _scaled(a, p.count)) for p in pieces]
        b = hi.build(hi.hi - 1)
        probe = min((c for p in pieces for c in p.inner(sa, sb, axis)),
                    key=lambda c: abs(2 * c[0].s(c[1], axis) - sa - sb), default=None)
        d = sb - sa
        step = lo.base.kv_pads[axis]            # cells between two points of the line
        ok = list(a) == list(b) and all((b[k] - a[k]) * step % d == 0 for k in a)
        if ok and probe is not None:
            p, j = probe
            mid = _interpolate(a, b, ka, kb, p.key(j))
            ok = mid is not None and list(mid.items()) == list(p.build(j).items())
        if ok:
            # per piece: sum over its ubatches of a + (b - a) * (s - sa) / d, in integers
            # (each term is: the slope is whole per padding step, s - sa a multiple of it)
            return [(p.first, _line_sum(a, b, sa, d, p.count, p.s_sum(axis)))
                    for p in pieces]
        if len(pieces) > 1:
            return [x for p in pieces for x in self._solve([p])]
        p = pieces[0]
        if probe is None:
            # two graphs only (no point between the ends): count each
            n_b = (p.s_sum(axis) - p.count * sa) // d
            return [(p.first, _scaled(a, p.count - n_b) + _scaled(b, n_b))]
        j = probe[1]                                 # halve the piece at the probe
        return (self._solve([_Piece(self, p.t, p.base, p.run, p.lo, j + 1)])
                + self._solve([_Piece(self, p.t, p.base, p.run, j + 1, p.hi)]))

    def counts(self, t: BenchTest) -> Counter:
        """The summed counts of ``t``'s ubatches (in their order, so keys come in the same
        order as a ubatch-by-ubatch sum)."""
        groups: dict[tuple, list[_Piece]] = {}
        base = None
        for run in step_runs(t):
            if base is None:
                base = self._resolve(t, run.tokens, run.past(0))
            for p in self._pieces(t, base, run):
                k = p.key(p.lo)
                groups.setdefault(k[:2] + k[4:] + _side(k, base), []).append(p)
        sums = sorted((x for g in groups.values() for x in self._solve(g)),
                      key=lambda x: x[0])
        total: Counter = Counter()
        for _, c in sums:
            for k, v in c.items():
                total[k] += v
        # flash attention's pairs move with the positions, not the cells: each group's
        # graph (built above: the one at its fewest cells) gives its heads x (Dk + Dv)
        macs: Counter = Counter()
        for g in groups.values():
            p0 = min(g, key=lambda p: _cells(p.key(p.lo)))
            for k, units in p0.build(p0.lo).items():
                if k.startswith("fa_units:"):
                    path = k.split(":")[1]
                    macs[k] += units * sum(fa_pairs_sum(path, p.run.tokens, p.run.cells,
                                                        p.lo, p.hi, self._window(k))
                                           for p in g)
        return fa_expand(total, macs)

    def predict(self, t: BenchTest) -> Prediction:
        c = self.counts(t)
        return Prediction(t, self.speed.seconds(c, t.threads), t.n_prompt + t.n_gen, c)


@dataclass(frozen=True)
class _Piece:
    """Ubatches ``m in [lo, hi)`` of one :class:`Run` whose graphs are on one side of
    every switch (:func:`_side`), for :meth:`Predictor._solve`."""

    pr: Predictor
    t: BenchTest
    base: object               # t's resolved context
    run: Run
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo

    @property
    def first(self) -> int:
        """The index of its first ubatch in the test's list (:func:`steps`)."""
        return self.run.position(self.lo)

    def key(self, m: int) -> tuple:
        return self.pr._key(self.t, self.base, self.run.tokens, self.run.past(m),
                            self.run.output)

    def build(self, m: int) -> Counter:
        return self.pr._build(self.key(m), (self.t, self.run.tokens, self.run.past(m)))

    def s(self, j: int, axis: int) -> int:
        """Ubatch ``j``'s position on the line: its cells on ``axis`` (:func:`_axis`)."""
        return _cells(self.key(j))[axis]

    def s_sum(self, axis: int) -> int:
        """The piece's positions summed over its ubatches, in closed form."""
        return self.base.kv_cells_sum(self.run.tokens, self.run.cells, self.lo,
                                      self.hi)[axis]

    def inner(self, sa: int, sb: int, axis: int) -> list[tuple["_Piece", int]]:
        """Its ubatches nearest the middle of ``sa..sb`` (the last below it and the first
        at or above it, by bisection) that lie strictly between ``sa`` and ``sb``."""
        lo, hi = self.lo, self.hi                # first j with 2 s(j) >= sa + sb, in lo..hi
        while lo < hi:
            m = (lo + hi) // 2
            if 2 * self.s(m, axis) >= sa + sb:
                hi = m
            else:
                lo = m + 1
        return [(self, j) for j in (lo - 1, lo)
                if self.lo <= j < self.hi and sa < self.s(j, axis) < sb]


def _axis(pieces: list[_Piece]) -> int:
    """The cells that move along the pieces' line: 0 (``n_kv``) unless it is the same at
    every point, then 1 (``n_kv_swa``). Where both move, both caches are below their size
    (:func:`_side`), so each is its padded used cells: the same cells when their paddings
    agree (the points lie on ``n_kv_swa = n_kv``), not on one line where they do not."""
    x = [_cells(p.key(j)) for p in pieces for j in (p.lo, p.hi - 1)]
    moves = [min(c[i] for c in x) != max(c[i] for c in x) for i in (0, 1)]
    pads = pieces[0].base.kv_pads
    if all(moves) and pads[0] != pads[1]:
        raise GraphcostError(f"graphcost speed: n_kv and n_kv_swa padded to different cells "
                             f"{pads} are not modelled")
    return 0 if moves[0] else 1


#: builds between two ``progress`` calls of a :class:`Predictor`
PROGRESS_EVERY = 256


def _cells(key: tuple) -> tuple[int, int]:
    """A point's attended cells: (n_kv, n_kv_swa or 0)."""
    return key[2], key[3] or 0


def _side(key: tuple, base) -> tuple[bool, ...]:
    """Which side of every switch a graph's cells are on, and whether the SWA cache is full
    (its cells stop growing there): a piece of a run keeps the same value. (The main cache
    never stops growing inside a run: every ubatch fits, so its used cells stay within
    ``kv_size``, a multiple of its padding, and ``n_kv`` is the padded used cells.)"""
    x, y = _cells(key)
    return (tuple(c >= s for c in (x, y) for s in N_KV_SWITCHES)
            + (y == (base.kv_size_swa or 0),))


def _scaled(c: Counter, n: int) -> Counter:
    """``c`` times ``n``, keys in ``c``'s order."""
    return Counter({k: v * n for k, v in c.items()})


def _line_sum(a: Counter, b: Counter, sa: int, d: int, n: int, s_sum: int) -> Counter:
    """The sum over ``n`` points at positions summing to ``s_sum`` of the line from ``a``
    (position ``sa``) to ``b`` (position ``sa + d``): ``n a + (b - a) (s_sum - n sa) / d``."""
    out: Counter = Counter()
    for k, va in a.items():
        q, r = divmod((b[k] - va) * (s_sum - n * sa), d)
        assert not r, (k, va, b[k], d)      # _solve checked the slope is whole per step
        out[k] = n * va + q
    return out


def _interpolate(a: Counter, b: Counter, ka: tuple, kb: tuple, k: tuple) -> Counter | None:
    """Counts at ``k`` on the line from ``ka`` (counts ``a``) to ``kb`` (``b``), in the key
    order of ``a``; None where a value is not an exact integer."""
    (xa, ya), (xb, yb), (x, y) = _cells(ka), _cells(kb), _cells(k)
    num, den = (x - xa, xb - xa) if xb != xa else (y - ya, yb - ya)
    out: Counter = Counter()
    for key, va in a.items():
        q, r = divmod((b[key] - va) * num, den)
        if r:
            return None
        out[key] = va + q
    return out


# ------------------------------------------------------------------- model description

_FTYPE_SUFFIX = {"S": "Small", "M": "Medium", "L": "Large", "XS": "Extra Small",
                 "XXS": "Extra Extra Small"}


def model_description(model) -> str:
    """llama-bench's ``model`` column, approximately (llama_model_desc: architecture,
    size class, file type): ``gemma3 268M Q4_K - Medium``. llama.cpp's size class comes
    from a per-family table (``llm_type``); graphcost rounds the parameter count."""
    import gguf

    n = model.n_params
    size = f"{n / 1e6:.0f}M" if n < 1e9 else f"{n / 1e9:.0f}B"
    ft = model.header.metadata.get("general.file_type")
    try:
        name = gguf.LlamaFileType(int(ft)).name.replace("MOSTLY_", "").replace("ALL_", "")
    except (TypeError, ValueError):
        return f"{model.arch} {size}"
    parts = name.split("_")
    if len(parts) >= 3 and parts[-1] in _FTYPE_SUFFIX and parts[-2] in ("K",):
        name = f"{'_'.join(parts[:-1])} - {_FTYPE_SUFFIX[parts[-1]]}"
    return f"{model.arch} {size} {name}"


def parse_list(flag: str, text: str, kind: str) -> list:
    """A llama-bench list flag (``1,2,3``); ``kind`` int or fa or cache; one line if bad."""
    from graphcost.graph.settings import CACHE_TYPES

    out = []
    for part in text.split(","):
        v = part.strip().lower()
        if kind == "int":
            try:
                x = int(v)
            except ValueError:
                if re.fullmatch(r"\d+-\d+(?:[+*]\d+)?", v):  # llama-bench's parse_int_range
                    raise GraphcostError(f"{flag} {text!r}: {part!r}: llama-bench's ranges "
                                         "(FIRST-LAST[+STEP|*MULT]) are not modelled; list "
                                         "the values, e.g. 1,2,3") from None
                raise GraphcostError(f"{flag} {text!r}: {part!r} is not an integer") from None
            if x < 0 or (flag in ("-b", "-ub", "-t", "-r") and x < 1):
                raise GraphcostError(f"{flag} {text!r}: {x} is out of range")
            if x > INT32_MAX:  # llama-bench's parse_int_range: std::stoi
                raise GraphcostError(f"{flag} {text!r}: {x} is above {INT32_MAX}, the largest "
                                     "value llama-bench accepts")
            out.append(x)
        elif kind == "fa":
            if v not in FA_VALUES:
                raise GraphcostError(f"{flag} {text!r}: {part!r}: use on, off, auto, 1 or 0")
            out.append(FA_VALUES[v])
        else:
            if v not in CACHE_TYPES:
                raise GraphcostError(f"{flag} {text!r}: {part!r}: use one of {', '.join(CACHE_TYPES)}")
            out.append(v)
    if not out:
        raise GraphcostError(f"{flag}: empty list")
    return out


def predict_all(path, hw, tests: list[BenchTest], progress=None, features=None
                ) -> tuple[object, "Predictor", list[Prediction]]:
    """Load ``path``, price every test with ``hw``'s speed model (``progress``,
    ``features``: see :class:`Predictor`, whose ``speed`` is the model)."""
    from graphcost.graph.build import load_model

    model = load_model(path)
    pr = Predictor(model, from_profile(hw), features=features, progress=progress)
    return model, pr, [pr.predict(t) for t in tests]
