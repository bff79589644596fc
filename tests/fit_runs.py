"""llama-fit-params on ggml-rpc-server devices, for tests/test_fit.py.

Free memory: the vendored ggml-rpc-server has no memory option; each server reports its
CPU backend's memory (ggml-cpu.cpp ``ggml_backend_cpu_device_get_memory``: free = total =
``sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE)``). Budgets are therefore set with the
fit's own margin, ``-fitt MiB``: target = free - margin on every device, and graphcost is
given the same free bytes and the same ``-fitt``.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from graphcost.judge.llama_tools import find_tool, missing_reason
from llama_runs import RUN_S, RpcServer

TOOLS = ("ggml-rpc-server", "llama-fit-params")
MiB = 1024 * 1024


def skip_reason() -> str | None:
    return missing_reason(*TOOLS)


def host_memory() -> int:
    """Bytes an RPC server backed by this machine's CPU reports as free."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def buft_names(servers: list[RpcServer]) -> dict[str, str]:
    """graphcost's device name -> llama.cpp's RPC buffer type name (one device per server)."""
    return {f"RPC{i}": f"RPC0[{s.endpoint}]" for i, s in enumerate(servers)}


def _rpc(servers: list[RpcServer]) -> list[str]:
    """``--rpc`` with the servers' endpoints; none: a CPU-only run."""
    return ["--rpc", ",".join(s.endpoint for s in servers)] if servers else []


def fit_params(model: Path, servers: list[RpcServer], args: list[str]) -> tuple[str, str]:
    """(the argument line llama-fit-params prints, in graphcost's device names; its log).
    Without servers (CPU-only) a failed fit (exit 1) gives the line ``failed``."""
    exe = find_tool("llama-fit-params")
    cmd = [str(exe), "-m", str(model)] + _rpc(servers) + ["-lv", "5"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_S, stdin=subprocess.DEVNULL)
    # exit 1 with nothing on stdout: the fit gave up (its "failed to fit CLI arguments"
    # line goes through the async log, which exit(1) often cuts off)
    if r.returncode == 1 and not r.stdout.strip():
        return "failed", r.stderr
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    line = r.stdout.strip().splitlines()[-1]
    for dev, buft in buft_names(servers).items():
        line = line.replace(f"={buft}", f"={dev}")
    return line, r.stderr


def llama_compute(model: Path, servers: list[RpcServer], base_args: list[str]):
    """compute(candidate) -> each device's compute buffer as llama.cpp's fit measures it
    (``llama-fit-params --fit-print on``: the no_alloc load of common_get_device_memory_data,
    whose ``sched_reserve: NAME compute buffer size = X MiB`` lines it logs at debug level;
    two decimals, so bytes within 0.005 MiB). A device without a line has 0 (llama.cpp logs
    sizes > 1 byte only). Without servers: the CPU's (the host row, ``Host``)."""
    exe = find_tool("llama-fit-params")
    names = buft_names(servers)
    # (graphcost's name, llama.cpp's buffer type, the row llama-fit-params prints)
    rows = ([(d, b, d) for d, b in names.items()] if servers else [("CPU", "CPU", "Host")])
    rx = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")

    def compute(c) -> list[int]:
        args = ["-c", str(c.n_ctx), "-ngl", str(c.n_gpu_layers)]
        if any(x != 0 for x in c.tensor_split):
            args += ["-ts", ",".join(repr(x) for x in c.tensor_split)]
        if c.overrides:
            args += ["-ot", ",".join(f"{o.pattern}={names.get(o.target, o.target)}"
                                     for o in c.overrides)]
        cmd = [str(exe), "-m", str(model)] + _rpc(servers) + ["-fitp", "on", "-lv", "5"] \
            + base_args + args
        for _ in range(12):  # the async log loses its tail at exit, often under load
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_S,
                               stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
            logged = {name: float(v) for name, v in rx.findall(r.stderr)}
            # stdout (printf, synchronous): "RPC0 model context compute" in whole MiB; the
            # debug log is written by a thread and can lose lines at exit: then run again
            printed = {row.split()[0]: [int(x) for x in row.split()[1:4]]
                       for row in r.stdout.splitlines() if row.split()}
            # sched_reserve logs its "graph: nodes = ..." line after every buffer's line:
            # with it, a device without a line has a compute buffer of at most 1 byte
            if not re.search(r"sched_reserve: graph: nodes = ", r.stderr):
                continue
            out = [round(logged.get(buft, 0.0) * MiB) for _, buft, _ in rows]
            for (_, buft, row), n in zip(rows, out):
                assert n // MiB == printed[row][2], (cmd, logged, printed)
            return out
        raise RuntimeError(f"{' '.join(cmd)}: the log lost its sched_reserve lines in 12 runs")
    return compute


def peak_bytes(server: RpcServer, since: int) -> int:
    """The most bytes the server held at once in its log after offset ``since``
    (GGML_RPC_DEBUG: ``[alloc_buffer] ... remote_ptr: P, remote_size: N`` and
    ``[free_buffer] remote_ptr: P``), to the byte."""
    text = server.log.read_bytes()[since:].decode(errors="replace")
    live: dict[str, int] = {}
    peak = 0
    for m in re.finditer(r"\[alloc_buffer\] device: \d+, size: \d+ -> remote_ptr: (\w+), "
                         r"remote_size: (\d+)|\[free_buffer\] remote_ptr: (\w+)", text):
        if m.group(1):
            live[m.group(1)] = int(m.group(2))
            peak = max(peak, sum(live.values()))
        else:
            live.pop(m.group(3), None)
    return peak
