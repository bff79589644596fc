"""Read a GGUF header from a URL or the Hugging Face Hub with HTTP range requests.

``https://host/path/model.gguf`` and ``hf://ORG/REPO[@REVISION]/FILE.gguf`` are read
without downloading the file: the header reader (:func:`graphcost.format.gguf_reader.read_source`)
asks for the bytes it walks and :class:`RemoteFile` fetches them in blocks that double
in size (256 KiB, 512 KiB, ... up to 16 MiB), so a header of a few MB -- a 262k-token
vocabulary -- takes a handful of requests. Scalar arrays the reader skips (token scores,
token types) are fetched only when a block happens to cover them.

HTTP goes through fsspec's HTTP file system (aiohttp); ``hf://`` paths become the Hub's
``resolve`` URLs through ``huggingface_hub.hf_hub_url`` and carry the headers of
``huggingface_hub.utils.build_hf_headers``, so ``HF_ENDPOINT`` and ``HF_TOKEN`` (or a
saved ``huggingface-cli login``) work as they do for every Hub tool. A split model's
first shard (``x-00001-of-00003.gguf``) brings the other shards, fetched the same way.
Both libraries are the optional extra ``graphcost[remote]``.

Failures are one line naming the URL: not found (404), authentication needed or refused
(401/403: a gated or private repository), a server that ignores range requests, a
timeout (``GRAPHCOST_HTTP_TIMEOUT`` seconds, default 30), a header larger than
:data:`HEADER_LIMIT`, or a file that is not GGUF (the reader's own message).
"""
from __future__ import annotations

import asyncio
import bisect
import mmap
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable

from graphcost.errors import GGUFError, GraphcostError
from graphcost.format.gguf_reader import GGUFHeader, _SHARD_RE, merge_shards, read_source

#: the part of a remote file graphcost will read: a header never comes near it
#: (the largest vocabularies make headers of ~10 MiB)
HEADER_LIMIT = 256 << 20
FIRST_BLOCK = 256 << 10
MAX_BLOCK = 16 << 20
#: a bound on range requests for one file (blocks double, so a 256 MiB header needs 20)
MAX_REQUESTS = 64
DEFAULT_TIMEOUT = 30.0
_SCHEMES = ("http://", "https://", "hf://")
_HF_RE = re.compile(r"^hf://(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/(?P<file>.+)$")


def is_remote(spec: object) -> bool:
    """True for ``http://``, ``https://`` and ``hf://`` model arguments."""
    return isinstance(spec, str) and spec.lower().startswith(_SCHEMES)


class RemoteLocation(str):
    """A URL standing where a header's ``Path`` would: ``str()`` is what the user typed,
    ``name`` and ``stem`` are those of its last path segment."""

    @property
    def name(self) -> str:
        return self.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    @property
    def stem(self) -> str:
        n = self.name
        return n[:-5] if n.lower().endswith(".gguf") else n


@dataclass(frozen=True)
class Target:
    """Where one file is: the name shown in messages, the URL fetched, the headers sent."""

    name: RemoteLocation
    url: str
    headers: dict
    hub: bool  # on the Hugging Face Hub (401/403 mean a gated or private repo)

    def sibling(self, filename: str) -> "Target":
        """The same place with another file name (a split model's other shards); a query
        string stays on."""
        def swap(u: str) -> str:
            base, sep, query = u.partition("?")
            return base[: base.rfind("/") + 1] + filename + sep + query
        return Target(RemoteLocation(swap(self.name)), swap(self.url), self.headers, self.hub)


def resolve(spec: str) -> Target:
    """``hf://ORG/REPO[@REV]/FILE`` -> the Hub's resolve URL and auth headers; an
    ``http(s)://`` URL as is, with no credentials."""
    if not spec.lower().startswith("hf://"):
        return Target(RemoteLocation(spec), spec, {}, hub=False)
    m = _HF_RE.match(spec)
    if not m:
        raise GraphcostError(f"{spec}: use hf://ORG/REPO/FILE.gguf or hf://ORG/REPO@REVISION/FILE.gguf")
    hf = _import("huggingface_hub", spec)
    from huggingface_hub.utils import build_hf_headers
    url = hf.hf_hub_url(m.group("repo"), m.group("file"), revision=m.group("rev"),
                        endpoint=os.environ.get("HF_ENDPOINT") or None)
    return Target(RemoteLocation(spec), url, build_hf_headers(), hub=True)


def _import(module: str, spec: str):
    try:
        return __import__(module)
    except ImportError:
        raise GraphcostError(f"{spec}: reading a remote header needs {module} "
                             f"(pip install 'graphcost[remote]')") from None


class RemoteFile:
    """A remote file read through fsspec in doubling blocks, kept in an anonymous mmap
    of ``limit`` bytes (pages the reader never ensures are never touched).

    ``requests`` counts the requests graphcost makes (the size query and every range
    GET; a redirect the client follows, or fsspec's GET after a HEAD without a size, is
    one more on the wire); ``fetched`` counts the body bytes received.
    """

    def __init__(self, target: Target, *, timeout: float | None = None,
                 on_progress: Callable[["RemoteFile"], None] | None = None):
        self.target = target
        self.name = target.name
        self.timeout = timeout if timeout is not None else _env_timeout()
        self.on_progress = on_progress
        self.requests = 0
        self.fetched = 0
        self._next_block = FIRST_BLOCK
        self._spans: list[tuple[int, int]] = []  # fetched [start, end), sorted, disjoint
        fsspec = _import("fsspec", target.name)
        aiohttp = _import("aiohttp", target.name)
        self._fs = fsspec.filesystem(
            "http", skip_instance_cache=True, headers=dict(target.headers),
            client_kwargs={"timeout": aiohttp.ClientTimeout(total=self.timeout)})
        self.requests += 1  # fsspec asks for the size first (HEAD, or GET if HEAD has none)
        info = self._call(lambda: self._fs.info(target.url))
        if info.get("size") is None:
            raise GraphcostError(f"{self.name}: the server does not say the file's size "
                                 "(no Content-Length), so it cannot be read in ranges")
        self.size = int(info["size"])
        self.limit = min(self.size, HEADER_LIMIT)
        self.buf = mmap.mmap(-1, max(self.limit, 1))
        # the Hub redirects resolve URLs to a CDN: range requests go to where the size
        # query was sent in the end, without the token if that is another host
        self.url, headers = target.url, dict(target.headers)
        final = info.get("url")
        if isinstance(final, str) and final != target.url:
            self.url = final
            if _host(final) != _host(target.url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        self._file = self._call(lambda: self._fs.open(self.url, "rb", block_size=MAX_BLOCK,
                                                      cache_type="none", size=self.size,
                                                      headers=headers))

    # ---- byte source ------------------------------------------------------------------
    def read(self, offset: int, n: int) -> bytes:
        self.ensure(offset, n)
        return bytes(self.buf[offset: offset + n])

    def ensure(self, offset: int, n: int) -> None:
        """Fetch whatever of ``[offset, offset + n)`` is not here yet."""
        end = offset + n
        if end > self.limit:
            raise GGUFError(self.name, offset, f"the header goes past the first {self.limit} "
                            "bytes, more than graphcost reads from a remote file")
        for lo, hi in self._missing(offset, end):
            while lo < hi:  # a fetch covers at least its block, so this ends
                lo = self._fetch(lo, hi)

    def _missing(self, lo: int, hi: int) -> list[tuple[int, int]]:
        out = []
        i = bisect.bisect_right(self._spans, (lo, float("inf"))) - 1
        i = max(i, 0)
        pos = lo
        for s, e in self._spans[i:]:
            if s >= hi:
                break
            if e <= pos:
                continue
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            if pos >= hi:
                break
        if pos < hi:
            out.append((pos, hi))
        return out

    def _fetch(self, lo: int, hi: int) -> int:
        """One range GET from ``lo`` of at least the current block size; returns its end."""
        if self.requests >= MAX_REQUESTS:
            raise GGUFError(self.name, lo, f"the header needs more than {MAX_REQUESTS} requests")
        end = min(self.limit, max(hi, lo + self._next_block))
        nxt = bisect.bisect_left(self._spans, (lo, 0))
        if nxt < len(self._spans):  # do not fetch again what a later span holds
            end = min(end, max(hi, self._spans[nxt][0]))
        self._next_block = min(MAX_BLOCK, self._next_block * 2)
        self.requests += 1

        def get() -> bytes:
            self._file.seek(lo)
            return self._file.read(end - lo)
        data = self._call(get)
        if len(data) != end - lo:
            raise GGUFError(self.name, lo, f"the server sent {len(data)} bytes for a range of "
                            f"{end - lo}")
        self.buf[lo:end] = data
        self.fetched += len(data)
        self._add_span(lo, end)
        if self.on_progress is not None:
            self.on_progress(self)
        return end

    def _add_span(self, lo: int, hi: int) -> None:
        spans = self._spans + [(lo, hi)]
        spans.sort()
        merged: list[tuple[int, int]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e))
            else:
                merged.append((s, e))
        self._spans = merged

    # ---- errors -----------------------------------------------------------------------
    def _call(self, fn):
        """Run one fsspec call; every way it can fail becomes one line naming the URL."""
        try:
            return fn()
        except GraphcostError:
            raise
        except Exception as e:  # fsspec/aiohttp raise many types; each is mapped below
            raise GraphcostError(f"{self.name}: {_explain(e, self.target, self.timeout)}") from None

    def close(self) -> None:
        try:
            self._file.close()
        except Exception:
            pass


def _host(url: str) -> str:
    from urllib.parse import urlsplit
    return urlsplit(url).netloc.lower()


def _status(e: BaseException) -> int | None:
    """The HTTP status behind an fsspec error (fsspec wraps some in FileNotFoundError)."""
    seen = 0
    while e is not None and seen < 8:  # bounded walk down the cause chain
        status = getattr(e, "status", None) or getattr(e, "code", None)
        if isinstance(status, int):
            return status
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def _explain(e: BaseException, target: Target, timeout: float) -> str:
    chain, c = [], e
    while c is not None and len(chain) < 8:
        chain.append(c)
        c = c.__cause__ or c.__context__
    if any(isinstance(c, (asyncio.TimeoutError, TimeoutError)) for c in chain):
        return f"no answer within {timeout:g} s (GRAPHCOST_HTTP_TIMEOUT)"
    try:
        from aiohttp import ClientConnectionError
    except ImportError:  # pragma: no cover (RemoteFile needs aiohttp to get here)
        ClientConnectionError = OSError
    for c in chain:  # no route, DNS, refused: fsspec reports these as "not found" too
        if isinstance(c, ClientConnectionError) and _status(c) is None:
            return f"cannot connect: {str(c).splitlines()[0] if str(c) else type(c).__name__}"
    if any("range requests" in str(c) or "Cannot seek" in str(c) for c in chain):
        return "the server does not support HTTP range requests (needed to read only the header)"
    status = _status(e)
    if status in (401, 403):
        if target.hub:
            return (f"HTTP {status}: the repository is gated or private; accept its terms on "
                    "the Hub and set HF_TOKEN (or log in with huggingface-cli login)")
        return f"HTTP {status}: the server refused access"
    if status == 404 or (status is None and isinstance(e, FileNotFoundError)):
        return "not found (HTTP 404)" if status == 404 else "not found"
    if status is not None:
        return f"HTTP {status}"
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"cannot fetch: {type(e).__name__}{': ' + msg if msg else ''}"


def _env_timeout() -> float:
    raw = os.environ.get("GRAPHCOST_HTTP_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not t > 0:
        raise GraphcostError(f"GRAPHCOST_HTTP_TIMEOUT={raw!r}: give seconds, > 0")
    return t


# ---- model ------------------------------------------------------------------------------

@dataclass
class Transfer:
    """What reading a remote model cost: HTTP requests and body bytes, over all shards."""

    files: int = 0
    requests: int = 0
    fetched: int = 0


def read_remote_model(spec: str, *, timeout: float | None = None, progress: bool | None = None,
                      transfer: Transfer | None = None) -> GGUFHeader:
    """The header of a remote model (every shard of a split one), like
    :func:`graphcost.format.gguf_reader.read_model` for a local file. ``progress``: a bar on
    stderr (default: only when stderr is a terminal)."""
    first = resolve(spec)
    transfer = transfer if transfer is not None else Transfer()
    with _Bar(first.name, progress) as bar:
        h = _read_one(first, timeout, bar, transfer)
        m = _SHARD_RE.match(first.name.name)
        if not m:
            return h
        count = int(m.group("count"))
        if count < 1:
            raise GGUFError(first.name, None, "split count in the file name is 0")
        given = int(m.group("no"))
        headers = []
        for i in range(1, count + 1):  # bounded by the count in the name; stops at a gap
            if i == given:
                headers.append(h)
                continue
            t = first.sibling(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf")
            try:
                headers.append(_read_one(t, timeout, bar, transfer))
            except GraphcostError as e:
                if str(e).endswith("not found (HTTP 404)"):
                    raise GGUFError(t.name, None, f"shard {i} of {count} is missing") from None
                raise
        return merge_shards(headers)


def _read_one(t: Target, timeout, bar: "_Bar", transfer: Transfer) -> GGUFHeader:
    rf = RemoteFile(t, timeout=timeout, on_progress=bar.update)
    try:
        return read_source(rf)
    finally:
        transfer.files += 1
        transfer.requests += rf.requests
        transfer.fetched += rf.fetched
        bar.done(rf)
        rf.close()


class _Bar:
    """A rich progress line on stderr while a header is read (off when not a terminal)."""

    def __init__(self, name: str, enabled: bool | None):
        from rich.console import Console
        console = Console(stderr=True)
        self.enabled = console.is_terminal if enabled is None else enabled
        self.name = name
        self.base = 0
        self.progress = None
        if self.enabled:
            from rich.progress import Progress, SpinnerColumn, TextColumn
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TextColumn("{task.fields[got]}"), console=console,
                                     transient=True)
            self.task = self.progress.add_task(f"header of {name}", total=None, got="")
        self.requests = 0

    def __enter__(self):
        if self.progress is not None:
            self.progress.start()
        return self

    def update(self, rf: RemoteFile) -> None:
        if self.progress is not None:
            got = f"{(self.base + rf.fetched) / 1e6:.2f} MB, {self.requests + rf.requests} requests"
            self.progress.update(self.task, got=got, description=f"header of {rf.name}")

    def done(self, rf: RemoteFile) -> None:
        self.base += rf.fetched
        self.requests += rf.requests

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
            if exc[0] is None:
                sys.stderr.write(f"read {self.base / 1e6:.2f} MB in {self.requests} requests "
                                 f"for the header of {self.name}\n")
        return False
