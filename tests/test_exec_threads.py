"""The kernels' thread count is set only inside an explicit, scoped call (issue 10):
``kernel_threads`` sets Numba's count for its block and gives the caller's back, also
when the block raises; a count Numba cannot run is refused in one line. No kernel is
compiled here."""
from __future__ import annotations

import numba
import pytest

from graphcost.errors import SettingsError
from graphcost.execute.threads import check_threads, kernel_threads


@pytest.fixture
def other():
    """A thread count other than the current one (needs NUMBA_NUM_THREADS >= 2)."""
    now, top = numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS
    if top < 2:
        pytest.skip("one Numba thread only (NUMBA_NUM_THREADS=1): no other count to set")
    return 1 if now != 1 else 2


def test_the_count_holds_inside_the_block_and_is_given_back(other):
    before = numba.get_num_threads()
    with kernel_threads(other) as n:
        assert n == other and numba.get_num_threads() == other
    assert numba.get_num_threads() == before
    with pytest.raises(RuntimeError), kernel_threads(other):
        raise RuntimeError("a kernel failed")
    assert numba.get_num_threads() == before


def test_none_keeps_the_count_and_a_bad_count_is_refused():
    before = numba.get_num_threads()
    with kernel_threads(None) as n:
        assert n == before == numba.get_num_threads()
    top = numba.config.NUMBA_NUM_THREADS
    for bad in (0, top + 1):
        with pytest.raises(SettingsError, match=rf"threads {bad}: use 1 to {top} "):
            check_threads(bad)
    assert numba.get_num_threads() == before
