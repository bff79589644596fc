"""Where a GGUF header's bytes come from: a local file or a remote one.

A byte source answers ``read(offset, n) -> bytes`` and knows its ``size`` (bytes) and a
``name`` for messages. The header reader (:mod:`graphcost.format.gguf_reader`) walks a local
file through an mmap and needs no source; a remote file (:mod:`graphcost.format.remote`) also
exposes ``buf``, a buffer as long as the part of the file graphcost will read, and
``ensure(offset, n)``, which fetches the blocks of ``[offset, offset + n)`` into ``buf``
before the reader looks at them. Bytes never ensured stay zero and are never read.
"""
from __future__ import annotations

import os
from typing import Protocol

from graphcost.errors import GGUFError


class ByteSource(Protocol):
    name: str
    size: int

    def read(self, offset: int, n: int) -> bytes: ...


class HeaderSource(ByteSource, Protocol):
    """A source the header reader parses in place: ``buf[:limit]`` holds every byte it
    has ensured; ``limit <= size`` is how far into the file it may read."""

    buf: object
    limit: int

    def ensure(self, offset: int, n: int) -> None: ...


class LocalFile:
    """A local file read with ``pread`` (opened per call: a handle kept open would
    outlive the header it belongs to)."""

    def __init__(self, path: str | os.PathLike):
        self.name = str(path)
        try:
            self.size = os.stat(path).st_size
        except OSError as e:
            raise GGUFError(path, None, f"cannot open: {e.strerror or e}") from None

    def read(self, offset: int, n: int) -> bytes:
        with open(self.name, "rb") as f:
            data = os.pread(f.fileno(), n, offset)
        if len(data) != n:
            raise GGUFError(self.name, offset, f"truncated: {n} bytes wanted, {len(data)} read")
        return data
