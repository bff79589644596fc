"""The memory sweep plot (matplotlib, ``graphcost[plot]``): units that fit the numbers,
every series drawn with the plan's exact values in its panel's unit, no two labels
overlapping, PNG and SVG by suffix, and one line (exit 2) without matplotlib."""
from __future__ import annotations

import itertools
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fixtures import write_llama
from graphcost.graph.build import load_model
from graphcost.memory.plan import sweep
from graphcost.report.plot import byte_unit
from graphcost.resources import bundled
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
GiB, MiB = 1 << 30, 1 << 20


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("n,unit", [
    (100 * GiB, "GiB"), (65879 * MiB, "GiB"), (GiB, "GiB"), (GiB - 1, "MiB"),
    (300 * MiB, "MiB"), (1200, "KiB"), (1023, "B"), (2 << 40, "TiB")])
def test_byte_unit(n, unit):
    assert byte_unit(n)[0] == unit


def _check_figure(fig, values, plans):
    """Each panel's lines hold the plans' bytes in the panel's unit; no texts overlap."""
    from graphcost.report.plot import visible_text_boxes
    axes = fig.axes
    assert len(axes) == 3
    expect = [
        {"total": [p.total_bytes for p in plans], "model weights": [p.weights_bytes for p in plans]},
        {"KV cache": [p.kv_cache_bytes for p in plans]},
        {"compute buffer": [p.compute_buffer_bytes for p in plans]},
    ]
    for ax, series in zip(axes, expect):
        unit, size = byte_unit(max(max(v) for v in series.values()))
        assert ax.get_ylabel() == unit
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for label, ys in series.items():
            assert list(lines[label].get_xdata()) == values
            assert list(lines[label].get_ydata()) == pytest.approx([y / size for y in ys], rel=1e-12)
            lo, hi = ax.get_ylim()
            assert lo <= min(ys) / size and max(ys) / size <= hi  # nothing clipped
    boxes = visible_text_boxes(fig)
    for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), f"{ta!r} overlaps {tb!r}"
    return boxes


def test_123b_model_ctx_sweep_is_readable():
    """Mistral Large 2407 (123B, 64.3 GiB of Q4_0 weights): GiB in every panel; the
    compute buffer (0.26 .. 24.4 GiB) has its own panel, on a log scale (span >= 16x)."""
    model = load_model(bundled("examples") / "mistral-large-2407-q4_0.gguf")
    values = [512, 2048, 8192, 32768, 131072]
    plans = sweep(model, RunSettings(flash_attn="off"), "ctx", values)
    pytest.importorskip("matplotlib", reason="pip install 'graphcost[plot]' for plots")
    from graphcost.report.plot import sweep_figure
    fig = sweep_figure("ctx", values, plans)
    boxes = _check_figure(fig, values, plans)
    assert [ax.get_ylabel() for ax in fig.axes] == ["GiB", "GiB", "GiB"]
    assert fig.axes[2].get_yscale() == "log" and fig.axes[0].get_yscale() == "linear"
    texts = [t for t, _ in boxes]
    # ffn_gate sets the peak at 512, the KQ scores from 2048 on: one label per run
    assert "ffn_gate" in texts and "kq (2048-131072)" in texts


def test_tiny_model_ub_sweep_labels_do_not_overlap(tmp_path):
    model = load_model(write_llama(tmp_path / "llama.gguf").path)
    values = [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    plans = sweep(model, RunSettings(flash_attn="off"), "ub", values)
    pytest.importorskip("matplotlib", reason="pip install 'graphcost[plot]' for plots")
    from graphcost.report.plot import sweep_figure
    fig = sweep_figure("ub", values, plans)
    _check_figure(fig, values, plans)
    assert [ax.get_ylabel() for ax in fig.axes] == ["MiB", "MiB", "MiB"]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_file_by_suffix(tmp_path, suffix):
    pytest.importorskip("matplotlib", reason="pip install 'graphcost[plot]' for plots")
    model = write_llama(tmp_path / "llama.gguf").path
    out = tmp_path / f"sweep{suffix}"
    r = cli("memory", model, "--sweep", "ctx=512,4096,32768", "-o", out)
    assert r.returncode == 0, r.stderr
    if suffix == ".png":
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        root = ET.parse(out).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg"


def test_without_matplotlib_one_line_exit_2(tmp_path):
    """A ``matplotlib`` package that fails to import stands in for a missing one."""
    fake = tmp_path / "nompl" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fake.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    model = write_llama(tmp_path / "llama.gguf").path
    r = cli("memory", model, "--sweep", "ub=1,64", "-o", tmp_path / "p.png", env=env)
    assert r.returncode == 2 and r.stdout == ""  # refused before any work
    assert r.stderr.strip().splitlines() == [
        f"graphcost: -o {tmp_path / 'p.png'}: plots need matplotlib: pip install 'graphcost[plot]'"]


def _overlaps(fig) -> list[tuple[str, str]]:
    from graphcost.report.plot import visible_text_boxes
    return [(a, b) for (a, x), (b, y) in itertools.combinations(visible_text_boxes(fig), 2)
            if x.overlaps(y)]


def test_crowded_labels_are_moved_or_dropped(tmp_path, monkeypatch):
    """31 swept values on a linear axis (500..530: under 8x, so not log) and a peak tensor
    that changes at every point: without the declutter step tick labels and peak labels
    collide (the check has teeth); with it nothing overlaps and labels are kept where
    there is room."""
    pytest.importorskip("matplotlib", reason="pip install 'graphcost[plot]' for plots")
    from graphcost.report import plot
    model = load_model(write_llama(tmp_path / "llama.gguf").path)
    values = list(range(500, 531))
    plans = sweep(model, RunSettings(flash_attn="off"), "ub", values)
    names = iter(itertools.cycle(["ffn_gate_long_name", "kq"]))
    monkeypatch.setattr(plot, "_base_name", lambda p: next(names))
    with monkeypatch.context() as m:
        m.setattr(plot, "_declutter", lambda *a: None)
        crowded = plot.sweep_figure("ub", values, plans)
    assert len(_overlaps(crowded)) > 30
    fig = plot.sweep_figure("ub", values, plans)
    _check_figure(fig, values, plans)
    shown = [t for t in fig.axes[2].texts if t.get_visible()]
    assert 3 <= len(shown) < len(values)
    ticks = [t for t in fig.axes[2].get_xticklabels() if t.get_visible()]
    assert 3 <= len(ticks) < len(values)
    fig.savefig(tmp_path / "crowded.png")  # drawing again keeps the decisions
    assert _overlaps(fig) == []
