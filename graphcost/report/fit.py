"""``graphcost fit`` and ``memory --max-ctx`` as plain text: llama.cpp's fit trace, one row
per device, and (last line) the arguments llama-fit-params prints."""
from __future__ import annotations

from graphcost.memory.fit import FitResult, MaxContext
from graphcost.units import mib


def render_fit(r: FitResult, model_name: str) -> str:
    lines = [f"graphcost fit: {model_name} (llama.cpp's --fit, common/fit.cpp)"]
    lines += [f"  {x}" for x in r.log]
    lines.append("")
    hdr = f"  {'device':<10} {'free':>10} {'margin':>10} {'projected':>10} {'left':>10} {'layers':>7}"
    lines += [hdr, "  " + "-" * (len(hdr) - 2)]
    for i, d in enumerate(r.devices):
        used = None if r.projected is None else r.projected[i]
        layers = "" if r.layers is None else (
            f"{r.layers[i].n_layer}" + (f" ({r.layers[i].n_part} partial)" if r.layers[i].n_part else ""))
        lines.append(f"  {d:<10} {mib(r.free[i]):>10} {mib(r.margins[i]):>10} "
                     f"{'' if used is None else mib(used):>10} "
                     f"{'' if used is None else mib(r.free[i] - used):>10} {layers:>7}")
    lines.append("  (MiB; projected = model + context + compute, weights without mmap, as "
                 "llama.cpp measures them)")
    lines.append("")
    lines.append(r.args_line())
    return "\n".join(lines) + "\n"


def render_max_ctx(m: MaxContext) -> str:
    tried = ", ".join(f"{n}{'' if ok else ' (no)'}" for n, ok in m.tried)
    head = (f"largest context that fits: {m.n_ctx}" if m.n_ctx else
            "no context fits (not even 256 cells)")
    return f"{head} (searched up to {m.limit} cells; tried {tried})\n"
