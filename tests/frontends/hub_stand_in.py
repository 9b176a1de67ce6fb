"""A Hugging Face Hub stand-in on a loopback port, for the tests of ``--model org/name``.

It answers the requests huggingface_hub makes (read in its source, huggingface_hub 2.4:
``file_download.get_hf_file_metadata`` and ``hf_hub_download``, ``HfApi.parse_safetensors_file_metadata``,
``utils._http.hf_raise_for_status``):

- ``HEAD`` and ``GET /{org}/{name}/resolve/{revision}/{file}``: the file, with the headers the
  client requires (``X-Repo-Commit``, ``ETag``, ``Content-Length``) and ``Range: bytes=a-b``
  honoured (206 and ``Content-Range``);
- errors as the Hub words them: ``X-Error-Code: RepoNotFound`` (404, or 401 for a private
  repository without a token), ``GatedRepo`` (401 without a token, 403 with a token not on the
  list), ``RevisionNotFound`` and ``EntryNotFound`` (404).

Every request is recorded (method, path, range, whether an ``Authorization`` header came and
which token), so that tests can hold what kvcore fetched: headers only, never tensor data.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs


@attrs.define
class Repo:
    """A repository: its files at one commit, branches naming it, and who may read it."""

    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    branches: dict[str, str] = attrs.Factory(dict)
    gated: bool = False
    private: bool = False
    token: str | None = None  # the one token the gated or private repository accepts

    def resolve(self, revision: str) -> str | None:
        if revision == self.commit:
            return self.commit
        return {"main": self.commit, **self.branches}.get(revision)


@attrs.define
class Request:
    method: str
    path: str
    range: str | None
    token: str | None


def safetensors_file(tensors: Mapping[str, tuple[str, list[int]]], *, data: bool = True) -> bytes:
    """A safetensors file: ``{name: (dtype, shape)}``, zero-filled data (or none, a header only,
    which is all a range request of the header reads)."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "U8": 1, "I8": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + (bytes(offset) if data else b"")


_RESOLVE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")


class HubStandIn:
    """The server: ``repos`` by id, ``requests`` as they came; ``fail_with`` makes every answer
    that status (a Hub outage)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.fail_with: int | None = None
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                stand_in.answer(self, body=False)

            def do_GET(self) -> None:
                stand_in.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        auth = handler.headers.get("Authorization")
        token = auth.removeprefix("Bearer ").strip() if auth else None
        self.requests.append(Request(handler.command, handler.path, handler.headers.get("Range"), token))
        if self.fail_with is not None:
            return self.send(handler, self.fail_with, body=body)
        match = _RESOLVE.match(handler.path.split("?", 1)[0])
        if match is None:
            return self.send(handler, 404, body=body, error="RepoNotFound")
        org, name, revision, filename = match.groups()
        repo = self.repos.get(f"{org}/{name}")
        if repo is None:
            return self.send(handler, 401 if token is None else 404, body=body, error="RepoNotFound")
        if (repo.gated or repo.private) and token != repo.token:
            if repo.private:
                return self.send(handler, 401 if token is None else 404, body=body, error="RepoNotFound")
            return self.send(handler, 401 if token is None else 403, body=body, error="GatedRepo")
        commit = repo.resolve(revision)
        if commit is None:
            return self.send(handler, 404, body=body, error="RevisionNotFound")
        content = repo.files.get(filename)
        if content is None:
            return self.send(handler, 404, body=body, error="EntryNotFound", commit=commit)
        status, start, end = 200, 0, len(content)
        wanted = handler.headers.get("Range")
        if wanted:
            found = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
            assert found is not None, wanted
            start = int(found.group(1))
            end = min(len(content), int(found.group(2)) + 1) if found.group(2) else len(content)
            status = 206
        part = content[start:end]
        handler.send_response(status)
        handler.send_header("X-Repo-Commit", commit)
        handler.send_header("ETag", f'"{hashlib.sha256(content).hexdigest()}"')
        handler.send_header("Content-Length", str(len(part)))
        if status == 206:
            handler.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(content)}")
        handler.end_headers()
        if body:
            handler.wfile.write(part)

    def send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        *,
        body: bool,
        error: str | None = None,
        commit: str | None = None,
    ) -> None:
        text = json.dumps({"error": error or "error"}).encode()
        handler.send_response(status)
        if error:
            handler.send_header("X-Error-Code", error)
            handler.send_header("X-Error-Message", error)
        if commit:
            handler.send_header("X-Repo-Commit", commit)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(text)))
        handler.end_headers()
        if body:
            handler.wfile.write(text)

    @contextmanager
    def running(self) -> Iterator[HubStandIn]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(timeout=10)

    def fetched(self) -> list[tuple[str, str, str | None]]:
        """``(method, path, range)`` of every request."""
        return [(r.method, r.path, r.range) for r in self.requests]
