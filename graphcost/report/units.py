"""Human-readable numbers: binary byte units and SI FLOP units, fixed precision."""
from __future__ import annotations


def human_bytes(n: int | float) -> str:
    """1536 -> '1.50 KiB' (binary units; exact bytes below 1 KiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_count(n: int | float, unit: str = "") -> str:
    """1.5e9 -> '1.50 G' + unit (SI prefixes)."""
    n = float(n)
    for prefix in ("", "k", "M", "G", "T", "P"):
        if abs(n) < 1000 or prefix == "P":
            return f"{int(n)} {unit}".rstrip() if prefix == "" else f"{n:.2f} {prefix}{unit}"
        n /= 1000
    raise AssertionError("unreachable")
