"""Real llama.cpp multi-device runs on one machine, for tests/test_devices_rpc.py.

``ggml-rpc-server`` processes on 127.0.0.1 stand in for devices (each backed by this
machine's CPU backend); ``llama-completion --rpc ...`` loads a model across them and logs
every buffer it allocates. The tools come from :mod:`graphcost.judge.llama_tools` (built once,
never by the tests); :func:`skip_reason` says why a test cannot run.
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from graphcost.judge.llama_tools import find_tool, missing_reason

TOOLS = ("ggml-rpc-server", "llama-completion")
#: seconds a server or a run may take before the test gives up on it
SERVER_START_S = 30
RUN_S = 120


def skip_reason() -> str | None:
    return missing_reason(*TOOLS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RpcServer:
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def mark(self) -> int:
        """The log's length now: :meth:`alloc_sizes` from here covers one run."""
        return self.log.stat().st_size

    def alloc_sizes(self, since: int = 0) -> list[int]:
        """Bytes of every buffer the server allocated (GGML_RPC_DEBUG's alloc_buffer
        lines), from byte ``since`` of its log on."""
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return [int(m) for m in re.findall(r"\[alloc_buffer\] device: \d+, size: (\d+) ->", text)]


@contextlib.contextmanager
def rpc_servers(n: int, workdir: Path):
    """Start ``n`` ggml-rpc-server processes on free 127.0.0.1 ports (one thread each,
    GGML_RPC_DEBUG on, so they log each allocation's exact size); always stopped on exit."""
    exe = find_tool("ggml-rpc-server")
    servers: list[RpcServer] = []
    try:
        for i in range(n):
            port = _free_port()
            log = workdir / f"rpc{i}.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                                        stdout=f, stderr=subprocess.STDOUT,
                                        env={**os.environ, "GGML_RPC_DEBUG": "1"})
            servers.append(RpcServer(port, proc, log))
        deadline = time.monotonic() + SERVER_START_S
        for s in servers:
            while True:
                if s.proc.poll() is not None:
                    raise RuntimeError(f"ggml-rpc-server exited: {s.log.read_text()[-2000:]}")
                with socket.socket() as c:
                    if c.connect_ex(("127.0.0.1", s.port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ggml-rpc-server on port {s.port} did not start")
                time.sleep(0.1)
        yield servers
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.terminate()
        for s in servers:
            try:
                s.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()


@dataclass
class Buffers:
    """The buffers one llama.cpp run logged, MiB as printed, by buffer name (a list: one
    entry per line, e.g. one KV buffer per cache of an ISWA model)."""

    model: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    kv: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: llama_memory_recurrent: "NAME RS buffer size" (recurrent states)
    rs: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    output: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    compute: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: ~llama_context (debug): "NAME compute buffer size is X MiB" (four decimals)
    compute4: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    #: sched_reserve: "graph: nodes = A, splits = B" or "... splits = Bpp / Btg"
    splits: tuple[int, int] | None = None
    layers: dict[int, str] = field(default_factory=dict)  # layer (n_layer = output) -> device
    log: str = ""


_LINES = {
    "model": re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB"),
    "rs": re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB"),
    "compute": re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB"),
    "compute4": re.compile(r"~llama_context:\s+(\S+) compute buffer size is\s+([\d.]+) MiB"),
}


def parse_buffers(log: str) -> Buffers:
    """Every ``... buffer size = X MiB`` line, by buffer name."""
    b = Buffers(log=log)
    for kind, rx in _LINES.items():
        for name, mib in rx.findall(log):
            getattr(b, kind)[name].append(float(mib))
    m = re.search(r"sched_reserve: graph.*?: nodes = [\d /]+, splits = (\d+)(?: / (\d+))?", log)
    if m:
        b.splits = (int(m.group(1)), int(m.group(2) or m.group(1)))
    # load_tensors (debug, -lv 5): "layer   3 assigned to device RPC0, is_swa = 0"
    for il, dev in re.findall(r"layer\s+(\d+) assigned to device (\S+),", log):
        b.layers[int(il)] = dev
    return b


def run_completion(model: Path, servers: list[RpcServer], args: list[str]) -> Buffers:
    """``llama-completion -m MODEL --rpc ... ARGS -p hi -if``: the prompt decoded, fit off,
    the buffers it logged. Raises with the log's tail when llama.cpp fails.

    llama.cpp writes its log from a worker thread (common_log) that nothing joins at exit,
    so a run that ends at once can lose its last lines; on a loaded machine it lost
    everything after graph_reserve, sched_reserve's buffer lines included, three runs in a
    row. So the run is interactive-first (``-if``): it decodes the prompt, then waits for
    input, and its stdin is closed (EOF: it exits) only once sched_reserve's last line has
    been read. (``-i`` would also decode the sampled token, one more graph: with ``-sm
    tensor`` a one-token qwen3moe graph trips a GGML_ASSERT in ggml-backend-meta.cpp.)"""
    exe = find_tool("llama-completion")
    cmd = [str(exe), "-m", str(model), "-n", "1", "-p", "hi", "-no-cnv", "-if", "-fit", "off",
           "-t", "1", "--no-warmup", "--seed", "1",
           "-lv", "5"]  # buffer lines: verbosity 4 (info); layer devices: 5 (debug)
    if servers:
        cmd += ["--rpc", ",".join(s.endpoint for s in servers)]
    cmd += args
    return parse_buffers(run_interactive(cmd))


#: sched_reserve's last line: every buffer line of a run comes before it
BUFFERS_LOGGED = "sched_reserve: graph"


def run_interactive(cmd: list[str], env: dict | None = None, timeout: float = RUN_S) -> str:
    """stdout + stderr of an interactive llama-completion ``cmd`` (``-if``): its stdin is a
    pipe, closed once sched_reserve's last line (``sched_reserve: graph ...``) has been read
    from stderr. Raises with the log's tail if it fails or never logs that line; killed
    after ``timeout`` seconds."""
    rc, log = run_until_buffers(cmd, env, timeout)
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({rc}):\n{log[-3000:]}")
    return log


def run_until_buffers(cmd: list[str], env: dict | None = None,
                      timeout: float = RUN_S) -> tuple[int, str]:
    """(exit status, stdout + stderr) of :func:`run_interactive`'s run, whatever its exit
    once its buffer lines are out (a run that dies after them still logged every buffer).
    Raises with the log's tail if it never logs sched_reserve's last line."""
    rc, log = _run_until(cmd, BUFFERS_LOGGED, env, timeout)
    if BUFFERS_LOGGED not in log:
        raise RuntimeError(f"{' '.join(cmd)} exited ({rc}) without sched_reserve's lines:\n"
                           f"{log[-3000:]}")
    return rc, log


def amx_skip_reason() -> str | None:
    """Why a test that needs llama.cpp's prompt on this CPU skips where its AMX buffer type
    is compiled in (AMX_INT8 and AVX512_VNNI); None elsewhere."""
    from graphcost.memory.backends import host_cpu_features
    if {"amx_int8", "avx512_vnni"} <= host_cpu_features():
        return ("this CPU has AMX_INT8 and AVX512_VNNI: graphcost's AMX buffers were checked "
                "against llama.cpp on a Sapphire Rapids host (benchmarks/check_cuda.py --amx), "
                "whose prompt through the AMX kernels died of SIGILL; this test needs that "
                "prompt")
    return None


def _run_until(cmd: list[str], marker: str, env: dict | None,
               timeout: float) -> tuple[int, str]:
    """Run ``cmd`` with its stdin a pipe, closed once a stderr line containing ``marker`` has
    been read (or stderr ends). Returns (exit status, stdout + stderr)."""
    # the prompt's echo from a random model may be any bytes: decode leniently
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace",
                         env=env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)
    reader.start()
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    err: list[str] = []
    try:
        for line in p.stderr:
            err.append(line)
            if marker in line and not p.stdin.closed:
                p.stdin.close()
        if not p.stdin.closed:
            p.stdin.close()
        rc = p.wait()
        reader.join()
    finally:
        timer.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, "".join(out) + "".join(err)
