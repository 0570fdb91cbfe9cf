"""A Hugging Face Hub on loopback, for ``hf://`` reads: the part of the Hub's HTTP API that
huggingface_hub's ``HfFileSystem`` reads a dataset repo with, served from memory.

No server of the Hub's API can be installed (moto serves S3's, gcp-storage-emulator GCS's), so
this one is written from the client's calls, as huggingface_hub 2.4 makes them:

- ``GET /api/datasets/{owner}/{name}[/revision/{rev}]``: the repo at a revision (``repo_info``);
- ``GET /api/datasets/{owner}/{name}/tree/{rev}/{path}``: a folder's entries (``list_repo_tree``,
  ``?recursive=true`` for everything below it);
- ``POST /api/datasets/{owner}/{name}/paths-info/{rev}``: some paths' entries (a form of ``paths``);
- ``GET /datasets/{owner}/{name}/resolve/{rev}/{path}``: a file's bytes, a ``Range`` of them;
- ``POST /api/datasets/{owner}/{name}/preupload/{rev}``: how each file of a commit is sent (here
  always ``regular``: inline in the commit; the Hub sends Parquet through LFS or Xet, which is
  huggingface_hub's own path, not tested here);
- ``POST /api/datasets/{owner}/{name}/commit/{rev}``: a commit (NDJSON: a header, added and
  deleted files), applied whole; a ``parentCommit`` that is not the branch's head is a 412.

A missing repo, revision or path is a 404 with the Hub's ``X-Error-Code``, which the client turns
into its exceptions; :attr:`HubServer.refusal` answers every request with a status and code
instead (a gated repo's 403, a 401 without a token), :attr:`HubServer.download_refusal` every
request for a file's bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Files = dict[str, bytes]  # path in the repo -> bytes


class HubServer:
    """The loopback Hub, serving :attr:`repos` (``"owner/name"`` -> revision -> files) at
    :attr:`endpoint`, on a thread of this process; :attr:`requests` logs each request's method
    and path."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Files]] = {}
        self.refusal: tuple[int, str] | None = None
        self.download_refusal: tuple[int, str] | None = None  # the files' bytes only
        self.requests: list[str] = []
        self.commits: dict[tuple[str, str], int] = {}  # (repo, branch) -> commits made
        self.refuse_commits: tuple[int, str] | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub._answer(self, head=False)

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

            def do_POST(self) -> None:
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.repos.clear()
        self.refusal = self.download_refusal = self.refuse_commits = None
        self.requests.clear()
        self.commits.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ----------------------------------------------------------------- answers

    def _answer(self, request: BaseHTTPRequestHandler, *, head: bool) -> None:
        url = urllib.parse.urlsplit(request.path)
        parts = [urllib.parse.unquote(part) for part in url.path.split("/")][1:]
        self.requests.append(f"{request.command} {url.path}")
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        if self.refusal is not None:
            self._error(request, *self.refusal, head=head)
        elif parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            self._api(request, parts[2:], url.query, body, head=head)
        elif parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            if self.download_refusal is not None:
                self._error(request, *self.download_refusal, head=head)
                return
            self._file(request, "/".join(parts[1:3]), parts[4], "/".join(parts[5:]), head=head)
        else:
            self._error(request, 404, "NotFound", head=head)

    def _api(
        self, request: BaseHTTPRequestHandler, parts: list[str], query: str, body: bytes, *, head: bool
    ) -> None:
        repo, what = "/".join(parts[:2]), parts[2] if len(parts) > 2 else "revision"
        revision = parts[3] if len(parts) > 3 else "main"
        files = self._files(request, repo, revision, head=head)
        if files is None:
            return
        if what == "revision":
            commit = self.head(repo, revision)
            siblings = [{"rfilename": path} for path in sorted(files)]
            self._json(
                request, {"id": repo, "sha": commit, "private": False, "siblings": siblings}, head=head
            )
        elif what == "tree":
            folder = "/".join(parts[4:]).strip("/")
            recursive = urllib.parse.parse_qs(query).get("recursive", ["false"])[0].lower() == "true"
            if folder and not any(path.startswith(folder + "/") for path in files):
                self._error(request, 404, "EntryNotFound", head=head)
            else:
                self._json(request, _tree(files, folder, recursive=recursive), head=head)
        elif what == "preupload":
            asked = json.loads(body)["files"]
            modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in asked]
            self._json(request, {"files": modes}, head=head)
        elif what == "commit":
            self._commit(request, repo, revision, files, body, head=head)
        elif what == "paths-info":
            paths = urllib.parse.parse_qs(body.decode()).get("paths", [])
            entries = [_entry(files, path.strip("/")) for path in paths]
            self._json(request, [entry for entry in entries if entry is not None], head=head)
        else:
            self._error(request, 404, "NotFound", head=head)

    def head(self, repo: str, branch: str) -> str:
        """The branch's head commit: it moves with each commit made."""
        made = self.commits.get((repo, branch), 0)
        return hashlib.sha1(f"{repo}@{branch}#{made}".encode()).hexdigest()

    def _commit(
        self,
        request: BaseHTTPRequestHandler,
        repo: str,
        branch: str,
        files: Files,
        body: bytes,
        *,
        head: bool,
    ) -> None:
        if self.refuse_commits is not None:
            self._error(request, *self.refuse_commits, head=head)
            return
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = lines[0]["value"]
        if header.get("parentCommit") not in (None, self.head(repo, branch)):
            self._error(request, 412, "PreconditionFailed", head=head)
            return
        changed = dict(files)
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                changed[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "deletedFile":
                del changed[value["path"]]
            else:
                self._error(request, 400, f"Unsupported{line['key']}", head=head)
                return
        files.clear()
        files.update(changed)
        self.commits[(repo, branch)] = self.commits.get((repo, branch), 0) + 1
        commit = self.head(repo, branch)
        url = f"{self.endpoint}/datasets/{repo}/commit/{commit}"
        self._json(request, {"commitUrl": url, "commitOid": commit, "pullRequestUrl": None}, head=head)

    def _file(
        self, request: BaseHTTPRequestHandler, repo: str, revision: str, path: str, *, head: bool
    ) -> None:
        files = self._files(request, repo, revision, head=head)
        if files is None:
            return
        if path not in files:
            self._error(request, 404, "EntryNotFound", head=head)
            return
        data = files[path]
        headers = {
            "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
            "X-Repo-Commit": self.head(repo, revision),
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        asked = request.headers.get("Range")
        if asked and asked.startswith("bytes=") and data:
            first, _, last = asked[len("bytes=") :].partition("-")
            start, stop = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{stop}/{len(data)}"
            self._send(request, 206, data[start : stop + 1], headers, head=head)
        else:
            self._send(request, 200, data, headers, head=head)

    def _files(
        self, request: BaseHTTPRequestHandler, repo: str, revision: str, *, head: bool
    ) -> Files | None:
        revisions = self.repos.get(repo)
        if revisions is None:
            self._error(request, 404, "RepoNotFound", head=head)
            return None
        files = revisions.get(revision)
        if files is None:
            self._error(request, 404, "RevisionNotFound", head=head)
        return files

    def _json(self, request: BaseHTTPRequestHandler, value: Any, *, head: bool, status: int = 200) -> None:
        self._send(
            request, status, json.dumps(value).encode(), {"Content-Type": "application/json"}, head=head
        )

    def _error(self, request: BaseHTTPRequestHandler, status: int, code: str, *, head: bool) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": code}
        self._send(request, status, json.dumps({"error": code}).encode(), headers, head=head)

    @staticmethod
    def _send(
        request: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], *, head: bool
    ) -> None:
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        if not head:
            request.wfile.write(body)


def _file_entry(path: str, data: bytes) -> dict[str, Any]:
    return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": path}


def _folder_entry(path: str) -> dict[str, Any]:
    return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}


def _entry(files: Files, path: str) -> dict[str, Any] | None:
    if path in files:
        return _file_entry(path, files[path])
    if any(name.startswith(path + "/") for name in files):
        return _folder_entry(path)
    return None


def _tree(files: Files, folder: str, *, recursive: bool) -> list[dict[str, Any]]:
    """A folder's entries (``""``: the repo's root), its subfolders first, as the Hub lists them."""
    prefix = f"{folder}/" if folder else ""
    found, folders = [], set()
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        below = path[len(prefix) :].split("/")
        for depth in range(1, len(below) if recursive else min(len(below), 2)):
            folders.add(prefix + "/".join(below[:depth]))
        if recursive or len(below) == 1:
            found.append(_file_entry(path, files[path]))
    return [_folder_entry(path) for path in sorted(folders)] + found
