"""``--format html``: one self-contained page built from the JSON report's document.

Without a browser: the embedded data is the document itself (same JSON), and a hostile
model name cannot end the data element or form markup. With Chromium (Debian package
``chromium``; skipped with the reason when absent): the page loads headless with no
console error and no request, and a check script injected into a copy of the page
clicks the table headers (rows come back sorted), searches for a node and opens it and
its neighbours, and reads the numbers on screen, which must equal the JSON report's.
A 3,000-node graph must load and filter quickly.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from fixtures import write_llama
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.memory.plan import plan_memory, sweep
from graphcost.document import document, memory_document
from graphcost.report.html import embed_json, render_analysis, render_memory_page
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>&amp;\u2028'
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
needs_browser = pytest.mark.skipif(
    BROWSER is None, reason="no Chromium: apt-get install chromium (Debian) to test the HTML report "
                            "in a real browser")


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory):
    """The tiny llama with general.name set to markup that would run if it were HTML."""
    orig = gguf.GGUFWriter.add_name
    gguf.GGUFWriter.add_name = lambda self, name: orig(self, HOSTILE)
    try:
        return write_llama(tmp_path_factory.mktemp("html") / "tiny.gguf", n_layer=2).path
    finally:
        gguf.GGUFWriter.add_name = orig


def _analysis(path, **kw):
    return analyze_graph(build_graph(load_model(path), RunSettings(**kw)), memory=True)


def _data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="gc-data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_embedded_data_is_the_json_document(hostile_model):
    a = _analysis(hostile_model, ctx_size=512, tokens=2, past=3)
    page = render_analysis(a)
    data = _data(page)
    assert data == {"kind": "analyze", "doc": json.loads(json.dumps(document(a)))}
    assert data["doc"]["model"]["name"] == HOSTILE
    # the only </script> and <script> tags are the page's own: 2 closing, 2 opening
    assert page.lower().count("</script") == 2 and page.lower().count("<script") == 2
    assert "<img" not in page and "onerror=" in page  # the text survives, escaped in JSON
    assert embed_json({"s": "<>&\u2028"}) == '{"s":"\\u003c\\u003e\\u0026\\u2028"}'
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in page  # nothing fetched: no CDN, no font, no script


def _run_page(page: str, tmp_path: Path, check_js: str, name: str = "page.html") -> dict:
    """Load ``page`` with an error catcher first and ``check_js`` last; return what the
    check script wrote into ``#gc-test-results`` and the console lines Chromium logged."""
    catcher = ("<script>window.__errors=[];addEventListener('error',e=>__errors.push(String(e.message)));"
               "const __ce=console.error;console.error=(...a)=>{__errors.push(a.join(' '));__ce(...a)};"
               "window.__t0=performance.now();</script>")
    runner = ("<script>(function(){let out;try{out=(function(){" + check_js + "})();}"
              "catch(e){out={exception:String(e&&e.stack||e)}}"
              "out.errors=window.__errors;out.resources=performance.getEntriesByType('resource').length;"
              "const pre=document.createElement('pre');pre.id='gc-test-results';"
              "pre.textContent=JSON.stringify(out);document.body.append(pre);})();</script>")
    assert page.count("<head>") == 1 and page.count("</body>") == 1
    page = page.replace("<head>", "<head>" + catcher, 1).replace("</body>", runner + "</body>", 1)
    f = tmp_path / name
    f.write_text(page, encoding="utf-8")
    r = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        "--disable-dev-shm-usage",  # containers: a small /dev/shm
                        "--enable-logging=stderr", "--v=0", "--virtual-time-budget=15000",
                        "--dump-dom", f.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="gc-test-results">(.*?)</pre>', r.stdout, re.S)
    assert m, f"no results from the page; chromium said: {r.stderr[-2000:]}"
    out = json.loads(html.unescape(m.group(1)))
    out["console"] = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln]
    return out


ANALYZE_CHECK = r"""
const R = {};
const D = JSON.parse(document.getElementById('gc-data').textContent).doc;
R.title = document.title;
R.pwned = window.__pwned || 0;
R.imgs = document.querySelectorAll('img').length;
R.heading = document.getElementById('title').textContent;
const col = (id, key) => [...document.querySelectorAll('#' + id + ' tbody td[data-key="' + key + '"]')];
const th = (id, key) => document.querySelector('#' + id + ' th[data-key="' + key + '"]');
// sort by_op by bytes read: descending, then ascending
th('table-by_op', 'bytes_read').click();
R.sortDesc = col('table-by_op', 'bytes_read').map(td => Number(td.dataset.value));
R.sortDescAria = th('table-by_op', 'bytes_read').getAttribute('aria-sort');
th('table-by_op', 'bytes_read').click();
R.sortAsc = col('table-by_op', 'bytes_read').map(td => Number(td.dataset.value));
th('table-by_op', 'key').click();
R.sortOps = col('table-by_op', 'key').map(td => td.textContent);
// the numbers on screen, as text, per op / layer / block
const shown = (id, k) => Object.fromEntries([...document.querySelectorAll('#' + id + ' tbody tr')].map(tr =>
  [tr.querySelector('td[data-key="' + k + '"]').textContent,
   Object.fromEntries([...tr.querySelectorAll('td.num')].map(td => [td.dataset.key, td.textContent]))]));
R.byOp = shown('table-by_op', 'key');
R.byBlock = shown('table-by_block', 'key');
R.byLayer = shown('table-by_layer', 'layer');
R.liveMarks = [...document.querySelectorAll('.live-mark title')].map(t => t.textContent);
R.totalFlops = document.getElementById('total-flops').textContent;
R.peakBytes = document.getElementById('peak-bytes').textContent;
R.breakdown = [...document.querySelectorAll('#memory-breakdown tbody td[data-value]')].map(td => td.textContent);
// search, open, follow an input and a consumer
const t1 = performance.now();
const s = document.getElementById('search');
s.value = 'attn_norm-1';
s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
R.searchMs = performance.now() - t1;
R.hits = [...document.querySelectorAll('#results tr')].map(tr => tr.children[1].textContent);
R.hitCount = document.getElementById('hit-count').textContent;
document.querySelector('#results tr').click();
R.opened = document.getElementById('detail-name').textContent;
R.detail = Object.fromEntries([...document.querySelectorAll('#detail [data-key]')].map(e => [e.dataset.key, e.textContent]));
R.inputs = [...document.querySelectorAll('#detail-inputs li')].map(li => li.textContent);
R.consumers = [...document.querySelectorAll('#detail-consumers li')].map(li => li.textContent);
document.querySelector('#detail-inputs button').click();
R.afterInput = Number(document.getElementById('detail-name').dataset.index);
document.querySelector('#detail-consumers button').click();
R.afterConsumer = Number(document.getElementById('detail-name').dataset.index);
s.value = 'mul_mat';
s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
R.opHits = document.getElementById('hit-count').textContent;
R.rowsShown = document.querySelectorAll('#results tr').length;
R.loadMs = t1 - window.__t0;
return R;
"""


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@needs_browser
def test_analyze_page_in_chromium(hostile_model, tmp_path):
    a = _analysis(hostile_model, ctx_size=512, tokens=2, past=3)
    doc = json.loads(json.dumps(document(a)))
    r = _run_page(render_analysis(a), tmp_path, ANALYZE_CHECK)
    assert "exception" not in r, r["exception"]
    assert r["errors"] == [] and r["console"] == [] and r["resources"] == 0
    assert r["pwned"] == 0 and r["imgs"] == 0
    assert r["title"] == "graphcost: " + HOSTILE and r["heading"].startswith(HOSTILE)
    # sorting
    assert r["sortDescAria"] == "descending"
    assert r["sortDesc"] == sorted((o["bytes_read"] for o in doc["by_op"]), reverse=True)
    assert r["sortAsc"] == sorted(o["bytes_read"] for o in doc["by_op"])
    assert r["sortOps"] == sorted(o["key"] for o in doc["by_op"])[::-1]  # first click: descending
    # every number in the three tables equals the JSON document's
    for rows, key, shown in ((doc["by_op"], "key", r["byOp"]), (doc["by_block"], "key", r["byBlock"])):
        assert set(shown) == {row[key] for row in rows}
        for row in rows:
            s = shown[row[key]]
            assert _int(s["flops"]) == row["flops"] and _int(s["bytes_read"]) == row["bytes_read"]
            assert _int(s["bytes_written"]) == row["bytes_written"]
            for k in ("weights", "kv", "inputs", "act"):
                assert _int(s["read." + k]) == row["read"][k]
    for row in doc["by_layer"]:
        s = r["byLayer"]["outside layers" if row["layer"] is None else str(row["layer"])]
        assert _int(s["flops"]) == row["flops"] and _int(s["bytes_read"]) == row["bytes_read"]
    assert _int(r["totalFlops"]) == doc["totals"]["flops"]
    assert _int(r["peakBytes"]) == doc["memory"]["peak_live_bytes"]
    # each tensor live at the peak that a node made is ticked at that node
    peak = doc["memory"]["peak_node"]["index"]
    made = [(max(n["index"] for n in doc["nodes"][:peak + 1] if n["name"] == t["name"]), t["name"])
            for t in doc["memory"]["peak_tensors"] if any(n["name"] == t["name"] for n in doc["nodes"][:peak + 1])]
    assert made and [m.split(":")[0] for m in r["liveMarks"]] == [f"#{i} {name}" for i, name in made]
    mem = doc["memory"]
    parts = [doc["model"]["weights_bytes"]] + [c["bytes"] for c in mem["kv_caches"]] + [
        mem["compute_buffer_bytes"], mem["output_buffer_bytes"]]
    assert [_int(x) for x in r["breakdown"]] == parts + [sum(parts)]
    # search finds the node; its numbers and neighbours are the document's
    want = [n for n in doc["nodes"] if "attn_norm-1" in n["name"]]
    assert r["hits"] == [n["name"] for n in want] and len(want) == 1
    node = want[0]
    assert r["opened"] == f"#{node['index']} {node['name']}"
    assert _int(r["detail"]["flops"]) == node["cost"]["flops"]
    assert _int(r["detail"]["live_bytes"]) == node["live_bytes"]
    assert _int(r["detail"]["nbytes"].split()[0]) == node["nbytes"]
    assert [i.split(" (")[0].split(" ", 1)[-1] for i in r["inputs"]] == node["src"]
    producer = max(n["index"] for n in doc["nodes"][:node["index"]] if n["name"] == node["src"][0])
    assert r["afterInput"] == producer
    users = [n["index"] for n in doc["nodes"] if node["name"] in n["src"] and n["index"] > node["index"]]
    assert r["consumers"] and r["consumers"][0].startswith(f"#{users[0]} ")
    n_mm = sum(n["op"] == "MUL_MAT" for n in doc["nodes"])
    assert r["opHits"] == f"{n_mm:,} of {len(doc['nodes']):,} nodes"


@needs_browser
def test_3000_node_graph_stays_responsive(tmp_path):
    """100 llama layers: ~3,000 nodes. The node list is paginated (100 rows), so the page
    draws 100 rows whatever the graph's size."""
    path = write_llama(tmp_path / "deep.gguf", n_embd=64, n_head=2, n_head_kv=1, n_ff=128,
                       n_layer=100, n_vocab=260).path
    a = _analysis(path, ctx_size=256)
    assert len(a.nodes) >= 3000
    page = render_analysis(a)
    r = _run_page(page, tmp_path, ANALYZE_CHECK.replace("attn_norm-1'", "attn_norm-77'"))
    assert "exception" not in r, r["exception"]
    assert r["errors"] == [] and r["console"] == []
    assert r["rowsShown"] == 100 and r["hits"] == ["attn_norm-77"]
    print(f"\n{len(a.nodes)} nodes, {len(page):,} bytes: drawn in {r['loadMs']:.0f} ms, "
          f"search in {r['searchMs']:.1f} ms")
    assert r["loadMs"] < 3000 and r["searchMs"] < 300  # generous: 2 shared cores


MEMORY_CHECK = r"""
const R = {};
R.title = document.title;
R.breakdown = [...document.querySelectorAll('#memory-breakdown tbody td[data-value]')].map(td => td.textContent);
const th = document.querySelector('#table-sweep th[data-key="compute_buffer_bytes"]');
th.click(); th.click();
R.sweepAsc = [...document.querySelectorAll('#table-sweep tbody td[data-key="compute_buffer_bytes"]')].map(td => td.textContent);
R.charts = document.querySelectorAll('svg polyline').length;
R.peakTensors = [...document.querySelectorAll('#table-peak-tensors tbody tr')].map(tr => tr.children[0].textContent);
return R;
"""


@needs_browser
def test_memory_page_in_chromium(hostile_model, tmp_path):
    model = load_model(hostile_model)
    s = RunSettings(ctx_size=1024, flash_attn="off")
    plan = plan_memory(model, s)
    values = [512, 2048, 256]
    swept = ("ctx", values, sweep(model, s, "ctx", values))
    doc = memory_document(plan, swept)
    r = _run_page(render_memory_page(plan, swept), tmp_path, MEMORY_CHECK)
    assert "exception" not in r, r["exception"]
    assert r["errors"] == [] and r["console"] == [] and r["resources"] == 0
    assert r["title"] == "graphcost memory: " + HOSTILE
    b = doc["breakdown"]
    assert [_int(x) for x in r["breakdown"]] == [b["weights_bytes"]] + [c["bytes"] for c in b["kv_caches"]] + [
        b["compute_buffer_bytes"], b["output_buffer_bytes"], b["total_bytes"]]
    assert [_int(x) for x in r["sweepAsc"]] == sorted(x["compute_buffer_bytes"] for x in doc["sweep"]["rows"])
    assert r["charts"] == len(doc["reserve_graphs"]) == 2
    assert r["peakTensors"] == [t["name"] for t in sorted(doc["peak_tensors"], key=lambda t: -t["bytes"])]


def test_cli_html_formats(tmp_path):
    model = write_llama(tmp_path / "tiny.gguf", n_layer=2).path
    for args in (["analyze", model, "-f", "html", "-o", tmp_path / "a.html"],
                 ["memory", model, "-f", "html", "--sweep", "ub=1,64", "-o", tmp_path / "m.html"]):
        r = subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stderr == "", r.stderr
    assert _data((tmp_path / "a.html").read_text())["kind"] == "analyze"
    assert _data((tmp_path / "m.html").read_text())["doc"]["sweep"]["key"] == "ub"
    bad = subprocess.run([sys.executable, "-m", "graphcost", "memory", str(model), "-f", "html",
                          "--fuse", "attention"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "graphcost: --fuse is shown by --format text only"]


ROOFLINE_CHECK = r"""
const R = {};
R.total = document.getElementById('roofline-seconds').textContent;
R.byOp = Object.fromEntries([...document.querySelectorAll('#table-by_op tbody tr')].map(tr =>
  [tr.querySelector('td[data-key="key"]').textContent, tr.querySelector('td[data-key="roofline_seconds"]').dataset.value]));
window.graphcost.select(5);
R.node5 = [...document.querySelectorAll('#detail th')].filter(th => th.textContent === 'roofline')
  .map(th => th.nextElementSibling.textContent);
return R;
"""


@needs_browser
def test_roofline_times_in_chromium(hostile_model, tmp_path):
    """--hardware: the per-op roofline column holds the document's seconds exactly
    (JavaScript and Python print a double the same shortest way)."""
    from graphcost.cost.hardware import load
    a = _analysis(hostile_model, ctx_size=512, tokens=4)
    hw = load("apple-m2")
    doc = json.loads(json.dumps(document(a, hardware=hw)))
    r = _run_page(render_analysis(a, hardware=hw), tmp_path, ROOFLINE_CHECK)
    assert "exception" not in r, r["exception"]
    assert r["errors"] == [] and r["console"] == []
    want = {o["op"]: o["seconds"] for o in doc["roofline"]["by_op"]}
    assert len(want) >= 5
    assert {k: float(v) for k, v in r["byOp"].items() if v is not None} == want
    assert all(r["byOp"].get(o["key"]) is None for o in doc["by_op"] if o["key"] not in want)
    assert r["total"] == f"{doc['roofline']['seconds'] * 1e6:.3f} \u00b5s"
    sec = doc["nodes"][5]["roofline_seconds"]
    assert r["node5"] == [f"{sec * 1e6:.3f} \u00b5s" if sec < 1e-3 else f"{sec * 1e3:.3f} ms"]
