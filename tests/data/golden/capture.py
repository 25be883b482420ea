"""Capture the first request frames that real Kafka clients send, into ``tests/data/golden/*.jsonl``.

No broker: a listening socket on loopback reads size-prefixed frames, answers ApiVersions (with every
version the codec knows, so each client picks min(its maximum, ours)) and Metadata (one broker: this
listener, no topics) with frames built by our codec, and records every request until the client has
sent ``LIMIT`` requests or stops. Clients: librdkafka (confluent-kafka), kafka-python, and the Java
admin client of kafka-clients 4.4.0 and 3.9.2 (tests/java/src/main/java/kpmon/KpmonClient.java).

Each output line: the client and its version, what the client was configured with or documents it
sends (``expect``: client id, software name and version), the correlation id read straight from the
frame bytes, and the frame as hex. Rerun with ``.venv/bin/python tests/data/golden/capture.py``.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import codec  # noqa: E402

HERE = Path(__file__).resolve().parent
LIMIT = 4
OLD_BROKER_API_VERSIONS = 2
API_VERSIONS = 18
METADATA = 3


def api_versions_body(api_versions_max: int) -> dict[str, Any]:
    keys = [
        {"ApiKey": key, "MinVersion": lo, "MaxVersion": api_versions_max if key == API_VERSIONS else hi}
        for key in codec.api_keys()
        for lo, hi in [codec.supported_versions(key)]
    ]
    return {"ErrorCode": 0, "ApiKeys": keys, "ThrottleTimeMs": 0}


def metadata_body(port: int) -> dict[str, Any]:
    broker = {"NodeId": 1, "Host": "127.0.0.1", "Port": port, "Rack": None}
    return {
        "ThrottleTimeMs": 0,
        "Brokers": [broker],
        "ClusterId": "kpmon-golden",
        "ControllerId": 1,
        "Topics": [],
    }


class Listener:
    """Accepts connections on loopback and records request frames (without their size prefix)."""

    def __init__(self, api_versions_max: int | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        #: Pretend to be an older broker: ApiVersions above this version get the v0 error-35 answer.
        self.api_versions_max = api_versions_max or codec.supported_versions(API_VERSIONS)[1]
        #: ("request" | "response", frame) in the order they crossed the socket.
        self.frames: list[tuple[str, bytes]] = []
        self.done = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while not self.done.is_set():
                    frame = self._read_frame(conn)
                    if frame is None:
                        return
                    with self.lock:
                        if sum(kind == "request" for kind, _ in self.frames) >= LIMIT:
                            self.done.set()
                            return
                        self.frames.append(("request", frame))
                        reply = self._answer(frame)
                        if reply is not None:
                            self.frames.append(("response", reply))
                    if reply is not None:
                        conn.sendall(struct.pack(">i", len(reply)) + reply)
            except OSError:
                return

    @staticmethod
    def _read_frame(conn: socket.socket) -> bytes | None:
        def exactly(n: int) -> bytes | None:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    return None
                data += chunk
            return data

        head = exactly(4)
        if head is None:
            return None
        return exactly(struct.unpack(">i", head)[0])

    def _answer(self, frame: bytes) -> bytes | None:
        api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
        if api_key == API_VERSIONS:
            top = self.api_versions_max
            body = api_versions_body(top)
            if version > top:
                # KIP-511: a v0 body (whatever was asked), error 35, and the ApiVersions range supported.
                versions = [k for k in body["ApiKeys"] if k["ApiKey"] == API_VERSIONS]
                return codec.encode_response(
                    API_VERSIONS, 0, correlation_id, {"ErrorCode": 35, "ApiKeys": versions}
                )
            return codec.encode_response(API_VERSIONS, version, correlation_id, body)
        if api_key == METADATA:
            return codec.encode_response(METADATA, version, correlation_id, metadata_body(self.port))
        return None

    def close(self) -> None:
        self.done.set()
        self.sock.close()


def run_client(
    name: str, argv: list[str], api_versions_max: int | None = None, seconds: float = 15
) -> tuple[list[tuple[str, bytes]], str]:
    """Run one client process against a fresh listener; the frames both ways and its stdout."""
    listener = Listener(api_versions_max)
    cmd = [arg.replace("{port}", str(listener.port)) for arg in argv]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not listener.done.is_set() and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)
    if proc.poll() is None:
        proc.kill()
    out = proc.communicate()[0]
    listener.close()
    with listener.lock:
        frames = list(listener.frames)
    print(f"{name}: {len(frames)} frames", file=sys.stderr)
    return frames, out


LIBRDKAFKA = """
import sys, confluent_kafka
p = confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:{port}", "client.id": "kpmon-golden-librdkafka"})
try:
    p.list_topics(timeout=5)
except Exception:
    pass
"""

KAFKA_PYTHON = """
import kafka
from kafka.admin import KafkaAdminClient
try:
    a = KafkaAdminClient(bootstrap_servers="127.0.0.1:{port}", client_id="kpmon-golden-kafka-python",
                         request_timeout_ms=4000)
    a.describe_cluster()
except Exception:
    pass
"""


def lines_for(
    client: str, client_version: str, expect: dict[str, Any], frames: list[tuple[str, bytes]]
) -> list[str]:
    out = []
    request: tuple[int, int] = (-1, -1)
    for direction, frame in frames:
        if direction == "request":
            api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
            request = (api_key, version)
        else:
            # Our answer to the request just before it: its api key and the version that was asked.
            (api_key, version), (correlation_id,) = request, struct.unpack_from(">i", frame)
        record = {
            "client": client,
            "client_version": client_version,
            "direction": direction,
            "api_key": api_key,
            "api_version": version,
            "correlation_id": correlation_id,
            "expect": expect,
            "hex": frame.hex(),
        }
        out.append(json.dumps(record))
    return out


def main() -> None:
    import confluent_kafka
    import kafka

    from tests.java import harness

    py = sys.executable
    lib = confluent_kafka.libversion()[0]
    runs: list[tuple[str, str, str, list[str], dict[str, Any]]] = [
        (
            "librdkafka",
            "librdkafka",
            lib,
            [py, "-c", LIBRDKAFKA],
            # confluent-kafka-python reports itself, with the librdkafka version, as the client software.
            {
                "client_id": "kpmon-golden-librdkafka",
                "software_name": "confluent-kafka-python",
                "software_version": f"{confluent_kafka.__version__}-rdkafka-{lib}",
            },
        ),
        (
            "kafka-python",
            "kafka-python",
            kafka.__version__,
            [py, "-c", KAFKA_PYTHON],
            {
                "client_id": "kpmon-golden-kafka-python",
                "software_name": "kafka-python",
                "software_version": kafka.__version__,
            },
        ),
    ]
    for release in ("4.4.0", "3.9.2"):
        client_id = f"kpmon-golden-java-{release}"
        argv = harness.client_command(release, "127.0.0.1:{port}", client_id)
        # software_version: what the jar says it is (KpmonClient prints it), filled in after the run.
        expect = {"client_id": client_id, "software_name": "apache-kafka-java", "software_version": None}
        runs.append((f"java-{release}", "java", release, argv, expect))
    for stem, client, client_version, argv, expect in runs:
        frames, out = run_client(stem, argv)
        if expect["software_version"] is None:
            expect["software_version"] = out.split()[0]
        write(f"{stem}.jsonl", lines_for(client, client_version, expect, frames))
        # The same client against a broker that only knows ApiVersions v0-v2: the first ApiVersions
        # gets the v0 error-35 answer, and the client retries at a version that broker advertised.
        frames, _ = run_client(f"{stem} (old broker)", argv, api_versions_max=OLD_BROKER_API_VERSIONS)
        write(f"{stem}-old-broker.jsonl", lines_for(client, client_version, expect, frames))


def write(name: str, lines: list[str]) -> None:
    (HERE / name).write_text("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
