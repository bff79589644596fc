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
the profile's coefficients. Graphs with the same shape are built once, and along a run
only a few KV lengths per ubatch shape are built: the others are interpolated exactly
(:class:`Predictor`).
"""
from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

from graphcost.cost.speed_model import (N_KV_SWITCHES, SpeedModel, counts, from_profile,
                                        repacked_weights)
from graphcost.errors import GraphcostError
from graphcost.graph.build import build_graph, resolve_for
from graphcost.graph.settings import INT32_MAX, RunSettings
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


def step_runs(t: BenchTest) -> list[tuple[int, int, int, int, int, bool, int]]:
    """:func:`steps` in runs: ``(index, index step, tokens, past, past step, has output,
    count)``: ubatches ``index + j * index step`` of the list (``j < count``) are ``(tokens,
    past + j * past step, has output)``. Every full batch of ``-b`` tokens has the same
    ubatches, so a prompt is one run per ubatch of a batch (+ the last, shorter batch) and
    the generation one run, whatever ``-p`` and ``-n``."""
    out = []
    idx = 0
    if t.n_prompt:
        ub = min(t.n_ubatch, t.n_batch)
        full, rest = divmod(t.n_prompt, t.n_batch)
        per = -(-t.n_batch // ub)                        # ubatches of a full batch
        for nb, n, past, step in ((t.n_batch, full, t.n_depth, t.n_batch),
                                  (rest, 1 if rest else 0, t.n_depth + full * t.n_batch, 0)):
            if not n:
                continue
            for s in range(0, nb, ub):
                k = min(ub, nb - s)
                out.append((idx + s // ub, per if nb == t.n_batch else 0, k, past + s, step,
                            s + k == nb, n))
            idx += n * -(-nb // ub)
    if t.n_gen:
        out.append((idx, 1, 1, t.n_depth, 1, True, t.n_gen))
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
    """Counts the graphs of llama-bench tests for one model.

    A graph's counts depend on its position only through the cells each cache attends
    (``get_n_kv``: ``n_kv``, ``n_kv_swa``); for one ubatch shape they are affine in those
    cells between the switches of :data:`~graphcost.cost.speed_model.N_KV_SWITCHES`
    (attention reads and MACs grow with the cells, the rest is constant). So of a long run's
    points (thousands of ``n_kv`` values) only a few are built: each segment's two ends,
    checked at its middle; the rest are interpolated where that is exact in integers, else
    built (:meth:`_solve`). ``progress(line)`` is called every :data:`PROGRESS_EVERY` builds
    and every :data:`PROGRESS_POINTS` distinct graphs met (a run of ~10^8 ubatches and more)."""

    def __init__(self, model, speed: SpeedModel, features=None, progress=None):
        self.model = model
        self.speed = speed
        self.repacked = repacked_weights(model, features)
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
        resolved context, :meth:`_resolve`)."""
        run = base.step(tokens, past, 1)
        return (tokens, output, run.n_kv, run.n_kv_swa, t.flash_attn, t.type_k, t.type_v,
                run.n_ctx, run.n_ubatch)

    def _points(self, t: BenchTest) -> tuple[dict[tuple, int], dict[tuple, object]]:
        """The distinct graphs of ``t``'s timed part in the order a ubatch-by-ubatch walk
        first meets them: how many ubatches each, and where to build each (test, tokens,
        past). Walks
        :func:`step_runs`, jumping over the ubatches of one graph (a run's key is monotone:
        the attended cells only grow), so a long run costs its distinct graphs, not its
        ubatches."""
        mult: dict[tuple, int] = {}
        runs: dict[tuple, object] = {}
        first: dict[tuple, int] = {}
        base = None
        for idx0, idx_step, tokens, past0, past_step, output, n in step_runs(t):
            if base is None:
                base = self._resolve(t, tokens, past0)

            def key_at(j, _tok=tokens, _p0=past0, _ps=past_step, _out=output):
                return self._key(t, base, _tok, _p0 + j * _ps, _out)

            j, span = 0, 0
            while j < n:
                key = key_at(j)
                lo, step = j, 1                  # gallop, then bisect, to the key's last j
                e = j + span - 1                 # first guess: the last key's span again
                if span > 1 and e + 1 < n and key_at(e) == key and key_at(e + 1) != key:
                    lo, step = e, 1
                else:
                    while lo + step < n and key_at(lo + step) == key:
                        lo, step = lo + step, step * 2
                hi = min(lo + step, n)           # key_at(hi) differs (or hi == n)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if key_at(mid) == key:
                        lo = mid
                    else:
                        hi = mid
                if key not in mult:
                    # where to build it from: (test, tokens, past), not the resolved ubatch
                    # (kilobytes; a long run has millions of points)
                    mult[key], first[key] = 0, idx0 + j * idx_step
                    runs[key] = (t, tokens, past0 + j * past_step)
                    if self.progress and len(mult) % PROGRESS_POINTS == 0:
                        self.progress(f"{t.name}: {len(mult)} distinct graphs (KV lengths) "
                                      "so far")
                mult[key] += lo - j + 1
                first[key] = min(first[key], idx0 + j * idx_step)
                j, span = lo + 1, lo - j + 1
        order = sorted(mult, key=first.__getitem__)
        return {k: mult[k] for k in order}, {k: runs[k] for k in order}

    def _build(self, key: tuple, where: tuple) -> Counter:
        """The counts of ``key``'s graph, built at ``where`` = (test, tokens, past)."""
        if key not in self._cache:
            t, tokens, past = where
            a = analyze_graph(build_graph(self.model, self._resolve(t, tokens, past)))
            self._cache[key] = counts(a, self.repacked, outputs=key[1])
            self.built += 1
            if self.progress and self.built % PROGRESS_EVERY == 0:
                self.progress(f"{self.built} graphs built so far (a graph per ubatch shape "
                              "and KV length that cannot be interpolated)")
        return self._cache[key]

    def _solve(self, runs: dict[tuple, object]) -> None:
        """Fill the cache for every key of ``runs``: per ubatch shape, the points in order of
        cells, cut where they stop lying on one line or cross a switch, each piece affine."""
        shapes: dict[tuple, list[tuple]] = {}
        for key in runs:
            if key not in self._cache:
                shapes.setdefault(key[:2] + key[4:], []).append(key)
        for keys in shapes.values():
            keys.sort(key=_cells)
            i = 0
            while i < len(keys):
                j = i + 1
                while j < len(keys) and _same_piece(keys[i], keys[i + 1], keys[j]):
                    j += 1
                self._affine(keys[i:j], runs)
                i = j

    def _affine(self, keys: list[tuple], runs) -> None:
        """Counts of ``keys`` (points on one line, no switch between them): the ends built,
        the middle built and compared with the interpolation (a difference halves the piece),
        the rest interpolated, or built where the interpolation is not an exact integer."""
        if len(keys) <= 3:
            for k in keys:
                self._build(k, runs[k])
            return
        a, b = self._build(keys[0], runs[keys[0]]), self._build(keys[-1], runs[keys[-1]])
        m = len(keys) // 2
        mid = self._build(keys[m], runs[keys[m]])
        if (list(a) != list(b) or list(mid) != list(a)
                or _interpolate(a, b, keys[0], keys[-1], keys[m]) != mid):
            self._affine(keys[:m + 1], runs)
            self._affine(keys[m:], runs)
            return
        for k in keys[1:-1]:
            if k not in self._cache:
                c = _interpolate(a, b, keys[0], keys[-1], k)
                self._cache[k] = c if c is not None else self._build(k, runs[k])

    def step_counts(self, t: BenchTest, tokens: int, past: int, output: bool) -> Counter:
        """The counts of one ubatch of ``t``, built (no interpolation)."""
        key = self._key(t, self._resolve(t, tokens, past), tokens, past, output)
        return self._build(key, (t, tokens, past))

    def counts(self, t: BenchTest) -> Counter:
        """The summed counts of ``t``'s ubatches (in their order, so keys come in the same
        order as a ubatch-by-ubatch sum)."""
        mult, runs = self._points(t)
        self._solve(runs)
        total: Counter = Counter()
        for key, n in mult.items():
            for k, v in self._cache[key].items():
                total[k] += v * n
        return total

    def predict(self, t: BenchTest) -> Prediction:
        c = self.counts(t)
        return Prediction(t, self.speed.seconds(c, t.threads), t.n_prompt + t.n_gen, c)


#: builds, and distinct graphs met, between two ``progress`` calls of a :class:`Predictor`
PROGRESS_EVERY = 256
PROGRESS_POINTS = 200_000


def _cells(key: tuple) -> tuple[int, int]:
    """A point's attended cells: (n_kv, n_kv_swa or 0)."""
    return key[2], key[3] or 0


def _same_piece(first: tuple, second: tuple, k: tuple) -> bool:
    """``k`` lies on the line through ``first`` and ``second`` (in cells) and on the same
    side of every switch as ``first``."""
    (x0, y0), (x1, y1), (x, y) = _cells(first), _cells(second), _cells(k)
    side = [(c >= s) for c in (x0, y0) for s in N_KV_SWITCHES]
    return ((x1 - x0) * (y - y0) == (y1 - y0) * (x - x0)
            and side == [(c >= s) for c in (x, y) for s in N_KV_SWITCHES])


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


def predict_all(path, hw, tests: list[BenchTest], progress=None
                ) -> tuple[object, SpeedModel, list[Prediction]]:
    """Load ``path``, price every test with ``hw``'s speed model (``progress``: see
    :class:`Predictor`)."""
    from graphcost.graph.build import load_model

    model = load_model(path)
    sm = from_profile(hw)
    pr = Predictor(model, sm, progress=progress)
    return model, sm, [pr.predict(t) for t in tests]
