"""The oracle: ask the real llama.cpp (PyPI ``llama-cpp-python``) what it does.

Used by the parity tests and by ``graphcost verify``; it needs llama-cpp-python only when
called (:func:`llama_cpp_available` says whether it is installed).

* :func:`capture_graph` -- every node the ggml backend scheduler evaluates during
  one ``llama_decode`` (observed through ``cb_eval``), with op, type, shape and
  source names.
* :func:`capture_log`   -- llama.cpp's log while the context is created and used,
  parsed into KV-cache / compute / output buffer sizes and resolved context sizes.
* :func:`run_model`     -- a prompt and then decode steps (given ids or greedy), with
  each step's logits, wall time, and the values of chosen nodes (read through
  ``cb_eval``) -- the numerics oracle for graphcost's executor.

Every call runs in a worker subprocess (this file executed as a script with
``--serve``), so llama.cpp's global state, its log callback and any crash stay out of
the pytest process; the parent only ever imports the standard library.  A worker
serves one environment and stays up for the next call (each call still loads the
model and creates its own context); a worker whose call failed exits (:class:`_Worker`).

Record format returned by :func:`capture_graph` (one dict per evaluated node, in
evaluation order)::

    {"index": 0,                 # position in evaluation order (0-based)
     "name": "embd",             # ggml tensor name (llama.cpp's cb() names, "-<il>" suffix per layer)
     "op": "GET_ROWS",           # ggml_op_desc(): sub-op for UNARY / GLU ("SILU", "GEGLU", ...)
     "type": "f32",              # ggml_type_name(), lower-case
     "ne": [256, 1, 1, 1],       # int64 ne[0..3]
     "src": ["token_embd.weight", "inp_tokens"]}   # names of the non-null src[] in order

With ``details=True`` each record also has ``"nb"`` (byte strides), ``"flags"``
(ggml tensor flags), ``"view_src"`` (name or None), ``"view_offs"``,
``"op_params"`` (16 int32), ``"src_ops"`` (ggml_op_desc of each src, "NONE"
for leaves) and ``"src_index"`` (index of each src among the recorded nodes, None
for leaves such as weights, inputs and KV-cache tensors -- names are not unique:
e.g. every ``norm-<il>`` and, in iSWA models, both masks are "attn_inp_kq_mask").
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import queue
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = [
    "OracleError",
    "llama_cpp_available",
    "llama_cpp_unavailable_reason",
    "capture_graph",
    "capture_log",
    "parse_log",
    "run_model",
]

_THIS = Path(__file__).resolve()
_MARK = "@@LLAMA_ORACLE_JSON@@"


class OracleError(RuntimeError):
    """The llama.cpp worker subprocess failed.

    ``.log`` holds llama.cpp's log text when it was captured (``capture_log``) and
    ``.llama_errors`` the ERROR-level log lines (both modes).
    """

    def __init__(self, msg: str, log: str = "", llama_errors: str = ""):
        super().__init__(msg)
        self.log = log
        self.llama_errors = llama_errors


# ----------------------------------------------------------------------------- parent side


@functools.lru_cache(maxsize=None)
def _probe() -> tuple[bool, str]:
    try:
        r = subprocess.run(
            [sys.executable, "-c",
             "import llama_cpp, sys; sys.stdout.write(llama_cpp.__version__)"],
            capture_output=True, text=True, timeout=120,
        )
    except Exception as e:  # pragma: no cover
        return False, f"could not run python to import llama_cpp: {e!r}"
    if r.returncode != 0:
        tail = (r.stderr or "").strip().splitlines()[-1:] or ["?"]
        return False, f"llama_cpp (llama-cpp-python) not importable: {tail[0]}"
    return True, r.stdout.strip()


def llama_cpp_available() -> bool:
    """True when ``import llama_cpp`` works (checked once, in a subprocess)."""
    return _probe()[0]


def llama_cpp_unavailable_reason() -> str:
    ok, msg = _probe()
    return "" if ok else msg


def _settings(n_ctx, n_ubatch, n_batch, flash_attn, type_k, type_v, swa_full, past,
              tokens, n_outputs, n_threads, embeddings=False, n_seq_max=1,
              kv_unified=False) -> dict[str, Any]:
    if tokens < 1:
        raise ValueError("tokens must be >= 1")
    if not 0 <= n_outputs <= tokens:
        raise ValueError("need 0 <= n_outputs <= tokens")
    if n_batch is None:
        if tokens > n_ubatch:
            raise ValueError(
                f"tokens={tokens} > n_ubatch={n_ubatch}: the decode would be split into "
                "several ubatches; pass n_batch explicitly if that is what you want")
        n_batch = n_ubatch
    if tokens > n_batch:
        raise ValueError(f"tokens={tokens} > n_batch={n_batch}")
    if isinstance(flash_attn, str):
        fa = flash_attn.lower()
        if fa in ("on", "enabled", "true", "1"):
            flash_attn = True
        elif fa in ("off", "disabled", "false", "0"):
            flash_attn = False
        else:
            raise ValueError("flash_attn must be True/False ('auto' is deliberately not supported)")
    return dict(n_ctx=int(n_ctx), n_ubatch=int(n_ubatch), n_batch=int(n_batch),
                flash_attn=bool(flash_attn), type_k=str(type_k).lower(),
                type_v=str(type_v).lower(), swa_full=bool(swa_full), past=int(past),
                tokens=int(tokens), n_outputs=int(n_outputs), n_threads=int(n_threads),
                embeddings=bool(embeddings), n_seq_max=int(n_seq_max),
                kv_unified=bool(kv_unified))


#: llama.cpp threads (n_threads and n_threads_batch) unless a call says otherwise: one.
#: The graph, the buffers and the values llama.cpp computes do not depend on it (each
#: thread computes whole rows), but with cb_eval every node is its own graph_compute,
#: so a second thread only adds a barrier per node, and on a loaded machine those
#: spin-waits cost ~20x the CPU of the work itself (tiny mixtral, load ~17: 0.17-1.4 CPU
#: s per capture with 2 threads, 0.007 with 1). Speed measurements pass their threads.
DEFAULT_THREADS = 1

#: environment variables that steer threads, thread pools or SIMD paths of llama.cpp,
#: OpenMP or Numba: what a speed comparison prints for each process
THREADING_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "GGML_", "LLAMA_", "OPENBLAS", "MKL_",
                          "NUMBA_")


def threading_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) named by
    :data:`THREADING_ENV_PREFIXES`."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith(THREADING_ENV_PREFIXES)}


class _Worker:
    """One llama.cpp worker process (this file run with ``--serve``) for one environment:
    it answers JSON requests, one line each, until its stdin closes.  Python start-up and
    ``import llama_cpp`` (~0.3 s, most of a tiny model's capture) are paid once per process,
    not once per capture; every request still loads the model, creates and frees its own
    context, exactly as a fresh process would.  A worker that fails a request exits, so a
    failure never leaks llama.cpp state into the next request."""

    def __init__(self, env: dict[str, str]):
        import tempfile

        self.err = tempfile.TemporaryFile()          # the worker's stderr (ggml aborts)
        self.proc = subprocess.Popen(
            [sys.executable, str(_THIS), "--serve"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)                          # EOF: the worker exited

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_since(self, pos: int) -> str:
        fd = self.err.fileno()
        return os.pread(fd, max(os.fstat(fd).st_size - pos, 0), pos).decode("utf-8", "replace")

    def request(self, req: dict, timeout: float) -> tuple[str | None, int | None, int]:
        """(payload, returncode, stderr offset): payload None when the worker died or timed
        out (returncode then says how; None = timed out, the worker is killed)."""
        import time

        pos = os.fstat(self.err.fileno()).st_size
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:                               # it died since its last answer
            return None, self.proc.wait(), pos
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:                       # timed out
                self.proc.kill()
                self.proc.wait()
                return None, None, pos
            if line is None:                          # the worker died (a ggml abort, ...)
                return None, self.proc.wait(), pos
            text = line.decode("utf-8", "replace")
            if text.startswith(_MARK):
                return text[len(_MARK):], None, pos

    def close(self) -> None:
        """Close its stdin (the worker exits at EOF); kill it if it has not within 10 s."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.proc.stdout.close()
        self.err.close()


#: idle workers by environment key (most recently used key last); at most _MAX_IDLE in all.
#: A call takes an idle worker of its key or starts one, so concurrent calls (threads)
#: run in parallel workers, as they did with a process per call.
_WORKERS: dict[tuple, list[_Worker]] = {}
_MAX_IDLE = 4
_WORKERS_LOCK = threading.Lock()
#: variables left out of a worker's key: pytest rewrites PYTEST_CURRENT_TEST for every
#: test, which would otherwise start a worker per test (the worker keeps its first value)
_VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})


@atexit.register
def _close_workers() -> None:
    with _WORKERS_LOCK:
        idle = [w for ws in _WORKERS.values() for w in ws]
        _WORKERS.clear()
    for w in idle:
        w.close()


def _take_worker(key: tuple) -> _Worker | None:
    with _WORKERS_LOCK:
        ws = _WORKERS.get(key, [])
        while ws:
            w = ws.pop()
            if w.alive():
                return w
            w.close()
        return None


def _give_back(key: tuple, w: _Worker) -> None:
    with _WORKERS_LOCK:
        _WORKERS.setdefault(key, []).append(w)
        _WORKERS[key] = _WORKERS.pop(key)          # most recently used last
        extra = []
        while sum(map(len, _WORKERS.values())) > _MAX_IDLE:
            oldest = next(k for k, ws in _WORKERS.items() if ws)
            extra.append(_WORKERS[oldest].pop(0))
            if not _WORKERS[oldest]:
                del _WORKERS[oldest]
    for e in extra:
        e.close()


def _run_worker(mode: str, model_path, settings: dict[str, Any], timeout: float,
                env: dict[str, str] | None, base_env: dict[str, str] | None = None) -> Any:
    req = dict(settings, mode=mode, model_path=os.fspath(model_path))
    full_env = dict(os.environ if base_env is None else base_env)
    if env:
        full_env.update(env)
    key = tuple(sorted(kv for kv in full_env.items() if kv[0] not in _VOLATILE_ENV))
    w = _take_worker(key) or _Worker(full_env)
    payload, rc, pos = w.request(req, timeout)
    if payload is None:
        err = w.stderr_since(pos)[-4000:]
        w.close()
        if rc is None:
            raise OracleError(f"llama.cpp worker timed out after {timeout}s ({mode})")
        raise OracleError(
            f"llama.cpp worker failed (mode={mode}, rc={rc}, settings={settings}):\n{err}")
    out = json.loads(payload)
    if isinstance(out, dict) and out.get("error"):
        w.close()                                     # the worker exits after a failure
        extra = out.get("errors", "")
        msg = out["error"] if extra.strip() in out["error"] else f"{out['error']}\n{extra}"
        raise OracleError(f"llama.cpp worker error: {msg}",
                          log=out.get("raw", ""), llama_errors=out.get("errors", ""))
    _give_back(key, w)
    return out


def capture_graph(model_path, *, n_ctx: int = 512, n_ubatch: int = 512, n_batch: int | None = None,
                  flash_attn: bool = False, type_k: str = "f16", type_v: str = "f16",
                  swa_full: bool = False, past: int = 0, tokens: int = 1, n_outputs: int = 1,
                  n_threads: int = DEFAULT_THREADS, embeddings: bool = False, details: bool = False,
                  n_seq_max: int = 1, kv_unified: bool = False, timeout: float = 600.0,
                  env: dict[str, str] | None = None) -> list[dict]:
    """Nodes llama.cpp evaluates for one decode of ``tokens`` tokens after ``past`` tokens.

    A context is created with the given settings (``n_seq_max`` sequences, 1 unless
    given, ``kv_unified`` as given; the decodes are sequence 0's; CPU only,
    flash attention forced on/off -- never auto).  First ``past`` tokens are
    decoded (in n_batch-sized chunks, logits for the very last one only) without
    recording; then ``tokens`` tokens at positions ``past .. past+tokens-1`` are
    decoded in one ``llama_decode``, the last ``n_outputs`` of them requesting
    logits, and every node the scheduler offers to ``cb_eval`` (``ask=True``) is
    recorded.  ``n_batch`` defaults to ``n_ubatch`` (so the whole decode is a single
    ubatch); ``embeddings=True`` sets ``cparams.embeddings`` (pooling as the GGUF says;
    models without a KV cache, such as bert, encode instead of decode and output every
    token); if you pass a larger ``n_batch`` and tokens > n_ubatch, the records of
    all ubatches are concatenated.  ``env`` adds environment variables for the
    worker (e.g. ``{"LLAMA_ATTN_ROT_DISABLE": "1"}``).
    """
    s = _settings(n_ctx, n_ubatch, n_batch, flash_attn, type_k, type_v, swa_full, past,
                  tokens, n_outputs, n_threads, embeddings, n_seq_max, kv_unified)
    s["details"] = bool(details)
    return _run_worker("graph", model_path, s, timeout, env)


def capture_log(model_path, *, n_ctx: int = 512, n_ubatch: int = 512, n_batch: int | None = None,
                flash_attn: bool = False, type_k: str = "f16", type_v: str = "f16",
                swa_full: bool = False, past: int = 0, tokens: int = 1, n_outputs: int = 1,
                n_threads: int = DEFAULT_THREADS, embeddings: bool = False,
                n_seq_max: int = 1, kv_unified: bool = False, timeout: float = 600.0,
                env: dict[str, str] | None = None) -> dict:
    """llama.cpp's log (all levels, DEBUG included) for model load + context creation +
    the same two decodes as :func:`capture_graph` + context free, parsed by
    :func:`parse_log`.  ``result["raw"]`` is the full text.
    """
    s = _settings(n_ctx, n_ubatch, n_batch, flash_attn, type_k, type_v, swa_full, past,
                  tokens, n_outputs, n_threads, embeddings, n_seq_max, kv_unified)
    out = _run_worker("log", model_path, s, timeout, env)
    parsed = parse_log(out["raw"])
    parsed["decode_rc"] = out.get("decode_rc")
    return parsed


def run_model(model_path, *, prompt: list[int], decode: list[int] | None = None, greedy: int = 0,
              capture: list[str] = (), capture_steps: list[int] = (0,), n_ctx: int = 1024,
              n_ubatch: int = 512, flash_attn: bool = False, type_k: str = "f16",
              type_v: str = "f16", swa_full: bool = False, n_threads: int = DEFAULT_THREADS,
              timeout: float = 600.0, env: dict[str, str] | None = None,
              base_env: dict[str, str] | None = None) -> dict:
    """Decode ``prompt`` (one ubatch, logits for its last token), then either the tokens
    of ``decode`` one at a time or ``greedy`` steps feeding back each step's argmax.

    Returns ``{"tokens": [generated ids], "steps": [{"n_tokens", "past", "argmax",
    "top5": [[id, logit], ...], "seconds"}], "logits": [float32 [n_vocab] per step],
    "captures": {step: [{"index", "name", "op", "type", "ne", "value"}]}}``.
    ``capture`` names nodes whose output is read through ``cb_eval`` during the steps in
    ``capture_steps`` (every node of that name; ``index`` is the node's position in the
    graph, as in :func:`capture_graph`); ``value`` is a float32 array shaped
    ``ne[::-1]`` (numpy order). Without ``capture`` no ``cb_eval`` is installed, so the
    steps run exactly as llama.cpp runs them (``seconds`` is the wall time of
    ``llama_decode`` + synchronize). The arrays travel through a temporary ``.npz``.
    The worker starts from ``base_env`` (default: this process's environment) plus
    ``env``; ``"env"`` in the result is its :func:`threading_env` as it ran.
    """
    import tempfile

    import numpy as np

    if decode is None and greedy < 0:
        raise ValueError("greedy must be >= 0")
    if len(prompt) > n_ubatch:
        raise ValueError("the prompt must fit one ubatch")
    s = _settings(n_ctx, n_ubatch, None, flash_attn, type_k, type_v, swa_full, 0,
                  max(1, len(prompt)), 1, n_threads)
    with tempfile.TemporaryDirectory() as d:
        npz = os.path.join(d, "out.npz")
        s.update(prompt=[int(t) for t in prompt], decode=None if decode is None else
                 [int(t) for t in decode], greedy=int(greedy), capture=list(capture),
                 capture_steps=[int(x) for x in capture_steps], npz=npz)
        out = _run_worker("run", model_path, s, timeout, env, base_env)
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
    out["logits"] = [arrays[f"logits_{i}"] for i in range(len(out["steps"]))]
    caps: dict[int, list] = {}
    for rec in out.pop("capture_records"):
        rec["value"] = arrays[rec.pop("key")]
        caps.setdefault(rec.pop("step"), []).append(rec)
    out["captures"] = caps
    return out


# ----------------------------------------------------------------------------- log parsing

_F = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_RE_CTX_FIELD = re.compile(
    r"^llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|causal_attn|flash_attn|"
    r"kv_unified|freq_base|freq_scale|n_rs_seq|n_outputs_max|n_outputs_max_per_seq)\s*=\s*(\S+)\s*$")
_RE_ISWA_CREATE = re.compile(r"^llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells")
_RE_KV_BUF = re.compile(r"^llama_kv_cache:\s*(\S+) KV buffer size =\s*" + _F + r" MiB")
_RE_KV_SIZE = re.compile(
    r"^llama_kv_cache: size =\s*" + _F + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
    r"K \((\S+)\):\s*" + _F + r" MiB, V \((\S+)\):\s*" + _F + r" MiB")
_RE_RS_BUF = re.compile(r"^llama_memory_recurrent:\s*(\S+) RS buffer size =\s*" + _F + r" MiB")
_RE_RS_SIZE = re.compile(
    r"^llama_memory_recurrent: size =\s*" + _F + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) seqs\s+(\d+) rs_seq\), "
    r"R \((\S+)\):\s*" + _F + r" MiB, S \((\S+)\):\s*" + _F + r" MiB")
_RE_ATTN_ROT = re.compile(r"^llama_kv_cache: attn_rot_(k|v) = (\d+), n_embd_head_k_all = (-?\d+)")
_RE_OUT_BUF = re.compile(r"^llama_context:\s*(\S+)\s+output buffer size =\s*" + _F + r" MiB")
_RE_COMPUTE_BUF = re.compile(r"^(?:llama_context|sched_reserve):\s*(\S+) compute buffer size =\s*" + _F + r" MiB")
_RE_COMPUTE_EXACT = re.compile(
    r"^~llama_context:\s*(\S+) compute buffer size (?:is|of)\s*" + _F +
    r" MiB, (?:matches|does not match) expectation of\s*" + _F + r" MiB")
_RE_GRAPH = re.compile(
    r"^(?:llama_context|sched_reserve): graph(?: \(pp bs=(\d+), tg bs=(\d+)\))?: nodes = ([\d /]+), "
    r"splits = ([\d /]+)")
_RE_MODEL_BUF = re.compile(r"^load_tensors:\s*(\S+) model buffer size =\s*" + _F + r" MiB")
#: lines that each add one {"buffer", "mib"} to a list of :func:`parse_log`'s result
_BUFFER_LINES = ((_RE_COMPUTE_BUF, "compute_buffers"), (_RE_MODEL_BUF, "model_buffers"),
                 (_RE_OUT_BUF, "output_buffers"))
_RE_SWA_FULL = re.compile(r"using full-size SWA cache")
_RE_KV_LAYER = re.compile(r"^llama_kv_cache: layer\s+(\d+): (?:dev = (\S+)|filtered)")
_RE_RESERVE = re.compile(
    r"^graph_reserve: reserving a graph for ubatch with n_tokens =\s*(\d+), n_seqs =\s*(\d+), "
    r"n_outputs =\s*(\d+)")
_RE_INPUT = re.compile(
    r"^llama_graph_n_input_tensors: input tensor '\s*(.*?)' \[(\S+), ne = \{\s*(-?\d+),\s*(-?\d+),"
    r"\s*(-?\d+),\s*(-?\d+) \}\] is used by node '(.*)' \((\S+)\)")


def _num(s: str):
    try:
        return int(s)
    except ValueError:
        try:
            return float(s)
        except ValueError:
            return s


def _size_fields(m: re.Match, per_seq: str, a: str, b: str) -> dict:
    """A memory's size line (llama_kv_cache and llama_memory_recurrent constructors):
    ``size = S MiB (C cells, L layers, N<per_seq> seqs), A (type): MiB, B (type): MiB``;
    ``per_seq`` names the fifth number (KV: n_stream, recurrent: rs_seq), ``a``/``b``
    the two parts (k/v, r/s)."""
    return {"size_mib": float(m.group(1)), "cells": int(m.group(2)), "layers": int(m.group(3)),
            "seqs": int(m.group(4)), per_seq: int(m.group(5)), f"type_{a}": m.group(6),
            f"{a}_mib": float(m.group(7)), f"type_{b}": m.group(8), f"{b}_mib": float(m.group(9))}


def _buffer_line(line: str) -> tuple[str | None, dict | None]:
    """(result list, {"buffer", "mib"}) for a line of :data:`_BUFFER_LINES`, else Nones."""
    for rx, key in _BUFFER_LINES:
        m = rx.match(line)
        if m:
            return key, {"buffer": m.group(1), "mib": float(m.group(2))}
    return None, None


def parse_log(raw: str) -> dict:
    """Parse llama.cpp's log text (formats from llama-context.cpp, llama-kv-cache.cpp,
    llama-kv-cache-iswa.cpp of the vendored llama.cpp).

    Returns a dict with keys:

    * ``context``: the ``llama_context: <field> = <value>`` block (n_ctx, n_ctx_seq,
      n_batch, n_ubatch, n_seq_max, flash_attn, kv_unified, ...), ints where numeric;
      also copied to top-level ``n_ctx``, ``n_ctx_seq``, ``n_batch``, ``n_ubatch``,
      ``flash_attn``.
    * ``kv_caches``: one dict per KV cache, in creation order: ``which``
      (``"non-SWA"`` / ``"SWA"`` from the iSWA log line, ``None`` for a plain cache),
      ``cells`` (kv size), ``buffers`` ([{"buffer": "CPU", "mib": float}]),
      ``buffer_mib`` (sum of buffers), ``size_mib``, ``layers``, ``seqs``,
      ``n_stream``, ``type_k``, ``k_mib``, ``type_v``, ``v_mib``, ``attn_rot_k``,
      ``attn_rot_v`` (Hadamard rotation of quantized K/V), ``layer_ids`` (layers
      stored in this cache, from the DEBUG ``layer N: dev = ...`` lines).
    * ``kv_buffer_mib``: all ``KV buffer size`` values in order (flat list).
    * ``output_buffers`` / ``output_buffer_mib`` (last).
    * ``compute_buffers`` (every ``compute buffer size`` line, a list of
      {"buffer","mib"}; 2 decimals) / ``compute_buffer_mib`` (CPU one, last reserve).
    * ``compute_buffer_exact``: from the DEBUG line printed when the context is
      freed (4 decimals): {"buffer","mib","expected_mib","matches"} per backend.
    * ``graph``: {"nodes": [pp, tg] or [n], "splits": [...], "pp_bs", "tg_bs"} from
      the sched_reserve summary line (reserve graphs, not the decode).
    * ``reserve_graphs``: one entry per ``graph_reserve`` (the worst-case graphs
      sched_reserve builds, last = the pp graph the compute buffer is sized for):
      {"n_tokens","n_seqs","n_outputs","inputs": [{"name","type","ne","used_by"}]}
      (inputs unique by name+type+ne: the two iSWA masks share one name).
    * ``model_buffers``: [{"buffer","mib"}], ``swa_full_warning``: bool.
    * ``recurrent_states``: one dict per llama_memory_recurrent (recurrent and hybrid
      models): ``buffer_mib`` (``RS buffer size``), ``size_mib``, ``cells``, ``layers``,
      ``seqs``, ``rs_seq``, ``type_r``, ``r_mib``, ``type_s``, ``s_mib``.
    """
    res: dict[str, Any] = {
        "context": {}, "kv_caches": [], "kv_buffer_mib": [], "output_buffers": [],
        "compute_buffers": [], "compute_buffer_exact": [], "graph": None,
        "model_buffers": [], "swa_full_warning": False, "raw": raw,
    }
    pending_which = None
    cur = None
    pending_layers: list[int] = []
    res["reserve_graphs"] = []
    res["recurrent_states"] = []

    def new_cache(which):
        c = {"which": which, "layer_ids": list(pending_layers), "cells": None, "buffers": [], "buffer_mib": 0.0, "size_mib": None,
             "layers": None, "seqs": None, "n_stream": None, "type_k": None, "k_mib": None,
             "type_v": None, "v_mib": None, "attn_rot_k": None, "attn_rot_v": None}
        res["kv_caches"].append(c)
        return c

    for line in raw.splitlines():
        line = line.rstrip()
        key, buf = _buffer_line(line)
        if key is not None:
            res[key].append(buf)
            continue
        m = _RE_CTX_FIELD.match(line)
        if m:
            res["context"][m.group(1)] = _num(m.group(2))
            continue
        m = _RE_ISWA_CREATE.match(line)
        if m:
            pending_which = (m.group(1), int(m.group(2)))
            pending_layers = []
            cur = None
            continue
        m = _RE_KV_LAYER.match(line)
        if m:
            if cur is not None and cur["size_mib"] is not None:
                cur = None  # a new cache's layer list starts
            if m.group(2) is not None:
                pending_layers.append(int(m.group(1)))
            continue
        m = _RE_RESERVE.match(line)
        if m:
            res["reserve_graphs"].append({"n_tokens": int(m.group(1)), "n_seqs": int(m.group(2)),
                                          "n_outputs": int(m.group(3)), "inputs": []})
            continue
        m = _RE_INPUT.match(line)
        if m:
            if res["reserve_graphs"]:
                ne = [int(m.group(i)) for i in range(3, 7)]
                inputs = res["reserve_graphs"][-1]["inputs"]
                for inp in inputs:
                    if inp["name"] == m.group(1) and inp["type"] == m.group(2) and inp["ne"] == ne:
                        break
                else:
                    inp = {"name": m.group(1), "type": m.group(2), "ne": ne, "used_by": []}
                    inputs.append(inp)
                inp["used_by"].append(m.group(7))
            continue
        m = _RE_KV_BUF.match(line)
        if m:
            if cur is None or cur["size_mib"] is not None:
                cur = new_cache(pending_which[0] if pending_which else None)
                if pending_which:
                    cur["cells"] = pending_which[1]
                pending_which = None
                pending_layers = []
            mib = float(m.group(2))
            cur["buffers"].append({"buffer": m.group(1), "mib": mib})
            cur["buffer_mib"] = round(cur["buffer_mib"] + mib, 6)
            res["kv_buffer_mib"].append(mib)
            continue
        m = _RE_KV_SIZE.match(line)
        if m:
            if cur is None or cur["size_mib"] is not None:
                cur = new_cache(pending_which[0] if pending_which else None)
                pending_which = None
                pending_layers = []
            cur.update(_size_fields(m, "n_stream", "k", "v"))
            continue
        m = _RE_RS_BUF.match(line)
        if m:
            res["recurrent_states"].append({"buffer": m.group(1), "buffer_mib": float(m.group(2))})
            continue
        m = _RE_RS_SIZE.match(line)
        if m:
            if not res["recurrent_states"] or "size_mib" in res["recurrent_states"][-1]:
                res["recurrent_states"].append({"buffer": None, "buffer_mib": None})
            res["recurrent_states"][-1].update(_size_fields(m, "rs_seq", "r", "s"))
            continue
        m = _RE_ATTN_ROT.match(line)
        if m:
            if cur is not None:
                cur["attn_rot_" + m.group(1)] = int(m.group(2))
            continue
        m = _RE_COMPUTE_EXACT.match(line)
        if m:
            res["compute_buffer_exact"].append({
                "buffer": m.group(1), "mib": float(m.group(2)), "expected_mib": float(m.group(3)),
                "matches": "does not match" not in line})
            continue
        m = _RE_GRAPH.match(line)
        if m:
            res["graph"] = {
                "pp_bs": int(m.group(1)) if m.group(1) else None,
                "tg_bs": int(m.group(2)) if m.group(2) else None,
                "nodes": [int(x) for x in m.group(3).split("/")],
                "splits": [int(x) for x in m.group(4).split("/")],
            }
            continue
        if _RE_SWA_FULL.search(line):
            res["swa_full_warning"] = True

    for k in ("n_ctx", "n_ctx_seq", "n_batch", "n_ubatch", "n_seq_max", "flash_attn"):
        res[k] = res["context"].get(k)
    res["output_buffer_mib"] = res["output_buffers"][-1]["mib"] if res["output_buffers"] else None
    cpu = [c for c in res["compute_buffers"] if c["buffer"].startswith("CPU")]
    res["compute_buffer_mib"] = (cpu or res["compute_buffers"] or [{"mib": None}])[-1]["mib"]
    return res


# ----------------------------------------------------------------------------- worker side
# Everything below runs only inside the subprocess (``python graphcost.judge.oracle.py '<json>'``).


def _worker(req: dict) -> Any:  # pragma: no cover - exercised through the subprocess
    import ctypes

    import llama_cpp as L

    GGML_MAX_DIMS = 4
    GGML_MAX_OP_PARAMS = 64
    GGML_MAX_SRC = 10
    GGML_MAX_NAME = 64

    class ggml_tensor(ctypes.Structure):
        pass

    # struct ggml_tensor, ggml/include/ggml.h (vendored llama.cpp of llama-cpp-python 0.3.36)
    ggml_tensor._fields_ = [
        ("type", ctypes.c_int),                                   # enum ggml_type
        ("buffer", ctypes.c_void_p),                              # struct ggml_backend_buffer *
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),                                     # enum ggml_op
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.POINTER(ggml_tensor) * GGML_MAX_SRC),
        ("view_src", ctypes.POINTER(ggml_tensor)),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]
    TP = ctypes.POINTER(ggml_tensor)

    # ggml functions: ggml.c lives in libggml-base; dlsym on a handle also searches its deps
    libdir = Path(L.__file__).resolve().parent / "lib"
    ggml = None
    for cand in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll",
                 "libggml.so", "libggml.dylib", "ggml.dll", "libllama.so", "libllama.dylib"):
        p = libdir / cand
        if p.exists():
            try:
                lib = ctypes.CDLL(str(p))
                lib.ggml_op_desc  # noqa: B018 - probe
                ggml = lib
                break
            except (OSError, AttributeError):
                continue
    if ggml is None:
        raise RuntimeError(f"no ggml shared library with ggml_op_desc under {libdir}")
    ggml.ggml_op_desc.argtypes = [ctypes.c_void_p]
    ggml.ggml_op_desc.restype = ctypes.c_char_p
    ggml.ggml_type_name.argtypes = [ctypes.c_int]
    ggml.ggml_type_name.restype = ctypes.c_char_p
    ggml.ggml_tensor_overhead.argtypes = []
    ggml.ggml_tensor_overhead.restype = ctypes.c_size_t
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
    ggml.ggml_nelements.restype = ctypes.c_int64
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t

    # layout check: sizeof(ggml_tensor) == ggml_tensor_overhead() - sizeof(struct ggml_object) (32)
    if ctypes.sizeof(ggml_tensor) != ggml.ggml_tensor_overhead() - 32:
        raise RuntimeError(f"ggml_tensor layout mismatch: ctypes {ctypes.sizeof(ggml_tensor)} vs "
                           f"ggml {ggml.ggml_tensor_overhead() - 32}")

    # type name -> ggml type id, from ggml itself
    type_ids: dict[str, int] = {}
    for tid in range(int(getattr(L, "GGML_TYPE_COUNT", 64))):
        try:
            nm = ggml.ggml_type_name(tid)
        except Exception:
            nm = None
        if nm:
            type_ids[nm.decode().lower()] = tid

    def tid_of(name: str) -> int:
        if name not in type_ids:
            raise ValueError(f"unknown ggml type {name!r}; known: {sorted(type_ids)}")
        return type_ids[name]

    mode = req["mode"]
    state = {"recording": False, "checked": False, "last_level": 0, "cb_error": None}
    log_chunks = _WORKER_LOG
    errors = _WORKER_ERRORS

    # typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
    @L.llama_log_callback
    def log_cb(level, text, user_data):
        s = text.decode("utf-8", "replace") if text else ""
        # levels: 1 DEBUG, 2 INFO, 3 WARN, 4 ERROR, 5 CONT (continuation of the previous)
        if mode == "log":
            log_chunks.append(s)
        if level == 4 or (level == 5 and state["last_level"] == 4):
            errors.append(s)
        if level != 5:
            state["last_level"] = level

    _KEEPALIVE.append(log_cb)
    L.llama_log_set(log_cb, ctypes.c_void_p(0))
    L.llama_backend_init()

    records: list[dict] = []
    addr_to_index: dict[int, int] = {}
    details = bool(req.get("details"))

    def tname(p) -> str | None:
        if not p:
            return None
        return p.contents.name.decode("utf-8", "replace")

    def record(t: int) -> None:
        tt = ctypes.cast(t, TP).contents
        name = tt.name.decode("utf-8", "replace")
        if not state["checked"]:
            state["checked"] = True
            ne_prod = tt.ne[0] * tt.ne[1] * tt.ne[2] * tt.ne[3]
            if (ggml.ggml_get_name(t).decode("utf-8", "replace") != name
                    or ggml.ggml_nelements(t) != ne_prod):
                raise RuntimeError("ggml_tensor layout mismatch (name/ne)")
        src_ptrs = [s for s in (tt.src[j] for j in range(GGML_MAX_SRC)) if s]
        rec = {
            "index": len(records),
            "name": name,
            "op": ggml.ggml_op_desc(t).decode(),
            "type": ggml.ggml_type_name(tt.type).decode().lower(),
            "ne": [int(tt.ne[i]) for i in range(4)],
            "src": [tname(s) for s in src_ptrs],
        }
        if details:
            src_addrs = [ctypes.cast(s, ctypes.c_void_p).value for s in src_ptrs]
            rec["nb"] = [int(tt.nb[i]) for i in range(4)]
            rec["flags"] = int(tt.flags)
            rec["view_src"] = tname(tt.view_src)
            rec["view_offs"] = int(tt.view_offs)
            rec["op_params"] = [int(x) for x in tt.op_params]
            rec["src_ops"] = [ggml.ggml_op_desc(a).decode() for a in src_addrs]
            rec["src_index"] = [addr_to_index.get(a) for a in src_addrs]
        addr_to_index[t] = rec["index"]
        records.append(rec)

    # typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data);
    # ask=True: "do you want this node's data?"  Answering True makes the scheduler compute
    # up to this node and call back with ask=False; answering False there would abort.
    capture_names = set(req.get("capture") or ())
    np_dtypes = {"f32": "<f4", "f16": "<f2", "i32": "<i4", "i64": "<i8"}

    def read_value(t: int):
        """A node's data as float32 in numpy order (ne reversed), honouring its strides."""
        import numpy as np

        tt = ctypes.cast(t, TP).contents
        tname_ = ggml.ggml_type_name(tt.type).decode().lower()
        if tname_ not in np_dtypes or not tt.data:
            return None
        span = int(ggml.ggml_nbytes(t))
        raw = np.frombuffer((ctypes.c_char * span).from_address(tt.data), dtype=np.uint8)
        ne = [int(tt.ne[i]) for i in range(4)]
        nb = [int(tt.nb[i]) for i in range(4)]
        arr = np.ndarray(ne[::-1], dtype=np_dtypes[tname_], buffer=raw, strides=nb[::-1])
        return np.array(arr, dtype=np.float32)

    run_state = {"step": -1, "ask_index": 0, "records": [], "arrays": {}}

    @L.ggml_backend_sched_eval_callback
    def eval_cb(t, ask, user_data):
        if mode == "run":
            try:
                if ask:
                    i = run_state["ask_index"]
                    run_state["ask_index"] += 1
                    name = ggml.ggml_get_name(t).decode("utf-8", "replace")
                    want = state["recording"] and name in capture_names
                    if want:
                        run_state["pending"] = (i, name)
                    return want
                i, name = run_state.pop("pending", (None, None))
                if i is None:
                    return True
                val = read_value(t)
                if val is not None:
                    key = f"cap_{run_state['step']}_{i}"
                    run_state["arrays"][key] = val
                    tt = ctypes.cast(t, TP).contents
                    run_state["records"].append({
                        "step": run_state["step"], "index": i, "name": name, "key": key,
                        "op": ggml.ggml_op_desc(t).decode(),
                        "type": ggml.ggml_type_name(tt.type).decode().lower(),
                        "ne": [int(tt.ne[k]) for k in range(4)]})
            except Exception as e:  # cannot cross the C boundary
                if state["cb_error"] is None:
                    state["cb_error"] = e
            return True
        if not ask:
            return True
        if not state["recording"]:
            return False  # not needed: let the scheduler compute in bulk
        try:
            record(t)  # t arrives as an int address (c_void_p argument)
        except Exception as e:  # exceptions cannot cross the C boundary: stash and re-raise later
            if state["cb_error"] is None:
                state["cb_error"] = e
        return True

    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = L.llama_model_load_from_file(req["model_path"].encode(), mparams)
    if not model:
        raise RuntimeError("llama_model_load_from_file failed: " + "".join(errors or log_chunks[-20:]))

    cparams = L.llama_context_default_params()
    cparams.n_ctx = req["n_ctx"]
    cparams.n_batch = req["n_batch"]
    cparams.n_ubatch = req["n_ubatch"]
    cparams.n_seq_max = req.get("n_seq_max", 1)
    cparams.kv_unified = bool(req.get("kv_unified", False))
    cparams.n_threads = req["n_threads"]
    cparams.n_threads_batch = req["n_threads"]
    cparams.flash_attn_type = (L.LLAMA_FLASH_ATTN_TYPE_ENABLED if req["flash_attn"]
                               else L.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cparams.type_k = tid_of(req["type_k"])
    cparams.type_v = tid_of(req["type_v"])
    cparams.swa_full = req["swa_full"]
    cparams.offload_kqv = False
    # llama-embedding's --embedding: pooled embeddings (pooling type from the GGUF)
    cparams.embeddings = bool(req.get("embeddings", False))
    cparams.no_perf = True
    if mode == "graph" or (mode == "run" and capture_names):
        cparams.cb_eval = eval_cb
        cparams.cb_eval_user_data = None

    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        L.llama_model_free(model)
        raise RuntimeError("llama_init_from_model failed: " + "".join(errors or log_chunks[-20:]))

    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    def decode(pos0: int, n: int, n_out: int) -> int:
        batch = L.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i in range(n):
                p = pos0 + i
                batch.token[i] = (p * 7 + 3) % n_vocab
                batch.pos[i] = p
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i >= n - n_out else 0
            return int(L.llama_decode(ctx, batch))
        finally:
            L.llama_batch_free(batch)

    if mode == "run":
        return _run_steps(L, ctx, model, n_vocab, req, state, run_state, errors)

    rc_past = 0
    past = req["past"]
    done = 0
    while done < past:
        n = min(req["n_batch"], past - done)
        last = done + n == past
        rc_past = decode(done, n, 1 if last else 0)
        if rc_past != 0:
            break
        done += n
    if rc_past != 0:
        raise RuntimeError(f"llama_decode of the {past} past tokens returned {rc_past}: " + "".join(errors))

    state["recording"] = True
    rc = decode(past, req["tokens"], req["n_outputs"])
    state["recording"] = False
    L.llama_synchronize(ctx)
    if state["cb_error"] is not None:
        raise state["cb_error"]

    if mode == "graph" and rc != 0:
        hint = " (1 = no KV slot found: past + tokens > n_ctx?)" if rc == 1 else ""
        raise RuntimeError(f"llama_decode returned {rc}{hint}: " + "".join(errors))

    L.llama_free(ctx)   # destructor logs the exact compute buffer size (DEBUG)
    L.llama_model_free(model)

    if mode == "graph":
        return records
    return {"raw": "".join(log_chunks), "decode_rc": rc}


def _run_steps(L, ctx, model, n_vocab, req, state, run_state, errors) -> dict:  # pragma: no cover
    """The "run" mode: prompt, then decode/greedy steps; arrays go to ``req["npz"]``."""
    import ctypes
    import time

    import numpy as np

    def decode(tokens: list[int], pos0: int) -> float:
        n = len(tokens)
        batch = L.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == n - 1 else 0
            t0 = time.perf_counter()
            rc = int(L.llama_decode(ctx, batch))
            L.llama_synchronize(ctx)
            dt = time.perf_counter() - t0
        finally:
            L.llama_batch_free(batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}: " + "".join(errors))
        if state["cb_error"] is not None:
            raise state["cb_error"]
        return dt

    capture_steps = set(req.get("capture_steps") or ())
    steps, arrays, generated = [], run_state["arrays"], []
    todo = req["decode"]
    n_steps = len(todo) if todo is not None else req["greedy"]
    tokens, past = list(req["prompt"]), 0
    for step in range(n_steps + 1):
        run_state["step"] = step
        run_state["ask_index"] = 0
        state["recording"] = step in capture_steps
        dt = decode(tokens, past)
        state["recording"] = False
        ptr = L.llama_get_logits_ith(ctx, -1)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                       shape=(n_vocab,)).copy()
        arrays[f"logits_{step}"] = logits
        top = np.argsort(-logits, kind="stable")[:5]
        steps.append({"n_tokens": len(tokens), "past": past, "argmax": int(top[0]),
                      "top5": [[int(i), float(logits[i])] for i in top], "seconds": dt})
        past += len(tokens)
        if step == n_steps:
            break
        nxt = int(todo[step]) if todo is not None else int(top[0])
        if todo is None:
            generated.append(nxt)
        tokens = [nxt]
    np.savez(req["npz"], **arrays)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {"tokens": generated, "steps": steps, "capture_records": run_state["records"],
            "env": threading_env()}


_WORKER_LOG: list[str] = []
_WORKER_ERRORS: list[str] = []
_KEEPALIVE: list[Any] = []


def _answer(req: dict) -> bool:  # pragma: no cover
    """Run one request and print its answer line; False when it failed."""
    del _WORKER_LOG[:], _WORKER_ERRORS[:]
    try:
        out, ok = _worker(req), True
    except Exception as e:  # report (with the log so far) instead of a bare traceback
        import traceback
        traceback.print_exc()
        out, ok = {"error": f"{type(e).__name__}: {e}", "errors": "".join(_WORKER_ERRORS),
                   "raw": "".join(_WORKER_LOG)}, False
    sys.stdout.write(_MARK + json.dumps(out) + "\n")
    sys.stdout.flush()
    return ok


def _worker_main(argv: list[str]) -> int:  # pragma: no cover
    """``--serve``: one JSON request per stdin line until EOF or a failed request;
    otherwise ``argv[1]`` is one request.  Exits through ``os._exit`` (skipping interpreter
    teardown: ctypes callbacks / llama.cpp globals)."""
    if argv[1:] == ["--serve"]:
        while True:
            line = sys.stdin.readline()
            if not line or (line.strip() and not _answer(json.loads(line))):
                break
    else:
        _answer(json.loads(argv[1]))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_worker_main(sys.argv))
