"""A model hub on loopback for the dev cluster: the part of the Hugging Face Hub's HTTP API
that `huggingface_hub` (pinned, 2.4.0) calls to download a repository, serving files from a
directory of this machine. The dev cluster has no network; with it, a weight cache's fill
(`inferfleet weights fill`, pointed here by `HF_ENDPOINT`) runs the same client code it runs
against the real Hub.

Served, for each repository `<org>/<name>` (a directory `<root>/<org>/<name>`), at one commit
(a digest of its files' names and contents):
- `GET /api/models/<repo>[/revision/<rev>]`: its id, commit (`sha`) and files (`siblings`);
- `GET /api/models/<repo>/tree/<rev>[/<path>]`: its files with size and blob id (one page);
- `HEAD` and `GET /<repo>/resolve/<rev>/<path>`: a file, with the headers the client reads
  (`X-Repo-Commit`, `ETag`, `Content-Length`); a `Range: bytes=N-` request continues a
  partial download (206), as the Hub's storage answers.
Not served: uploads, Xet storage (no `X-Xet-Hash`, so the client falls back to plain HTTP),
authentication (any token is accepted), other repository types.

`bytes_per_s` paces every download, so that a fill takes long enough to be watched; `fail_after`
cuts the connection of each file's first download after that many bytes, as a flaky network
does, so that the client's retries are exercised.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

CHUNK: Final = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d+)-$")
_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass
class ModelHub:
    """The hub's content and pacing; `serve` starts it."""

    root: Path
    bytes_per_s: float | None = None
    fail_after: int | None = None
    served: dict[str, int] = field(default_factory=dict)
    """Bytes sent per file path, all requests together (what a test checks resumption by)."""
    _cut: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def files(self, repo: str) -> list[Path]:
        base = self.root / repo
        return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def commit(self, repo: str) -> str:
        digest = hashlib.sha1(repo.encode())
        for path in self.files(repo):
            digest.update(str(path.relative_to(self.root / repo)).encode())
            digest.update(_file_digest(path, "sha1").encode())
        return digest.hexdigest()

    def count(self, path: str, sent: int) -> None:
        with self._lock:
            self.served[path] = self.served.get(path, 0) + sent

    def cut_now(self, path: str, offset: int, sent: int) -> bool:
        """Whether this file's first download is cut here (each file is cut once)."""
        if self.fail_after is None or offset > 0 or sent < self.fail_after:
            return False
        with self._lock:
            if path in self._cut:
                return False
            self._cut.add(path)
            return True


def _file_digest(path: Path, name: str) -> str:
    digest = hashlib.new(name)
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Handler(BaseHTTPRequestHandler):
    hub: ModelHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        api = _API.match(path)
        if api is not None:
            repo, kind = api.group(1), api.group(2)
            if not self.hub.files(repo):
                self._json({"error": f"Repository {repo} not found"}, HTTPStatus.NOT_FOUND)
            elif kind == "tree":
                self._json(self._tree(repo, (api.group(4) or "").strip("/")))
            else:
                self._json(self._info(repo))
            return
        resolve = _RESOLVE.match(path)
        if resolve is None:
            self._json({"error": "not served here"}, HTTPStatus.NOT_FOUND)
            return
        repo, relative = resolve.group(1), resolve.group(3)
        file = self.hub.root / repo / relative
        if not file.is_file() or ".." in Path(relative).parts:
            self._json({"error": f"{relative} not found"}, HTTPStatus.NOT_FOUND)
            return
        self._file(repo, relative, file, body=body)

    def _info(self, repo: str) -> dict[str, object]:
        names = [str(p.relative_to(self.hub.root / repo)) for p in self.hub.files(repo)]
        return {
            "id": repo,
            "modelId": repo,
            "sha": self.hub.commit(repo),
            "private": False,
            "siblings": [{"rfilename": name} for name in names],
        }

    def _tree(self, repo: str, under: str) -> list[dict[str, object]]:
        entries: list[dict[str, object]] = []
        for file in self.hub.files(repo):
            name = str(file.relative_to(self.hub.root / repo))
            if under and not name.startswith(f"{under}/"):
                continue
            entries.append(
                {"type": "file", "path": name, "size": file.stat().st_size,
                 "oid": _file_digest(file, "sha1")}
            )  # fmt: skip
        return entries

    def _json(self, payload: object, status: HTTPStatus = HTTPStatus.OK) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _file(self, repo: str, relative: str, file: Path, *, body: bool) -> None:
        size = file.stat().st_size
        wanted = _RANGE.match(self.headers.get("Range") or "")
        offset = min(int(wanted.group(1)), size) if wanted else 0
        self.send_response(HTTPStatus.PARTIAL_CONTENT if wanted else HTTPStatus.OK)
        self.send_header("X-Repo-Commit", self.hub.commit(repo))
        self.send_header("ETag", f'"{_file_digest(file, "sha256")}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(size - offset))
        if wanted:
            self.send_header("Content-Range", f"bytes {offset}-{size - 1}/{size}")
        self.end_headers()
        if not body:
            return
        sent = 0
        for chunk in _paced(file, offset, self.hub.bytes_per_s):
            self.wfile.write(chunk)
            sent += len(chunk)
            self.hub.count(relative, len(chunk))
            if self.hub.cut_now(relative, offset, sent):
                self.close_connection = True
                return


def _paced(file: Path, offset: int, bytes_per_s: float | None) -> Iterator[bytes]:
    started = time.monotonic()
    sent = 0
    with file.open("rb") as handle:
        handle.seek(offset)
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            if bytes_per_s:
                ahead = sent / bytes_per_s - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            sent += len(chunk)
            yield chunk


class RunningHub:
    """A started hub: its address, and `close` to stop it."""

    def __init__(self, hub: ModelHub, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("HubHandler", (_Handler,), {"hub": hub})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
