"""graphcost.execute.numba_cache: numba's cache saves hold a lock on their directory."""
from __future__ import annotations

import threading

import pytest

from graphcost.execute import numba_cache

pytestmark = pytest.mark.skipif(numba_cache.fcntl is None, reason="flock needs fcntl")


def _cache_file(tmp_path):
    from numba.core.caching import IndexDataCacheFile

    return IndexDataCacheFile(str(tmp_path), "f-1.py311", source_stamp=(1.0, 10))


def test_a_save_waits_while_another_holds_the_cache_lock(tmp_path):
    assert numba_cache.guard_saves() and numba_cache.guard_saves()     # idempotent
    f = _cache_file(tmp_path)
    index = tmp_path / "f-1.py311.nbi"
    with numba_cache.locked(tmp_path) as held:     # another process's save, under way
        assert held
        t = threading.Thread(target=f.save, args=(("sig-a", "cpu"), b"code of a"))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not index.exists()   # it waits for the lock
    t.join(10)
    assert not t.is_alive()
    assert f.load(("sig-a", "cpu")) == b"code of a"
    # a second signature gets the next data file, not the first one again
    f.save(("sig-b", "cpu"), b"code of b")
    assert f.load(("sig-a", "cpu")) == b"code of a"
    assert f.load(("sig-b", "cpu")) == b"code of b"
    assert sorted(p.name for p in tmp_path.glob("*.nbc")) == ["f-1.py311.1.nbc",
                                                                "f-1.py311.2.nbc"]
    assert (tmp_path / numba_cache.LOCK_NAME).exists()


def test_an_unwritable_cache_saves_unlocked(tmp_path):
    # the lock file cannot be made: the block runs without it (numba then fails or
    # falls back as it would have)
    with numba_cache.locked(tmp_path / "missing") as held:
        assert not held


def test_loading_the_kernels_guards_numba_saves():
    from numba.core import caching

    from graphcost.execute.kernels_loader import load_kernels

    load_kernels()
    assert caching.IndexDataCacheFile.save.graphcost_locked


def test_a_stale_cache_is_dropped_once(tmp_path):
    # the loader's housekeeping (under the same lock): a process that finds the stamp
    # current, as one that waited for another's drop does, deletes nothing
    from graphcost.execute import kernels_loader as kl

    root = tmp_path / "kernels"
    (root / "__pycache__").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "__pycache__" / "a.f-1.py311.nbi").write_bytes(b"stale")
    kl._drop_stale_numba_cache(root)
    assert not (root / "__pycache__" / "a.f-1.py311.nbi").exists()
    (root / "__pycache__" / "a.f-1.py311.nbi").write_bytes(b"fresh")
    kl._drop_stale_numba_cache(root)          # stamp current: nothing dropped
    assert (root / "__pycache__" / "a.f-1.py311.nbi").read_bytes() == b"fresh"
    assert (root / "__pycache__" / kl._STAMP).read_text() == kl._sources_digest(root)
