"""A real HTTP receiver on loopback for the hook tests: records every POST, answers as scripted."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)


class Receiver:
    """``script(request) -> Reply`` decides each answer (default: 200). Requests are recorded whatever
    the answer, so a test can count attempts too."""

    def __init__(self, port: int | None = None, script: Callable[[Received], Reply] | None = None) -> None:
        self.port = port or free_port()
        self.script = script or (lambda _request: Reply())
        self.requests: list[Received] = []
        self._changed = threading.Condition()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                request = Received(self.path, dict(self.headers.items()), json.loads(raw))
                reply = receiver.script(request)
                with receiver._changed:
                    receiver.requests.append(request)
                    receiver._changed.notify_all()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.requests):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True

    def bodies(self) -> list[Any]:
        with self._changed:
            return [request.body for request in self.requests]
