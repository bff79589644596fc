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
the profile's coefficients. Graphs with the same shape are built once.
"""
from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass

from graphcost.cost.speed_model import SpeedModel, counts, from_profile, repacked_weights
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
    """Builds (once per shape) and counts the graphs of llama-bench tests for one model."""

    def __init__(self, model, speed: SpeedModel, features=None):
        self.model = model
        self.speed = speed
        self.repacked = repacked_weights(model, features)
        self._cache: dict[tuple, Counter] = {}

    def step_counts(self, t: BenchTest, tokens: int, past: int, output: bool) -> Counter:
        # a graph's shape (hence its counts) depends on the past only through the cells
        # each cache attends (get_n_kv): build one graph per distinct shape
        rs = RunSettings(ctx_size=t.n_ctx, batch_size=t.n_batch, ubatch_size=t.n_ubatch,
                         flash_attn=t.flash_attn, cache_type_k=t.type_k,
                         cache_type_v=t.type_v, tokens=tokens, past=past, outputs=1)
        run = resolve_for(self.model, rs)
        key = (tokens, output, run.n_kv, run.n_kv_swa, t.flash_attn, t.type_k, t.type_v,
               run.n_ctx, run.n_ubatch)
        if key not in self._cache:
            a = analyze_graph(build_graph(self.model, rs))
            self._cache[key] = counts(a, self.repacked, outputs=output)
        return self._cache[key]

    def counts(self, t: BenchTest) -> Counter:
        total: Counter = Counter()
        for tokens, past, output in steps(t):
            total.update(self.step_counts(t, tokens, past, output))
        return total

    def predict(self, t: BenchTest) -> Prediction:
        c = self.counts(t)
        return Prediction(t, self.speed.seconds(c, t.threads), t.n_prompt + t.n_gen, c)


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


def predict_all(path, hw, tests: list[BenchTest]) -> tuple[object, SpeedModel, list[Prediction]]:
    """Load ``path``, price every test with ``hw``'s speed model."""
    from graphcost.graph.build import load_model

    model = load_model(path)
    sm = from_profile(hw)
    pr = Predictor(model, sm)
    return model, sm, [pr.predict(t) for t in tests]
