"""Import the bundled Numba kernels as the package ``graphcost_kernels``.

``kernels/`` is data to the wheel (installed as ``graphcost/_bundled/kernels``; in a
source checkout it sits at the repository root), so it is not importable by name.
:func:`load_kernels` imports it from :func:`graphcost.resources.bundled` as a real
package, registered in ``sys.modules`` so the relative imports inside it resolve.
The kernels take their type facts (block sizes, vec_dot types) from
:mod:`graphcost.format.ggml_types`, which is importable wherever they are.

Numba's on-disk cache (``cache=True``) is keyed on each function's own source file,
not on the files it calls into: after editing ``quants.py`` a kernel in
``matmul.py`` would load stale machine code. The loader therefore stamps the
kernels' ``__pycache__`` with a digest of all kernel sources and the numba version,
and drops the numba cache files there (and in its subdirectories: the tests' caches for
other CPU models) when the stamp changes (best effort: an installed,
read-only copy never changes, and numba then caches elsewhere anyway).

Processes that compile at once share the cache safely: every numba cache save holds a
lock on its cache directory, and so does dropping a stale cache
(:mod:`graphcost.execute.numba_cache`).

It changes no setting process-wide (no environment variable, no thread count): other
libraries in the same process (llama.cpp's OpenMP threads among them) read those. The
save lock is the one change to numba itself, and it only serializes saves.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from graphcost.execute.numba_cache import guard_saves, locked
from graphcost.resources import bundled

PACKAGE = "graphcost_kernels"
_STAMP = "graphcost_kernels.sources"


def _sources_digest(root: Path) -> str:
    import numba

    h = hashlib.sha256(numba.__version__.encode())
    for path in sorted(root.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _drop_stale_numba_cache(root: Path) -> None:
    cache = root / "__pycache__"
    digest = _sources_digest(root)
    stamp = cache / _STAMP
    try:
        if stamp.is_file() and stamp.read_text() == digest:
            return
        cache.mkdir(exist_ok=True)
        with locked(cache):    # one process drops; another waits, then finds the stamp
            if stamp.is_file() and stamp.read_text() == digest:
                return
            # and the caches of other CPU models below it (cpu-*)
            for f in list(cache.rglob("*.nbi")) + list(cache.rglob("*.nbc")):
                f.unlink(missing_ok=True)
            stamp.write_text(digest)
    except OSError:
        pass  # read-only install: sources cannot have changed under the cache


def load_kernels() -> ModuleType:
    """The kernels package (imported once per process)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    root = bundled("kernels")
    init = root / "__init__.py"
    if not init.is_file():
        raise ImportError(f"graphcost kernels not found: {init} is missing")
    guard_saves()
    _drop_stale_numba_cache(root)
    spec = importlib.util.spec_from_file_location(PACKAGE, init,
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    return module
