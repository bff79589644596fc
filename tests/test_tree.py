"""The tree report (graphcost.report.tree).

* a golden whole-output test on a 1-layer llama fixture
  (``GRAPHCOST_UPDATE_GOLDEN=1 pytest tests/test_tree.py`` rewrites the golden file);
* relational tests that parse the output: every node appears once, in order; every
  wire starts at its producer (``<---``) and ends at its consumers' source lines
  (``>---``), with no gaps; ``layers`` narrows the node blocks but not the totals;
* the header-only examples (Mistral-Large: ~3,000 nodes) render, with the time and the
  gutter width printed (see them with ``pytest -s``).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from pathlib import Path

import pytest

from fixtures import write_llama
from graphcost.cost.analysis import Analysis, NodeCost, analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.report.tree import MAX_WIRES, SRC_LABELS, render_tree
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "tree_llama_tiny.txt"
EXAMPLES = ["mistral-large-2407-q4_0.gguf", "llama-3.1-8b-instruct-q4_k_m.gguf",
            "gemma-3-4b-it-q4_k_m.gguf"]
# tiny dims: n_embd 64 = 4 heads x 16, 2 KV heads; rows of 64/128 fit q4_0/q8_0/f16
TINY = dict(n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=260)
RUN = RunSettings(ctx_size=256, tokens=2, past=3, flash_attn="off")


def _analysis(path, run: RunSettings = RUN) -> Analysis:
    return analyze_graph(build_graph(load_model(path), run), memory=True)


@pytest.fixture(scope="module")
def tiny1(tmp_path_factory) -> Analysis:
    return _analysis(write_llama(tmp_path_factory.mktemp("tree") / "tiny1.gguf", n_layer=1, **TINY))


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory) -> Analysis:
    return _analysis(write_llama(tmp_path_factory.mktemp("tree") / "tiny3.gguf", n_layer=3, **TINY))


# ---- parsing the report -------------------------------------------------------------------

HEADER = re.compile(r"^(?P<name>.*): (?P<op>[A-Z_]+)  #(?P<i>\d+)$")
ENTRY = re.compile(r"^(?P<name>.*): (?P<op>[A-Z_]+)  #(?P<i>\d+) \(made by a node not shown\)$")
SOURCE = re.compile(r"^  (?P<label>\w+): .*  \((?P<what>[^()]*)\)$")


def _gutter_width(text: str) -> int:
    """Characters of the gutter: 2 per wire column (from the 'wires:' line)."""
    return 2 * int(re.search(r"^wires: +(\d+) column", text, re.M).group(1))


def _node_section(text: str) -> list[str]:
    lines = text.splitlines()
    k = next(i for i, line in enumerate(lines) if line.startswith("  unmodelled ops:"))
    assert lines[k + 1] == ""
    return lines[k + 2:]


def _headers(text: str) -> list[tuple[int, str, str]]:
    """(index, name, op) of every node block header, in output order."""
    g = _gutter_width(text)
    out = []
    for line in _node_section(text):
        body = line[g:]
        m = HEADER.match(body)
        if m and not ENTRY.match(body) and not body.startswith(" "):
            out.append((int(m["i"]), m["name"], m["op"]))
    return out


def _check_wires(text: str) -> dict[tuple[int, str], int]:
    """Walk the gutter line by line and check that every wire is whole.

    A column opens at a '<' line (the producer, ``#i``), shows '|' on every line until
    it ends, and ends only just after a '>' line naming the same producer. Columns to
    the right of an arrow show '|' where a wire is live and '-' elsewhere. Returns
    {(consumer index, source label): producer index} for every '>' line, plus the
    source lines drawn without a wire (marked 'no wire').
    """
    g = _gutter_width(text)
    open_: dict[int, int] = {}  # gutter position -> producer index
    ended_by_use: dict[int, bool] = {}  # position -> previous line was '>' there
    uses: dict[tuple[int, str], int] = {}
    current: int | None = None
    for n, line in enumerate(_node_section(text)):
        gut, body = line[:g].ljust(g), line[g:]
        heads = [p for p in range(0, g, 2) if gut[p] in "<>"]
        assert len(heads) <= 1, f"line {n}: two arrows: {line!r}"
        head = heads[0] if heads else None
        # a wire that ended on the previous line's '>' is not drawn any more
        for p in list(open_):
            if gut[p] in " -":
                assert ended_by_use[p], f"line {n}: wire of #{open_[p]} stops without a consumer"
                del open_[p]
        for p in range(0, g, 2):
            right = head is not None and p >= head
            assert gut[p + 1] == ("-" if right else " "), f"line {n}: {line!r}"
            if p == head:
                continue
            want = "|" if p in open_ else ("-" if right else " ")
            assert gut[p] == want, f"line {n}, column {p // 2}: {gut[p]!r} != {want!r}: {line!r}"
        header, entry = HEADER.match(body), ENTRY.match(body)
        if header and not body.startswith(" "):
            current = int(header["i"])
        if head is not None and gut[head] == "<":
            assert head not in open_, f"line {n}: '<' on a live column: {line!r}"
            assert header or entry, f"line {n}: '<' without a producer: {line!r}"
            open_[head] = int((header or entry)["i"])
            ended_by_use[head] = False
            continue
        src = SOURCE.match(body)
        if head is not None:
            assert gut[head] == ">" and head in open_, f"line {n}: '>' on a dead column: {line!r}"
            assert src, f"line {n}: '>' on a line that is not a source: {line!r}"
            assert src["what"] == f"#{open_[head]}", f"line {n}: wire of #{open_[head]}: {line!r}"
            uses[(current, src["label"])] = open_[head]
        elif src and src["what"].endswith(", no wire"):
            uses[(current, src["label"])] = int(src["what"][1:].split(",")[0])
        for p in open_:
            ended_by_use[p] = p == head
    dangling = {open_[p] for p in open_ if not ended_by_use[p]}
    assert not dangling, f"wires still open at the end: {dangling}"
    return uses


def _expected_uses(a: Analysis, shown: set[int]) -> dict[tuple[int, str], int]:
    """Every (consumer, source label) -> producer for node-made sources of drawn nodes."""
    index_of = {id(nc.node): nc.index for nc in a.nodes}
    out = {}
    for nc in a.nodes:
        if nc.index not in shown:
            continue
        for k, s in enumerate(nc.node.src):
            i = index_of.get(id(s))
            if i is not None and i != nc.index:
                out[(nc.index, SRC_LABELS[k] if k < len(SRC_LABELS) else f"src{k}")] = i
    return out


def _totals_block(text: str) -> list[str]:
    """The lines before the node blocks, without the ones that depend on the narrowing."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("  unmodelled ops:"))
    return [line for line in lines[:end + 1] if not line.startswith(("shown:", "wires:"))]


# ---- golden -------------------------------------------------------------------------------

def test_golden_tiny_llama(tiny1):
    text = render_tree(tiny1)
    if os.environ.get("GRAPHCOST_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_render_is_deterministic(tiny3):
    assert render_tree(tiny3) == render_tree(tiny3)
    assert render_tree(tiny3, layers={1}) == render_tree(tiny3, layers={1})


# ---- relational ---------------------------------------------------------------------------

@pytest.mark.parametrize("fixture", ["tiny1", "tiny3"])
def test_every_node_once_in_order(fixture, request):
    a = request.getfixturevalue(fixture)
    got = _headers(render_tree(a))
    assert got == [(nc.index, nc.node.name, nc.node.op) for nc in a.nodes]


@pytest.mark.parametrize("fixture", ["tiny1", "tiny3"])
def test_every_wire_joins_producer_to_each_consumer(fixture, request):
    a = request.getfixturevalue(fixture)
    text = render_tree(a)
    assert _check_wires(text) == _expected_uses(a, {nc.index for nc in a.nodes})
    assert "no wire" not in text


def test_totals_block(tiny1):
    text = render_tree(tiny1)
    t = tiny1.total
    assert f"graph:   {len(tiny1.nodes)} nodes, {len(tiny1.graph.leafs)} leaves" in text
    assert re.search(rf"^  bytes read +{t.bytes_read:,}  \(", text, re.M)
    assert re.search(rf"^    weights +{t.read['weights']:,}  \(", text, re.M)
    assert re.search(rf"^  bytes written +{t.bytes_written:,}  \(", text, re.M)
    assert re.search(rf"^  flops +{t.flops:,}  \(", text, re.M)
    assert re.search(rf"^    mul +{t.ops['mul']:,}$", text, re.M)
    assert re.search(r"^    tanh +0$", text, re.M)  # every FLOP kind is listed, zeros too
    assert re.search(rf"^  KV cache +{tiny1.kv_cache_bytes:,}  \(", text, re.M)
    assert "  unmodelled ops: none" in text
    # the peak of live temporary storage belongs to another report
    assert "temporary" not in text


def test_unmodelled_node_is_listed_not_costed(tiny1):
    # pretend the first ROPE had no cost function
    k = next(nc.index for nc in tiny1.nodes if nc.node.op == "ROPE")
    nc = NodeCost(k, tiny1.nodes[k].node, None, "no cost function for ROPE")
    nodes = list(tiny1.nodes)
    nodes[k] = nc
    text = render_tree(dataclasses.replace(tiny1, nodes=nodes, unmodelled=[nc]))
    assert f"  unmodelled ops: ROPE x1 (nodes #{k}; not counted in the totals)" in text
    block = text.split(f": ROPE  #{k}\n", 1)[1].split("\n\n", 1)[0]
    assert "cost: unmodelled (no cost function for ROPE)" in block


@pytest.mark.parametrize("layers", [{0}, {1}, {2}, {0, 1}, {0, 2}], ids=["0", "1", "2", "0-1", "0,2"])
def test_layers_narrow_the_blocks_not_the_totals(tiny3, layers):
    full = render_tree(tiny3)
    text = render_tree(tiny3, layers=layers)
    shown = {nc.index for nc in tiny3.nodes if nc.node.layer in layers}
    assert [h[0] for h in _headers(text)] == sorted(shown)
    assert _totals_block(text) == _totals_block(full)
    assert re.search(rf"^shown: +layers? .*: {len(shown)} of {len(tiny3.nodes)} nodes \(narrowed; "
                     r"the totals are for the whole graph\)$", text, re.M)
    assert _check_wires(text) == _expected_uses(tiny3, shown)
    # the epilogue (layer None) is dropped, and the hidden span is said
    assert "result_output: MUL_MAT" not in text
    assert re.search(r"\.\.\. \d+ nodes? not shown \(#\d+(-#\d+)?\) \.\.\.", text)


def test_value_from_a_hidden_layer_enters_from_the_top(tiny3):
    text = render_tree(tiny3, layers={1})
    l_out0 = next(nc.index for nc in tiny3.nodes if nc.node.name == "l_out-0")
    entry = f"<---------l_out-0: ADD  #{l_out0} (made by a node not shown)"
    section = _node_section(text)
    assert entry in section
    # it enters just above the first node of layer 1, which reads it
    first = next(nc for nc in tiny3.nodes if nc.node.layer == 1)
    assert section[section.index(entry) + 1].endswith(f"{first.node.name}: {first.node.op}  #{first.index}")


def test_unknown_layer_shows_no_blocks(tiny3):
    text = render_tree(tiny3, layers={7})
    assert _headers(text) == []
    assert "(no nodes in the selected layers)" in text


def test_wire_cap(tiny3):
    text = render_tree(tiny3, max_wires=2)
    assert re.search(r"^wires: +2 columns \(the cap\); \d+ values found no free column", text, re.M)
    assert "no wire" in text
    # with the cap every node-made source is still accounted for: wired or marked
    assert _check_wires(text) == _expected_uses(tiny3, {nc.index for nc in tiny3.nodes})


# ---- the header-only examples --------------------------------------------------------------

@functools.cache
def _example(name: str) -> Analysis:
    return _analysis(ROOT / "examples" / name, RunSettings(tokens=1, past=31, flash_attn="off"))


@pytest.mark.parametrize("name", EXAMPLES, ids=[e.split("-")[0] for e in EXAMPLES])
def test_examples_render(name):
    example = _example(name)
    t0 = time.perf_counter()
    text = render_tree(example)
    dt = time.perf_counter() - t0
    width = _gutter_width(text) // 2
    print(f"\n{name}: {len(example.nodes)} nodes, {text.count(chr(10))} lines, "
          f"gutter {width} columns, rendered in {dt:.3f} s")
    # measured: 5 columns on all three examples (flash attention on or off, 1 or 32 tokens)
    assert width < MAX_WIRES
    assert [h[0] for h in _headers(text)] == list(range(len(example.nodes)))
    assert _check_wires(text) == _expected_uses(example, {nc.index for nc in example.nodes})


def test_mistral_first_layers():
    example = _example(EXAMPLES[0])
    text = render_tree(example, layers={0, 1})
    shown = {nc.index for nc in example.nodes if nc.node.layer in (0, 1)}
    assert [h[0] for h in _headers(text)] == sorted(shown)
    assert _check_wires(text) == _expected_uses(example, shown)
