"""Human-readable numbers: binary byte units and SI FLOP units, fixed precision; sizes as
users write them (``24GiB``); and strings from files made safe to print. A shared utility:
any stage may import it."""
from __future__ import annotations

import re

from graphcost.errors import GraphcostError

#: bytes in a MiB, the unit llama.cpp logs its buffers in
MiB = 1024 * 1024

_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "TIB": 1024 ** 4,
          "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4}


def parse_bytes(text: str, what: str) -> int:
    """'24GiB', '24105MiB', '8e9' -> bytes; anything else is one line starting ``what``."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise GraphcostError(f"{what} {text!r}: use a size like 24GiB, 24105MiB or 8GB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def mib(n: int | float, digits: int = 2) -> str:
    """Bytes as llama.cpp logs them: MiB with ``digits`` decimals (``%8.2f`` of
    ``size/1024.0/1024.0``; the compute-buffer check on freeing prints ``%8.4f``), without
    the padding: 1572864 -> '1.50'."""
    return f"{n / MiB:.{digits}f}"


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


#: characters shown as escapes: C0/C1 controls and DEL (ESC opens terminal sequences that
#: clear screens or set window titles; control characters are not allowed in XML) and the
#: bidirectional overrides (which reorder what a reader sees)
_BIDI = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _escape_char(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def literal(s: object, keep_newlines: bool = False) -> str:
    """``str(s)`` with every control character (and bidi override) written as an escape
    (``\\x1b``), so a string from a file reaches a terminal, a text report or an SVG
    exactly as a reader should see it; ``keep_newlines`` keeps ``\\n`` (whole reports)."""
    t = str(s)
    if t.isprintable() and not (_BIDI & set(t)):
        return t
    return "".join(c if (c.isprintable() and c not in _BIDI) or (keep_newlines and c == "\n")
                   else _escape_char(c) for c in t)
