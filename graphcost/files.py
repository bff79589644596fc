"""Files graphcost reads and writes, checked before they are touched.

Every input (model, shard, baseline, hardware profile) must be a regular file of a sane
size before anything reads it: a FIFO would block the reader forever, ``/dev/zero`` would
feed it without end, a 100 MB baseline would take minutes and gigabytes to parse. Every
``-o`` write goes to a temporary file in the target's directory and is renamed over the
target (:func:`write_atomic`), so a full disk or a crash never leaves a truncated report
and never destroys the previous one; a target that is one of the inputs, or an existing
GGUF (``analyze -o model.gguf`` with the model argument forgotten), is refused.

YAML (baselines, hardware profiles) is read with a safe loader that also refuses aliases
(:func:`load_yaml`): an alias bomb (``a: &a [x, x]; b: &b [*a, *a]; ...``) expands to an
exponential number of nodes from a few hundred bytes.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

import yaml
from gguf import GGUF_MAGIC

from graphcost.errors import GraphcostError

#: GGUF files start with these four bytes (GGUF_MAGIC, little-endian)
_GGUF_MAGIC_BYTES = GGUF_MAGIC.to_bytes(4, "little")
#: largest baseline read: ``analyze --format yaml`` of Mistral Large 2407 (88 layers, 2871
#: nodes) is about 3 MB; 32 MiB leaves ten times that and parses in seconds
MAX_BASELINE_BYTES = 32 << 20
#: largest hardware profile read: ``hwprobe`` writes about 2 KB
MAX_PROFILE_BYTES = 1 << 20

_KIND = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a non-regular file is, for a message ("a FIFO")."""
    for test, name in _KIND:
        if test(mode):
            return name
    return "not a regular file"


def check_input(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> int:
    """The size of ``path`` if it is a regular file of at most ``max_bytes``; else one
    line naming the file and why. ``what`` says what the file is for ("baseline")."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise GraphcostError(f"{p}: cannot open {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GraphcostError(f"{p}: cannot open {what}: {file_kind(st.st_mode)}, not a regular file")
    if max_bytes is not None and st.st_size > max_bytes:
        raise GraphcostError(f"{p}: {what} has {st.st_size:,} bytes, more than the "
                             f"{max_bytes:,} a {what} can sensibly hold")
    return st.st_size


def read_text(path: str | os.PathLike, what: str, max_bytes: int) -> str:
    """The text of a checked input (UTF-8); one line on any failure."""
    p = Path(path)
    check_input(p, what, max_bytes)
    try:
        with open(p, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise GraphcostError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    if len(raw) > max_bytes:  # grew since the stat
        raise GraphcostError(f"{p}: {what} has more than the {max_bytes:,} bytes a {what} "
                             "can sensibly hold")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GraphcostError(f"{p}: {what} is not UTF-8 text (byte {e.start})") from None


#: the C loader when pyyaml was built with libyaml (a 3 MB baseline in 0.3 s, not 15 s)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | os.PathLike, what: str, max_bytes: int) -> Any:
    """Parse a checked input as YAML (JSON is YAML) with aliases refused; a syntax error
    is one line with its line and column."""
    p = Path(path)
    text = read_text(p, what, max_bytes)
    try:
        # aliases are found in the event stream before anything is built from it
        for ev in yaml.parse(text, Loader=_LOADER):
            if isinstance(ev, yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, f"alias *{ev.anchor}: aliases "
                                                  "are not allowed", ev.start_mark)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(e.problem or e.context or "invalid").split())
        raise GraphcostError(f"{p}: {what} is not valid YAML: {where}{problem}") from None
    except (yaml.YAMLError, RecursionError) as e:
        raise GraphcostError(f"{p}: {what} is not valid YAML: "
                             f"{' '.join(str(e).split())[:120]}") from None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_output(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse an ``-o`` target that is one of ``inputs``, an existing GGUF file, or an
    existing file that is not a regular one (a FIFO would block, a directory cannot be
    replaced). Call before any work, so a mistake costs nothing."""
    p = Path(path)
    for src in inputs:
        if src is not None and _same_file(p, Path(src)):
            raise GraphcostError(f"-o {p}: is an input of this command; refusing to overwrite it")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise GraphcostError(f"-o {p}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GraphcostError(f"-o {p}: is {file_kind(st.st_mode)}; give a file name")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    if head == _GGUF_MAGIC_BYTES:
        raise GraphcostError(f"-o {p}: is a GGUF file (a model?); refusing to overwrite it")
    return p


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``:
    readers see the old file or the whole new one, never a part."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    directory = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise GraphcostError(f"{p}: cannot write: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise GraphcostError(f"{p}: cannot write: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
