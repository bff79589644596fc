"""The executor model (graphcost.cost.hardware.executor_seconds: the probe's per-op-kind cost
curves and per-type peaks) and the profile's untimed rate and model columns, on documents
and rows built here: exact arithmetic, no kernels run, no timing."""
from __future__ import annotations

import numpy as np
import pytest

from graphcost.cost import hardware as hwmod
from graphcost.cost.hardware import curve_seconds, executor_seconds, roofline_seconds
from graphcost.errors import GraphcostError
from graphcost.execute.profile import NodeRow, Profile, StepRow
from graphcost.report.profile import document, render_table

#: bytes, flops, seconds: 2 us up to 1000 B, then 1 ns/B to 3000 B, then 2 ns/B to 7000 B
CURVE = [[3000, 30, 4e-6], [1000, 10, 2e-6], [7000, 70, 12e-6]]


def measured(**extra) -> hwmod.Hardware:
    doc = {"name": "m", "kind": "measured",
           "memory_bandwidth": {"bytes_per_second": 20e9, "by_type": {"q4_K": 16e9}},
           "peak_flops": {"flops_per_second": 100e9, "by_type": {"q4_K": 40e9}},
           "op_overhead": {"seconds": 5e-6, "by_op": {"MUL_MAT": 3e-6}}}
    doc.update(extra)
    return hwmod.parse(doc, None)


@pytest.mark.parametrize("nbytes,seconds", [
    (500, 2e-6),                       # below the smallest size: its time (the fixed cost)
    (1000, 2e-6),
    (2000, 3e-6),                      # 2 us + (4 - 2) us * 1000 / 2000
    (5000, 8e-6),                      # 4 us + (12 - 4) us * 2000 / 4000
    (9000, 16e-6),                     # past the largest: 12 us + 2 ns/B * 2000 B
], ids=["below", "first", "first_segment", "last_segment", "beyond"])
def test_curve_interpolates_between_measured_sizes(nbytes, seconds):
    assert curve_seconds(sorted(CURVE), nbytes) == pytest.approx(seconds, rel=1e-12)


def test_curve_edge_cases():
    assert curve_seconds([[100, 0, 7e-6]], 10_000) == 7e-6            # one point: flat
    # a last segment that goes down (noise) is carried on flat, never below its end
    assert curve_seconds([[100, 0, 9e-6], [200, 0, 8e-6]], 10_000) == 8e-6


def test_model_uses_the_curve_of_the_op_and_of_the_weight_type():
    hw = measured(op_costs={"by_op": {"GEGLU": CURVE}, "matvec": {"q4_K": CURVE}})
    assert hw.op_curve("GEGLU") == sorted(CURVE)
    assert hw.op_curve("MUL_MAT", "q4_K") == sorted(CURVE)
    assert hw.op_curve("MUL_MAT", "q8_0") is None and hw.op_curve("ADD") is None
    # GEGLU at 2000 B: the curve's 3 us (20 kFLOP / 100 GFLOP/s = 0.2 ns is below it)
    assert executor_seconds("GEGLU", 2000, 20e3, hw) == pytest.approx(3e-6)
    # a matvec: the type's curve, 5000 B -> 8 us
    assert executor_seconds("MUL_MAT", 5000, 1e4, hw, "q4_K") == pytest.approx(8e-6)
    # many rows: 1 GFLOP over q4_K's own peak of 40 GFLOP/s = 25 ms, above the curve
    assert executor_seconds("MUL_MAT", 5000, 1e9, hw, "q4_K") == pytest.approx(25e-3)
    # no curve for q8_0 or ADD: per-op overhead + roofline (q8_0: no rate -> bandwidth)
    # 80 MB / 20 GB/s = 4 ms + MUL_MAT's 3 us
    assert executor_seconds("MUL_MAT", 80e6, 1e8, hw, "q8_0") == pytest.approx(4.003e-3)
    # 2 MB / 20 GB/s = 100 us + the median overhead 5 us
    assert executor_seconds("ADD", 2e6, 5e5, hw) == pytest.approx(1.05e-4)


def test_model_reads_the_after_matmul_curve_whatever_ran_before():
    """``by_op_chained`` (the call repeated after a small op) is measured but not
    modelled: a decode's SCALE after a ROPE and SET_ROWS after a SET_ROWS take what the
    probe's call right after a matmul takes (docs/executor.md)."""
    hot = [[1000, 10, 1e-6], [7000, 70, 3e-6]]
    hw = measured(op_costs={"by_op": {"RMS_NORM": CURVE}, "by_op_chained": {"RMS_NORM": hot}})
    # by_op's point at 3000 B: 4 us (the chained curve would give 1 + 2 * 2000 / 6000 us)
    assert executor_seconds("RMS_NORM", 3000, 0, hw) == pytest.approx(4e-6)
    assert hw.op_curve("RMS_NORM") == sorted(CURVE)


def test_get_rows_from_an_activation_has_a_curve_of_its_own():
    """The token embedding gather (rows of a weight table, from memory) and the last
    layer's row select (rows of an activation in the caches) are modelled apart (issue
    12); a profile without the activation's curve models both with GET_ROWS's."""
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    g = Graph()
    table = g.new_tensor(gt.GGMLType.Q8_0, [64, 10], role="weight")
    cur = g.add(g.new_tensor(gt.F32, [64, 3]), g.new_tensor(gt.F32, [64, 3]))
    ids = g.new_tensor(gt.I32, [1])
    assert hwmod.model_op(g.get_rows(table, ids)) == "GET_ROWS"
    assert hwmod.model_op(g.get_rows(cur, ids)) == hwmod.GET_ROWS_ACTIVATION \
        == "GET_ROWS@activation"
    assert hwmod.model_op(cur) == "ADD"
    act = [[1000, 0, 1e-6], [7000, 0, 3e-6]]
    hw = measured(op_costs={"by_op": {"GET_ROWS": CURVE, "GET_ROWS@activation": act}})
    # 3000 B: the table's curve 4 us; the activation's 1 + 2 * 2000 / 6000 us
    assert executor_seconds("GET_ROWS", 3000, 0, hw) == pytest.approx(4e-6)
    assert executor_seconds(hwmod.GET_ROWS_ACTIVATION, 3000, 0, hw) == pytest.approx(
        (1 + 2 * 2000 / 6000) * 1e-6)
    hw0 = measured(op_costs={"by_op": {"GET_ROWS": CURVE}})
    assert executor_seconds(hwmod.GET_ROWS_ACTIVATION, 3000, 0, hw0) == pytest.approx(4e-6)


def test_a_gather_of_repeated_rows_costs_its_distinct_rows_plus_warm_repeats():
    """issue 12: the probe gathers distinct rows; a prompt's token ids repeat (the
    bench_profile prompt: 10 distinct of 21), and a repeated row was just read. The gather
    is modelled as its distinct rows' (at the node's warmth) plus the repeats at the warm
    curve: warm(all rows) - warm(distinct rows)."""
    since = {"by_op": {"GET_ROWS": 2e6}, "by_op_cold": {"GET_ROWS": 8e6}}
    hw = measured(op_costs={"by_op": {"GET_ROWS": CURVE}, "by_op_cold": {"GET_ROWS": COLD},
                            "since_bytes": since})
    # 6000 B, half of the rows distinct, cold (since 8 MB): the distinct half, 3000 B on
    # the cold curve, 10 + 20 * 2000 / 6000 us; the repeats, warm(6000 B) - warm(3000 B)
    # = (4 + 8 * 3000 / 4000) - 4 = 6 us
    assert executor_seconds("GET_ROWS", 6000, 0, hw, since=8e6, distinct=0.5) == \
        pytest.approx((10 + 20 * 2000 / 6000 + 6) * 1e-6)
    # every row distinct: the cold curve at 6000 B, 10 + 20 * 5000 / 6000 us
    assert executor_seconds("GET_ROWS", 6000, 0, hw, since=8e6) == \
        pytest.approx((10 + 20 * 5000 / 6000) * 1e-6)
    # warm (no since): 4 us at 3000 B + 6 us of repeats = warm(6000 B), 10 us
    assert executor_seconds("GET_ROWS", 6000, 0, hw, distinct=0.5) == pytest.approx(10e-6)


def test_distinct_share_reads_the_token_ids_of_the_embedding_gather_only():
    from graphcost.execute.profile import distinct_share
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    g = Graph()
    table = g.new_tensor(gt.GGMLType.Q8_0, [64, 300], role="weight")
    ids = g.new_tensor(gt.I32, [6])
    emb = g.get_rows(table, ids)
    assert distinct_share(emb, [5, 7, 5, 9, 7, 5]) == 3 / 6          # 5, 7, 9
    assert distinct_share(emb, [1, 2, 3, 4, 5, 6]) == 1.0
    assert distinct_share(emb, [5, 5]) == 1.0                        # not this step's ids
    act = g.add(g.new_tensor(gt.F32, [64, 6]), g.new_tensor(gt.F32, [64, 6]))
    assert distinct_share(g.get_rows(act, ids), [5, 5, 5, 5, 5, 5]) == 1.0   # an activation
    assert distinct_share(act, [5, 5, 5, 5, 5, 5]) == 1.0


@pytest.mark.parametrize("since,share", [
    (1e6, 0.0),                        # below the warm curve's figure: warm
    (2e6, 0.0),
    (4e6, 0.5),                        # log(4/2) / log(8/2) = 1/2
    (2e6 * 2 ** 1.5, 0.75),            # log(2^1.5) / log(4) = 1.5 / 2
    (8e6, 1.0),
    (171e6, 1.0),                      # past the cold curve's figure: cold
], ids=["below", "warm", "half", "three_quarters", "cold", "beyond"])
def test_cold_share_is_log_linear_between_the_probes_two_figures(since, share):
    assert hwmod.cold_share(since, 2e6, 8e6) == pytest.approx(share, abs=1e-12)


def test_streamed_since_counts_back_to_the_kinds_last_node_a_step_taken_as_repeating():
    from graphcost.execute.profile import streamed_since
    # a step of A(1 B) B(2) A(4) C(8), 15 B in all, run again and again:
    # A first: since the A of the step before, C's 8; B, the only B: since itself a step
    # before, 4 + 8 + 1 = 13; A second: since the first A, B's 2; C: 1 + 2 + 4 = 7
    assert streamed_since(["A", "B", "A", "C"], [1, 2, 4, 8]) == [8, 13, 2, 7]
    assert streamed_since(["A"], [5]) == [0]       # one node: nothing ran in between
    assert streamed_since([], []) == []


#: a cold curve: 10 us at 1000 B, 30 us at 7000 B
COLD = [[1000, 10, 10e-6], [7000, 70, 30e-6]]


def test_a_node_whose_kind_ran_long_ago_moves_toward_the_cold_curve():
    """issue 12: a step's first node of its kind, after the output matmul (layer 0's GEGLU,
    the token embedding gather), meets its code and tables out of the caches; the probe
    times each kind right after a flush (by_op_cold) and says how much streamed since the
    kind last ran at the calls of both curves (since_bytes)."""
    since = {"by_op": {"GEGLU": 2e6}, "by_op_cold": {"GEGLU": 8e6},
             "by_op_tokens": {"GEGLU": 1e6}, "by_op_tokens_cold": {"GEGLU": 4e6}}
    rows = [[1000, 10, 20e-6], [7000, 70, 40e-6]]
    hw = measured(op_costs={"by_op": {"GEGLU": CURVE}, "by_op_cold": {"GEGLU": COLD},
                            "by_op_tokens": {"GEGLU": rows},
                            "by_op_tokens_cold": {"GEGLU": [[1000, 10, 60e-6]]},
                            "since_bytes": since})
    assert hw.warmth_curves("GEGLU") == [(2e6, sorted(CURVE)), (8e6, COLD)]
    assert hw.warmth_curves("ADD") == []
    # 3000 B: warm 4 us, cold 10 + 20 * 2000 / 6000 us = 16.67 us
    cold_3000 = (10 + 20 * 2000 / 6000) * 1e-6
    assert executor_seconds("GEGLU", 3000, 0, hw) == pytest.approx(4e-6)
    assert executor_seconds("GEGLU", 3000, 0, hw, since=1.5e6) == pytest.approx(4e-6)
    assert executor_seconds("GEGLU", 3000, 0, hw, since=8e6) == pytest.approx(cold_3000)
    # 4 MB since: half way (cold_share 0.5)
    assert executor_seconds("GEGLU", 3000, 0, hw, since=4e6) == pytest.approx(
        4e-6 + 0.5 * (cold_3000 - 4e-6))
    # several tokens: the curves measured on several tokens and their figures; 2 MB is
    # log(2/1) / log(4/1) = half way from 20 + 20 * 2000 / 6000 us to 60 us
    warm_rows = (20 + 20 * 2000 / 6000) * 1e-6
    assert executor_seconds("GEGLU", 3000, 0, hw, tokens=16, since=2e6) == pytest.approx(
        warm_rows + 0.5 * (60e-6 - warm_rows))
    # a profile without the figures, or with figures that do not grow: the warm curve
    for oc in ({"by_op": {"GEGLU": CURVE}, "by_op_cold": {"GEGLU": COLD}},
               {"by_op": {"GEGLU": CURVE}, "by_op_cold": {"GEGLU": COLD},
                "since_bytes": {"by_op": {"GEGLU": 8e6}, "by_op_cold": {"GEGLU": 8e6}}}):
        assert executor_seconds("GEGLU", 3000, 0, measured(op_costs=oc),
                                since=171e6) == pytest.approx(4e-6)
    # matmuls have no cold curve: their weights stream from memory either way
    hw_mm = measured(op_costs={"matvec": {"q4_K": CURVE}, "by_op_cold": {"MUL_MAT": COLD},
                               "since_bytes": {"by_op": {"MUL_MAT": 1.0},
                                               "by_op_cold": {"MUL_MAT": 2.0}}})
    assert executor_seconds("MUL_MAT", 5000, 1e4, hw_mm, "q4_K", since=1e9) == \
        pytest.approx(8e-6)


#: middle curves: 6 us at 1000 B, 18 us at 7000 B; 5 us flat
MID = [[1000, 10, 6e-6], [7000, 70, 18e-6]]
MID2 = [[1000, 10, 5e-6], [7000, 70, 5e-6]]


def test_the_middle_curve_places_a_node_a_layer_after_its_kind_ran():
    """The probe's middle curves (by_op_midN: each call after a matvec over N MiB of
    weights, as a layer's matvecs stream between two GEGLUs) are measured between the warm
    and the cold figures: a node between two neighbouring figures moves log-linearly
    between those two curves; a middle figure not between warm and cold is not read."""
    since = {"by_op": {"GEGLU": 1e6}, "by_op_mid2": {"GEGLU": 2e6}, "by_op_mid8": {"GEGLU": 4e6},
             "by_op_cold": {"GEGLU": 64e6}, "by_op_tokens": {"GEGLU": 1e6},
             "by_op_tokens_mid8": {"GEGLU": 4e6}, "by_op_tokens_cold": {"GEGLU": 64e6}}
    hw = measured(op_costs={"by_op": {"GEGLU": CURVE}, "by_op_mid8": {"GEGLU": MID},
                            "by_op_mid2": {"GEGLU": MID2},
                            "by_op_cold": {"GEGLU": COLD}, "since_bytes": since})
    assert hw.warmth_curves("GEGLU") == [(1e6, sorted(CURVE)), (2e6, MID2), (4e6, MID),
                                         (64e6, COLD)]
    # at 3000 B: warm 4 us, middle 5 us and 6 + 12 * 2000 / 6000 = 10 us, cold 16.67 us
    warm, mid2, mid, cold = 4e-6, 5e-6, 10e-6, (10 + 20 * 2000 / 6000) * 1e-6
    assert executor_seconds("GEGLU", 3000, 0, hw, since=1e6) == pytest.approx(warm)
    # 1.41 MB: log(2^0.5) / log(2) = half way from warm to the 2 MB curve
    assert executor_seconds("GEGLU", 3000, 0, hw, since=2 ** 0.5 * 1e6) == pytest.approx(
        warm + 0.5 * (mid2 - warm))
    assert executor_seconds("GEGLU", 3000, 0, hw, since=2e6) == pytest.approx(mid2)
    # 2.83 MB: half way from the 2 MB curve to the 4 MB one
    assert executor_seconds("GEGLU", 3000, 0, hw, since=2 ** 1.5 * 1e6) == pytest.approx(
        mid2 + 0.5 * (mid - mid2))
    assert executor_seconds("GEGLU", 3000, 0, hw, since=4e6) == pytest.approx(mid)
    # 16 MB: log(16/4) / log(64/4) = half way from middle to cold
    assert executor_seconds("GEGLU", 3000, 0, hw, since=16e6) == pytest.approx(
        mid + 0.5 * (cold - mid))
    assert executor_seconds("GEGLU", 3000, 0, hw, since=171e6) == pytest.approx(cold)
    # several tokens without a curve on several tokens: the one-row curves, as op_curve
    assert executor_seconds("GEGLU", 3000, 0, hw, tokens=16, since=4e6) == pytest.approx(mid)
    # a middle figure not between the two others (a kind whose warm calls came that
    # long after its last): warm to cold, log(4/2) / log(64/2) = 1/5 of the way
    for b in (2e6, 64e6, 100e6):
        oc = {**hw.extra["op_costs"], "since_bytes": {**since, "by_op": {"GEGLU": 2e6},
                                                      "by_op_mid8": {"GEGLU": b}}}
        del oc["by_op_mid2"]
        hw2 = measured(op_costs=oc)
        assert [s for s, _ in hw2.warmth_curves("GEGLU")] == [2e6, 64e6]
        assert executor_seconds("GEGLU", 3000, 0, hw2, since=4e6) == pytest.approx(
            warm + (cold - warm) / 5)


#: a curve with the kind's code warm: 1 us at 1000 B, 2 us at 7000 B
AGAIN = [[1000, 10, 1e-6], [7000, 70, 2e-6]]


def test_a_node_whose_code_just_ran_reads_the_code_warm_curve():
    """A decode's node mostly meets its code warm (the Q norm ran before the K norm, the
    MUL before the residual ADD: one kernel, exec_ops.code_kind); the probe times each
    one-row kind so too (by_op_again: a node of its op right before its matvecs;
    by_op_local_again: right before it, after the local pass), the warmest curve, at its
    own since_bytes (0 right before: nothing moved between)."""
    from graphcost.execute.exec_ops import code_kind

    since = {"by_op_again": {"GEGLU": 0.5e6}, "by_op": {"GEGLU": 2e6},
             "by_op_cold": {"GEGLU": 8e6}, "by_op_local": {"GEGLU": 1e6},
             "by_op_local_again": {"GEGLU": 0}}
    hw = measured(op_costs={"by_op": {"GEGLU": CURVE}, "by_op_again": {"GEGLU": AGAIN},
                            "by_op_local": {"GEGLU": LOCAL},
                            "by_op_local_again": {"GEGLU": AGAIN},
                            "by_op_cold": {"GEGLU": COLD}, "since_bytes": since})
    assert hw.warmth_curves("GEGLU") == [(0.5e6, AGAIN), (2e6, sorted(CURVE)), (8e6, COLD)]
    assert hw.warmth_curves("GEGLU", local=True) == [(0.0, AGAIN), (1e6, LOCAL), (8e6, COLD)]
    # 3000 B: code-warm 1 + 1 * 2000 / 6000 = 1.33 us, warm 4 us
    again, warm = (1 + 2000 / 6000) * 1e-6, 4e-6
    assert executor_seconds("GEGLU", 3000, 0, hw, since=0.0) == pytest.approx(again)
    assert executor_seconds("GEGLU", 3000, 0, hw, since=0.5e6) == pytest.approx(again)
    # 1 MB: log(1 / 0.5) / log(2 / 0.5) = half way to the warm curve
    assert executor_seconds("GEGLU", 3000, 0, hw, since=1e6) == pytest.approx(
        again + 0.5 * (warm - again))
    assert executor_seconds("GEGLU", 3000, 0, hw, since=2e6) == pytest.approx(warm)
    # after a small op, 0 bytes since: the code-warm curve; 1 MB: the local curve,
    # 1 + 2 * 2000 / 6000 = 1.67 us
    assert executor_seconds("GEGLU", 3000, 0, hw, since=0.0, local=True) == \
        pytest.approx(again)
    assert executor_seconds("GEGLU", 3000, 0, hw, since=1e6, local=True) == \
        pytest.approx((1 + 2 * 2000 / 6000) * 1e-6)
    # without a since figure the warm curve, as before
    assert executor_seconds("GEGLU", 3000, 0, hw) == pytest.approx(warm)
    # a code-warm figure not below the warm one is not read
    oc = {**hw.extra["op_costs"], "since_bytes": {**since, "by_op_again": {"GEGLU": 2e6}}}
    assert [b for b, _ in measured(op_costs=oc).warmth_curves("GEGLU")] == [2e6, 8e6]
    # ADD, SUB, MUL and DIV run one kernel: one code kind; others their own
    assert {code_kind(op) for op in ("ADD", "SUB", "MUL", "DIV")} == {"binary"}
    assert code_kind("RMS_NORM") == "RMS_NORM" and code_kind("SCALE") == "SCALE"


#: a curve after a small op: 1 us at 1000 B, 3 us at 7000 B
LOCAL = [[1000, 10, 1e-6], [7000, 70, 3e-6]]


def test_a_node_after_a_small_op_reads_the_local_curve():
    """issue 12: a decode's node right after a small op (a residual ADD after the norm's
    MUL) runs warmer than one right after a matvec: the probe times each one-row node
    after its matvecs and a small op that rewrote its inputs on the calling thread
    (by_op_local); the model reads that curve for such a node (local=True) as its warm
    end, and the middle and cold curves (measured after matvecs) beyond it."""
    since = {"by_op": {"ADD": 2e6}, "by_op_local": {"ADD": 1e6}, "by_op_mid8": {"ADD": 4e6},
             "by_op_cold": {"ADD": 64e6}}
    hw = measured(op_costs={"by_op": {"ADD": CURVE}, "by_op_local": {"ADD": LOCAL},
                            "by_op_mid8": {"ADD": MID}, "by_op_cold": {"ADD": COLD},
                            "by_op_tokens": {"ADD": MID2}, "since_bytes": since})
    assert hw.op_curve("ADD", local=True) == LOCAL
    assert hw.op_curve("ADD") == sorted(CURVE)
    assert hw.warmth_curves("ADD", local=True) == [(1e6, LOCAL), (4e6, MID), (64e6, COLD)]
    assert hw.warmth_curves("ADD") == [(2e6, sorted(CURVE)), (4e6, MID), (64e6, COLD)]
    # 3000 B: local 1 + 2 * 2000 / 6000 us, after a matvec 4 us, middle 10 us
    local = (1 + 2 * 2000 / 6000) * 1e-6
    assert executor_seconds("ADD", 3000, 0, hw, since=1e6, local=True) == pytest.approx(local)
    assert executor_seconds("ADD", 3000, 0, hw, since=1e6) == pytest.approx(4e-6)
    # 2 MB since: log(2/1) / log(4/1) = half way from the local curve to the middle one
    assert executor_seconds("ADD", 3000, 0, hw, since=2e6, local=True) == pytest.approx(
        local + 0.5 * (10e-6 - local))
    # several tokens (a prompt's node): the curve on several tokens, local or not
    assert executor_seconds("ADD", 3000, 0, hw, tokens=16, local=True) == pytest.approx(5e-6)
    # a kind without a local curve (flash attention, an older profile): by_op
    assert executor_seconds("GEGLU", 3000, 0, measured(op_costs={"by_op": {"GEGLU": CURVE}}),
                            local=True) == pytest.approx(4e-6)


def test_a_prompt_node_after_a_small_op_reads_the_local_curve_on_several_tokens():
    """A prompt's node right after a small op that wrote its input (the Q scale after
    the rope) reads the probe's curve on several tokens after a small op
    (by_op_tokens_local) as its warm end, and the middle and cold curves on several
    tokens beyond it; without one the curve on several tokens (MID2)."""
    since = {"by_op_tokens": {"ADD": 2e6}, "by_op_tokens_local": {"ADD": 1e6},
             "by_op_tokens_cold": {"ADD": 64e6}}
    hw = measured(op_costs={"by_op": {"ADD": CURVE}, "by_op_tokens": {"ADD": MID2},
                            "by_op_tokens_local": {"ADD": LOCAL},
                            "by_op_tokens_cold": {"ADD": COLD}, "since_bytes": since})
    assert hw.warmth_curves("ADD", tokens=16, local=True) == [(1e6, LOCAL), (64e6, COLD)]
    assert hw.warmth_curves("ADD", tokens=16) == [(2e6, MID2), (64e6, COLD)]
    # 3000 B: local 1 + 2 * 2000 / 6000 us; after a matvec MID2's 5 us
    assert executor_seconds("ADD", 3000, 0, hw, tokens=16, since=1e6, local=True) == \
        pytest.approx((1 + 2 * 2000 / 6000) * 1e-6)
    assert executor_seconds("ADD", 3000, 0, hw, tokens=16, since=2e6) == pytest.approx(5e-6)
    # one row: no local curve on one row here, so by_op (CURVE's 4 us at 3000 B)
    assert executor_seconds("ADD", 3000, 0, hw, local=True) == pytest.approx(4e-6)


def test_after_small_is_a_node_right_after_a_small_op_that_wrote_its_first_input():
    from graphcost.execute.profile import after_small
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph
    g = Graph()
    x, w, r = (g.new_tensor(gt.F32, [64]) for _ in range(3))
    normed = g.rms_norm(x, 1e-6)
    scaled = g.mul(normed, w)
    added = g.add(g.reshape(scaled, [64, 1]), r)    # through a view of MUL's output
    mm = g.mul_mat(g.new_tensor(gt.F32, [64, 8]), x)
    assert after_small(normed, scaled) is True
    assert after_small(scaled, added) is True
    assert after_small(None, scaled) is False       # nothing ran before it
    assert after_small(mm, g.scale(mm, 2.0)) is False       # a matmul wrote it
    # a small op ran just before but wrote elsewhere (a V cache write after the K's)
    assert after_small(normed, g.add(r, x)) is False
    assert after_small(normed, g.add(r, normed)) is False   # its second input only


def test_bad_since_bytes_are_one_line():
    with pytest.raises(GraphcostError, match=r"op_costs.since_bytes.by_op.GEGLU must be"):
        measured(op_costs={"since_bytes": {"by_op": {"GEGLU": -1}}})
    with pytest.raises(GraphcostError, match=r"op_costs.since_bytes.by_op must be"):
        measured(op_costs={"since_bytes": {"by_op": 3}})
    with pytest.raises(GraphcostError, match=r"op_costs.by_op_cold.ADD must list"):
        measured(op_costs={"by_op_cold": {"ADD": []}})
    with pytest.raises(GraphcostError, match=r"op_costs.by_op_mid8.ADD\[0\] must be"):
        measured(op_costs={"by_op_mid8": {"ADD": [[1, 2]]}})


def test_peak_per_weight_type_sets_the_compute_roof():
    hw = measured()
    assert hw.peak_for("q4_K") == 40e9 and hw.peak_for("q8_0") == 100e9
    assert hw.peak_for(None) == 100e9
    # 1 MB and 1 GFLOP: against F32's 100 GFLOP/s 10 ms, against q4_K's 40 GFLOP/s 25 ms
    assert roofline_seconds(1e6, 1e9, hw) == (pytest.approx(1e-2), "compute")
    assert roofline_seconds(1e6, 1e9, hw, peak=hw.peak_for("q4_K")) == (
        pytest.approx(2.5e-2), "compute")
    # a decode matvec, 1 MB and 2 MFLOP: memory-bound whichever peak (50 us vs 50 ns)
    assert roofline_seconds(1e6, 2e6, hw, peak=hw.peak_for("q4_K"))[1] == "memory"


@pytest.mark.parametrize("op_costs,message", [
    ({"by_op": {"ADD": []}}, "op_costs.by_op.ADD must list at least one"),
    ({"by_op": {"ADD": [[1, 2]]}}, r"op_costs.by_op.ADD\[0\] must be \[bytes, flops, seconds\]"),
    ({"matvec": {"q4_K": [[0, 1, 1e-6]]}}, r"op_costs.matvec.q4_K\[0\] must be a finite number > 0"),
    ({"by_op": {"ADD": [[10, 1, -1e-6]]}}, r"op_costs.by_op.ADD\[0\] must be a finite number >= 0"),
    ({"by_op": {"ADD": "fast"}}, "op_costs.by_op.ADD must be a list"),
], ids=["empty", "two_numbers", "zero_bytes", "negative_time", "not_a_list"])
def test_bad_curves_are_one_line(op_costs, message):
    with pytest.raises(GraphcostError, match=message):
        measured(op_costs=op_costs)


def test_bad_peak_by_type_is_one_line():
    with pytest.raises(GraphcostError, match="peak_flops.by_type.q4_K must be a finite number > 0"):
        hwmod.parse({"memory_bandwidth": {"bytes_per_second": 1e9},
                     "peak_flops": {"flops_per_second": 1e9, "by_type": {"q4_K": 0}}}, None)


def _node(i: int, op: str, us: float, model_us: float) -> NodeRow:
    return NodeRow(i, f"n{i}", op, 0, "attn", False, us * 1e-6, 1000, 10, us * 0.5e-6,
                   "memory", model_us * 1e-6)


def _profile(hw) -> Profile:
    def step(past, n_tokens, wall_ms, replay_ms, nodes):
        """``replay_ms``: (timed, untimed) ms of each replay round."""
        return StepRow(n_tokens, past, 7, [(7, 2.0), (3, 1.0)], wall_ms * 1e-3, nodes,
                       timed_runs=[t * 1e-3 for t, _ in replay_ms],
                       untimed_runs=[u * 1e-3 for _, u in replay_ms])
    # the replay's pairs: in round 2 the memory changes state between a step's untimed
    # run (fast: 4 ms a decode step) and its node-timed one (slow: 8.4 ms); rounds 1 and
    # 3 meet one state each: 4.2 / 4.0 and 8.4 / 8.0, node timing adding 5%
    decode = [(4.2, 4.0), (8.4, 4.0), (8.4, 8.0)]
    steps = [step(0, 4, 10.0, [(10.0, 12.0)] * 3, [_node(0, "MUL_MAT", 400, 300)]),
             # decode: MUL_MAT 100 us (model 80) and 120 us (model 150), GEGLU 20 (model 15)
             step(4, 1, 5.0, decode, [_node(0, "MUL_MAT", 100, 80), _node(1, "GEGLU", 20, 15)]),
             step(5, 1, 7.0, decode, [_node(0, "MUL_MAT", 120, 150), _node(1, "GEGLU", 20, 15)]),
             step(6, 1, 6.0, decode, [_node(0, "MUL_MAT", 100, 100), _node(1, "GEGLU", 20, 25)])]
    settings = {"n_ctx": 256, "n_ubatch": 512, "flash_attn": "on", "cache_type_k": "f16",
                "cache_type_v": "f16"}
    return Profile("m.gguf", "m", "llama", settings, "fast", 2, 3, hw, steps, 0.5,
                   {"hits": 1, "misses": 0})


def test_untimed_rate_and_timing_overhead():
    p = _profile(measured())
    tps = p.tokens_per_second()
    # untimed decode runs 4, 4, 8 ms in each of 3 steps: median 4 ms -> 250 tok/s; timed
    # 4.2, 8.4, 8.4: median 8.4 ms -> 119.05 tok/s
    assert tps["decode_untimed"] == pytest.approx(250) and tps["decode"] == pytest.approx(1 / 8.4e-3)
    # prompt: 4 tokens in 10 ms timed, 12 ms untimed
    assert tps["prompt"] == pytest.approx(400) and tps["prompt_untimed"] == pytest.approx(4 / 12e-3)
    # paired: 4.2/4.0, 8.4/4.0, 8.4/8.0 = 1.05, 2.1, 1.05 in each step: median of the 9
    # ratios 1.05 -> +5%, where the medians' ratio 8.4 / 4.0 - 1 would say +110%
    assert p.timing_overhead() == pytest.approx(0.05)
    # the steps' medians: untimed 12 ms (prompt), 4 ms (decode); timed 10, 8.4
    assert [s.untimed for s in p.steps] == pytest.approx([12e-3, 4e-3, 4e-3, 4e-3])
    assert [s.timed for s in p.steps] == pytest.approx([10e-3, 8.4e-3, 8.4e-3, 8.4e-3])
    # with no decode step, the prompt's pairs: 10 / 12 - 1 = -16.7% in each round
    p.steps[1:] = []
    assert p.timing_overhead() == pytest.approx(10 / 12 - 1)


@pytest.mark.parametrize("timed,untimed,overhead", [
    ([1.1, 2.2, 3.0], [1.0, 2.0, 2.0], 0.1),     # ratios 1.1, 1.1, 1.5 -> median 1.1
    ([2.0, 1.0], [1.0, 1.0], 0.5),               # ratios 2, 1 -> median 1.5
    ([0.9], [1.0], -0.1),                        # one pair, timed quicker
    ([], [], None),                              # no pair: no figure, not zero
], ids=["odd", "even", "negative", "none"])
def test_paired_overhead(timed, untimed, overhead):
    from graphcost.execute.profile import paired_overhead
    got = paired_overhead(timed, untimed)
    assert got is None if overhead is None else got == pytest.approx(overhead)


def test_paired_overhead_needs_pairs():
    from graphcost.execute.profile import paired_overhead
    with pytest.raises(ValueError, match="2 timed runs against 3 untimed"):
        paired_overhead([1.0, 1.0], [1.0, 1.0, 1.0])


def test_model_columns_and_per_kind_accuracy():
    p = _profile(measured())
    by_op = {r.key: r for r in p.by_op()}
    # per decode token: MUL_MAT (100 + 120 + 100) / 3 us measured, (80 + 150 + 100) / 3 model
    assert by_op["MUL_MAT"].seconds == pytest.approx(320e-6 / 3)
    assert by_op["MUL_MAT"].modelled == pytest.approx(330e-6 / 3)
    assert by_op["MUL_MAT"].model_ratio == pytest.approx(330 / 320)
    acc = p.estimate_accuracy()
    # MUL_MAT |model/measured - 1|: 0.2, 0.25, 0 -> median 0.2; GEGLU: 0.25, 0.25, 0.25
    assert acc["by_op"]["MUL_MAT"]["median_abs_error_model"] == pytest.approx(0.2)
    assert acc["by_op"]["GEGLU"]["median_abs_error_model"] == pytest.approx(0.25)
    # all six: 0.2, 0.25, 0, 0.25, 0.25, 0.25 -> median 0.25
    assert acc["median_abs_error_model"] == pytest.approx(0.25)
    # the prompt step alone: one MUL_MAT, 300 / 400 us -> 0.25; decode as the default
    prompt = p.estimate_accuracy(phase="prompt")
    assert prompt["nodes"] == 1 and prompt["median_abs_error_model"] == pytest.approx(0.25)
    assert p.estimate_accuracy(phase="decode") == acc
    with pytest.raises(ValueError, match="prompt or decode"):
        p.estimate_accuracy(phase="both")
    d = document(p)
    assert d["estimate_accuracy_prompt"] == prompt
    assert d["node_timing_overhead"] == pytest.approx(0.05)
    assert [s["untimed_seconds"] for s in d["steps"]] == pytest.approx([12e-3, 4e-3, 4e-3, 4e-3])
    assert [s["timed_seconds"] for s in d["steps"]] == pytest.approx([10e-3, 8.4e-3, 8.4e-3, 8.4e-3])
    assert d["steps"][1]["timed_runs_seconds"] == pytest.approx([4.2e-3, 8.4e-3, 8.4e-3])
    assert d["steps"][1]["untimed_runs_seconds"] == pytest.approx([4e-3, 4e-3, 8e-3])
    row = next(r for r in d["by_op"] if r["key"] == "GEGLU")
    assert row["modelled_seconds"] == pytest.approx(55e-6 / 3)
    assert row["model_ratio"] == pytest.approx(55 / 60)


def test_table_prints_the_untimed_rate_beside_the_timed_one():
    out = render_table(_profile(measured()), width=100, top=5)
    flat = " ".join(out.split())
    assert "decode 250.00 untimed (Executor.step replayed, median of 3)" in flat
    assert "with every node timed: prompt 400.00, decode 119.05" in flat
    assert "node timing adds +5.0% to a step (median of 9 timed/untimed pairs)" in flat
    # most nodes first, then by name
    assert "the model per op kind: GEGLU 0.25 (3), MUL_MAT 0.20 (3)" in flat
    # and the prompt step's own: its one MUL_MAT, modelled 300 us against 400
    assert ("estimate accuracy (prompt, 1 nodes > 10 us): median |estimate/measured - 1| = "
            "0.50 for the roofline, 0.25 for the executor model; the model per op kind: "
            "MUL_MAT 0.25 (1)") in flat
    assert all(len(line) <= 100 for line in out.splitlines())


def causal(past: int, n_tok: int, n_kv: int) -> np.ndarray:
    """The live cells of ``n_tok`` causal queries at positions ``past``.. over cells
    0..n_kv-1 holding positions 0..: query t attends cells 0..past + t."""
    return np.arange(n_kv)[None, :] <= past + np.arange(n_tok)[:, None]


def test_flash_attention_is_modelled_on_the_cells_it_attends():
    from graphcost.execute.profile import live_fraction
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    g = Graph()
    q = g.permute(g.reshape(g.new_tensor(gt.F32, [64 * 4, 1]), [64, 4, 1]), 0, 2, 1, 3)
    k = g.permute(g.view(g.new_tensor(gt.F16, [64, 256], role="kv"), [64, 1, 256],
                         [128, 128], 0), 0, 2, 1, 3)
    mask = g.new_tensor(gt.F16, [256, 1])
    fa = g.flash_attn_ext(q, k, k, mask, 0.125, 0.0, 0.0)
    # decode at past 31: 32 of the 256 cells are unmasked -> 1/8 of the K and V rows
    assert live_fraction(fa, {id(mask): causal(31, 1, 256)}) == 32 / 256
    assert live_fraction(fa, {id(mask): causal(1000, 1, 256)}) == 1.0   # never above all
    assert live_fraction(fa, {}) == 1.0                # no mask read: every cell, as costed
    assert live_fraction(g.add(q, q), {}) == 1.0       # other ops: as costed


#: a prompt matmul's probe points, [weight bytes, flops, seconds]: on the 1000-byte matrix
#: 400 more FLOPs take 4 us more (1e-8 s a FLOP: 100 MFLOP/s), leaving 3 - 1 = 2 us once a
#: call; on the 200-byte matrix 1.5 us - 20 FLOPs * 1e-8 s = 1.3 us
PROMPT = [[1000, 500, 7e-6], [200, 20, 1.5e-6], [1000, 100, 3e-6]]


def test_prompt_matmul_fit_parts_per_row_work_from_work_once_a_call():
    rate, rest = hwmod.matmul_fit(PROMPT)
    assert rate == pytest.approx(1e8)
    assert rest == [[200, 0, pytest.approx(1.3e-6)], [1000, 0, pytest.approx(2e-6)]]
    # one matrix: its rest alone (a flat curve)
    assert hwmod.matmul_fit(PROMPT[::2])[1] == [[1000, 0, pytest.approx(2e-6)]]
    # no slope (one FLOP count, or more FLOPs taking less time: noise): no fit
    assert hwmod.matmul_fit([[1000, 100, 3e-6], [200, 20, 1e-6]]) is None
    assert hwmod.matmul_fit([[1000, 100, 3e-6], [1000, 500, 2e-6]]) is None
    assert hwmod.matmul_fit([]) is None
    # a rest below zero (noise) counts as zero: 1e-6 - 500 * 1e-8 < 0 at the fewest FLOPs
    assert hwmod.matmul_fit([[1000, 500, 1e-6], [1000, 900, 5e-6]])[1] == [[1000, 0, 0.0]]


def test_prompt_matmuls_take_the_prompt_model_above_the_matvec_rows():
    hw = measured(op_costs={"matvec": {"q4_K": CURVE}, "matmul": {"q4_K": PROMPT},
                            "matvec_max_rows": 4})
    assert hw.matvec_max_rows == 4 and hw.matmul_points("q4_K") == sorted(PROMPT, key=lambda p: p[1])
    # 16 rows, 600 weight bytes, 300 FLOPs: the rest curve at 600 B, 1.3 + 0.7 * 400 / 800
    # = 1.65 us, plus 300 FLOPs at 100 MFLOP/s = 3 us: 4.65 us (nbytes is not used)
    assert executor_seconds("MUL_MAT", 9e9, 300, hw, "q4_K", rows=16,
                            weight_bytes=600) == pytest.approx(4.65e-6)
    # 4 rows: the matvec kernels, so the matvec curve at 5000 B (8 us; 300 FLOPs at
    # q4_K's 40 GFLOP/s is below it)
    assert executor_seconds("MUL_MAT", 5000, 300, hw, "q4_K", rows=4,
                            weight_bytes=600) == pytest.approx(8e-6)
    # a type without prompt points: the matvec curve; no weight bytes: the same
    hw2 = measured(op_costs={"matvec": {"q4_K": CURVE}})
    assert hw2.matvec_max_rows == 1
    assert executor_seconds("MUL_MAT", 5000, 300, hw2, "q4_K", rows=16,
                            weight_bytes=600) == pytest.approx(8e-6)
    assert executor_seconds("MUL_MAT", 5000, 300, hw, "q4_K", rows=16) == pytest.approx(8e-6)
    # a type whose kernel pads rows to tiles of 4: 21 rows cost 24 rows' FLOPs,
    # 1.65 us + 300 * 24 / 21 FLOPs at 100 MFLOP/s
    hw4 = measured(op_costs={"matmul": {"q4_0": PROMPT}, "matmul_row_tile": {"q4_0": 4}})
    assert executor_seconds("MUL_MAT", 0, 300, hw4, "q4_0", rows=21, weight_bytes=600) \
        == pytest.approx(1.65e-6 + 300 * 24 / 21 * 1e-8)
    assert executor_seconds("MUL_MAT", 0, 300, hw4, "q4_0", rows=20, weight_bytes=600) \
        == pytest.approx(4.65e-6)


def test_flash_attention_is_read_by_flops_and_prompts_by_the_tile_curve():
    # [bytes, flops, seconds]: read by FLOPs, 1 us at 100 FLOPs to 3 us at 300
    dec = [[5000, 100, 1e-6], [1000, 300, 3e-6]]
    tiles = [[5000, 100, 2e-6], [1000, 300, 10e-6]]
    hw = measured(op_costs={"by_op": {"FLASH_ATTN_EXT@256": dec},
                            "flash_attn_tiled": {"FLASH_ATTN_EXT@256": tiles},
                            "flash_attn_tile_min_tokens": 4})
    # 200 FLOPs: halfway, whatever the bytes
    assert executor_seconds("FLASH_ATTN_EXT", 3000, 200, hw, head_size=256) == pytest.approx(2e-6)
    # 3 queries: the one-query kernel's curve; 4 or more: the tiles' (2 + 8 / 2 us)
    assert executor_seconds("FLASH_ATTN_EXT", 3000, 200, hw, head_size=256,
                            tokens=3) == pytest.approx(2e-6)
    assert executor_seconds("FLASH_ATTN_EXT", 3000, 200, hw, head_size=256,
                            tokens=21) == pytest.approx(6e-6)
    # a profile without tile curves uses the one-query curve for prompts too
    hw1 = measured(op_costs={"by_op": {"FLASH_ATTN_EXT@256": dec}})
    assert executor_seconds("FLASH_ATTN_EXT", 3000, 200, hw1, head_size=256,
                            tokens=21) == pytest.approx(2e-6)


def test_nodes_of_several_tokens_take_the_curve_measured_on_several_tokens():
    rows = [[1000, 10, 5e-6], [7000, 70, 6e-6]]
    hw = measured(op_costs={"by_op": {"RMS_NORM": CURVE}, "by_op_chained": {"RMS_NORM": CURVE},
                            "by_op_tokens": {"RMS_NORM": rows}, "by_op_tokens_rows": 16})
    # one token: the one-row curve, 4 us at 3000 B; 21 tokens: 5 + 1 * 2000 / 6000 us
    assert executor_seconds("RMS_NORM", 3000, 0, hw) == pytest.approx(4e-6)
    assert executor_seconds("RMS_NORM", 3000, 0, hw,
                            tokens=21) == pytest.approx((5 + 2000 / 6000) * 1e-6)
    # an op without a several-token curve keeps its one-row curve
    hw1 = measured(op_costs={"by_op": {"RMS_NORM": CURVE}, "by_op_tokens": {"ADD": rows}})
    assert executor_seconds("RMS_NORM", 3000, 0, hw1, tokens=21) == pytest.approx(4e-6)


def test_curve_read_by_flops():
    # column 1: sorted and interpolated by FLOPs (10 -> 2 us, 30 -> 4 us, 70 -> 12 us)
    assert curve_seconds(CURVE, 20, column=1) == pytest.approx(3e-6)
    assert curve_seconds(CURVE, 90, column=1) == pytest.approx(16e-6)


@pytest.mark.parametrize("key,value", [("matvec_max_rows", 0), ("matvec_max_rows", 2.5),
                                       ("flash_attn_tile_min_tokens", "4"),
                                       ("flash_attn_tile_queries", -16),
                                       ("by_op_tokens_rows", True)],
                         ids=["zero", "float", "string", "negative", "bool"])
def test_bad_row_thresholds_are_one_line(key, value):
    with pytest.raises(GraphcostError, match=f"op_costs.{key} must be an integer >= 1"):
        measured(op_costs={key: value})


@pytest.mark.parametrize("tile,message", [({"q4_0": 0}, "must be a finite number > 0"),
                                          ({"q4_0": 2.5}, "must be an integer >= 1"),
                                          ([4], "must be a mapping")],
                         ids=["zero", "float", "list"])
def test_bad_row_tiles_are_one_line(tile, message):
    with pytest.raises(GraphcostError, match=message):
        measured(op_costs={"matmul_row_tile": tile})


def test_prompt_flash_attention_runs_the_lanes_of_whole_tiles():
    from graphcost.execute.profile import live_fraction
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    g = Graph()
    q = g.permute(g.reshape(g.new_tensor(gt.F32, [64 * 4 * 21, 1]), [64, 4, 21]), 0, 2, 1, 3)
    k = g.permute(g.view(g.new_tensor(gt.F16, [64, 256], role="kv"), [64, 1, 256],
                         [128, 128], 0), 0, 2, 1, 3)
    mask = g.new_tensor(gt.F16, [256, 21])
    fa = g.flash_attn_ext(q, k, k, mask, 0.125, 0.0, 0.0)
    # 21 queries from position 0 in tiles of 16: tile 0's 16 lanes over cells 0..15, tile
    # 1's 16 lanes (5 queries) over cells 0..20: 16 * 16 + 16 * 21 = 592 of 21 * 256 pairs
    assert live_fraction(fa, {id(mask): causal(0, 21, 256)}, 16) == 592 / (21 * 256)
    # after 100 cells: 16 * 116 + 16 * 121; never more cells than the window's 256
    assert live_fraction(fa, {id(mask): causal(100, 21, 256)}, 16) == \
        (16 * 116 + 16 * 121) / (21 * 256)
    assert live_fraction(fa, {id(mask): causal(250, 21, 256)}, 16) == \
        2 * 16 * 256 / (21 * 256)
    assert live_fraction(g.add(q, q), {}, 16) == 1.0                 # other ops: as costed


def test_flash_attention_uses_the_nearest_head_size():
    c64, c128, c256 = ([[1000, 0, t]] for t in (1e-6, 2e-6, 3e-6))
    hw = measured(op_costs={"by_op": {"FLASH_ATTN_EXT": c128, "FLASH_ATTN_EXT@64": c64,
                                      "FLASH_ATTN_EXT@256": c256}})
    at = {d: executor_seconds("FLASH_ATTN_EXT", 500, 0, hw, head_size=d)
          for d in (64, 80, 96, 128, 192, 256, 512)}
    # nearest measured size; a tie (96: 64 or 128, 192: 128 or 256) takes the smaller
    assert at == {64: 1e-6, 80: 1e-6, 96: 1e-6, 128: 2e-6, 192: 2e-6, 256: 3e-6, 512: 3e-6}
    assert executor_seconds("FLASH_ATTN_EXT", 500, 0, hw) == 2e-6      # no head size: 128's


# ---- benchmarks/check_small_ops.py: the GELU table lines a layer's gate values index ----

def _check_small_ops():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "check_small_ops.py"
    spec = importlib.util.spec_from_file_location("check_small_ops", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_lines_are_f16_bits_over_32():
    mod = _check_small_ops()
    # F16 bits: 0.0 -> 0x0000 (line 0); 1.0 -> 0x3C00 = 15360 (line 15360 // 32 = 480);
    # 1 + 2**-10 -> 0x3C01 (line 480 too); 2.0 -> 0x4000 = 16384 (line 512);
    # -1.0 -> 0xBC00 = 48128 (line 1504)
    assert mod.table_lines([0.0, 1.0, 1.0 + 2 ** -10, 2.0, -1.0]) == {0, 480, 512, 1504}


def test_new_lines_counts_lines_no_earlier_node_read():
    mod = _check_small_ops()
    # {0, 480}: both new; {480, 512}: 512 new; {0, 512}: none; {7}: new
    assert mod.new_lines([{0, 480}, {480, 512}, {0, 512}, {7}]) == [2, 1, 0, 1]


def test_probe_set_rows_cache_cells():
    """The probe's SET_ROWS caches: 1024 cells (bench_profile's context) where 1024 rows
    of F16 fit in 8 MiB, fewer for long rows, never under 16 calls' worth of cells."""
    from graphcost.execute.hwprobe import cache_cells

    assert cache_cells(256, 1) == 1024          # 8 MiB / (256 x 2 B) = 16384 -> 1024
    assert cache_cells(8192, 1) == 512          # 8 MiB / 16 KiB
    assert cache_cells(65536, 1) == 64          # 8 MiB / 128 KiB
    assert cache_cells(4096, 16) == 1024        # 8 MiB / 8 KiB: 64 runs of 16 cells
    assert cache_cells(1 << 20, 16) == 256      # 8 MiB / 2 MiB = 4 < 16 x 16
