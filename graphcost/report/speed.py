"""``graphcost speed`` output in llama-bench's layouts (tools/llama-bench/llama-bench.cpp:
``markdown_printer`` and ``json_printer``), then graphcost's note on where the figures
come from and the error band the calibration measured."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from graphcost.cost.speed_model import COUNTS
from graphcost.errors import SettingsError
from graphcost.speed import DEFAULTS, Prediction
from graphcost.units import mib

#: llama-bench's test::avg_ns() is a uint64_t (nanoseconds): at most 2**64 - 1, 584 years
_AVG_NS_MAX = 2 ** 64 - 1

FORMATS = ("md", "json")

#: markdown_printer::get_field_width (negative: left-aligned)
_WIDTH = {"model": -30, "size": 10, "params": 10, "backend": -10, "n_threads": 7,
          "n_batch": 7, "n_ubatch": 8, "type_k": 6, "type_v": 6, "flash_attn": 3,
          "test": 15, "t/s": 20}
#: markdown_printer::get_field_display_name
_DISPLAY = {"n_threads": "threads", "flash_attn": "fa"}
_FA_INT = {"auto": -1, "off": 0, "on": 1}


def shown_fields(given: dict) -> list[str]:
    """markdown_printer::print_header: the fixed columns, threads (always on the CPU
    backend), and each list flag given other than its default."""
    fields = ["model", "size", "params", "backend", "n_threads"]
    for f in ("n_batch", "n_ubatch", "type_k", "type_v", "flash_attn"):
        if given.get(f) is not None and given[f] != DEFAULTS[f]:
            fields.append(f)
    return fields + ["test", "t/s"]


def _size(nbytes: int) -> str:
    return (f"{mib(nbytes)} MiB" if nbytes < 1024 ** 3
            else f"{nbytes / 1024 ** 3:.2f} GiB")


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def _value(field: str, p: Prediction, desc: str, model) -> str:
    t = p.test
    return {"model": desc, "size": _size(model.weights_bytes), "params": _params(model.n_params),
            "backend": "CPU", "n_threads": str(t.threads), "n_batch": str(t.n_batch),
            "n_ubatch": str(t.n_ubatch), "type_k": t.type_k, "type_v": t.type_v,
            "flash_attn": str(_FA_INT[t.flash_attn]), "test": t.name,
            "t/s": f"{p.tokens_per_second:.2f} ± 0.00"}[field]


def render_md(preds: list[Prediction], fields: list[str], desc: str, model) -> str:
    head = "|" + "".join(f" {_DISPLAY.get(f, f):>{abs(_WIDTH[f])}} |" if _WIDTH[f] > 0 else
                         f" {_DISPLAY.get(f, f):<{abs(_WIDTH[f])}} |" for f in fields)
    rule = "|" + "".join(f" {'-' * (abs(_WIDTH[f]) - 1)}{':' if _WIDTH[f] > 0 else '-'} |"
                         for f in fields)
    lines = [head, rule]
    for p in preds:
        cells = []
        for f in fields:
            w = _WIDTH[f]
            v = _value(f, p, desc, model)
            # a minimum width, as llama-bench's printf("%*s"): a longer value (a test name
            # like tg2147483647) widens its row's cell, not the column.
            # llama-bench's HACK: '±' is two bytes, so its column is one wider in bytes
            cells.append(f" {v:>{w}} |" if w > 0 else f" {v:<{-w}} |")
        lines.append("|" + "".join(cells))
    return "\n".join(lines) + "\n"


def render_json(preds: list[Prediction], desc: str, model, path: str, hw_name: str,
                note: dict) -> str:
    """llama-bench's JSON rows (the fields a prediction has), plus ``graphcost``: how.

    Raises :class:`SettingsError` when a test's predicted time does not fit llama-bench's
    ``avg_ns`` (a uint64 of nanoseconds): such a row would break its schema."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = []
    for p in preds:
        t, avg_ns = p.test, round(p.seconds * 1e9)
        if avg_ns > _AVG_NS_MAX:
            raise SettingsError(
                f"-o json: test {t.name} is predicted to take {p.seconds:.3g} s, more than "
                f"llama-bench's avg_ns field holds (uint64: {_AVG_NS_MAX / 1e9:.3g} s, 584 "
                f"years); use -o md, or fewer tokens")
        rows.append({
            "backends": "CPU", "model_filename": path, "model_type": desc,
            "model_size": model.weights_bytes, "model_n_params": model.n_params,
            "n_batch": t.n_batch, "n_ubatch": t.n_ubatch, "n_threads": t.threads,
            "type_k": t.type_k, "type_v": t.type_v, "flash_attn": _FA_INT[t.flash_attn],
            "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
            "test_time": now, "avg_ns": avg_ns, "stddev_ns": 0,
            "avg_ts": round(p.tokens_per_second, 6), "stddev_ts": 0.0,
            "graphcost": {"predicted": True, "hardware": hw_name, **note},
        })
    return json.dumps(rows, indent=2) + "\n"


def describe(sm, hw, features=None, features_from: str = "") -> dict:
    """Where the figures come from: the profile, whether they were checked, the band, the
    ggml CPU ``features`` weights were placed for and where those come from
    (graphcost.cost.speed_model.placement_features)."""
    out = {"verified": sm.verified, "how": sm.source, "threads_calibrated": sm.threads}
    if features is not None:
        out["cpu_features"] = sorted(features)
        out["cpu_features_from"] = features_from
        cal = sm.cpu_features
        if cal is not None and frozenset(features) != cal:
            out["cpu_features_calibrated"] = sorted(cal)
    if sm.band:
        out["error_band"] = dict(sm.band)
    if sm.verified and sm.counts < COUNTS:
        out["counts_calibrated"] = sm.counts
    if hw.kind == "theoretical":
        out["warning"] = "datasheet profile: unverified, not checked against llama.cpp"
    elif not sm.verified or not sm.band:
        out["warning"] = ("no llama-bench calibration in this profile: bandwidth and peak "
                          "FLOP rate only, unverified (graphcost calibrate -o NAME measures one)")
    return out


def footer(note: dict, hw, threads: set[int]) -> str:
    """The lines under the table (graphcost's, not llama-bench's), from ``note``
    (:func:`describe`'s, with the tests' counts that have no coefficient,
    ``no_coefficient``, or one the calibration cases did not pin down,
    ``not_pinned_down``)."""
    missing, loose = note.get("no_coefficient"), note.get("not_pinned_down")
    lines = [f"\npredicted by graphcost for --hardware {hw.name} ({hw.kind} profile)"]
    if "error_band" in note:
        b = note["error_band"]
        lines.append(f"error band (held-out llama-bench cases of the calibration): median "
                     f"{100 * b['median']:.1f}%, worst {100 * b['worst']:.1f}% over "
                     f"{b['cases']} cases")
    if "warning" in note:
        lines.append(f"UNVERIFIED: {note['warning']}")
    if "cpu_features" in note:
        lines.append(f"weights placed (repacked or not) for CPU features "
                     f"{', '.join(note['cpu_features']) or 'none'} ({note['cpu_features_from']})")
    if "cpu_features_calibrated" in note:
        lines.append(f"note: calibrated with CPU features "
                     f"{', '.join(note['cpu_features_calibrated']) or 'none'}; other layouts' "
                     f"coefficients may be missing or not pinned down (below)")
    if "counts_calibrated" in note:
        lines.append(f"note: calibrated on counts {note['counts_calibrated']} (flash "
                     f"attention priced over every KV cell); these are counts {COUNTS} (the "
                     f"cells its kernels compute): run graphcost calibrate again")
    cal = note.get("threads_calibrated")
    if cal and any(t != cal for t in threads):
        lines.append(f"note: calibrated at {cal} threads; other thread counts scale the "
                     f"compute terms (not checked)")
    macs = [k for k in missing or () if k.startswith("mac:")]
    rest = [k for k in missing or () if not k.startswith("mac:")]
    if macs:
        lines.append(f"note: no coefficient of their own (the mean of their path's, else of "
                     f"every MAC coefficient, used): {', '.join(macs)}")
    if rest:
        lines.append(f"note: not calibrated in this profile, priced at 0 (the prediction is "
                     f"short by their time): {', '.join(rest)}")
    if loose:
        lines.append(f"note: coefficients the calibration cases did not pin down (the band "
                     f"may not hold): {', '.join(loose)}")
    return "\n".join(lines) + "\n"
