"""The kernels' thread count, set only for the span of an explicit call and restored
after it: graphcost changes no process-wide setting that other code (another library's
Numba kernels, llama.cpp's OpenMP threads beside it) would read."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from graphcost.errors import SettingsError


def check_threads(threads: int | None, flag: str = "threads") -> int:
    """``threads`` (default: the threads Numba runs now), refused unless between 1 and
    NUMBA_NUM_THREADS (the threads Numba started); ``flag`` names it in the message."""
    import numba

    if threads is None:
        return numba.get_num_threads()
    top = numba.config.NUMBA_NUM_THREADS
    if not 1 <= threads <= top:
        raise SettingsError(f"{flag} {threads}: use 1 to {top} (the threads Numba started; "
                            "NUMBA_NUM_THREADS sets it)")
    return threads


@contextmanager
def kernel_threads(threads: int | None) -> Iterator[int]:
    """Run the block with Numba's parallel kernels on ``threads`` threads (None: as they
    are) and give the calling thread back its own count after it
    (``numba.set_num_threads`` is per calling thread). Yields the count in force."""
    import numba

    n = check_threads(threads)
    before = numba.get_num_threads()
    if n == before:
        yield n
        return
    numba.set_num_threads(n)
    try:
        yield n
    finally:
        numba.set_num_threads(before)
