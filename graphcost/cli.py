"""The ``graphcost`` command: parse flags, run the pipeline, print. No math here."""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from graphcost.errors import GraphcostError, SettingsError
from graphcost.units import literal

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="What one llama.cpp step costs, from a GGUF header alone.")

# ---- shared run-setting options (llama.cpp flag names) -------------------------------
CtxOpt = Annotated[int, typer.Option("--ctx-size", "-c", help="context size (0 = model's)")]
BatchOpt = Annotated[int, typer.Option("--batch-size", "-b", help="logical batch size")]
UbatchOpt = Annotated[int, typer.Option("--ubatch-size", "-ub", help="physical batch size")]
FaOpt = Annotated[Optional[str], typer.Option(
    "--flash-attn", "-fa", help="on|off|auto [default: the flavour's: auto for head, off for 2024-08]")]
CtkOpt = Annotated[str, typer.Option("--cache-type-k", "-ctk", help="K cache type")]
CtvOpt = Annotated[str, typer.Option("--cache-type-v", "-ctv", help="V cache type")]
SwaOpt = Annotated[bool, typer.Option("--swa-full", help="full-size sliding-window cache")]
TokOpt = Annotated[int, typer.Option("--tokens", help="tokens in this ubatch")]
PastOpt = Annotated[int, typer.Option("--past", help="KV cells already filled")]
OutOpt = Annotated[int, typer.Option("--outputs", help="tokens whose logits are computed")]
FlavourOpt = Annotated[str, typer.Option("--llama-cpp", help="graph flavour: head | 2024-08")]
NpOpt = Annotated[int, typer.Option(
    "--parallel", "-np", help="parallel sequences (n_seq_max): N KV streams unless -kvu")]
KvuOpt = Annotated[bool, typer.Option(
    "--kv-unified", "-kvu", help="one KV buffer shared by all sequences (one stream)")]

# ---- placement options for analyze (llama.cpp flag names; memory spells the same) -----
DeviceOpt = Annotated[Optional[list[str]], typer.Option(
    "--device", help="KIND[:MEM], repeatable: a device (cuda, rocm, sycl, metal, vulkan, rpc)")]
NglOpt = Annotated[str, typer.Option(
    "--n-gpu-layers", "-ngl", "--gpu-layers", help="layers on the devices: N, auto or all")]
TsOpt = Annotated[Optional[str], typer.Option("--tensor-split", "-ts", help="proportions per device, e.g. 3,1")]
SmOpt = Annotated[str, typer.Option("--split-mode", "-sm", help="none|layer|row|tensor")]
MgOpt = Annotated[int, typer.Option("--main-gpu", "-mg", help="the device with -sm none")]
OtOpt = Annotated[Optional[list[str]], typer.Option(
    "--override-tensor", "-ot", help="PATTERN=BUFFER_TYPE[,...], e.g. exps=CPU")]
NcmoeOpt = Annotated[int, typer.Option("--n-cpu-moe", "-ncmoe", help="experts of the first N layers on the CPU")]
CmoeOpt = Annotated[bool, typer.Option("--cpu-moe", "-cmoe", help="all experts on the CPU")]
NkvoOpt = Annotated[bool, typer.Option("--no-kv-offload/--kv-offload", "-nkvo/-kvo",
                                       help="KV cache on the CPU (-kvo: offloaded, the default)")]
NoRepackOpt = Annotated[bool, typer.Option("--no-repack/--repack", "-nr",
                                           help="no CPU_REPACK weights")]
NoHostOpt = Annotated[bool, typer.Option("--no-host", help="no pinned host buffer for CPU weights")]
DevOpt = Annotated[Optional[str], typer.Option(
    "-dev", help="llama.cpp's -dev: use only these devices, in this order (e.g. RPC1,RPC0; none)")]
NoOpOffloadOpt = Annotated[bool, typer.Option(
    "--no-op-offload/--op-offload",
    help="no offloading of host-weight ops to a device (cparams.op_offload)")]
CpuFeatOpt = Annotated[Optional[str], typer.Option(
    "--cpu-features", help="ggml CPU features for CPU_REPACK, e.g. avx2,avx512 [default: this machine's]")]


def _placement_flags(ngl, ts, sm, mg, ot, n_cpu_moe, cpu_moe, nkvo, no_repack, no_host, mode,
                     cpu_features, dev=None, no_op_offload=False):
    """llama.cpp's placement flags as graphcost.memory.placement.PlacementFlags."""
    from graphcost.memory.backends import parse_cpu_features
    from graphcost.memory.placement import (PlacementFlags, cpu_moe_override, n_cpu_moe_overrides,
                                            parse_gpu_layers, parse_overrides, parse_tensor_split)
    if n_cpu_moe < 0:
        _fail(f"--n-cpu-moe {n_cpu_moe}: must be >= 0")
    # -ot, --cpu-moe and --n-cpu-moe append to one override list, in this order of parsing
    overrides = parse_overrides(ot)
    if cpu_moe:
        overrides.append(cpu_moe_override())
    overrides += n_cpu_moe_overrides(n_cpu_moe)
    feats = parse_cpu_features(cpu_features)
    return PlacementFlags(n_gpu_layers=parse_gpu_layers(ngl), tensor_split=parse_tensor_split(ts),
                          split_mode=sm, main_gpu=mg, overrides=tuple(overrides),
                          no_kv_offload=nkvo, repack=not no_repack, no_host=no_host,
                          load_mode=mode, cpu_features=feats,
                          select_devices=_parse_dev(dev), op_offload=not no_op_offload)


def _parse_dev(dev: str | None) -> tuple[str, ...] | None:
    """-dev NAME,NAME | none (common/arg.cpp parse_device_list)."""
    if dev is None:
        return None
    names = tuple(x.strip() for x in dev.split(",") if x.strip())
    if not names:
        _fail("-dev: no devices specified")
    return () if names == ("none",) else names
EmbdOpt = Annotated[bool, typer.Option("--embeddings", help="llama.cpp --embeddings: pooled "
                                       "embeddings (the GGUF's pooling type)")]


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"graphcost: {msg}", err=True)
    raise typer.Exit(code)


def _undecided(key: str, e: Exception, format: str, output) -> None:
    """graphcost cannot decide (a figure the answer needs is not modelled): with ``--format
    json`` the document ``{schema, KEY: {status: undecided, reason}}``, then the one-line
    reason and exit 4."""
    if format == "json":
        import json
        from graphcost.document import SCHEMA
        _emit(json.dumps({"schema": SCHEMA, key: {"status": "undecided",
                                                   "reason": str(e)}}) + "\n", output)
    _fail(str(e), 4)


def _parse_layers(spec: str | None, n_layer: int) -> set[int] | None:
    """'0-1,5' -> {0, 1, 5}; every range is checked against ``n_layer`` before the set
    is built (a range like 0-30000000 would otherwise fill memory)."""
    if spec is None:
        return None
    ranges: list[tuple[int, int]] = []
    for part in spec.split(","):
        part = part.strip()
        try:
            lo, _, hi = part.partition("-") if "-" in part[1:] else (part, "", part)
            lo, hi = int(lo), int(hi)
        except ValueError:
            raise GraphcostError(f"--layers {spec!r}: use a list like 0-1,5") from None
        if not 0 <= lo <= hi:
            raise GraphcostError(f"--layers {spec!r}: {part!r} is not a range lo-hi with "
                                 "0 <= lo <= hi")
        if hi >= n_layer:
            raise GraphcostError(f"--layers {spec!r}: layer {hi} is past the last layer "
                                 f"(the model has {n_layer}: 0-{n_layer - 1})")
        ranges.append((lo, hi))
    return {il for lo, hi in ranges for il in range(lo, hi + 1)}


def _threads(flag_value: int | None) -> int | None:
    """``--threads``: between 1 and the threads Numba can run (NUMBA_NUM_THREADS, by
    default the cores it sees); None when not given."""
    from graphcost.execute.threads import check_threads
    return None if flag_value is None else check_threads(flag_value, "--threads")


def _hardware_inputs(hardware: str | None) -> list[Path]:
    """The file ``--hardware`` names, as an input an ``-o`` must not overwrite."""
    if hardware is None:
        return []
    from graphcost.cost.hardware import find
    p = find(hardware)
    return [p] if p is not None else []


def _model_path(model: Optional[str]) -> Path | str:
    """The model argument: a local path, a URL or hf://... (kept as typed), or the
    bundled example."""
    from graphcost.format.remote import is_remote
    from graphcost.resources import default_model
    if model is None:
        return default_model()
    return model if is_remote(model) else Path(model)


def _local_model(model: str, command: str) -> Path:
    """The model of a command that needs the whole local file (profile, verify): a URL or
    hf:// path is refused in one line (a Path would have folded 'hf://' into 'hf:/')."""
    from graphcost.format.remote import is_remote
    if is_remote(model):
        _fail(f"{model}: {command} needs a local GGUF file (it reads the tensor data); "
              "download it first (analyze, memory, fit, speed and check read a remote header)")
    return Path(model)


ModelArg = Annotated[Optional[str], typer.Argument(
    help="GGUF file, https:// URL or hf://ORG/REPO[@REV]/FILE.gguf (default: a bundled example)")]


@app.command()
def analyze(
    model: ModelArg = None,
    format: Annotated[str, typer.Option("--format", "-f", help="summary|tree|json|yaml|html")] = "summary",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write to FILE")] = None,
    layers: Annotated[Optional[str], typer.Option("--layers", help="tree: only these layers, e.g. 0-1")] = None,
    ctx_size: CtxOpt = 4096, batch_size: BatchOpt = 2048, ubatch_size: UbatchOpt = 512,
    flash_attn: FaOpt = None, cache_type_k: CtkOpt = "f16", cache_type_v: CtvOpt = "f16",
    swa_full: SwaOpt = False, tokens: TokOpt = 1, past: PastOpt = 0, outputs: OutOpt = 1,
    llama_cpp: FlavourOpt = "head", embeddings: EmbdOpt = False,
    parallel: NpOpt = 1, kv_unified: KvuOpt = False,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", help="add roofline times for a hardware profile (name or .yaml)")] = None,
    device: DeviceOpt = None, n_gpu_layers: NglOpt = "auto", tensor_split: TsOpt = None,
    split_mode: SmOpt = "layer", main_gpu: MgOpt = 0, override_tensor: OtOpt = None,
    n_cpu_moe: NcmoeOpt = 0, cpu_moe: CmoeOpt = False, no_kv_offload: NkvoOpt = False,
    no_repack: NoRepackOpt = False, no_host: NoHostOpt = False, cpu_features: CpuFeatOpt = None,
    dev: DevOpt = None, no_op_offload: NoOpOffloadOpt = False,
) -> None:
    """Rebuild llama.cpp's graph for one ubatch and report its cost; with --device, also
    each node's device and the bytes copied between devices (ggml's backend scheduler)."""
    from graphcost.cost.analysis import analyze_graph
    from graphcost.graph.build import build_graph, load_model, resolve_for
    from graphcost.files import check_output
    from graphcost.cost.hardware import load as load_hardware
    from graphcost.report.formats import RENDERERS, Format
    from graphcost.report.renderer import RenderOptions, refuse_unused, render, wants_colour
    from graphcost.graph.settings import RunSettings

    try:
        fmt = Format(format)
    except ValueError:
        _fail(f"--format {format!r}: use one of {', '.join(f.value for f in Format)}")
    settings = RunSettings(ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                           flash_attn=flash_attn, cache_type_k=cache_type_k,
                           cache_type_v=cache_type_v, swa_full=swa_full, tokens=tokens,
                           past=past, outputs=outputs, llama_cpp=llama_cpp,
                           embeddings=embeddings, n_seq_max=parallel, kv_unified=kv_unified)
    path = _model_path(model)
    if output is not None:
        check_output(output, [path, *_hardware_inputs(hardware)])
    hw = load_hardware(hardware) if hardware is not None else None
    feats = None
    if cpu_features is not None:          # the placement (--device) and the predicted step
        from graphcost.memory.backends import parse_cpu_features
        feats = parse_cpu_features(cpu_features)
    opts = RenderOptions(layers=None if layers is None else set(), hardware=hw, width=80,
                         color=wants_colour(RENDERERS[fmt], output is not None,
                                            sys.stdout.isatty()), cpu_features=feats)
    refuse_unused(RENDERERS, fmt, opts)   # before the analysis, not after
    info = load_model(path)
    # the ranges are checked against the model's layers before a set is built
    opts = replace(opts, layers=_parse_layers(layers, info.n_layer))
    if device:
        from graphcost.memory.placement import parse_device, place
        from graphcost.memory.sched import flash_attn_auto_fails, schedule_step
        flags = _placement_flags(n_gpu_layers, tensor_split, split_mode, main_gpu,
                                 override_tensor or [], n_cpu_moe, cpu_moe, no_kv_offload,
                                 no_repack, no_host, "auto", cpu_features, dev, no_op_offload)
        dargs = [parse_device(d) for d in device]
        run = resolve_for(info, settings)
        if flash_attn_auto_fails(info, run, place(info, dargs, flags), flags):
            # llama.cpp's -fa auto does too, the cache already made for it (V not transposed)
            run = resolve_for(info, replace(settings, flash_attn="off", v_trans=False))
        a = analyze_graph(build_graph(info, run), memory=RENDERERS[fmt].memory)
        step = schedule_step(a.graph, dargs, flags)
        if isinstance(step, str):
            _fail(f"--device: the scheduler is not modelled here: {step}")
        a.schedule = step
    elif (n_gpu_layers != "auto" or tensor_split is not None or split_mode != "layer"
          or main_gpu or override_tensor or n_cpu_moe or cpu_moe or no_kv_offload or no_repack
          or no_host or (cpu_features is not None and hw is None) or dev is not None
          or no_op_offload):
        _fail("the placement flags (-ngl, -ts, -sm, -mg, -ot, -dev, ...) go with --device "
              "(--cpu-features: with --device or --hardware)")
    else:
        a = analyze_graph(build_graph(info, settings), memory=RENDERERS[fmt].memory)
    _emit(render(RENDERERS, fmt, a, opts), output)


@app.command()
def check(
    model: Annotated[str, typer.Argument(help="GGUF file, https:// URL or hf://ORG/REPO[@REV]/FILE.gguf")],
    baseline: Annotated[Path, typer.Option("--baseline", help="YAML written by analyze --format yaml")],
    rtol: Annotated[float, typer.Option("--rtol", help="allowed relative change")] = 0.0,
) -> None:
    """Exit 0 if the costs match the baseline within --rtol, 1 (with a diff table) if not."""
    from graphcost.check import baseline_settings, compare, load_baseline, unknown_run_keys
    from graphcost.pipeline import analyze_model
    from graphcost.report.check_table import render_drift
    from graphcost.document import document

    if not rtol >= 0:
        _fail(f"--rtol {rtol} must be >= 0")
    base = load_baseline(baseline)
    try:
        a = analyze_model(_model_path(model), baseline_settings(base, baseline))
    except SettingsError as e:  # the settings came from the file, not from flags
        raise SettingsError(f"{baseline}: the baseline's run settings: {e}") from None
    current = document(a)
    unknown_run_keys(base, current, baseline)
    drifts = compare(base, current, rtol)
    if drifts:
        typer.echo(render_drift(drifts, rtol), nl=False)
        raise typer.Exit(1)
    typer.echo(f"ok: {model} matches {baseline} within rtol {rtol}")


def _parse_sweep(spec: str | None) -> tuple[str, list[int]] | None:
    """'ctx=512,4096' -> ('ctx', [512, 4096])."""
    if spec is None:
        return None
    from graphcost.memory.plan import SWEEP_KEYS
    key, _, vals = spec.partition("=")
    key = key.strip()
    try:
        values = [int(v) for v in vals.split(",") if v.strip()]
    except ValueError:
        values = []
    if key not in SWEEP_KEYS or not values or any(v < 1 for v in values):
        raise GraphcostError(f"--sweep {spec!r}: use ctx=512,4096,32768 or ub=1,64,512")
    return key, values


@app.command()
def memory(
    model: ModelArg = None,
    sweep: Annotated[Optional[str], typer.Option(
        "--sweep", help="ctx=512,4096,32768 or ub=1,64,512")] = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="--format html: write the page to FILE; with --sweep: plot to "
                               "FILE (.png or .svg; needs graphcost[plot])")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="text|html")] = "text",
    fuse: Annotated[Optional[str], typer.Option(
        "--fuse", help="what-if: 'attention' as one fused kernel")] = None,
    ctx_size: CtxOpt = 4096, batch_size: BatchOpt = 2048, ubatch_size: UbatchOpt = 512,
    flash_attn: FaOpt = None, cache_type_k: CtkOpt = "f16", cache_type_v: CtvOpt = "f16",
    swa_full: SwaOpt = False, embeddings: EmbdOpt = False,
    parallel: NpOpt = 1, kv_unified: KvuOpt = False,
    device: Annotated[Optional[list[str]], typer.Option(
        "--device", help="KIND[:MEM], repeatable: a device (cuda, rocm, sycl, metal, vulkan, rpc) "
                         "and the free memory it reports, e.g. cuda:24GiB")] = None,
    n_gpu_layers: Annotated[str, typer.Option(
        "--n-gpu-layers", "-ngl", "--gpu-layers", help="layers on the devices: N, auto or all")] = "auto",
    tensor_split: Annotated[Optional[str], typer.Option(
        "--tensor-split", "-ts", help="proportions per device, e.g. 3,1")] = None,
    split_mode: Annotated[str, typer.Option("--split-mode", "-sm", help="none|layer|row|tensor")] = "layer",
    main_gpu: Annotated[int, typer.Option("--main-gpu", "-mg", help="the device with -sm none")] = 0,
    override_tensor: Annotated[Optional[list[str]], typer.Option(
        "--override-tensor", "-ot", help="PATTERN=BUFFER_TYPE[,...], e.g. exps=CPU")] = None,
    n_cpu_moe: Annotated[int, typer.Option(
        "--n-cpu-moe", "-ncmoe", help="experts of the first N layers on the CPU")] = 0,
    cpu_moe: Annotated[bool, typer.Option("--cpu-moe", "-cmoe", help="all experts on the CPU")] = False,
    no_kv_offload: Annotated[bool, typer.Option(
        "--no-kv-offload/--kv-offload", "-nkvo/-kvo", help="KV cache on the CPU")] = False,
    no_repack: Annotated[bool, typer.Option("--no-repack/--repack", "-nr",
                                            help="no CPU_REPACK weights")] = False,
    no_host: Annotated[bool, typer.Option("--no-host", help="no pinned host buffer for CPU weights")] = False,
    load_mode: Annotated[Optional[str], typer.Option(
        "--load-mode", "-lm", help="auto|none|mmap|mlock|mmap+mlock|dio")] = None,
    mmap: Annotated[Optional[bool], typer.Option(
        "--mmap/--no-mmap", help="older spelling of -lm mmap / -lm none")] = None,
    cpu_features: Annotated[Optional[str], typer.Option(
        "--cpu-features", help="ggml CPU features for CPU_REPACK, e.g. avx2,avx512 "
                               "[default: this machine's]")] = None,
    max_ctx: Annotated[bool, typer.Option(
        "--max-ctx", help="the largest context whose every device fits its MEM")] = False,
    dev: DevOpt = None, no_op_offload: NoOpOffloadOpt = False,
) -> None:
    """What llama.cpp allocates at start-up: weights, KV cache, compute and output buffers;
    with --device (or any placement flag), per device as llama.cpp places them."""
    from graphcost.graph.build import load_model
    from graphcost.files import check_output
    from graphcost.memory.fusion import fuse_plan
    from graphcost.memory.plan import plan_memory, sweep as run_sweep
    from graphcost.report.memory import render_memory, render_sweep, write_plot
    from graphcost.graph.settings import RunSettings

    if fuse is not None and fuse != "attention":
        _fail(f"--fuse {fuse!r}: only 'attention' is modelled")
    if format not in ("text", "html", "json"):
        _fail(f"--format {format!r}: use text, html or json")
    placing = (bool(device) or n_gpu_layers != "auto" or tensor_split is not None
               or split_mode != "layer" or main_gpu != 0 or bool(override_tensor) or n_cpu_moe
               or cpu_moe or no_kv_offload or no_repack or no_host or load_mode is not None
               or mmap is not None or cpu_features is not None or format == "json" or max_ctx
               or dev is not None or no_op_offload)
    if placing:
        if sweep is not None or fuse is not None or format == "html":
            _fail("--device and the placement flags go with --format text or json, "
                  "without --sweep or --fuse")
        if output is not None:
            check_output(output, [_model_path(model)])
        _memory_devices(model, format, output, device or [], n_gpu_layers, tensor_split,
                        split_mode, main_gpu, override_tensor or [], n_cpu_moe, cpu_moe,
                        no_kv_offload, no_repack, no_host, load_mode, mmap, cpu_features,
                        RunSettings(ctx_size=ctx_size, batch_size=batch_size,
                                    ubatch_size=ubatch_size, flash_attn=flash_attn,
                                    cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                                    swa_full=swa_full, embeddings=embeddings,
                                    n_seq_max=parallel, kv_unified=kv_unified), max_ctx=max_ctx,
                        dev=dev, no_op_offload=no_op_offload)
        return
    if format == "html" and fuse is not None:
        _fail("--fuse is shown by --format text only")
    if output is not None and sweep is None and format == "text":
        _fail("-o/--output writes the sweep plot: give --sweep too (or --format html)")
    parsed = _parse_sweep(sweep)
    if output is not None:
        check_output(output, [_model_path(model)])
    if output is not None and format == "text":
        from graphcost.report.plot import check_plot_path
        check_plot_path(output)
    settings = RunSettings(ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                           flash_attn=flash_attn, cache_type_k=cache_type_k,
                           cache_type_v=cache_type_v, swa_full=swa_full,
                           embeddings=embeddings, n_seq_max=parallel, kv_unified=kv_unified)
    info = load_model(_model_path(model))
    if format == "html":
        from graphcost.report.html import render_memory_page
        swept = None if parsed is None else (*parsed, run_sweep(info, settings, *parsed))
        _emit(render_memory_page(plan_memory(info, settings), swept), output)
        return
    if parsed is None:
        plan = plan_memory(info, settings)
        sys.stdout.write(render_memory(plan, fuse_plan(plan) if fuse else None))
        return
    key, values = parsed
    plans = run_sweep(info, settings, key, values)
    sys.stdout.write(render_sweep(key, values, plans))
    if fuse:
        for v, plan in zip(values, plans):
            sys.stdout.write(f"\n{key} = {v}:\n" + render_memory(plan, fuse_plan(plan)))
    if output is not None:
        write_plot(output, key, values, plans)
        sys.stdout.write(f"plot written to {output}\n")


@app.command()
def fit(
    model: ModelArg = None,
    device: Annotated[Optional[list[str]], typer.Option(
        "--device", help="KIND:MEM, repeatable: a device and the free memory it reports, "
                         "e.g. cuda:24GiB")] = None,
    fit_target: Annotated[Optional[str], typer.Option(
        "--fit-target", "-fitt", help="MiB to leave free per device: one value or MiB0,MiB1,... "
                                      "[default: 1024]")] = None,
    fit_ctx: Annotated[Optional[int], typer.Option(
        "--fit-ctx", "-fitc", help="smallest context the fit may set [default: 4096]")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="text|json")] = "text",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write to FILE")] = None,
    ctx_size: Annotated[Optional[int], typer.Option(
        "--ctx-size", "-c", help="context size; unset: the fit may reduce the model's")] = None,
    batch_size: BatchOpt = 2048, ubatch_size: UbatchOpt = 512,
    flash_attn: FaOpt = None, cache_type_k: CtkOpt = "f16", cache_type_v: CtvOpt = "f16",
    swa_full: SwaOpt = False,
    n_gpu_layers: Annotated[str, typer.Option(
        "--n-gpu-layers", "-ngl", "--gpu-layers", help="N, auto or all (set: the fit may not "
                                                       "change it)")] = "auto",
    tensor_split: Annotated[Optional[str], typer.Option("--tensor-split", "-ts")] = None,
    split_mode: Annotated[str, typer.Option("--split-mode", "-sm")] = "layer",
    main_gpu: Annotated[int, typer.Option("--main-gpu", "-mg")] = 0,
    override_tensor: Annotated[Optional[list[str]], typer.Option("--override-tensor", "-ot")] = None,
    n_cpu_moe: Annotated[int, typer.Option("--n-cpu-moe", "-ncmoe")] = 0,
    cpu_moe: Annotated[bool, typer.Option("--cpu-moe", "-cmoe")] = False,
    no_kv_offload: Annotated[bool, typer.Option("--no-kv-offload/--kv-offload", "-nkvo/-kvo")] = False,
    no_repack: Annotated[bool, typer.Option("--no-repack/--repack", "-nr")] = False,
    no_host: Annotated[bool, typer.Option("--no-host")] = False,
    load_mode: Annotated[Optional[str], typer.Option(
        "--load-mode", "-lm", help="accepted; the fit measures without mmap whatever is given")] = None,
    mmap: Annotated[Optional[bool], typer.Option("--mmap/--no-mmap", help="as -lm")] = None,
    cpu_features: Annotated[Optional[str], typer.Option("--cpu-features")] = None,
    host_memory: Annotated[Optional[str], typer.Option(
        "--host-memory", help="without --device: the host's total memory, e.g. 32GiB "
                              "[default: this machine's]")] = None,
    parallel: Annotated[int, typer.Option(
        "--parallel", "-np", help="parallel sequences (KV streams unless -kvu; "
                                  "llama-fit-params has no -kvu)")] = 1,
    kv_unified: KvuOpt = False,
    dev: DevOpt = None, no_op_offload: NoOpOffloadOpt = False,
) -> None:
    """What llama.cpp's --fit (llama-fit-params) chooses for these devices' free memory:
    context, -ngl, -ts and -ot. The last line is the argument line llama-fit-params prints.
    Without --device: a CPU-only machine (the host's buffers against its total memory).
    Exit 1: llama.cpp's fit gives up; 4: a figure it needs is not modelled."""
    import json

    from graphcost.graph.build import load_model, resolve_for
    from graphcost.graph.settings import RunSettings
    from graphcost.memory.fit import (DEFAULT_MIN_CTX, UINT32_MAX, Undecided, fit as run_fit, fit_inputs, graphcost_measure, parse_fit_target)
    from graphcost.report.fit import render_fit

    if format not in ("text", "json"):
        _fail(f"--format {format!r}: use text or json")
    if ctx_size is not None and ctx_size < 0:
        _fail(f"--ctx-size {ctx_size}: must be >= 0")
    if fit_ctx is not None and fit_ctx < 0:
        _fail(f"--fit-ctx {fit_ctx}: must be >= 0")
    if output is not None:
        from graphcost.files import check_output
        check_output(output, [_model_path(model)])
    margins = parse_fit_target(fit_target)
    # common/arg.cpp: -c 0 asks for the full context (fit_params_min_ctx = UINT32_MAX);
    # an -fitc given as well wins (as when llama.cpp parses it after -c)
    n_ctx_min = fit_ctx if fit_ctx is not None else (
        UINT32_MAX if ctx_size == 0 else DEFAULT_MIN_CTX)
    flags, args = _placement(device or [], n_gpu_layers, tensor_split, split_mode, main_gpu,
                             override_tensor or [], n_cpu_moe, cpu_moe, no_kv_offload, no_repack,
                             no_host, load_mode, mmap, cpu_features, dev, no_op_offload)
    host_total = None
    if host_memory is not None:
        from graphcost.units import parse_bytes
        host_total = parse_bytes(host_memory, "--host-memory")
    info = load_model(_model_path(model))
    settings = RunSettings(ctx_size=ctx_size or 0, batch_size=batch_size, ubatch_size=ubatch_size,
                           flash_attn=flash_attn, cache_type_k=cache_type_k,
                           cache_type_v=cache_type_v, swa_full=swa_full,
                           n_seq_max=parallel, kv_unified=kv_unified)
    resolve_for(info, settings)  # refuses impossible settings (-np 300) in one line first
    inputs = fit_inputs(info, args, flags, n_ctx=ctx_size or 0, margins=margins,
                        n_ctx_min=n_ctx_min, host_total=host_total, n_seq=parallel,
                        kv_unified=kv_unified)
    try:
        r = run_fit(inputs, graphcost_measure(info, settings, args, flags))
    except Undecided as e:
        _undecided("fit", e, format, output)
    if format == "json":
        from graphcost.document import SCHEMA
        _emit(json.dumps({"schema": SCHEMA, "fit": r.as_dict()}, indent=2) + "\n", output)
    elif r.status == "fit":
        _emit(render_fit(r, info.name), output)
    if r.status != "fit":
        _fail(f"llama.cpp's fit gives up: {r.reason} (llama-fit-params exits 1)", 1)


def _placement(devices, ngl, ts, sm, mg, ot, n_cpu_moe, cpu_moe, nkvo, no_repack, no_host,
               load_mode, mmap, cpu_features, dev=None, no_op_offload=False):
    """llama.cpp's placement flags -> (PlacementFlags, [DeviceArg]); bad flags raise."""
    from graphcost.memory.placement import parse_device

    if load_mode is not None and mmap is not None:
        _fail("give -lm/--load-mode or --mmap/--no-mmap, not both")
    mode = load_mode if load_mode is not None else (
        "auto" if mmap is None else ("mmap" if mmap else "none"))
    flags = _placement_flags(ngl, ts, sm, mg, ot, n_cpu_moe, cpu_moe, nkvo, no_repack, no_host,
                             mode, cpu_features, dev, no_op_offload)
    return flags, [parse_device(d) for d in devices]


def _memory_devices(model, format, output, devices, ngl, ts, sm, mg, ot, n_cpu_moe, cpu_moe,
                    nkvo, no_repack, no_host, load_mode, mmap, cpu_features, settings,
                    max_ctx: bool = False, dev=None, no_op_offload=False) -> None:
    """memory --device ...: parse llama.cpp's placement flags and print the device rows
    (with --max-ctx: the largest context that fits)."""
    import json

    from graphcost.graph.build import load_model
    from graphcost.memory.placement import plan_devices
    from graphcost.report.memory import devices_json, render_devices

    flags, args = _placement(devices, ngl, ts, sm, mg, ot, n_cpu_moe, cpu_moe, nkvo, no_repack,
                             no_host, load_mode, mmap, cpu_features, dev, no_op_offload)
    info = load_model(_model_path(model))
    if max_ctx:
        from graphcost.memory.fit import Undecided, largest_device_context
        from graphcost.report.fit import render_max_ctx
        try:
            m = largest_device_context(info, settings, args, flags)
        except Undecided as e:
            _undecided("max_ctx", e, format, output)
        if format == "json":
            from graphcost.document import SCHEMA
            _emit(json.dumps({"schema": SCHEMA, "max_ctx": {"status": "decided", **m.as_dict()}},
                             indent=2) + "\n", output)
        else:
            _emit(render_max_ctx(m), output)
        return
    dp = plan_devices(info, settings, args, flags)
    if format == "json":
        from graphcost.document import SCHEMA
        _emit(json.dumps({"schema": SCHEMA, "memory": devices_json(dp)}, indent=2) + "\n", output)
    else:
        _emit(render_devices(dp), output)


def _parse_ids(flag: str, spec: str | None) -> list[int]:
    if spec is None or not spec.strip():
        return []
    try:
        ids = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise GraphcostError(f"{flag} {spec!r}: use comma-separated token ids, e.g. 3,10,17") from None
    if any(i < 0 for i in ids):
        raise GraphcostError(f"{flag} {spec!r}: token ids are >= 0")
    return ids


@app.command()
def profile(
    model: Annotated[str, typer.Argument(help="GGUF file (header-only files run on random weights)")],
    token_ids: Annotated[str, typer.Option("--token-ids", help="prompt token ids, e.g. 3,10,17,24")],
    decode_ids: Annotated[Optional[str], typer.Option("--decode-ids", help="then decode these ids one by one")] = None,
    greedy: Annotated[int, typer.Option("--greedy", help="then K greedy (argmax) decode steps")] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="runs per step; node times are medians")] = 3,
    depth: Annotated[int, typer.Option(
        "--depth", "-d", help="KV cells filled first with random ids, untimed (llama-bench's -d)")] = 0,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", help="hardware profile for the roofline (default: probe this machine now)")] = None,
    numerics: Annotated[str, typer.Option(
        "--numerics", help="fast (fastest kernel per weight type) | ggml (llama.cpp's activation rounding for every matmul)")] = "fast",
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="kernel threads")] = None,
    format: Annotated[str, typer.Option("--format", "-f", help="table|json")] = "table",
    top: Annotated[Optional[int], typer.Option("--top", help="table: slowest nodes shown (0 = all) [default: 20]")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write to FILE")] = None,
    ctx_size: CtxOpt = 4096, batch_size: BatchOpt = 2048, ubatch_size: UbatchOpt = 512,
    flash_attn: FaOpt = None, cache_type_k: CtkOpt = "f16", cache_type_v: CtvOpt = "f16",
    swa_full: SwaOpt = False,
) -> None:
    """Run the graph on the Numba kernels and time every node against its modelled cost."""
    from graphcost.graph.build import load_model, resolve_for
    from graphcost.execute.executor import NUMERICS, check_runnable
    from graphcost.files import check_output
    from graphcost.cost.hardware import load as load_hardware
    from graphcost.execute.profile import check_steps, quick_hardware, run_profile
    from graphcost.report.profile import RENDERERS, ProfileFormat
    from graphcost.report.renderer import RenderOptions, refuse_unused, render, wants_colour
    from graphcost.graph.settings import RunSettings

    model = _local_model(model, "profile")
    try:
        fmt = ProfileFormat(format)
    except ValueError:
        _fail(f"--format {format!r}: use one of {', '.join(f.value for f in ProfileFormat)}")
    if numerics not in NUMERICS:
        _fail(f"--numerics {numerics!r}: use one of {', '.join(NUMERICS)}")
    threads = _threads(threads)
    if greedy < 0:
        _fail(f"--greedy {greedy} must be >= 0")
    opts = RenderOptions(top=top, width=100,
                         color=wants_colour(RENDERERS[fmt], output is not None, sys.stdout.isatty()))
    refuse_unused(RENDERERS, fmt, opts)
    prompt = _parse_ids("--token-ids", token_ids)
    settings = RunSettings(ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                           flash_attn=flash_attn, cache_type_k=cache_type_k,
                           cache_type_v=cache_type_v, swa_full=swa_full, tokens=max(1, len(prompt)))
    if output is not None:
        check_output(output, [model, *_hardware_inputs(hardware)])
    hw = load_hardware(hardware) if hardware is not None else None
    info = load_model(model)
    ctx = resolve_for(info, replace(settings, tokens=1))
    if len(prompt) > min(ctx.n_ubatch, ctx.kv_size):
        # the prompt is one ubatch (not split as llama_decode would): say so, naming the flag
        # given rather than --tokens, which profile does not have
        _fail(f"--token-ids: {len(prompt)} ids are more than one ubatch of this context "
              f"holds (-ub {ctx.n_ubatch}, {ctx.kv_size} KV cells); profile runs the prompt "
              "as one ubatch")
    run = resolve_for(info, settings)   # once: the executor steps through this context
    check_runnable(info, run)  # before the probe: a partial file, a huge -c, at once
    decode = _parse_ids("--decode-ids", decode_ids)
    check_steps(prompt, decode, greedy, repeat, depth)  # before the probe (tens of seconds)
    if depth + len(prompt) + (len(decode) or greedy) > ctx.kv_size:
        # the last decode step would need a cell past the context: refuse now, not after
        # minutes of steps
        _fail(("--depth, " if depth else "")
              + f"--token-ids and {'--decode-ids' if decode else '--greedy'}: "
              + (f"{depth} + " if depth else "") + f"{len(prompt)} + "
              f"{len(decode) or greedy} tokens are more than the context's {ctx.kv_size} "
              "KV cells (-c)")
    for i in prompt + decode:  # before the probe, and before numpy sees a huge id
        if i >= info.n_vocab:
            _fail(f"token id {i} is not in the vocabulary [0, {info.n_vocab})")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # no auto-refresh thread: it would take the GIL from the timed loop now and then
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                  auto_refresh=False) as bar:
        task = bar.add_task("probing hardware" if hw is None else "loading",
                            total=(1 + (len(decode) or greedy)) * repeat)
        bar.refresh()
        if hw is None:
            hw = quick_hardware(threads)

        def tick(description: str, advance: int) -> None:
            bar.update(task, description=description, advance=advance)
            bar.refresh()
        prof = run_profile(info, run, prompt, decode_ids=decode, greedy=greedy,
                           repeat=repeat, hardware=hw, numerics=numerics, threads=threads,
                           depth=depth, progress=tick)
    _emit(render(RENDERERS, fmt, prof, opts), output)


@app.command()
def hwprobe(
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="profile NAME (saved in the user's config dir; default: host "
        "name) or a PATH (with a slash or .yaml)")] = None,
    mib: Annotated[int, typer.Option("--mib", help="size of the streamed matrices")] = 256,
    repeat: Annotated[int, typer.Option("--repeat", help="timed runs per figure (median)")] = 5,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", help="kernel threads")] = None,
) -> None:
    """Measure memory bandwidth and peak FLOP rate with the kernels; write a hardware profile."""
    from graphcost.files import check_output
    from graphcost.cost.hardware import is_path, save, user_dir
    from graphcost.execute.hwprobe import default_name, probe

    if mib < 16:
        _fail(f"--mib {mib}: use at least 16 (the matrix must be larger than the caches)")
    from graphcost.execute.weights import available_memory
    if mib << 20 > available_memory() // 4:  # the probe holds a few matrices of this size
        _fail(f"--mib {mib}: more than a quarter of the {available_memory() >> 20} MiB "
              "of memory available")
    if repeat < 1:
        _fail(f"--repeat {repeat} must be >= 1")
    threads = _threads(threads)
    name = output or default_name()
    check_output(Path(name) if is_path(name) else user_dir() / f"{name}.yaml")  # before probing
    from rich.console import Console
    err = Console(stderr=True)
    with err.status("probing") as status:
        doc = probe(mib=mib, repeat=repeat, threads=threads,
                    progress=lambda s: status.update(f"probing {s}"))
    doc["name"] = Path(name).stem if is_path(name) else name
    path, note = save(doc, name)
    bw, fl = doc["memory_bandwidth"], doc["peak_flops"]
    typer.echo(f"memory bandwidth: {bw['bytes_per_second'] / 1e9:.2f} GB/s (streaming read)")
    typer.echo("matvec, % of it:  " + ", ".join(
        f"{k} {v / bw['bytes_per_second']:.0%}" for k, v in bw["by_type"].items()))
    typer.echo("  % of the read timed beside it: " + ", ".join(
        f"{k} {v / bw['stream_by_type'][k]:.0%}" for k, v in bw["by_type"].items()))
    typer.echo(f"peak FLOP rate:   {fl['flops_per_second'] / 1e9:.1f} GFLOP/s")
    typer.echo("matmul peak per weight type (GFLOP/s): " + ", ".join(
        f"{k} {v / 1e9:.1f}" for k, v in fl["by_type"].items()))
    ovh = doc["op_overhead"]
    typer.echo(f"per-op overhead:  {ovh['seconds'] * 1e6:.1f} us median over op kinds ("
               f"{min(ovh['by_op'].values()) * 1e6:.1f}-{max(ovh['by_op'].values()) * 1e6:.1f} us)")
    typer.echo(f"wrote {path}")
    if note:
        typer.echo(f"note: {note}")
    from graphcost.calibrate import find_llama_bench
    try:
        bench = find_llama_bench()
        typer.echo(f"llama.cpp's own rates (graphcost speed): graphcost calibrate -o {name} "
                   f"(llama-bench found: {bench})")
    except GraphcostError:
        typer.echo(f"llama.cpp's own rates (graphcost speed): graphcost calibrate -o {name} "
                   "--llama-bench PATH (no llama-bench found)")


@app.command()
def calibrate(
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="profile NAME (user's config dir; default: host name) or PATH; "
        "an existing profile (graphcost hwprobe's) keeps its other fields")] = None,
    llama_bench: Annotated[Optional[str], typer.Option(
        "--llama-bench", help="llama-bench executable or its directory [default: PATH, "
        "then graphcost's llama.cpp tools cache]")] = None,
    quick: Annotated[bool, typer.Option(
        "--quick", help="small generated models only (minutes, not the full set's ~10)")] = False,
    threads: Annotated[Optional[int], typer.Option(
        "--threads", "-t", help="llama-bench -t [default: the profile's, else all cores]")] = None,
    save_runs: Annotated[Optional[Path], typer.Option(
        "--save", help="also write llama-bench's measurements (JSON) here")] = None,
    cpu_features: Annotated[Optional[str], typer.Option(
        "--cpu-features", help="ggml CPU features of the llama-bench measured, for its weight "
        "repacking (a build or variant without some of this CPU's, e.g. no AMX), e.g. "
        "avx2,avx512 [default: this machine's]; kept in the profile")] = None,
    passes: Annotated[int, typer.Option(
        "--passes", help="measure every case in this many llama-bench processes (the whole "
        "set again each pass), the median of all their repetitions: for a machine whose "
        "speed moves between processes (N times the time)")] = 1,
) -> None:
    """Fit graphcost speed's coefficients against llama-bench on this machine; store them
    and the held-out error band in a hardware profile (docs/speed.md)."""
    import json

    from graphcost.calibrate import calibrate as run_calibration
    from graphcost.calibrate import find_llama_bench, machine_read, section, store
    from graphcost.cost.hardware import find, is_path, load, user_dir
    from graphcost.execute.hwprobe import default_name
    from graphcost.files import check_output
    from graphcost.memory.backends import parse_cpu_features

    if threads is not None and threads < 1:
        _fail(f"--threads {threads}: use 1 or more")
    if passes < 1:
        _fail(f"--passes {passes}: use 1 or more")
    feats = parse_cpu_features(cpu_features)
    bench = find_llama_bench(llama_bench)
    name = output or default_name()
    for target in ([Path(name).expanduser()] if is_path(name) else []) + \
            ([save_runs] if save_runs is not None else []):
        check_output(target)         # before minutes of measuring, not after
        if not target.parent.is_dir():
            _fail(f"{target}: directory {target.parent} does not exist")
    if not is_path(name):
        check_output(user_dir() / f"{name}.yaml")
    if threads is None:
        existing = find(name)
        threads = (load(name).threads if existing is not None and existing.exists() else None) \
            or os.cpu_count() or 1
    typer.echo(f"llama-bench: {bench}; threads {threads}; "
               f"{'quick (small models)' if quick else 'full'} calibration; weights placed "
               f"for CPU features {', '.join(sorted(feats)) or 'none'}", err=True)
    cal = run_calibration(bench, threads, quick, log=lambda s: typer.echo(s, err=True),
                          features=feats, passes=passes)
    if save_runs is not None:
        keep = ("counts", "pred_ts", "ratio", "meas_ts", "seconds", "cal")
        save_runs.write_text(json.dumps([{k: v for k, v in r.items() if k not in keep}
                                         for r in cal.rows], indent=1))
    for r in cal.rows:
        typer.echo(f"{r['model']:14s} {r['test']:14s} ub {r['n_ubatch']:4d} fa {r['flash_attn']} "
                   f"{'cal ' if r['cal'] else 'held'} predicted {r['pred_ts']:9.2f} measured "
                   f"{r['meas_ts']:9.2f} tok/s  pred/meas {r['ratio']:.3f}")
    for k, b in cal.band.items():
        typer.echo(f"{k}: {b['cases']} cases, median |pred/meas - 1| {100 * b['median']:.1f}%, "
                   f"worst {100 * b['worst']:.1f}%")
    if cal.undetermined:
        typer.echo(f"not pinned down by the calibration cases: {', '.join(cal.undetermined)}")
    path, note = store(name, section(cal, bench, quick), read=machine_read)
    typer.echo(f"wrote {path}" + (f" ({note})" if note else ""))


@app.command(context_settings={"help_option_names": ["--help", "-h"]})
def speed(
    model: ModelArg = None,
    hardware: Annotated[Optional[str], typer.Option(
        "--hardware", help="hardware profile (name or .yaml); calibrated by "
        "graphcost calibrate")] = None,
    n_prompt: Annotated[str, typer.Option("-p", "--n-prompt", help="prompt tokens, list")] = "512",
    n_gen: Annotated[str, typer.Option("-n", "--n-gen", help="generated tokens, list")] = "128",
    n_depth: Annotated[str, typer.Option("-d", "--n-depth", help="context depth, list")] = "0",
    batch: Annotated[Optional[str], typer.Option("-b", "--batch-size", help="list")] = None,
    ubatch: Annotated[Optional[str], typer.Option("-ub", "--ubatch-size", help="list")] = None,
    fa: Annotated[Optional[str], typer.Option("-fa", "--flash-attn", help="on|off|auto, list")] = None,
    threads: Annotated[Optional[str], typer.Option("-t", "--threads", help="list [default: the "
                                                   "profile's]")] = None,
    ctk: Annotated[Optional[str], typer.Option("-ctk", "--cache-type-k", help="list")] = None,
    ctv: Annotated[Optional[str], typer.Option("-ctv", "--cache-type-v", help="list")] = None,
    reps: Annotated[str, typer.Option("-r", "--repetitions", help="accepted; a prediction "
                                      "has no repetitions")] = "5",
    cpu_features: Annotated[Optional[str], typer.Option(
        "--cpu-features", help="ggml CPU features of the llama.cpp that will run, for its "
        "weight repacking, e.g. avx2,avx512 or none [default: those the profile was "
        "calibrated with, else the profile's CPU's, else this machine's]")] = None,
    fmt: Annotated[str, typer.Option("-o", "--format", help="md | json")] = "md",
) -> None:
    """Predict what llama-bench prints (pp and tg tokens/s) for a model on a hardware profile."""
    from graphcost.cost.hardware import load as load_hardware
    from graphcost.memory.backends import parse_cpu_features
    from graphcost.report.speed import (FORMATS, describe, footer, render_json, render_md,
                                        shown_fields)
    from graphcost.speed import DEFAULTS, instances, model_description, parse_list, predict_all

    if fmt not in FORMATS:
        _fail(f"-o/--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if hardware is None:
        _fail("--hardware is required: a profile name or a .yaml (graphcost hwprobe, then "
              "graphcost calibrate -o NAME to calibrate it against llama-bench)")
    hw = load_hardware(hardware)
    feats = None if cpu_features is None else parse_cpu_features(cpu_features)
    given = {"n_batch": None if batch is None else parse_list("-b", batch, "int"),
             "n_ubatch": None if ubatch is None else parse_list("-ub", ubatch, "int"),
             "flash_attn": None if fa is None else parse_list("-fa", fa, "fa"),
             "type_k": None if ctk is None else parse_list("-ctk", ctk, "cache"),
             "type_v": None if ctv is None else parse_list("-ctv", ctv, "cache")}
    parse_list("-r", reps, "int")
    t_list = parse_list("-t", threads, "int") if threads else [hw.threads or os.cpu_count() or 1]
    tests = instances(parse_list("-p", n_prompt, "int"), parse_list("-n", n_gen, "int"),
                      parse_list("-d", n_depth, "int"),
                      *(given[k] or DEFAULTS[k] for k in ("n_batch", "n_ubatch", "flash_attn",
                                                          "type_k", "type_v")), t_list)
    # no test (-p 0 -n 0): llama-bench prints its header and no row, exit 0 (main in
    # tools/llama-bench/llama-bench.cpp prints the header before looping over the instances)
    path = _model_path(model)
    info, pr, preds = predict_all(path, hw, tests, progress=lambda line: typer.echo(
        f"graphcost speed: {line}", err=True), features=feats)
    sm = pr.speed
    desc = model_description(info)
    note = describe(sm, hw, pr.placement.features, pr.placement.features_from)
    missing = sorted({k for p in preds for k in sm.missing(p.counts)})
    loose = sorted({k for p in preds for k, v in p.counts.items() if v and k in sm.undetermined})
    if missing:                 # the footer under a table and each JSON row say so
        note["no_coefficient"] = missing
    if loose:
        note["not_pinned_down"] = loose
    if fmt == "json":
        sys.stdout.write(render_json(preds, desc, info, str(path), hw.name, note))
        return
    sys.stdout.write(render_md(preds, shown_fields(given), desc, info))
    sys.stdout.write(footer(note, hw, set(t_list)))


@app.command()
def verify(
    model: Annotated[str, typer.Argument(help="GGUF file (header-only and partial files are padded)")],
    ctx_size: CtxOpt = 4096, batch_size: BatchOpt = 2048, ubatch_size: UbatchOpt = 512,
    flash_attn: FaOpt = None, cache_type_k: CtkOpt = "f16", cache_type_v: CtvOpt = "f16",
    swa_full: SwaOpt = False, tokens: TokOpt = 1, past: PastOpt = 0, outputs: OutOpt = 1,
    embeddings: EmbdOpt = False, parallel: NpOpt = 1, kv_unified: KvuOpt = False,
) -> None:
    """Run the installed llama.cpp (llama-cpp-python) on the model and show where graphcost's
    graph and buffers differ from it: exit 0 when equal, 1 when not."""
    from graphcost.graph.settings import RunSettings
    from graphcost.judge.verify import render_verification, verify as run_verify

    settings = RunSettings(ctx_size=ctx_size, batch_size=batch_size, ubatch_size=ubatch_size,
                           flash_attn=flash_attn, cache_type_k=cache_type_k,
                           cache_type_v=cache_type_v, swa_full=swa_full, tokens=tokens,
                           past=past, outputs=outputs, embeddings=embeddings,
                           n_seq_max=parallel, kv_unified=kv_unified)
    v = run_verify(_local_model(model, "verify"), settings)
    sys.stdout.write(render_verification(v))
    raise typer.Exit(0 if v.equal else 1)


@app.command()
def archs(
    fmt: Annotated[str, typer.Option("--format", "-f", help="text | json")] = "text",
) -> None:
    """List the modelled architectures, what is proven for each, and those not modelled."""
    from graphcost.archs import archs_document
    from graphcost.report.archs import RENDERERS, ArchsFormat
    from graphcost.report.renderer import RenderOptions, render

    try:
        f = ArchsFormat(fmt)
    except ValueError:
        _fail(f"--format {fmt!r}: use one of {', '.join(f.value for f in ArchsFormat)}")
    sys.stdout.write(render(RENDERERS, f, archs_document(), RenderOptions()))


def _emit(text: str, output: Optional[Path]) -> None:
    """Print, or write ``-o`` atomically (checked by check_output before any work)."""
    if output is None:
        sys.stdout.write(text)
        return
    from graphcost.files import write_atomic
    write_atomic(output, text)


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        rc = app(standalone_mode=False)  # click returns typer.Exit's code here
        sys.exit(rc if isinstance(rc, int) else 0)
    except GraphcostError as e:
        # one line, shown literally: a name from a file cannot break it or reach the
        # terminal as an escape sequence
        typer.echo(f"graphcost: {literal(e)}", err=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as e:  # usage errors: unknown option, bad value, ...
        if e.format_message():  # empty when the help was shown for a bare command
            typer.echo(f"graphcost: {literal(e.format_message())}", err=True)
        sys.exit(2)
    except Exception as e:  # anything unforeseen: still one line
        if os.environ.get("GRAPHCOST_DEBUG"):
            raise
        typer.echo(f"graphcost: internal error: {type(e).__name__}: {literal(e)} "
                   "(set GRAPHCOST_DEBUG=1 for a traceback)", err=True)
        sys.exit(3)
