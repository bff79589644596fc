"""Numba's on-disk cache, made safe for processes that compile the same kernels at once.

Numba saves a compiled overload by reading the function's index file, adding the new
signature with the first free data-file number, and writing both back
(``numba.core.caching.IndexDataCacheFile.save``). Two processes that save overloads of
one function at once (two cold ``graphcost profile`` runs started together, say) both
read the same index, both pick data file 1, and the last to write wins the data
file while the index may name the other's signature: a later process would load the
machine code of one signature for another.

:func:`guard_saves` wraps that method so that each save holds an exclusive ``flock`` on
a lock file in the cache directory (``.graphcost-save.lock``) from reading the index to
writing the data. Loads need no lock: numba writes every file to a temporary name and
renames it into place. Where ``fcntl`` is missing (Windows) or the lock file cannot be
made (a read-only cache), the save runs as numba wrote it.

:func:`locked` is the same lock for graphcost's own cache housekeeping
(:mod:`graphcost.execute.kernels_loader` dropping a stale cache).
"""
from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

try:
    import fcntl
except ImportError:     # pragma: no cover - Windows
    fcntl = None

#: the lock file's name in each numba cache directory
LOCK_NAME = ".graphcost-save.lock"


@contextlib.contextmanager
def locked(directory: str | os.PathLike) -> Iterator[bool]:
    """Hold the exclusive lock of cache ``directory`` while the block runs; yields
    whether it is held (False: no ``fcntl``, or the lock file could not be opened)."""
    fd = -1
    if fcntl is not None:
        try:
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd >= 0
    finally:
        if fd >= 0:
            os.close(fd)            # closing the descriptor releases the lock


def guard_saves() -> bool:
    """Make every numba cache save in this process hold :func:`locked` on its cache
    directory (once per process; later calls do nothing). Returns whether the guard is
    in place (False where this numba has no ``IndexDataCacheFile.save``)."""
    from numba.core import caching

    cls = getattr(caching, "IndexDataCacheFile", None)
    save = getattr(cls, "save", None)
    if save is None:
        return False
    if getattr(save, "graphcost_locked", False):
        return True

    @functools.wraps(save)
    def locked_save(self, key, data):
        with locked(self._cache_path):
            return save(self, key, data)

    locked_save.graphcost_locked = True
    cls.save = locked_save
    return True
