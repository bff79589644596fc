"""Remote headers: ``https://`` URLs and ``hf://ORG/REPO[@REV]/FILE`` read with HTTP range
requests from a real HTTP server started here on 127.0.0.1, laid out like the Hub
(``/ORG/REPO/resolve/REVISION/FILE``) and reached through ``HF_ENDPOINT``.

Each case checks that the remote header equals the local one (same metadata, tensor
infos and analysis), counts the requests and bytes the server saw, and that every
failure (404, no range support, timeout, gated repo, not a GGUF) is one line.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gguf
import numpy as np
import pytest

pytest.importorskip("fsspec", reason="pip install 'graphcost[remote]' for remote headers")
pytest.importorskip("aiohttp", reason="pip install 'graphcost[remote]' for remote headers")
pytest.importorskip("huggingface_hub", reason="pip install 'graphcost[remote]' for remote headers")

from fixtures import write_llama  # noqa: E402

from graphcost.graph.build import load_model  # noqa: E402
from graphcost.errors import GraphcostError  # noqa: E402
from graphcost.format.gguf_reader import LazyArray, read_model  # noqa: E402
from graphcost.format.remote import FIRST_BLOCK, Transfer, read_remote_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_graphcost_test_token"  # the token the test server's gated repository accepts


class HubServer(ThreadingHTTPServer):
    """Serves ``files`` (URL path -> local file) with single-range GETs, counting what it
    sends. ``mode``: "range" (normal), "norange" (ignores Range, sends 200 and the whole
    body), "slow" (answers after ``delay`` seconds); paths in ``gated`` answer 401."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, Path] = {}
        self.gated: set[str] = set()
        self.mode = "range"
        self.delay = 0.0
        self.redirect = False  # resolve URLs answer 302 to /cdn/..., as the Hub's do
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range
        self.sent = 0
        self.lock = threading.Lock()

    def handle_error(self, request, client_address):
        pass  # a client that hangs up early (it had what it needed, or timed out) is fine

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def file_requests(self) -> list[tuple[str, str, str | None]]:
        """Requests for files (huggingface_hub itself may ask ``/api/agent-harnesses``
        once a day to build its user agent: not part of reading the header)."""
        return [r for r in self.requests if not r[1].startswith("/api/")]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.sent = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _start(self) -> Path | None:
        srv: HubServer = self.server
        with srv.lock:
            srv.requests.append((self.command, self.path, self.headers.get("Range")))
        if srv.mode == "slow" and not self.path.startswith("/api/"):
            time.sleep(srv.delay)
        path = self.path.split("?", 1)[0]
        if srv.redirect and "/resolve/" in path and path in srv.files:
            self.send_response(302)
            self.send_header("Location", "/cdn" + path + "?signed=1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if path.startswith("/cdn/"):
            path = path[4:]
        if path in srv.gated and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._plain(401, b"Access to this repository is restricted.")
            return None
        f = srv.files.get(path)
        if f is None:
            self._plain(404, b"Entry not found")
            return None
        return f

    def _plain(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        f = self._start()
        if f is None:
            return
        self.send_response(200)
        self.send_header("Content-Length", str(f.stat().st_size))
        if self.server.mode != "norange":
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        f = self._start()
        if f is None:
            return
        size = f.stat().st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if self.server.mode == "norange" or m is None:
            lo, hi = 0, size
            self.send_response(200)
        else:
            lo = int(m.group(1))
            hi = min(size, int(m.group(2)) + 1 if m.group(2) else size)
            if lo >= size:
                self._plain(416, b"")
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.send_header("Content-Length", str(hi - lo))
        self.end_headers()
        with open(f, "rb") as fh:
            fh.seek(lo)
            left = hi - lo
            try:
                while left > 0:
                    chunk = fh.read(min(left, 1 << 16))
                    self.wfile.write(chunk)
                    with self.server.lock:
                        self.server.sent += len(chunk)
                    left -= len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client had what it needed


@pytest.fixture(scope="module")
def hub():
    srv = HubServer()
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def endpoint(hub, monkeypatch):
    hub.reset()
    hub.mode, hub.delay, hub.redirect = "range", 0.0, False
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return hub


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return Path(write_llama(tmp_path_factory.mktemp("remote") / "tiny.gguf", n_layer=2,
                            n_vocab=333))


def _same_header(local, remote) -> None:
    assert remote.metadata.keys() == local.metadata.keys()
    for k, v in local.metadata.items():
        if isinstance(v, LazyArray):  # same place in the file, same items
            r = remote.metadata[k]
            assert (r.offset, r.count, r.nbytes) == (v.offset, v.count, v.nbytes)
            if v.nbytes < 1 << 20:
                assert r.load() == v.load()  # through the remote source
        else:
            assert remote.metadata[k] == v, k
    assert list(remote.tensors.values()) == list(local.tensors.values())
    assert (remote.data_offset, remote.file_size, remote.alignment, remote.has_data) == \
           (local.data_offset, local.file_size, local.alignment, local.has_data)


def test_hf_path_with_revision_reads_the_same_header(endpoint, tiny):
    endpoint.files["/org/tiny/resolve/v1.0/tiny.gguf"] = tiny
    t = Transfer()
    h = read_remote_model("hf://org/tiny@v1.0/tiny.gguf", progress=False, transfer=t)
    _same_header(read_model(tiny), h)
    assert str(h.path) == "hf://org/tiny@v1.0/tiny.gguf" and h.path.stem == "tiny"
    # one size query (HEAD) and one 256 KiB range: the tiny header is ~10 KB
    assert [r[0] for r in endpoint.file_requests] == ["HEAD", "GET"]
    assert endpoint.file_requests[1][2] == f"bytes=0-{FIRST_BLOCK - 1}"
    assert (t.requests, t.fetched) == (2, FIRST_BLOCK) == (2, endpoint.sent)


def test_gated_repo_reads_with_hf_token(endpoint, tiny, monkeypatch):
    endpoint.files["/org/gated/resolve/main/tiny.gguf"] = tiny
    endpoint.gated.add("/org/gated/resolve/main/tiny.gguf")
    try:
        with pytest.raises(GraphcostError, match="HTTP 401: the repository is gated"):
            read_remote_model("hf://org/gated/tiny.gguf", progress=False)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        h = read_remote_model("hf://org/gated/tiny.gguf", progress=False)
        _same_header(read_model(tiny), h)
        # a plain https:// URL never carries the Hub token
        with pytest.raises(GraphcostError, match="HTTP 401: the server refused access"):
            read_remote_model(endpoint.url + "/org/gated/resolve/main/tiny.gguf", progress=False)
    finally:
        endpoint.gated.clear()


def test_https_url_gives_the_same_analysis(endpoint, tiny):
    from graphcost.cost.analysis import analyze_graph
    from graphcost.graph.build import build_graph
    from graphcost.document import document
    from graphcost.graph.settings import RunSettings
    endpoint.files["/files/tiny.gguf"] = tiny
    s = RunSettings(ctx_size=256, tokens=3, past=5)
    local = document(analyze_graph(build_graph(load_model(tiny), s), memory=True))
    remote = document(analyze_graph(build_graph(load_model(endpoint.url + "/files/tiny.gguf"), s), memory=True))
    assert local.pop("model")["path"] == str(tiny)
    assert remote.pop("model")["path"] == endpoint.url + "/files/tiny.gguf"
    assert remote == local


def test_real_262k_vocab_header_in_few_requests(endpoint, gemma3_270m):
    """gemma-3-270m: 262,144 tokens. The header is ~4 MB of which the token strings are
    most; scores and token types (1 MiB each) are skipped unless a block covers them."""
    endpoint.files["/google/gemma-3-270m/resolve/main/gemma3.gguf"] = Path(gemma3_270m)
    endpoint.redirect = True  # like the Hub: resolve -> 302 -> CDN
    t = Transfer()
    h = read_remote_model("hf://google/gemma-3-270m/gemma3.gguf", progress=False, transfer=t)
    local = read_model(gemma3_270m)
    _same_header(local, h)
    gets = [r for r in endpoint.file_requests if r[0] == "GET"]
    print(f"\ngemma3 270M header ({local.data_offset:,} bytes): {len(endpoint.file_requests)} requests, "
          f"{endpoint.sent:,} bytes sent of a {local.file_size:,}-byte file")
    # the size query is redirected once; the ranges go straight to the CDN URL
    assert [(m, p.split("?")[0]) for m, p, _ in endpoint.file_requests[:2]] == [
        ("HEAD", "/google/gemma-3-270m/resolve/main/gemma3.gguf"),
        ("HEAD", "/cdn/google/gemma-3-270m/resolve/main/gemma3.gguf")]
    assert all(p.startswith("/cdn/") and p.endswith("?signed=1") for _, p, _ in gets)
    assert t.requests + 1 == len(endpoint.file_requests) and t.fetched == endpoint.sent
    # blocks double from 256 KiB: 256K+512K+1M+2M+4M = 7.75 MiB covers any header < 7.75 MiB
    assert len(gets) <= 5 and endpoint.sent <= 2 * local.data_offset
    assert endpoint.sent < local.file_size / 20


def _write_split(tmp_path: Path) -> list[Path]:
    """A split model: llama.block_count and three tensors, two in shard 1, one in shard 2."""
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama", split_max_tensors=2)
    w.add_uint32("llama.block_count", 1)
    for name, arr in {"t0": np.zeros(4, np.float32), "t1": np.ones((2, 8), np.float16),
                      "t2": np.full(3, 2.0, np.float32)}.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]


def test_split_model_fetches_every_shard(endpoint, tmp_path):
    shards = _write_split(tmp_path)
    for s in shards:
        endpoint.files[f"/org/split/resolve/main/{s.name}"] = s
    t = Transfer()
    h = read_remote_model(f"hf://org/split/{shards[0].name}", progress=False, transfer=t)
    local = read_model(shards[0])
    assert [(x.name, x.shard, x.offset) for x in h.tensors.values()] == \
           [(x.name, x.shard, x.offset) for x in local.tensors.values()] == \
           [("t0", 0, 0), ("t1", 0, 32), ("t2", 1, 0)]
    assert [str(p) for p in h.shards] == [f"hf://org/split/{s.name}" for s in shards]
    assert t.files == 2 and t.requests == 4  # HEAD + one GET per shard
    # the same through a plain URL (with a query string kept on every shard's URL)
    url = f"{endpoint.url}/org/split/resolve/main/{shards[0].name}?download=1"
    h2 = read_remote_model(url, progress=False)
    assert [str(p) for p in h2.shards] == [f"{endpoint.url}/org/split/resolve/main/{s.name}?download=1"
                                           for s in shards]
    assert list(h2.tensors.values()) == list(h.tensors.values())
    del endpoint.files[f"/org/split/resolve/main/{shards[1].name}"]
    with pytest.raises(GraphcostError, match="shard 2 of 2 is missing"):
        read_remote_model(f"hf://org/split/{shards[0].name}", progress=False)


def _big_header(path: Path) -> Path:
    """A GGUF whose header (60,000 strings, ~0.8 MB) is longer than the first block."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(60000)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert path.stat().st_size > FIRST_BLOCK
    return path


@pytest.mark.parametrize("case", ["404", "no-range", "timeout", "gated", "not-gguf", "refused"])
def test_failures_are_one_line(endpoint, tmp_path, case):
    spec, expect = "hf://org/repo/model.gguf", None
    served = "/org/repo/resolve/main/model.gguf"
    if case == "404":
        expect = r"hf://org/repo/model.gguf: not found \(HTTP 404\)$"
    elif case == "no-range":
        endpoint.mode = "norange"
        endpoint.files[served] = _big_header(tmp_path / "big.gguf")
        expect = "does not support HTTP range requests"
    elif case == "timeout":
        endpoint.mode, endpoint.delay = "slow", 3.0
        expect = r"no answer within 1 s"
    elif case == "gated":
        endpoint.gated.add(served)
        expect = "HTTP 401: the repository is gated or private; .* HF_TOKEN"
    elif case == "refused":  # a port nothing listens on (this server's, after it closed)
        expect = r"cannot connect: Cannot connect to host 127\.0\.0\.1"
    else:
        (tmp_path / "x.gguf").write_bytes(b"<html>not a model</html>" * 100)
        endpoint.files[served] = tmp_path / "x.gguf"
        expect = r"offset 0: not a GGUF file"
    url = endpoint.url if case != "refused" else _closed_port_url()
    env = dict(os.environ, HF_ENDPOINT=url, GRAPHCOST_HTTP_TIMEOUT="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", spec], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    endpoint.gated.discard(served)
    endpoint.files.pop(served, None)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("graphcost: hf://org/repo/model.gguf") and re.search(expect, lines[0]), lines
    assert time.monotonic() - t0 < 60
    if case == "no-range":  # the first block came from the 200 answer, the second could not
        assert [m for m, _, _ in endpoint.file_requests] == ["HEAD", "GET", "GET"]


def _closed_port_url() -> str:
    import socket
    with socket.socket() as s:  # bind, learn the port, close: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_cli_analyze_url_json_equals_local(endpoint, tiny, tmp_path):
    endpoint.files["/org/tiny/resolve/main/tiny.gguf"] = tiny
    env = dict(os.environ, HF_ENDPOINT=endpoint.url,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    outs = []
    for spec in ("hf://org/tiny/tiny.gguf", str(tiny)):
        r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", spec, "-f", "json",
                            "-c", "256"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and r.stderr == "", r.stderr  # no bar: stderr is not a tty
        d = json.loads(r.stdout)
        d["model"].pop("path")
        outs.append(d)
    assert outs[0] == outs[1]


def test_progress_line_and_check_against_a_local_baseline(endpoint, tiny, tmp_path, capsys):
    """The bar (forced on here: stderr is not a terminal under pytest) ends with one line
    saying what was read; ``check`` takes a URL like ``analyze`` does."""
    endpoint.files["/org/tiny/resolve/main/tiny.gguf"] = tiny
    read_remote_model("hf://org/tiny/tiny.gguf", progress=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"read {FIRST_BLOCK / 1e6:.2f} MB in 2 requests for the header of hf://org/tiny/tiny.gguf"
    env = dict(os.environ, HF_ENDPOINT=endpoint.url,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    base = tmp_path / "base.yaml"

    def run(*args):
        return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    assert run("analyze", tiny, "-f", "yaml", "-o", base, "-c", 256).returncode == 0
    r = run("check", "hf://org/tiny/tiny.gguf", "--baseline", base)
    assert r.returncode == 0 and r.stdout.startswith("ok: hf://org/tiny/tiny.gguf matches"), r.stderr


@pytest.mark.parametrize("missing,spec", [("fsspec", "https://127.0.0.1:9/x.gguf"),
                                          ("huggingface_hub", "hf://org/repo/x.gguf")])
def test_without_the_remote_extra_one_line_exit_2(tmp_path, missing, spec):
    """A package that fails to import stands in for a missing one."""
    fake = tmp_path / "shadow" / missing
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise ImportError('no {missing} here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fake.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", spec], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"graphcost: {spec}: reading a remote header needs {missing} "
        "(pip install 'graphcost[remote]')"]
