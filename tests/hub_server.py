"""A loopback HTTP server answering the Hugging Face Hub's file endpoints, for tests.

``GET|HEAD /{owner}/{name}/resolve/{revision}/{file}`` serves files from folders registered as
repos, with the headers huggingface_hub reads (X-Repo-Commit, ETag, Content-Length) and HTTP
Range support; every request and the bytes sent are logged so a test can check what was read.
Point huggingface_hub at it with ``HF_ENDPOINT=http://127.0.0.1:<port>``.
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_PATH = re.compile(r"^/(?:api/models/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class HubServer:
    """``with HubServer({"owner/name": folder}) as hub: hub.url``; ``hub.log`` lists
    ``(method, repo, file, range header, bytes sent)``; ``gated`` repos answer 401 without
    an Authorization header."""

    def __init__(self, repos: dict[str, Path], gated: tuple[str, ...] = ()):
        self.repos, self.gated, self.log = {k: Path(v) for k, v in repos.items()}, set(gated), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _serve(self, head: bool):
                m = _PATH.match(self.path.split("?")[0])
                if not m or m["repo"] not in server.repos:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "RepoNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if m["repo"] in server.gated and "authorization" not in {k.lower() for k in self.headers}:
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                f = server.repos[m["repo"]] / m["file"]
                if not f.is_file():
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    server.log.append((self.command, m["repo"], m["file"], None, 0))
                    return
                data = f.read_bytes()
                rng = self.headers.get("Range")
                status, body = 200, data
                if rng:
                    a, b = re.match(r"bytes=(\d+)-(\d*)", rng).groups()
                    a, b = int(a), (int(b) if b else len(data) - 1)
                    body, status = data[a : b + 1], 206
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {a}-{a + len(body) - 1}/{len(data)}")
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                server.log.append((self.command, m["repo"], m["file"], rng, 0 if head else len(body)))

            def do_HEAD(self):
                self._serve(True)

            def do_GET(self):
                self._serve(False)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> "HubServer":
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()

    def bytes_sent(self, file_suffix: str = "") -> int:
        """Bytes of file bodies sent (GET), optionally only for files ending in ``file_suffix``."""
        return sum(n for _, _, f, _, n in self.log if f.endswith(file_suffix))
