"""Hostile and careless input, second round: every probe a case with an id.

tests/test_bad_input.py damages GGUF files; this set aims at everything else a user or an
attacker hands graphcost: ``-o`` targets that are inputs or models, FIFOs and devices in
place of files, baselines and hardware profiles with NaNs, wrong types and alias bombs,
headers that parse but contradict themselves, names that carry rich markup or terminal
escape sequences, nonsense sizes that parse, partial downloads, and where the user's
hardware profiles go. Each probe asserts the exit code (2 for bad input) and that the
message is one line naming what is wrong; the CLI runs in-process through
``graphcost.cli.main`` (FIFO probes, which would hang a broken reader, in a subprocess
with a timeout). XDG_CONFIG_HOME points at a temporary directory for every test, so no
probe reads or writes the user's real profiles.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tracemalloc
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
import yaml
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from fixtures import write_llama
from graphcost.cli import main
from graphcost.errors import GraphcostError

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------
# files: a header-only llama whose hyperparameters and tensor infos can be overridden
# --------------------------------------------------------------------------------------

N_EMBD, N_HEAD, N_KV, N_FF, N_VOCAB, N_LAYER = 64, 4, 2, 96, 50, 2
HD = N_EMBD // N_HEAD  # 16


def header_only(path: Path, *, kv: dict | None = None, tensors: dict | None = None,
                drop: tuple[str, ...] = (), name: str = "tiny", n_vocab: int = N_VOCAB) -> Path:
    """A header-only arch-llama GGUF (2 layers, n_embd 64, 4 heads of 16, 2 KV heads,
    n_ff 96, vocab 50); ``kv``: extra keys {key: (type, value)}; ``tensors``: {name:
    (ne, type)} added or replacing; ``drop``: tensors left out."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(1e-5)
    if n_vocab < 2**32:
        w.add_vocab_size(n_vocab)
    else:
        w.add_key_value("llama.vocab_size", n_vocab, VT.UINT64)
    for key, (vt, value) in (kv or {}).items():
        w.add_key_value(key, value, vt)
    ts = {"token_embd.weight": ((N_EMBD, n_vocab), QT.F32),
          "output_norm.weight": ((N_EMBD,), QT.F32),
          "output.weight": ((N_EMBD, n_vocab), QT.F32)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.update({p + "attn_norm.weight": ((N_EMBD,), QT.F32),
                   p + "attn_q.weight": ((N_EMBD, N_HEAD * HD), QT.F32),
                   p + "attn_k.weight": ((N_EMBD, N_KV * HD), QT.F32),
                   p + "attn_v.weight": ((N_EMBD, N_KV * HD), QT.F32),
                   p + "attn_output.weight": ((N_HEAD * HD, N_EMBD), QT.F32),
                   p + "ffn_norm.weight": ((N_EMBD,), QT.F32),
                   p + "ffn_gate.weight": ((N_EMBD, N_FF), QT.F32),
                   p + "ffn_up.weight": ((N_EMBD, N_FF), QT.F32),
                   p + "ffn_down.weight": ((N_FF, N_EMBD), QT.F32)})
    ts.update(tensors or {})
    for d in drop:
        del ts[d]
    for tname, (ne, qt) in ts.items():
        blk, size = GGML_QUANT_SIZES[qt]
        w.add_tensor_info(tname, list(reversed(ne)), np.dtype(np.float32),
                          int(np.prod(ne)) // blk * size, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def moe_layers(used) -> dict:
    """expert_count 4, expert_used_count ``used``, and expert tensors in every layer."""
    kv = {"llama.expert_count": (VT.UINT32, 4),
          "llama.expert_used_count": (VT.ARRAY, used) if isinstance(used, list)
          else (VT.UINT32, used)}
    tensors = {}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        tensors[p + "ffn_gate_inp.weight"] = ((N_EMBD, 4), QT.F32)
        tensors[p + "ffn_gate_exps.weight"] = ((N_EMBD, N_FF, 4), QT.F32)
        tensors[p + "ffn_up_exps.weight"] = ((N_EMBD, N_FF, 4), QT.F32)
        tensors[p + "ffn_down_exps.weight"] = ((N_FF, N_EMBD, 4), QT.F32)
    drop = tuple(f"blk.{i}.ffn_{k}.weight" for i in range(N_LAYER) for k in ("gate", "up", "down"))
    return dict(kv=kv, tensors=tensors, drop=drop)


#: a model name that is rich markup, an OSC 8 hyperlink, a window title and a screen clear
EVIL_NAME = "evil[/bold] [link=file:///etc/passwd]click[/link] \x1b]0;pwned\x07\x1b[2J:smile:"


@pytest.fixture(autouse=True)
def config_home(tmp_path, monkeypatch):
    """Every test gets its own empty user configuration directory (platformdirs reads
    XDG_CONFIG_HOME on Linux)."""
    d = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(d))
    return d


@pytest.fixture
def model(tmp_path) -> Path:
    return header_only(tmp_path / "model.gguf")


def run(argv: list, monkeypatch, capsys) -> tuple[int, str, str]:
    """``graphcost ARGV`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["graphcost", *map(str, argv)])
    monkeypatch.delenv("GRAPHCOST_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def run_subprocess(argv: list, cwd: Path, timeout: float = 60) -> tuple[int, str, str]:
    """``python -m graphcost ARGV`` with a timeout (for probes a broken reader would hang)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GRAPHCOST_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "graphcost", *map(str, argv)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr


def one_line(err: str, expect: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert expect in lines[0], lines[0]
    assert lines[0].isprintable(), repr(lines[0])


def baseline(tmp_path: Path, model: Path, monkeypatch, capsys) -> tuple[Path, dict]:
    """A real baseline of ``model`` (analyze -f yaml), and its document."""
    b = tmp_path / "base.yaml"
    code, _, err = run(["analyze", model, "-f", "yaml", "-o", b, "-c", 256], monkeypatch, capsys)
    assert code == 0, err
    return b, yaml.safe_load(b.read_text())


# --------------------------------------------------------------------------------------
# item 5: partial files
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_llama(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("partial") / "whole.gguf", n_layer=2).path


def _cut(full: Path, where: str, tmp_path: Path) -> Path:
    """The whole file cut right after the header ('header'), in the first tensor's data
    ('data'), or one byte before its end ('last-byte')."""
    from graphcost.format.gguf_reader import read_header
    buf = full.read_bytes()
    h = read_header(full)
    n = {"header": h.data_offset, "data": h.data_offset + 4096, "last-byte": len(buf) - 1}[where]
    p = tmp_path / f"cut-{where}.gguf"
    p.write_bytes(buf[:n])
    return p


def _same_doc(a: dict, b: dict) -> None:
    """Documents equal except the model path, has_tensor_data and the data note."""
    for d in (a, b):
        d["model"].pop("path")
        d["model"].pop("has_tensor_data")
        d["notes"] = [n for n in d["notes"] if "tensor data" not in n]
    assert a == b


@pytest.mark.parametrize("where", ["header", "data", "last-byte"])
def test_partial_file_analyze_and_memory_equal_the_whole_file(full_llama, where, tmp_path,
                                                              monkeypatch, capsys):
    cut = _cut(full_llama, where, tmp_path)
    docs = []
    for path in (full_llama, cut):
        o = tmp_path / f"{path.stem}.json"
        code, _, err = run(["analyze", path, "-f", "json", "-o", o, "-c", 256, "--tokens", 3],
                           monkeypatch, capsys)
        assert code == 0, err
        docs.append(json.loads(o.read_text()))
    note = [n for n in docs[1]["notes"] if "tensor data" in n]
    assert len(note) == 1
    assert ("absent" if where == "header" else "cut short") in note[0]
    assert docs[1]["model"]["has_tensor_data"] is False
    _same_doc(*docs)
    outs = []
    for path in (full_llama, cut):
        code, out, err = run(["memory", path, "-c", 256], monkeypatch, capsys)
        assert code == 0, err
        outs.append(out)
    assert "note: " not in outs[0] and "tensor data" in outs[1]
    assert outs[0].splitlines()[2:] == [line for line in outs[1].splitlines()[2:]
                                        if not line.startswith("note: ")]


@pytest.mark.parametrize("where", ["data", "last-byte"])
def test_partial_file_check_passes_the_whole_files_baseline(full_llama, where, tmp_path,
                                                            monkeypatch, capsys):
    b, _ = baseline(tmp_path, full_llama, monkeypatch, capsys)
    code, out, err = run(["check", _cut(full_llama, where, tmp_path), "--baseline", b],
                         monkeypatch, capsys)
    assert code == 0, out + err and "ok:" in out


@pytest.mark.parametrize("where", ["data", "last-byte"])
def test_partial_file_profile_refuses_in_one_line(full_llama, where, tmp_path, monkeypatch,
                                                  capsys):
    cut = _cut(full_llama, where, tmp_path)
    code, _, err = run(["profile", cut, "--token-ids", "1,2", "-c", 256, "--hardware", "apple-m2"],
                       monkeypatch, capsys)
    assert code == 2
    one_line(err, "tensor data is cut short")
    assert str(cut) in err


def test_file_cut_inside_the_header_stays_an_error(full_llama, tmp_path, monkeypatch, capsys):
    from graphcost.format.gguf_reader import read_header
    p = tmp_path / "cut-in-header.gguf"
    p.write_bytes(full_llama.read_bytes()[:read_header(full_llama).data_offset - 40])
    code, _, err = run(["analyze", p], monkeypatch, capsys)
    assert code == 2
    one_line(err, "truncated")


# --------------------------------------------------------------------------------------
# item 6: hardware profiles in the user's configuration directory
# --------------------------------------------------------------------------------------

PROFILE = {"name": "mine", "kind": "measured", "memory_bandwidth": {"bytes_per_second": 2e10},
           "peak_flops": {"flops_per_second": 1e11}}


def test_save_goes_to_the_user_config_dir_never_the_package(config_home):
    from graphcost.cost import hardware as hw
    before = sorted(p.name for p in hw.hardware_dir().iterdir())
    path, note = hw.save(dict(PROFILE), "mine")
    assert path == config_home / "graphcost" / "hardware" / "mine.yaml" and path.is_file()
    assert note is None
    assert sorted(p.name for p in hw.hardware_dir().iterdir()) == before
    assert hw.load("mine").path == path and hw.load("mine").bandwidth == 2e10
    assert "mine" in hw.available() and "apple-m2" in hw.available()


def test_user_profile_shadows_a_bundled_one_and_says_so(config_home):
    from graphcost.cost import hardware as hw
    bundled = hw.load("apple-m2")
    path, note = hw.save(dict(PROFILE, name="apple-m2"), "apple-m2")
    assert "now means this profile" in note
    mine = hw.load("apple-m2")
    assert mine.path == path and mine.bandwidth == 2e10 != bundled.bandwidth
    assert bundled.path.parent == hw.hardware_dir()


def test_save_and_load_by_path(tmp_path):
    from graphcost.cost import hardware as hw
    target = tmp_path / "sub" / "probe.yaml"
    path, _ = hw.save(dict(PROFILE), str(target))
    assert path == target and target.is_file()
    assert hw.load(str(target)).bandwidth == 2e10
    assert not (hw.user_dir() / "probe.yaml").exists()


def test_analyze_finds_a_user_profile_by_name(model, config_home, monkeypatch, capsys):
    from graphcost.cost import hardware as hw
    hw.save(dict(PROFILE), "mine")
    assert (config_home / "graphcost" / "hardware" / "mine.yaml").is_file()
    code, out, err = run(["analyze", model, "-c", 256, "--hardware", "mine"], monkeypatch, capsys)
    assert code == 0, err
    assert "Roofline on mine" in out


# --------------------------------------------------------------------------------------
# item 8: the probes
# --------------------------------------------------------------------------------------


def _alias_bomb(levels: int = 12) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _edit_baseline(edit: Callable[[dict], object]) -> Callable:
    """A probe: the model's own baseline with ``edit`` applied, then ``check``."""
    def make(tmp_path, model, monkeypatch, capsys):
        b, doc = baseline(tmp_path, model, monkeypatch, capsys)
        edit(doc)
        b.write_text(yaml.safe_dump(doc, sort_keys=False))
        return ["check", model, "--baseline", b]
    return make


def _set(path: str, value) -> Callable[[dict], None]:
    def edit(doc):
        keys = path.split(".")
        d = doc
        for k in keys[:-1]:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[int(keys[-1]) if isinstance(d, list) else keys[-1]] = value
    return edit


def _baseline_text(text: str) -> Callable:
    def make(tmp_path, model, monkeypatch, capsys):
        b = tmp_path / "base.yaml"
        b.write_text(text)
        return ["check", model, "--baseline", b]
    return make


def _baseline_path(path: str) -> Callable:
    return lambda tmp_path, model, mp, cs: ["check", model, "--baseline", path]


def _huge_baseline(tmp_path, model, monkeypatch, capsys):
    b = tmp_path / "huge.yaml"
    with open(b, "wb") as f:  # sparse: 40 MiB on paper, nothing on disk
        f.truncate(40 << 20)
    return ["check", model, "--baseline", b]


def _profile_file(doc_or_text) -> Callable:
    def make(tmp_path, model, monkeypatch, capsys):
        p = tmp_path / "hw.yaml"
        p.write_text(doc_or_text if isinstance(doc_or_text, str) else yaml.safe_dump(doc_or_text))
        return ["analyze", model, "-c", 256, "--hardware", p]
    return make


def _bad_header(**kw) -> Callable:
    def make(tmp_path, model, monkeypatch, capsys):
        return ["analyze", header_only(tmp_path / "bad.gguf", **kw), "-c", 256]
    return make


def _argv(*args) -> Callable:
    """A probe on the model: ``{model}`` and ``{tmp}`` are filled in."""
    def make(tmp_path, model, monkeypatch, capsys):
        return [str(a).format(model=model, tmp=tmp_path) for a in args]
    return make


def _gguf_as_output(tmp_path, model, monkeypatch, capsys):
    other = header_only(tmp_path / "other.gguf")
    return ["analyze", "-o", other]  # the model argument forgotten: -o names a model


HW = ["--hardware", "apple-m2"]

# id -> (make argv: (tmp_path, model, monkeypatch, capsys) -> argv, expected message part)
PROBES: dict[str, tuple[Callable, str]] = {
    # ---- never overwrite an input
    "analyze-o-is-the-model": (_argv("analyze", "{model}", "-o", "{model}"), "is an input"),
    "analyze-o-is-a-gguf": (_gguf_as_output, "is a GGUF file"),
    "profile-o-is-the-model": (_argv("profile", "{model}", "--token-ids", "1", *HW,
                                     "-o", "{model}"), "is an input"),
    "memory-o-is-the-model": (_argv("memory", "{model}", "--sweep", "ctx=256", "-o", "{model}"),
                              "is an input"),
    "analyze-o-is-the-hardware-profile": (
        lambda t, m, mp, cs: ["analyze", m, "-c", 256, "--hardware",
                              _write(t / "hw.yaml", yaml.safe_dump(PROFILE)), "-o", t / "hw.yaml"],
        "is an input"),
    "hwprobe-o-is-a-gguf": (_argv("hwprobe", "-o", "{model}"), "is a GGUF file"),
    "analyze-o-is-a-directory": (_argv("analyze", "{model}", "-o", "{tmp}"),
                                 "is a directory; give a file name"),
    # ---- check: baselines
    "baseline-nan-total": (_edit_baseline(_set("totals.flops", math.nan)),
                           "totals.flops must be a finite number"),
    "baseline-inf-by-op": (_edit_baseline(_set("by_op.0.bytes_read", math.inf)),
                           "by_op[0].bytes_read must be a finite number"),
    "baseline-nan-memory": (_edit_baseline(_set("memory.kv_cache_bytes", math.nan)),
                            "memory.kv_cache_bytes must be a finite number"),
    "baseline-negative-inf-read": (_edit_baseline(_set("totals.read.weights", -math.inf)),
                                   "totals.read.weights must be a finite number"),
    "baseline-fractional-ctx": (_edit_baseline(_set("run.ctx_size", 256.5)),
                                "run.ctx_size must be a non-negative integer, got 256.5"),
    "baseline-ctx-a-string": (_edit_baseline(_set("run.ctx_size", "256")),
                              "run.ctx_size must be a non-negative integer"),
    "baseline-ctx-2**70": (_edit_baseline(_set("run.ctx_size", 2**70)),
                           "--ctx-size 1180591620717411303424 is above 2147483647"),
    "baseline-negative-tokens": (_edit_baseline(_set("run.tokens", -1)),
                                 "run.tokens must be a non-negative integer"),
    "baseline-flash-attn-a-number": (_edit_baseline(_set("run.flash_attn", 1)),
                                     "run.flash_attn must be a string"),
    "baseline-swa-full-a-string": (_edit_baseline(_set("run.swa_full", "yes")),
                                   "run.swa_full must be true or false"),
    # QA sweep 2026-11-27: a setting llama.cpp refuses, read from the baseline, was reported
    # as a flag ("--flash-attn 'maybe': ...") the user never gave; now the file is named
    "baseline-flash-attn-maybe": (_edit_baseline(_set("run.flash_attn", "maybe")),
                                  "base.yaml: the baseline's run settings: --flash-attn 'maybe'"),
    "baseline-parallel-1000": (_edit_baseline(_set("run.n_seq_max", 1000)),
                               "base.yaml: the baseline's run settings: --parallel 1000 must be"),
    "baseline-run-a-list": (_edit_baseline(_set("run", [1, 2])), "run must be a mapping"),
    # a misspelt setting was ignored (the check then ran at the default context)
    "baseline-run-unknown-key": (_edit_baseline(_set("run.ctx_sise", 8192)),
                                 "base.yaml: the baseline's run section has unknown key(s) "
                                 "'ctx_sise'"),
    "baseline-totals-a-string": (_edit_baseline(_set("totals", "big")), "totals must be a mapping"),
    "baseline-totals-flops-a-string": (_edit_baseline(_set("totals.flops", "many")),
                                       "totals.flops must be a finite number"),
    "baseline-totals-flops-a-bool": (_edit_baseline(_set("totals.flops", True)),
                                     "totals.flops must be a finite number"),
    "baseline-totals-ops-a-list": (_edit_baseline(_set("totals.ops", [1])),
                                   "totals.ops must be a mapping"),
    "baseline-by-op-a-mapping": (_edit_baseline(_set("by_op", {"a": 1})), "by_op must be a list"),
    "baseline-by-op-row-a-number": (_edit_baseline(_set("by_op.0", 7)),
                                    "by_op[0] must be a mapping"),
    "baseline-by-op-key-a-number": (_edit_baseline(_set("by_op.0.key", 7)),
                                    "by_op[0].key must be a string"),
    "baseline-by-op-key-missing": (_edit_baseline(lambda d: d["by_op"][0].pop("key")),
                                   "by_op[0].key is missing"),
    "baseline-memory-a-list": (_edit_baseline(_set("memory", [])), "memory must be a mapping"),
    "baseline-alias-bomb": (_baseline_text("schema: 1\n" + _alias_bomb()),
                            "aliases are not allowed"),
    "baseline-yaml-syntax": (_baseline_text("schema: 1\nrun: {ctx_size: [\n"),
                             "baseline is not valid YAML: line"),
    "baseline-dev-zero": (_baseline_path("/dev/zero"), "a character device, not a regular file"),
    "baseline-directory": (_argv("check", "{model}", "--baseline", "{tmp}"),
                           "a directory, not a regular file"),
    "baseline-40-MiB": (_huge_baseline, "more than the 33,554,432"),
    # ---- --layers
    "layers-0-30000000": (_argv("analyze", "{model}", "-f", "tree", "--layers", "0-30000000"),
                          "layer 30000000 is past the last layer (the model has 2: 0-1)"),
    "layers-reversed": (_argv("analyze", "{model}", "-f", "tree", "--layers", "1-0"),
                        "is not a range lo-hi"),
    "layers-negative": (_argv("analyze", "{model}", "-f", "tree", "--layers", "-1"),
                        "is not a range lo-hi"),
    # ---- inputs that are not regular files
    "model-dev-zero": (_argv("analyze", "/dev/zero"), "a character device, not a regular file"),
    "hardware-dev-zero": (_argv("analyze", "{model}", "--hardware", "/dev/zero"),
                          "a character device, not a regular file"),
    "hardware-directory": (_argv("analyze", "{model}", "--hardware", "{tmp}/"), "a directory"),
    # ---- hardware profiles
    "hardware-alias-bomb": (_profile_file(_alias_bomb()), "aliases are not allowed"),
    "hardware-yaml-syntax": (_profile_file("name: [x\nkind: measured\n"),
                             "hardware profile is not valid YAML: line"),
    "hardware-infinite-bandwidth": (
        _profile_file(dict(PROFILE, memory_bandwidth={"bytes_per_second": math.inf})),
        "memory_bandwidth.bytes_per_second must be a finite number > 0"),
    "hardware-nan-peak": (_profile_file(dict(PROFILE, peak_flops={"flops_per_second": math.nan})),
                          "peak_flops.flops_per_second must be a finite number > 0"),
    "hardware-bandwidth-a-string": (
        _profile_file(dict(PROFILE, memory_bandwidth={"bytes_per_second": "fast"})),
        "memory_bandwidth.bytes_per_second must be a finite number > 0, got 'fast'"),
    "hardware-by-type-a-string": (
        _profile_file(dict(PROFILE, memory_bandwidth={"bytes_per_second": 1e9,
                                                      "by_type": {"q4_K": "fast"}})),
        "memory_bandwidth.by_type.q4_K must be a finite number > 0"),
    "hardware-stream-by-type-negative": (
        _profile_file(dict(PROFILE, memory_bandwidth={"bytes_per_second": 1e9,
                                                      "stream_by_type": {"q8_0": -1}})),
        "memory_bandwidth.stream_by_type.q8_0 must be a finite number > 0"),
    "hardware-threads-a-string": (_profile_file(dict(PROFILE, threads="four")),
                                  "threads must be an integer >= 1 or null"),
    "hardware-overhead-by-op-a-list": (
        _profile_file(dict(PROFILE, op_overhead={"seconds": 1e-6, "by_op": [1]})),
        "op_overhead.by_op must be a mapping"),
    "hardware-name-a-list": (_profile_file(dict(PROFILE, name=[1])), "name must be a string"),
    "hardware-a-list": (_profile_file("- 1\n- 2\n"), "the hardware profile must be a mapping"),
    "hardware-no-bandwidth": (_profile_file({k: v for k, v in PROFILE.items()
                                             if k != "memory_bandwidth"}),
                              "memory_bandwidth must be a mapping, got None"),
    # ---- headers that parse but contradict themselves
    "q-shape-vs-heads": (_bad_header(tensors={"blk.0.attn_q.weight": ((N_EMBD, 48), QT.F32)}),
                         "tensor 'blk.0.attn_q.weight' has shape [64, 48], the "
                         "hyperparameters say [64, 64]"),
    "ffn-down-vs-n-ff": (_bad_header(tensors={"blk.1.ffn_down.weight": ((80, N_EMBD), QT.F32)}),
                         "tensor 'blk.1.ffn_down.weight' has shape [80, 64]"),
    "vocab-vs-token-embd": (_bad_header(tensors={"token_embd.weight": ((N_EMBD, 51), QT.F32)}),
                            "tensor 'token_embd.weight' has shape [64, 51], the "
                            "hyperparameters say [64, 50]"),
    "vocab-vs-output": (_bad_header(tensors={"output.weight": ((N_EMBD, 49), QT.F32)}),
                        "tensor 'output.weight' has shape [64, 49]"),
    "n-rot-above-head-size": (_bad_header(kv={"llama.rope.dimension_count": (VT.UINT32, 32)}),
                              "'llama.rope.dimension_count' = 32 is larger than the head size 16"),
    "n-rot-not-head-size-llama": (_bad_header(kv={"llama.rope.dimension_count": (VT.UINT32, 8)}),
                                  "llama needs the head size 16 (llama.cpp: invalid n_rot)"),
    "norm-weight-f16": (_bad_header(tensors={"blk.0.attn_norm.weight": ((N_EMBD,), QT.F16)}),
                        "norm weight 'blk.0.attn_norm.weight' is f16"),
    "norm-weight-q8_0": (_bad_header(tensors={"output_norm.weight": ((N_EMBD,), QT.Q8_0)}),
                         "norm weight 'output_norm.weight' is q8_0"),
    "norm-weight-wrong-length": (_bad_header(tensors={"blk.1.ffn_norm.weight": ((32,), QT.F32)}),
                                 "tensor 'blk.1.ffn_norm.weight' has shape [32]"),
    "expert-used-per-layer-0": (_bad_header(**moe_layers([2, 0])),
                                "layer 1 has experts (ffn_gate_inp) but "
                                "'llama.expert_used_count' gives it 0"),
    "expert-tensor-vs-count": (_bad_header(**{**moe_layers(2), "tensors": {
        **moe_layers(2)["tensors"], "blk.0.ffn_gate_inp.weight": ((N_EMBD, 5), QT.F32)}}),
        "tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 5]"),
    "expert-count-2000": (_bad_header(kv={"llama.expert_count": (VT.UINT32, 2000),
                                          "llama.expert_used_count": (VT.UINT32, 2)}),
                          "above llama.cpp's LLAMA_MAX_EXPERTS (1024)"),
    "tensor-in-layer-past-block-count": (
        _bad_header(tensors={"blk.7.attn_norm.weight": ((N_EMBD,), QT.F32)}),
        "tensor 'blk.7.attn_norm.weight' is in layer 7, but 'llama.block_count' = 2"),
    "block-count-1000": (_bad_header(kv={"llama.block_count": (VT.UINT32, 1000)}),
                         "(1 to 512 layers)"),
    "vocab-2**40": (_bad_header(n_vocab=2**40, drop=("token_embd.weight", "output.weight")),
                    "vocabulary of 1099511627776 tokens"),
    # QA sweep 2026-11-27: taken as is, analyze -c 0 costed a 2**63-cell KV cache (llama.cpp
    # reads the key into a uint32_t and refuses a wider one)
    "context-length-2**63": (_bad_header(kv={"llama.context_length": (VT.UINT64, 2**63)}),
                             "'llama.context_length' must be a 32-bit non-negative integer"),
    # llama.cpp aborts (GGML_ASSERT) on a rope scaling type it does not know; it was taken
    "rope-scaling-type-bogus": (_bad_header(kv={"llama.rope.scaling.type": (VT.STRING, "bogus")}),
                                "'llama.rope.scaling.type' is 'bogus'; llama.cpp knows none, "
                                "linear, yarn, longrope"),
    "head-count-kv-2**40": (
        _bad_header(kv={"llama.attention.head_count_kv": (VT.UINT64, 2**40)}),
        "'llama.attention.head_count_kv' must be a 32-bit integer or a per-layer array"),
    # ---- nonsense that parses, refused as llama.cpp would
    "ctx-2**70": (_argv("analyze", "{model}", "-c", 2**70),
                  "--ctx-size 1180591620717411303424 is above 2147483647"),
    "ctx-2**40-memory": (_argv("memory", "{model}", "-c", 2**40), "is above 2147483647"),
    "ubatch-2**40": (_argv("analyze", "{model}", "-ub", 2**40), "--ubatch-size"),
    "profile-ctx-2**40": (_argv("profile", "{model}", "--token-ids", "1", "-c", 2**40, *HW),
                          "--ctx-size 1099511627776 is above 2147483647"),
    "profile-kv-cache-too-big": (_argv("profile", "{model}", "--token-ids", "1",
                                       "-c", 2**31 - 256, *HW), "more than the"),
    "profile-token-id-above-int64": (_argv("profile", "{model}", "--token-ids",
                                           "99999999999999999999", *HW),
                                     "token id 99999999999999999999 is not in the vocabulary"),
    "profile-decode-id-above-vocab": (_argv("profile", "{model}", "--token-ids", "1",
                                            "--decode-ids", "50", *HW),
                                      "token id 50 is not in the vocabulary [0, 50)"),
    # QA sweep 2026-11-27: these named --tokens and --past, flags profile does not have
    "profile-prompt-above-ubatch": (_argv("profile", "{model}", "--token-ids", ",".join(["1"] * 40),
                                          "-ub", 32, *HW),
                                    "--token-ids: 40 ids are more than one ubatch of this "
                                    "context holds (-ub 32, 4096 KV cells)"),
    "profile-prompt-above-context": (_argv("profile", "{model}", "--token-ids",
                                           ",".join(["1"] * 300), "-c", 256, *HW),
                                     "--token-ids: 300 ids are more than one ubatch"),
    # ... this one ran 255 greedy steps (minutes) before failing on the 256th
    "profile-greedy-past-context": (_argv("profile", "{model}", "--token-ids", "1",
                                          "--greedy", 100000, "-c", 256, *HW),
                                    "--token-ids and --greedy: 1 + 100000 tokens are more "
                                    "than the context's 256 KV cells"),
    "profile-decode-past-context": (_argv("profile", "{model}", "--token-ids", "1,2",
                                          "--decode-ids", ",".join(["3"] * 255), "-c", 256, *HW),
                                    "--token-ids and --decode-ids: 2 + 255 tokens"),
    # a remote path reached the reader as 'hf:/x/y/z.gguf' (no such file)
    "profile-remote": (_argv("profile", "hf://x/y/z.gguf", "--token-ids", "1", *HW),
                       "hf://x/y/z.gguf: profile needs a local GGUF file"),
    "verify-remote": (_argv("verify", "https://example.com/m.gguf"),
                      "https://example.com/m.gguf: verify needs a local GGUF file"),
    "profile-threads-above-cores": (_argv("profile", "{model}", "--token-ids", "1",
                                          "--threads", 100000, *HW), "--threads 100000: use 1 to"),
    "hwprobe-mib-2**40": (_argv("hwprobe", "--mib", 2**40, "-o", "{tmp}/p.yaml"),
                          "of memory available"),
    "hwprobe-threads-above-cores": (_argv("hwprobe", "--threads", 100000, "-o", "{tmp}/p.yaml"),
                                    "--threads 100000: use 1 to"),
}


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def _not_utf8(tmp_path, model, monkeypatch, capsys):
    b = tmp_path / "base.yaml"
    b.write_bytes(b"schema: 1\nrun: \xff\xfe\n")
    return ["check", model, "--baseline", b]


PROBES["baseline-not-utf8"] = (_not_utf8, "baseline is not UTF-8 text")


@pytest.mark.parametrize("probe", list(PROBES))
def test_probe(probe, tmp_path, model, monkeypatch, capsys):
    make, expect = PROBES[probe]
    argv = make(tmp_path, model, monkeypatch, capsys)
    before = model.read_bytes()
    code, out, err = run(argv, monkeypatch, capsys)
    assert code == 2, (out, err)
    one_line(err, expect)
    assert model.read_bytes() == before  # no probe ever touches the model


# ---- FIFOs: a broken reader would block; run in a subprocess with a timeout


def _fifo(p: Path) -> Path:
    os.mkfifo(p)
    return p


FIFO_PROBES: dict[str, tuple[Callable[[Path, Path], list], str]] = {
    "model-fifo": (lambda t, m: ["analyze", _fifo(t / "fifo.gguf")],
                   "a FIFO, not a regular file"),
    "shard-fifo": (lambda t, m: ["analyze", _shards_with_fifo(t, m)], "a FIFO, not a regular file"),
    "baseline-fifo": (lambda t, m: ["check", m, "--baseline", _fifo(t / "base.yaml")],
                      "a FIFO, not a regular file"),
    "hardware-fifo": (lambda t, m: ["analyze", m, "--hardware", _fifo(t / "hw.yaml")],
                      "a FIFO, not a regular file"),
    "o-fifo": (lambda t, m: ["analyze", m, "-o", _fifo(t / "out.txt")], "is a FIFO"),
}


def _shards_with_fifo(t: Path, m: Path) -> Path:
    first = t / "split-00001-of-00002.gguf"
    first.write_bytes(m.read_bytes())
    _fifo(t / "split-00002-of-00002.gguf")
    return first


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
@pytest.mark.parametrize("probe", list(FIFO_PROBES))
def test_fifo_probe(probe, tmp_path, model):
    make, expect = FIFO_PROBES[probe]
    code, out, err = run_subprocess(make(tmp_path, model), cwd=tmp_path, timeout=60)
    assert code == 2, (out, err)
    one_line(err, expect)


# ---- -o writes are atomic

_real_replace = os.replace


def test_o_write_is_atomic_and_keeps_the_old_report_on_failure(model, tmp_path, monkeypatch,
                                                               capsys):
    out = tmp_path / "report.txt"
    out.write_text("the previous report\n")
    import graphcost.files as files

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "replace", full_disk)
    code, _, err = run(["analyze", model, "-c", 256, "-o", out], monkeypatch, capsys)
    assert code == 2
    one_line(err, "cannot write: No space left on device")
    assert out.read_text() == "the previous report\n"
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    monkeypatch.setattr(files.os, "replace", _real_replace)
    code, _, err = run(["analyze", model, "-c", 256, "-o", out], monkeypatch, capsys)
    assert code == 0, err
    assert out.read_text().startswith("tiny") and not any(p.name.endswith(".tmp")
                                                         for p in tmp_path.iterdir())


# ---- names from the file are shown literally


@pytest.fixture
def evil(tmp_path) -> Path:
    return header_only(tmp_path / "evil.gguf", name=EVIL_NAME)


def _no_raw_controls(text: str) -> None:
    assert not any(not c.isprintable() and c != "\n" for c in text), \
        [c for c in text if not c.isprintable() and c != "\n"][:5]


@pytest.mark.parametrize("fmt", ["summary", "tree"])
def test_markup_and_escapes_in_names_are_shown_literally(evil, fmt, monkeypatch, capsys):
    code, out, err = run(["analyze", evil, "-c", 256, "-f", fmt], monkeypatch, capsys)
    assert code == 0, err
    _no_raw_controls(out)
    assert "evil[/bold] [link=file:///etc/passwd]click[/link] \\x1b]0;pwned\\x07\\x1b[2J:smile:" \
        in out


def test_summary_in_colour_keeps_names_literal(evil):
    """With colour on, rich writes its own escapes; none may come from the name: no
    hyperlink (OSC 8), no window title (OSC 0), the markup and emoji code as text."""
    from graphcost.pipeline import analyze_model
    from graphcost.report.summary import render_summary
    from graphcost.graph.settings import RunSettings
    out = render_summary(analyze_model(evil, RunSettings(ctx_size=256)), color=True)
    assert "\x1b]8;" not in out and "\x1b]0;" not in out and "\x07" not in out
    assert "evil[/bold] [link=file:///etc/passwd]click[/link]" in out and ":smile:" in out


def test_memory_text_and_svg_escape_names(evil, tmp_path, monkeypatch, capsys):
    code, out, err = run(["memory", evil, "-c", 256], monkeypatch, capsys)
    assert code == 0, err
    _no_raw_controls(out)
    assert "\\x1b]0;pwned\\x07" in out
    svg = tmp_path / "m.svg"
    code, out, err = run(["memory", evil, "--sweep", "ctx=256,512", "-o", svg], monkeypatch, capsys)
    assert code == 0, err
    _no_raw_controls(out)
    ET.parse(svg)  # valid XML
    text = svg.read_text()
    _no_raw_controls(text.replace("\t", " "))
    assert "pwned" in text and "\\x1b]0;pwned\\x07" in text  # the title, shown literally


def test_error_messages_escape_control_characters(tmp_path, monkeypatch, capsys):
    p = tmp_path / "x\x1b[2J.gguf"
    p.write_bytes(b"not a model at all")
    code, _, err = run(["analyze", p], monkeypatch, capsys)
    assert code == 2
    one_line(err, "x\\x1b[2J.gguf")


# ---- JSON never holds NaN or Infinity


def test_json_document_refuses_non_finite_numbers():
    from graphcost.document import non_finite, to_json
    doc = {"a": 1.0, "b": [0.5, math.inf], "c": {"d": math.nan}}
    assert non_finite(doc) == ["b[1]", "c.d"]
    with pytest.raises(GraphcostError, match=r"non-finite number at b\[1\] \(and 1 more\)"):
        to_json(doc)
    assert json.loads(to_json({"a": 1.5})) == {"a": 1.5}


def test_profile_json_writes_non_finite_measurements_as_null_and_flags_them(monkeypatch):
    from graphcost.report import profile as rp
    monkeypatch.setattr(rp, "document", lambda p: {"notes": [], "steps": [
        {"top5": [[3, math.nan], [1, -math.inf]], "wall_seconds": 0.5}]})
    from graphcost.report.renderer import RenderOptions
    text = rp.RENDERERS[rp.ProfileFormat.json].render(object(), RenderOptions())
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)
    assert doc["steps"][0]["top5"] == [[3, None], [1, None]]
    assert doc["notes"] == ["2 non-finite value(s) written as null, first at steps[0].top5[0][1]"]


# ---- profile on a header-only file: random data only for what the graph uses


def test_random_weights_are_drawn_lazily_in_their_own_dtype(tmp_path):
    """An unused 64 MiB F32 tensor is never drawn (it used to be, in float64: 192 MiB);
    only the tensors asked for are. The tensor is one llama's loader creates (a file with
    one it does not create is refused: tests/test_created_tensors.py) and the llama graph
    does not read: rope_factors_long of a longrope file run within its original context
    (256 = n_ctx_train here), where llama_model::get_rope_factors picks the short ones."""
    from graphcost.graph.build import load_model
    from graphcost.execute.weights import random_weights
    unused = "rope_factors_long.weight"
    p = header_only(tmp_path / "h.gguf", kv={"llama.rope.scaling.type": (VT.STRING, "longrope")},
                    tensors={unused: ((4096, 4096), QT.F32)})
    m = load_model(p)
    w = random_weights(m)
    assert len(w) == 0
    big = w["token_embd.weight"]  # 64 x 50 F32
    name = "output.weight"
    out = w[name]
    assert big.nbytes == 64 * 50 * 4 and out.nbytes == m.tensor(name).nbytes
    assert unused not in w and set(w) == {"token_embd.weight", name}
    assert np.isfinite(out.view(np.float32)).all()
    assert "2 tensors the graph uses" in w.note


def test_random_weights_peak_for_a_large_tensor(tmp_path):
    """The same bound on a 16 MiB tensor (64 x 65536 F32), where a float64 draw and its
    float32 copy would take 48 MiB."""
    from graphcost.graph.build import load_model
    from graphcost.execute.weights import random_weights
    w = random_weights(load_model(header_only(tmp_path / "h.gguf", n_vocab=65536)))
    w["output_norm.weight"]  # warm up the generator
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out = w["output.weight"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.nbytes == 64 * 65536 * 4
    assert peak < 1.5 * out.nbytes
