"""A file with a tensor llama.cpp's loader does not create is refused in one line, as
llama.cpp refuses it (``llama_model_loader::done_getting_tensors``: "wrong number of
tensors; expected N, got M"), and so is a file without a tensor it requires
(``check_tensor_dims``: "tensor 'X' not found"); every tensor a family's loader does create
(optional ones, ones the graph never reads) is accepted. The lists are the ``tensors:`` of
each spec, with the loader's branches on the hyperparameters, and ``specs/loader.yaml``
(:mod:`graphcost.graph.created_tensors`).

Proof: every tiny model of the parity tests (tests/parity_models.py ``MODELS``, all
families) and every bundled example header is accepted; each family's model with an
unknown ``blk.0.frob.weight`` is refused with the counts; for each branch of a family's
loader (``BRANCHES``), a model given a tensor of the branch its hyperparameters do not take
is refused, and one without a required tensor (read by the graph or not: NextN blocks) is
refused; where llama-cpp-python is installed, llama.cpp refuses the same files and loads
the same accepted ones.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from graphcost.cli import main
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.format.model import expr_names
from graphcost.graph.arch_spec import TensorBranch, load_specs
from graphcost.graph.build import load_model
from graphcost.graph.created_tensors import (_probed, extra_tensors, loader_rules,
                                             missing_tensors)
from graphcost.judge.oracle import (OracleError, capture_log, llama_cpp_available,
                                    llama_cpp_unavailable_reason)
from graphcost.resources import bundled
from parity_models import MODELS

#: one tiny model of tests/parity_models.py for each family with a spec (a new family
#: without an entry fails test_every_family_has_a_model_here)
FAMILY_MODEL = {
    "bert": "bert", "cohere2": "cohere2", "deepseek2": "deepseek2", "ernie4_5-moe": "ernie",
    "exaone4": "exaone4", "falcon": "falcon", "gemma2": "gemma2", "gemma3": "gemma3",
    "gemma3n": "gemma3n", "gemma4": "gemma4", "glm4": "glm4", "glm4moe": "glm45",
    "gpt-oss": "gptoss", "gpt2": "gpt2", "granite": "granite", "granitehybrid": "granitehybrid",
    "lfm2": "lfm2", "lfm2moe": "lfm2moe", "llama": "llama", "llama4": "llama4",
    "minimax-m2": "minimax", "mistral3": "mistral3", "nemotron_h": "nemotron_h",
    "nemotron_h_moe": "nemotron_h_moe", "nomic-bert": "nomic", "olmo2": "olmo2",
    "olmoe": "olmoe", "phi3": "phi3", "qwen2": "qwen2", "qwen2moe": "qwen2moe",
    "qwen3": "qwen3", "qwen35": "qwen35", "qwen35moe": "qwen35moe", "qwen3moe": "qwen3moe",
    "qwen3next": "qwen3next", "qwen3vl": "qwen3vl", "qwen3vlmoe": "qwen3vlmoe",
    "seed_oss": "seed_oss", "smollm3": "smollm3", "starcoder2": "starcoder2",
}
FAMILIES = sorted(k for k in load_specs() if "@" not in k)
#: families whose refusal llama.cpp judges too (every one; tests skip without llama-cpp-python)
JUDGED = FAMILIES

needs_llama_cpp = pytest.mark.skipif(not llama_cpp_available(),
                                     reason="llama-cpp-python: " + llama_cpp_unavailable_reason())


def _path(written) -> Path:
    return Path(getattr(written, "path", written))


def with_tensors(src: Path, dst: Path, extra: dict[str, tuple[list[int], QT]],
                 drop: tuple[str, ...] = (), kv: dict[str, int] | None = None) -> Path:
    """A copy of the GGUF ``src`` (every key and tensor) with the tensors ``extra`` added:
    {name: (ne, type)}, filled with small F32 values (F32 only); less the tensors ``drop``
    (each must be there); with the values ``kv`` for keys it has ({key: value}, same type)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    kv = kv or {}
    assert set(kv) <= set(r.fields) and set(drop) <= {t.name for t in r.tensors}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(f.name, kv.get(f.name, f.contents()), vt,
                        sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if t.name in drop:
            continue
        # t.data: numpy order, quantized rows as their bytes (the writer turns them back)
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    for name, (ne, qt) in extra.items():
        assert qt == QT.F32
        w.add_tensor(name, np.full(list(reversed(ne)), 0.01, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every tiny model, written once: name -> path."""
    d = tmp_path_factory.mktemp("created")
    return {n: _path(MODELS[n][0](d / f"{n}.gguf", **MODELS[n][1])) for n in MODELS}


def test_every_family_has_a_spec_list_and_a_model_here():
    assert sorted(FAMILY_MODEL) == FAMILIES
    assert [f for f in FAMILIES if load_specs()[f].tensors is None] == []


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_tiny_model_is_accepted(written, name):
    m = load_model(written[name])
    assert extra_tensors(m, load_specs()[m.arch]) == []


@pytest.mark.parametrize("example", sorted(p.name for p in bundled("examples").glob("*.gguf")))
def test_every_bundled_example_is_accepted(example):
    m = load_model(bundled("examples") / example)
    assert extra_tensors(m, load_specs()[m.arch]) == []


def _frob(written, family: str, tmp_path: Path) -> tuple[Path, int]:
    """The family's tiny model plus ``blk.0.frob.weight``; and the model's tensor count."""
    src = written[FAMILY_MODEL[family]]
    n = len(gguf.GGUFReader(src).tensors)
    return with_tensors(src, tmp_path / "frob.gguf", {"blk.0.frob.weight": ([8], QT.F32)}), n


@pytest.mark.parametrize("family", FAMILIES)
def test_an_unknown_tensor_is_refused_with_the_counts(written, family, tmp_path):
    bad, n = _frob(written, family, tmp_path)
    source = load_specs()[family].source
    # the file holds n + 1 tensors; llama.cpp's loader creates the model's n
    with pytest.raises(GraphcostError) as e:
        load_model(bad)
    assert str(e.value) == (
        f"{bad}: tensor 'blk.0.frob.weight' not created by llama.cpp's {family} loader "
        f"(load_arch_tensors in {source}); llama.cpp refuses the file: wrong number of "
        f"tensors; expected {n + 1}, got {n}")


def test_the_cli_refuses_in_one_line_with_exit_2(written, tmp_path, monkeypatch, capsys):
    src = written["llama"]
    bad = with_tensors(src, tmp_path / "two.gguf", {"blk.0.frob.weight": ([8], QT.F32),
                                                   "frob.weight": ([8], QT.F32)})
    n = len(gguf.GGUFReader(src).tensors)
    for cmd in (["analyze", "-c", "256"], ["memory", "-c", "256"], ["speed", "--hardware", "amd-ryzen9-7950x"],
                ["profile", "--token-ids", "1,2"]):
        monkeypatch.setattr(sys, "argv", ["graphcost", cmd[0], str(bad), *cmd[1:]])
        monkeypatch.delenv("GRAPHCOST_DEBUG", raising=False)
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.strip()]
        assert e.value.code == 2, err
        assert len(lines) == 1 and "Traceback" not in err, err
        # n + 2 tensors in the file, n created
        assert lines[0].endswith(f"2 tensors 'blk.0.frob.weight', 'frob.weight' not created by "
                                 f"llama.cpp's llama loader (load_arch_tensors in "
                                 f"src/models/llama.cpp); llama.cpp refuses the file: wrong "
                                 f"number of tensors; expected {n + 2}, got {n}"), lines[0]


def test_more_than_three_are_counted_not_listed(written, tmp_path):
    extra = {f"blk.0.frob{i}.weight": ([8], QT.F32) for i in range(5)}
    bad = with_tensors(written["llama"], tmp_path / "five.gguf", extra)
    with pytest.raises(GraphcostError, match=r"5 tensors 'blk\.0\.frob0\.weight', "
                       r"'blk\.0\.frob1\.weight', 'blk\.0\.frob2\.weight' and 2 more not created"):
        load_model(bad)


# what the loader creates though the graph may not read it, and what it does not create
# (llama tiny model: 3 layers, n_embd 256, n_ff 768, head_dim 32; tests/fixtures.py write_llama)
ACCEPTED = {
    # TENSOR_NOT_REQUIRED: an attention output bias, a dense FFN bias
    "attn_output.bias": {"blk.1.attn_output.bias": ([256], QT.F32)},
    "ffn_up.bias": {"blk.0.ffn_up.bias": ([768], QT.F32)},
    # the generic pass of llama_model_base::load_tensors: a weight scale beside attn_q
    "attn_q.scale": {"blk.0.attn_q.scale": ([1], QT.F32)},
}
REFUSED = {
    # another family's tensor (qwen3's q norm)
    "attn_q_norm": {"blk.0.attn_q_norm.weight": ([32], QT.F32)},
    # a scale beside a weight the block does not have (llama has no attn_gate)
    "attn_gate.scale": {"blk.0.attn_gate.scale": ([1], QT.F32)},
    # output.scale of an output matrix that is not NVFP4
    "output.scale": {"output.scale": ([1], QT.F32)},
    # LongRoPE's factors without rope.scaling.type longrope (llama creates rope_freqs then)
    "rope_factors_long": {"rope_factors_long.weight": ([16], QT.F32)},
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_tensors_the_loader_creates_are_accepted(written, case, tmp_path):
    m = load_model(with_tensors(written["llama"], tmp_path / "ok.gguf", ACCEPTED[case]))
    assert extra_tensors(m, load_specs()["llama"]) == []


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_tensors_the_loader_does_not_create_are_refused(written, case, tmp_path):
    bad = with_tensors(written["llama"], tmp_path / "bad.gguf", REFUSED[case])
    (name,) = REFUSED[case]
    with pytest.raises(GraphcostError, match=f"tensor '{name}' not created"):
        load_model(bad)


def _longrope_with_freqs(written, tmp_path: Path) -> Path:
    """llama_longrope (rope.scaling.type longrope, its long/short factors: head_dim 32, 16
    each) plus a rope_freqs.weight, which llama creates only without longrope scaling."""
    return with_tensors(written["llama_longrope"], tmp_path / "freqs.gguf",
                        {"rope_freqs.weight": ([16], QT.F32)})


def test_rope_freqs_is_refused_under_longrope_scaling(written, tmp_path):
    m = load_model(written["llama_longrope"])
    assert m.rope_scaling_type == "longrope" and "rope_factors_long.weight" in m.header.tensors
    n = len(m.header.tensors)
    with pytest.raises(GraphcostError) as e:
        load_model(_longrope_with_freqs(written, tmp_path))
    assert "tensor 'rope_freqs.weight' not created" in str(e.value)
    assert str(e.value).endswith(f"expected {n + 1}, got {n}")


def test_nextn_blocks_take_the_nextn_list(written, tmp_path):
    """deepseek2_nextn has a NextN block past its 2 trunk layers: its nextn.* tensors are
    accepted there and refused in a trunk block."""
    m = load_model(written["deepseek2_nextn"])
    assert m.n_layer_nextn > 0
    nextn = [n for n in m.header.tensors if ".nextn." in n]
    assert nextn and all(int(n.split(".")[1]) >= m.n_layer for n in nextn)
    bad = with_tensors(written["deepseek2_nextn"], tmp_path / "bad.gguf",
                       {"blk.0.nextn.enorm.weight": ([m.n_embd], QT.F32)})
    with pytest.raises(GraphcostError, match="tensor 'blk.0.nextn.enorm.weight' not created"):
        load_model(bad)


def _fused_qkv(written, name: str, il: int, tmp_path: Path) -> Path:
    """Model ``name`` plus a fused ``blk.<il>.attn_qkv.weight`` beside its Q, K and V, as
    long as the three: {n_embd, n_q + n_k + n_v}."""
    t = load_model(written[name]).header.tensors
    ne = [t[f"blk.{il}.attn_q.weight"].ne[0],
          sum(t[f"blk.{il}.attn_{x}.weight"].ne[1] for x in "qkv")]
    return with_tensors(written[name], tmp_path / "qkv.gguf",
                        {f"blk.{il}.attn_qkv.weight": (ne, QT.F32)})


def test_a_fused_qkv_replaces_the_separate_tensors_in_a_trunk_block(written, tmp_path):
    # create_tensor_qkv: with attn_qkv the loader creates it and not attn_q/k/v: the file's
    # n + 1 tensors, n + 1 - 3 created
    n = len(load_model(written["llama"]).header.tensors)
    with pytest.raises(GraphcostError) as e:
        load_model(_fused_qkv(written, "llama", 1, tmp_path))
    assert ("3 tensors 'blk.1.attn_q.weight', 'blk.1.attn_k.weight', 'blk.1.attn_v.weight' "
            "not created by llama.cpp's llama loader") in str(e.value)
    assert str(e.value).endswith(f"expected {n + 1}, got {n - 2}")


def test_a_nextn_block_creates_fused_and_separate_tensors(written, tmp_path):
    """glm4's NextN blocks load with TENSOR_SKIP: create_tensor_qkv creates (counts) all."""
    m = load_model(written["glm4_nextn"])
    assert m.n_layer_nextn == 2
    m2 = load_model(_fused_qkv(written, "glm4_nextn", m.n_layer, tmp_path))
    assert extra_tensors(m2, load_specs()["glm4"]) == []


def test_the_loader_rules_name_output_scales_of_nvfp4():
    assert loader_rules().scale_suffixes == ("scale", "input_scale")
    assert loader_rules().scaled_output_type == QT.NVFP4


# ---- the judge: llama.cpp refuses the same files and loads the same accepted ones ----


@needs_llama_cpp
@pytest.mark.parametrize("family", JUDGED)
def test_llama_cpp_refuses_the_unknown_tensor_too(written, family, tmp_path):
    assert capture_log(written[FAMILY_MODEL[family]], n_ctx=256)["model_buffers"]
    bad, n = _frob(written, family, tmp_path)
    with pytest.raises(OracleError, match=f"wrong number of tensors; expected {n + 1}, got {n}"):
        capture_log(bad, n_ctx=256)


@needs_llama_cpp
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_llama_cpp_loads_what_we_accept(written, case, tmp_path):
    assert capture_log(with_tensors(written["llama"], tmp_path / "ok.gguf", ACCEPTED[case]),
                       n_ctx=256)["model_buffers"]


@needs_llama_cpp
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_llama_cpp_refuses_what_we_refuse(written, case, tmp_path):
    with pytest.raises(OracleError, match="wrong number of tensors"):
        capture_log(with_tensors(written["llama"], tmp_path / "bad.gguf", REFUSED[case]),
                    n_ctx=256)


@needs_llama_cpp
def test_llama_cpp_refuses_rope_freqs_under_longrope_scaling(written, tmp_path):
    assert capture_log(written["llama_longrope"], n_ctx=256)["model_buffers"]
    with pytest.raises(OracleError, match="wrong number of tensors"):
        capture_log(_longrope_with_freqs(written, tmp_path), n_ctx=256)


def test_a_spec_without_its_tensor_list_is_refused(tmp_path):
    from graphcost.graph.arch_spec import parse_spec
    p = tmp_path / "fam.yaml"
    p.write_text("architecture: fam\nlayer: []\n")
    with pytest.raises(GraphcostError, match=r"fam\.yaml: 'tensors' is required"):
        parse_spec(p)
    p.write_text("architecture: fam\ntensors: {model: [a.weight], layer: [b, [c.bias], "
                 "{optional: [d]}, {if: n_expert == 0, then: [e], else: [f]}, "
                 "{has: g, then: [h], else: optional}]}\n")
    t = parse_spec(p).tensors
    assert (t.model, t.nextn) == (("a.weight",), None)
    assert t.layer == ("b", "c.bias", "d?", TensorBranch("if", "n_expert == 0", ("e",), ("f",)),
                       TensorBranch("has", "g", ("h",), ("h?",)))
    p.write_text("architecture: fam\ntensors: {model: [a.weight]}\n")
    with pytest.raises(GraphcostError, match="tensors must map model, layer"):
        parse_spec(p)
    p.write_text("architecture: fam\ntensors: {model: [a.weight], layer: [{when: x, then: [b]}]}\n")
    with pytest.raises(GraphcostError, match=r"tensors\.layer: \{'when': 'x', 'then': \['b'\]\} "
                       r"is neither a tensor name, \{optional: \[\.\.\.\]\} nor a branch"):
        parse_spec(p)
    p.write_text("architecture: fam\ntensors: {model: [a], layer: [b], mtp_only: blk.0.b}\n")
    with pytest.raises(GraphcostError, match=r"tensors\.mtp_only must be a tensor name, beside "
                                             r"a nextn list: 'blk\.0\.b'"):
        parse_spec(p)
    p.write_text("architecture: fam\ntensors: {model: [a], layer: [b], nextn: [b], "
                 "mtp_only: blk.0.b}\n")
    assert parse_spec(p).tensors.mtp_only == "blk.0.b"


def _conditions(items) -> list[str]:
    """Every ``if:`` expression of a ``tensors:`` list, taken branch or not, and every
    ``{h}`` placeholder of a ``has:`` probe as the expression ``h``."""
    out = []
    for it in items or ():
        if isinstance(it, TensorBranch):
            out += ([it.arg] if it.test == "if" else re.findall(r"\{(\w+)\}", it.arg)) \
                + _conditions(it.then) + _conditions(it.orelse)
    return out


def test_every_branch_names_known_hyperparameters(written):
    """A branch no tiny model takes is still checked: each name its expression uses is one
    :func:`created` gives a block (expr_names, il, is_swa, is_recr, n_ff_layer)."""
    known = set(expr_names(load_model(written["llama"]))) | {"il", "is_swa", "is_recr",
                                                              "n_ff_layer"}
    for fam in FAMILIES:
        t = load_specs()[fam].tensors
        for e in _conditions(t.model + t.layer + (t.nextn or ())):
            used = {n.id for n in ast.walk(ast.parse(e, mode="eval")) if isinstance(n, ast.Name)}
            assert used <= known, (fam, e, used - known)


@needs_llama_cpp
def test_llama_cpp_counts_fused_qkv_as_we_do(written, tmp_path):
    n = len(load_model(written["llama"]).header.tensors)
    with pytest.raises(OracleError, match=f"wrong number of tensors; expected {n + 1}, got {n - 2}"):
        capture_log(_fused_qkv(written, "llama", 1, tmp_path), n_ctx=256)
    m = load_model(written["glm4_nextn"])
    assert capture_log(_fused_qkv(written, "glm4_nextn", m.n_layer, tmp_path),
                       n_ctx=256)["model_buffers"]


# ---- the loader's branches on the hyperparameters, and the tensors it requires ----


class Case(NamedTuple):
    """A tiny model with the [8] F32 tensors ``add`` added, ``drop`` removed and the keys
    ``kv`` set; ``refused``: the (first) tensor named in the refusal (not created if added or
    if ``kv`` changes the branch, missing if dropped), None where llama.cpp loads the file;
    ``n_refused``: how many tensors are refused. The tiny models themselves, each
    family's taken branches, are accepted here and loaded by llama.cpp (the tests above
    and tests/test_parity*.py)."""

    model: str
    add: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    refused: str | None = None
    kv: dict | None = None
    n_refused: int = 1


def _extra(model: str, name: str) -> Case:
    return Case(model, add=(name,), refused=name)


def _missing(model: str, name: str) -> Case:
    return Case(model, drop=(name,), refused=name)


#: family -> the files that show its loader's branches (the hyperparameters of each model:
#: tests/parity_models.py)
BRANCHES: dict[str, list[Case]] = {
    "llama": [
        _extra("llama", "blk.0.ffn_gate_inp.weight"),    # n_expert == 0: dense FFN only
        _extra("mixtral", "blk.0.ffn_gate.weight"),      # n_expert 6: experts, no dense FFN
        _extra("mixtral", "blk.1.ffn_up_shexp.weight"),  # n_ff_shexp == 0: no shared expert
        _missing("llama", "blk.2.ffn_up.weight"),        # required, read by the graph too
        # create_tensor_qkv: a fused bias only beside a fused weight
        _extra("llama", "blk.1.attn_qkv.bias"),
    ],
    "mistral3": [_extra("mistral3_moe", "blk.2.ffn_down.weight")],
    "granite": [_extra("granite", "blk.0.ffn_down_exps.weight")],
    "deepseek2": [
        _extra("deepseek2", "blk.0.attn_q.weight"),          # q_lora_rank 160: Q LoRA only
        _extra("deepseek2_lite", "blk.0.attn_q_a.weight"),   # q_lora_rank 0: attn_q only
        _extra("deepseek2", "blk.1.attn_kv_b.weight"),       # MLA: attn_k_b / attn_v_b
        _extra("deepseek2_legacy", "blk.1.attn_k_b.weight"),  # not MLA: attn_kv_b
        _extra("deepseek2", "blk.0.ffn_gate_inp.weight"),    # il < n_layer_dense_lead 1
        _extra("deepseek2", "blk.1.ffn_gate.weight"),        # a MoE layer
        # a NextN block the graph never reads: its tensors are required where the file has
        # its nextn.eh_proj, optional where not (trunk_only)
        _missing("deepseek2_nextn", "blk.2.nextn.enorm.weight"),
        Case("deepseek2_nextn", drop=("blk.2.nextn.eh_proj.weight", "blk.2.nextn.enorm.weight")),
        # one trunk_only probe, the first NextN block's (blk.2) nextn.eh_proj: there, the
        # second block's tensors are required, eh_proj too; not there, none is, enorm neither
        _missing("deepseek2_nextn2", "blk.3.nextn.eh_proj.weight"),
        Case("deepseek2_nextn2", drop=("blk.2.nextn.eh_proj.weight", "blk.3.nextn.enorm.weight")),
    ],
    "ernie4_5-moe": [
        _extra("ernie", "blk.0.ffn_gate_exps.weight"),   # il < n_layer_dense_lead 1
        _extra("ernie", "blk.1.ffn_gate.weight"),        # a MoE layer
        _extra("ernie_bare", "blk.0.ffn_up_shexp.weight"),  # n_ff_shexp == 0
    ],
    "gemma4": [
        # n_embd_per_layer 48 / 0: the per-layer inputs' tensors, required / not created
        _missing("gemma4", "blk.3.inp_gate.weight"),
        _extra("gemma4_fused", "blk.0.inp_gate.weight"),
        # layers 4-6 of 7 share KV (shared_kv_layers 3): their K is optional (the model has
        # none there), layer 0's is not
        _missing("gemma4", "blk.0.attn_k.weight"),
        # rope_freqs: required by the full-attention layer 3
        _missing("gemma4", "rope_freqs.weight"),
        # a layer without ffn_gate_inp creates no experts; one with it requires them
        _extra("gemma4", "blk.0.ffn_gate_exps.weight"),
        _missing("gemma4_moe", "blk.0.pre_ffw_norm_2.weight"),
    ],
    "glm4moe": [
        _extra("glm45", "blk.0.ffn_gate_inp.weight"),    # il < n_layer_dense_lead 1
        _extra("glm45", "blk.1.ffn_gate.weight"),        # a MoE layer
        # expert_shared_count 0: no shared expert; the file's 3 in each of the MoE layers 1,
        # 2 and the NextN block 3 are not created
        Case("glm45", kv={"glm4moe.expert_shared_count": 0},
             refused="blk.1.ffn_gate_shexp.weight", n_refused=3 * 3),
        _missing("glm45", "blk.3.nextn.enorm.weight"),
        Case("glm45", drop=("blk.3.nextn.eh_proj.weight", "blk.3.nextn.enorm.weight")),
    ],
    "glm4": [_missing("glm4_nextn", "blk.3.nextn.eh_proj.weight")],  # TENSOR_SKIP, required
    "exaone4": [_missing("exaone4_nextn", "blk.2.nextn.hnorm.weight")],
    "granitehybrid": [
        _extra("granitehybrid", "blk.0.attn_q.weight"),  # layer 0 recurrent
        _extra("granitehybrid", "blk.1.ssm_in.weight"),  # layer 1 attention
        _extra("granitehybrid", "blk.0.ffn_gate_inp.weight"),  # n_expert 0
        _extra("granitehybrid_moe", "blk.0.ffn_gate.weight"),  # n_expert 5
    ],
    "lfm2": [
        _extra("lfm2", "blk.0.attn_q_norm.weight"),      # layer 0 short-conv
        _extra("lfm2", "blk.2.shortconv.conv.weight"),   # layer 2 attention
        _extra("lfm2", "blk.0.ffn_gate_inp.weight"),     # every lfm2 layer dense
    ],
    "lfm2moe": [
        _extra("lfm2moe", "blk.0.ffn_gate_inp.weight"),  # il < n_layer_dense_lead 1
        _extra("lfm2moe", "blk.1.ffn_gate.weight"),
    ],
    "llama4": [
        _extra("llama4", "blk.0.ffn_gate_inp.weight"),   # interleave_moe_layer_step 2: dense
        _extra("llama4", "blk.1.ffn_gate.weight"),       # MoE
    ],
    "nemotron_h": [
        # layers R.R..R: 0 recurrent, 1 MLP (n_ff 160), 3 attention (n_ff 0)
        _extra("nemotron_h", "blk.1.attn_q.weight"),
        _extra("nemotron_h", "blk.3.ffn_up.weight"),
        _extra("nemotron_h", "blk.1.ffn_gate_inp.weight"),   # n_expert 0
        _extra("nemotron_h_moe", "blk.1.ffn_up.weight"),     # n_expert 6
    ],
    "qwen35": [
        _extra("qwen35", "blk.0.attn_q_norm.weight"),    # layers RRR.R
        _extra("qwen35", "blk.3.ssm_a"),
    ],
    "qwen35moe": [_extra("qwen35moe", "blk.1.ssm_conv1d.weight")],  # layers R.R.
    "qwen3next": [
        _extra("qwen3next", "blk.3.ssm_ba.weight"),      # layers RRR.
        _extra("qwen3next", "blk.0.attn_output.weight"),
    ],
}


def _branch_file(written, c: Case, path: Path) -> Path:
    return with_tensors(written[c.model], path, {n: ([8], QT.F32) for n in c.add},
                        drop=c.drop, kv=c.kv)


@pytest.mark.parametrize("family", sorted(BRANCHES))
def test_the_loader_branches_on_the_hyperparameters(written, family, tmp_path):
    for i, c in enumerate(BRANCHES[family]):
        path = _branch_file(written, c, tmp_path / f"{i}.gguf")
        arch = load_model(written[c.model]).arch
        if c.refused is None:
            m = load_model(path)
            assert (extra_tensors(m, load_specs()[arch]), missing_tensors(m, load_specs()[arch])) \
                == ([], []), c
            continue
        where = (f"llama.cpp's {arch} loader (load_arch_tensors in "
                 f"{load_specs()[arch].source})")
        n = len(gguf.GGUFReader(path).tensors)
        with pytest.raises(GraphcostError) as e:
            load_model(path)
        if c.refused in c.drop:
            assert str(e.value) == (f"{path}: tensor '{c.refused}' required by {where} missing "
                                    f"from the file; llama.cpp refuses it: tensor "
                                    f"'{c.refused}' not found"), c
        elif c.n_refused == 1:
            # n tensors in the file, all but the refused one created
            assert str(e.value) == (f"{path}: tensor '{c.refused}' not created by {where}; "
                                    f"llama.cpp refuses the file: wrong number of tensors; "
                                    f"expected {n}, got {n - 1}"), c
        else:
            k = c.n_refused
            assert str(e.value).startswith(f"{path}: {k} tensors '{c.refused}', "), c
            assert str(e.value).endswith(f" and {k - 3} more not created by {where}; llama.cpp "
                                         f"refuses the file: wrong number of tensors; "
                                         f"expected {n}, got {n - k}"), c


@needs_llama_cpp
@pytest.mark.parametrize("family", sorted(BRANCHES))
def test_llama_cpp_takes_the_same_branches(written, family, tmp_path):
    for i, c in enumerate(BRANCHES[family]):
        path = _branch_file(written, c, tmp_path / f"{i}.gguf")
        if c.refused is None:
            assert capture_log(path, n_ctx=256)["model_buffers"], c
            continue
        n = len(gguf.GGUFReader(path).tensors)
        expect = (f"tensor '{c.refused}' not found" if c.refused in c.drop
                  else f"wrong number of tensors; expected {n}, got {n - c.n_refused}")
        with pytest.raises(OracleError, match=re.escape(expect)):
            capture_log(path, n_ctx=256)


def test_the_cli_refuses_a_missing_tensor_in_one_line_with_exit_2(written, tmp_path,
                                                                 monkeypatch, capsys):
    bad = _branch_file(written, _missing("glm4_nextn", "blk.3.nextn.eh_proj.weight"),
                       tmp_path / "missing.gguf")
    monkeypatch.setattr(sys, "argv", ["graphcost", "analyze", str(bad), "-c", "256"])
    monkeypatch.delenv("GRAPHCOST_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].endswith("tensor 'blk.3.nextn.eh_proj.weight' required by llama.cpp's glm4 "
                             "loader (load_arch_tensors in src/models/glm4.cpp) missing from "
                             "the file; llama.cpp refuses it: tensor "
                             "'blk.3.nextn.eh_proj.weight' not found"), lines[0]


def test_a_probe_names_the_hyperparameters_of_its_placeholders():
    """``has: /blk.{n_layer}.x``: a model-level name, its placeholder the value; in a
    block, a bare name is the block's."""
    assert _probed("/blk.{n_layer}.nextn.eh_proj.weight", "blk.3.", {"n_layer": 61.0},
                   "spec.yaml") == "blk.61.nextn.eh_proj.weight"
    assert _probed("nextn.eh_proj.weight", "blk.3.", {}, "spec.yaml") \
        == "blk.3.nextn.eh_proj.weight"
    with pytest.raises(GraphcostError, match=r"spec.yaml: has: '/blk.\{frob\}.x' names "
                                             r"'frob', not a hyperparameter"):
        _probed("/blk.{frob}.x", "", {"n_layer": 2.0}, "spec.yaml")


def _faults(written, tmp_path: Path, name: str, bad_shape: str, drop: tuple[str, ...] = (),
            add: tuple[str, ...] = ()) -> Path:
    """The llama tiny model with ``bad_shape`` (a layer norm) 8 long instead of n_embd,
    less ``drop``, plus the [8] F32 tensors ``add``."""
    return with_tensors(written["llama"], tmp_path / name,
                        {bad_shape: ([8], QT.F32), **{n: ([8], QT.F32) for n in add}},
                        drop=(bad_shape, *drop))


#: (file, the tensor named first) where a file has two faults: llama.cpp creates the
#: tensors in its loader's order (blk.0's before blk.1's), stops at the first missing or
#: wrongly shaped one, and counts them last
FIRST_FAULT = {
    "shape-before-missing": (dict(bad_shape="blk.0.attn_norm.weight",
                                  drop=("blk.1.ffn_up.weight",)), "blk.0.attn_norm.weight"),
    "missing-before-shape": (dict(bad_shape="blk.1.attn_norm.weight",
                                  drop=("blk.0.ffn_up.weight",)), "blk.0.ffn_up.weight"),
    "shape-before-count": (dict(bad_shape="blk.1.attn_norm.weight",
                                add=("blk.0.frob.weight",)), "blk.1.attn_norm.weight"),
}


@pytest.mark.parametrize("case", sorted(FIRST_FAULT))
def test_the_first_fault_in_the_loaders_order_is_named(written, tmp_path, case):
    kw, first = FIRST_FAULT[case]
    path = _faults(written, tmp_path, f"{case}.gguf", **kw)
    n_embd = load_model(written["llama"]).n_embd
    with pytest.raises(GraphcostError) as e:
        load_model(path)
    if first in kw.get("drop", ()):
        assert str(e.value).endswith(f"llama.cpp refuses it: tensor '{first}' not found")
    else:
        assert str(e.value) == (f"{path}: tensor '{first}' has shape [8], the "
                                f"hyperparameters say [{n_embd}] (n_embd {n_embd})")


@needs_llama_cpp
@pytest.mark.parametrize("case", sorted(FIRST_FAULT))
def test_llama_cpp_names_the_same_first_fault(written, tmp_path, case):
    kw, first = FIRST_FAULT[case]
    path = _faults(written, tmp_path, f"{case}.gguf", **kw)
    expect = (f"tensor '{first}' not found" if first in kw.get("drop", ())
              else f"tensor '{first}' has wrong shape")
    with pytest.raises(OracleError, match=re.escape(expect)):
        capture_log(path, n_ctx=256)


#: a tiny model with NextN blocks for each family whose loader probes for MTP-only files
#: (load_arch_tensors' mtp_only: NextN blocks and no blk.0.attn_norm.weight)
MTP_ONLY = {"deepseek2": "deepseek2_nextn", "glm4moe": "glm45", "qwen3next": "qwen3next_nextn",
            "qwen35": "qwen35_nextn", "qwen35moe": "qwen35moe_nextn",
            "nemotron_h_moe": "nemotron_h_moe_nextn"}


def _mtp_only(written, model: str, path: Path) -> Path:
    """``model`` less every trunk block's tensors (blk.<il>, il < n_layer)."""
    m = load_model(written[model])
    trunk = tuple(n for n in m.header.tensors
                  if n.startswith("blk.") and int(n.split(".")[1]) < m.n_layer)
    return with_tensors(written[model], path, {}, drop=trunk)


def test_the_mtp_only_probe_is_in_the_specs_that_make_it():
    assert sorted(f for f in FAMILIES if (load_specs()[f].tensors.mtp_only
                                          == "blk.0.attn_norm.weight")) \
        == sorted(["deepseek2", "glm4moe", "qwen3next", "qwen35", "qwen35moe", "nemotron_h",
                   "nemotron_h_moe"])


@pytest.mark.parametrize("family", sorted(MTP_ONLY))
def test_an_mtp_only_file_is_refused_as_not_modelled(written, family, tmp_path):
    path = _mtp_only(written, MTP_ONLY[family], tmp_path / "mtp.gguf")
    spec, n = load_specs()[family], load_model(written[MTP_ONLY[family]]).n_layer_nextn
    with pytest.raises(UnsupportedError) as e:
        load_model(path)
    assert str(e.value) == (
        f"{path}: an MTP-only file (nextn_predict_layers {n}, no 'blk.0.attn_norm.weight': the "
        f"mtp_only probe of llama.cpp's {family} loader (load_arch_tensors in {spec.source}), "
        "which makes the trunk's tensors optional): graphcost builds the trunk graph only; "
        "not modelled")


@needs_llama_cpp
def test_llama_cpp_runs_no_trunk_graph_on_an_mtp_only_file(written, tmp_path):
    """llama.cpp's loader accepts it (the trunk optional); its trunk graph has no tensors
    to read, and the worker dies (0.3.36: SIGSEGV)."""
    with pytest.raises(OracleError, match="llama.cpp worker failed"):
        capture_log(_mtp_only(written, "deepseek2_nextn", tmp_path / "mtp.gguf"), n_ctx=256)
