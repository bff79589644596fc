"""llama.cpp's command-line tools, built from the source llama-cpp-python vendors.

The multi-device proof (tests/test_devices_rpc.py) runs real llama.cpp with several
devices on one machine: ``ggml-rpc-server`` processes on 127.0.0.1, and
``llama-completion --rpc ...`` logging every device's buffers. Those tools are not part of
the llama-cpp-python wheel, so they are built once, from the same llama.cpp source
(``vendor/llama.cpp`` of the llama-cpp-python sdist), with ``GGML_RPC=ON``, into a cache
directory keyed by llama-cpp-python's version:

    <user cache dir>/llama-tools-<version>-build/bin
    (Linux: ~/.cache/graphcost/llama-tools-0.3.36-build/bin; platformdirs.user_cache_dir)

Building is a manual step (minutes; tests never build, they skip with the reason)::

    python -c "from graphcost.judge.llama_tools import build; build('/path/to/llama_cpp_python-0.3.36')"

which runs ``cmake -S <src>/vendor/llama.cpp -B <cache> -G Ninja -DGGML_RPC=ON
-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release`` and builds the targets in
:data:`TOOLS`. ``GRAPHCOST_LLAMA_TOOLS`` overrides the directory the tools are looked up in.
"""
from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

#: the tools the proof needs (cmake target names = binary names; tools/rpc/CMakeLists.txt
#: names the RPC server ``ggml-rpc-server``), and ``test-backend-ops`` (tests/CMakeLists.txt,
#: with LLAMA_BUILD_TESTS): its ``perf`` mode times one op, benchmarks/bench_kernels.py's
#: ``--beside-llama-cpp``
TOOLS = ("ggml-rpc-server", "llama-completion", "llama-fit-params", "llama-bench",
         "test-backend-ops")


def llama_cpp_version() -> str | None:
    """llama-cpp-python's installed version (the key of the build cache), or None."""
    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def build_dir(version: str | None = None) -> Path:
    """Where the tools of this llama-cpp-python version are (or would be) built."""
    from platformdirs import user_cache_dir
    v = version or llama_cpp_version() or "unknown"
    return Path(user_cache_dir("graphcost")) / f"llama-tools-{v}-build"


def bin_dir() -> Path:
    env = os.environ.get("GRAPHCOST_LLAMA_TOOLS")
    return Path(env) if env else build_dir() / "bin"


def find_tool(name: str) -> Path | None:
    """The executable ``name`` (e.g. ``llama-completion``, ``ggml-rpc-server``) if built."""
    p = bin_dir() / name
    return p if p.is_file() and os.access(p, os.X_OK) else None


def missing_reason(*names: str) -> str | None:
    """None when every tool is built, else one sentence saying what is missing and how to
    build it (for pytest.skip)."""
    missing = [n for n in names if find_tool(n) is None]
    if not missing:
        return None
    return (f"llama.cpp tools {', '.join(missing)} not built in {bin_dir()} (build them once "
            "with graphcost.judge.llama_tools.build(<llama_cpp_python sdist dir>); see its docstring)")


def build(sdist: str | os.PathLike, jobs: int | None = None, version: str | None = None) -> Path:
    """Configure and build :data:`TOOLS` from ``<sdist>/vendor/llama.cpp`` with GGML_RPC=ON
    into :func:`build_dir`; returns the bin directory. A manual step: minutes of compiling."""
    src = Path(sdist) / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{src}: no llama.cpp source (give the llama_cpp_python sdist directory)")
    out = build_dir(version)
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DGGML_RPC=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=ON",
                    "-DCMAKE_BUILD_TYPE=Release"],
                   check=True)
    cmd = ["cmake", "--build", str(out), "--target", *TOOLS]
    if jobs:
        cmd += ["-j", str(jobs)]
    subprocess.run(cmd, check=True)
    return out / "bin"
