"""Replays recorded HTTP exchanges on loopback, in order, for a client no real server can run for here.

Each exchange is the request expected (method, path, JSON body if any) and the recorded answer (status,
JSON body). A request that is not the next one recorded is answered 599 and remembered, so the test
fails on it; ``unplayed`` lists what the client never asked. An exchange with ``"any_request": true``
takes any body, which the test checks itself: ``received`` keeps every request as it came, with its
``Authorization`` header and what ``probe`` returned when it came: the test's view of the world at that
moment, or a change to it (what the real system would have done by then).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Replay:
    def __init__(
        self, exchanges: list[dict[str, Any]], probe: Callable[[str, str], Any] | None = None
    ) -> None:
        self.exchanges = list(exchanges)
        self.unexpected: list[str] = []
        self.received: list[dict[str, Any]] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                replay.received.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body,
                        "authorization": self.headers.get("Authorization"),
                        "probe": probe(self.command, self.path) if probe is not None else None,
                    }
                )
                expected = replay.exchanges[0] if replay.exchanges else None
                if expected is None or (
                    expected["method"],
                    expected["path"],
                    body if expected.get("any_request") else expected.get("request"),
                ) != (self.command, self.path, body):
                    replay.unexpected.append(f"{self.command} {self.path} {body}")
                    status, answer = 599, {"unexpected": True}
                else:
                    replay.exchanges.pop(0)
                    status, answer = expected["status"], expected["response"]
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Replay:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def unplayed(self) -> list[dict[str, Any]]:
        return self.exchanges
