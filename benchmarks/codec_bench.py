"""Codec decode throughput: kpmon's codec (full and projected) against kio and kafka-python.

Figures, not a timed test. Every library decodes the same frames (built once with our encoder and
checked to decode identically in each library), in the same run on the same machine: warm-up, then
``--reps`` repetitions of about ``--seconds / --reps`` each per (library, frame); the median counts.
Whether a projected decode is slower than a full one on some frame is answered separately, by pairs
timed back to back and a sign test (``paired_projection_check``): on small frames the two run the
same plan, and separate medians differ by the benchmark's spread either way.

kio 0.6.x parses entities in a Rust extension (``kio._kio_native``; ``kio.serial.entity_reader`` is
re-exported from it) and ships no pure-Python parser. Its last pure-Python release, 0.5.0, has the same
``entity_reader(type)(buffer, offset)`` API; it runs in a child process with that release first on
``sys.path`` (``--kio-pure-path``) so the two kio versions never share an interpreter.

    .venv/bin/python -m benchmarks.codec_bench              # ~2-3 minutes
    .venv/bin/python -m benchmarks.codec_bench --quick      # smoke run, ~20 seconds

The first run installs kio 0.5.0 from PyPI into ``.kpmon/bench/kio-0.5.0`` (once; ``--kio-pure-path``
names another place), outside the venv, where the native 0.6 release lives.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.metadata
import json
import math
import os
import pickle
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.results_file import machine  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "codec_bench.json"
DEFAULT_KIO_PURE = Path(os.environ.get("KPMON_HOME", REPO / ".kpmon")) / "bench" / "kio-0.5.0"

PRODUCE, FETCH, METADATA, JOIN_GROUP, SYNC_GROUP, API_VERSIONS, INIT_PID, END_TXN = (
    0,
    1,
    3,
    11,
    14,
    18,
    22,
    26,
)


@dataclass(frozen=True)
class FrameSpec:
    """One workload frame; versions are the highest every compared library supports for it."""

    name: str
    api_key: int
    version: int
    is_request: bool
    #: kio module under ``kio.schema`` and class; kafka-python class (``kafka.protocol``).
    kio_module: str
    lib_class: str
    #: Dotted fields the protocol checks need: the projection of measurement (b).
    fields: frozenset[str]
    #: A path (our field names, ``*`` = every element) whose leaves must match across libraries.
    probe: tuple[str, ...]
    #: Frame bytes, filled in by ``build_frames``.
    data: bytes = field(default=b"", compare=False)


SPECS: list[FrameSpec] = [
    FrameSpec(
        "produce_req",
        PRODUCE,
        9,
        True,
        "produce",
        "ProduceRequest",
        frozenset(
            {
                "TransactionalId",
                "Acks",
                "TopicData.Name",
                "TopicData.PartitionData.Index",
                "TopicData.PartitionData.Records",
            }
        ),
        ("TopicData", "*", "PartitionData", "*", "Records"),
    ),
    FrameSpec(
        "fetch_resp",
        FETCH,
        12,
        False,
        "fetch",
        "FetchResponse",
        frozenset(
            {
                "ErrorCode",
                "Responses.Topic",
                "Responses.Partitions.PartitionIndex",
                "Responses.Partitions.ErrorCode",
                "Responses.Partitions.LastStableOffset",
                "Responses.Partitions.AbortedTransactions",
                "Responses.Partitions.Records",
            }
        ),
        ("Responses", "*", "Partitions", "*", "Records"),
    ),
    FrameSpec(
        "metadata_resp",
        METADATA,
        12,
        False,
        "metadata",
        "MetadataResponse",
        frozenset({"Topics.ErrorCode", "Topics.Name", "Topics.Partitions.ErrorCode"}),
        ("Topics", "*", "Partitions", "*", "LeaderId"),
    ),
    FrameSpec(
        "join_group_req",
        JOIN_GROUP,
        9,
        True,
        "join_group",
        "JoinGroupRequest",
        frozenset({"GroupId", "MemberId", "ProtocolType", "Protocols.Name"}),
        ("Protocols", "*", "Metadata"),
    ),
    FrameSpec(
        "join_group_resp",
        JOIN_GROUP,
        9,
        False,
        "join_group",
        "JoinGroupResponse",
        frozenset({"ErrorCode", "GenerationId", "ProtocolType", "ProtocolName", "Leader", "MemberId"}),
        ("Members", "*", "Metadata"),
    ),
    FrameSpec(
        "sync_group_req",
        SYNC_GROUP,
        5,
        True,
        "sync_group",
        "SyncGroupRequest",
        frozenset({"GroupId", "GenerationId", "MemberId", "ProtocolType", "ProtocolName"}),
        ("Assignments", "*", "Assignment"),
    ),
    FrameSpec(
        "sync_group_resp",
        SYNC_GROUP,
        5,
        False,
        "sync_group",
        "SyncGroupResponse",
        frozenset({"ErrorCode", "ProtocolType", "ProtocolName"}),
        ("Assignment",),
    ),
    FrameSpec(
        "api_versions_req",
        API_VERSIONS,
        3,
        True,
        "api_versions",
        "ApiVersionsRequest",
        frozenset({"ClientSoftwareName", "ClientSoftwareVersion"}),
        ("ClientSoftwareName",),
    ),
    FrameSpec(
        "api_versions_resp",
        API_VERSIONS,
        3,
        False,
        "api_versions",
        "ApiVersionsResponse",
        frozenset({"ErrorCode", "ApiKeys.ApiKey", "ApiKeys.MinVersion", "ApiKeys.MaxVersion"}),
        ("ApiKeys", "*", "MaxVersion"),
    ),
    FrameSpec(
        "init_producer_id_req",
        INIT_PID,
        5,
        True,
        "init_producer_id",
        "InitProducerIdRequest",
        frozenset({"TransactionalId", "ProducerId", "ProducerEpoch"}),
        ("TransactionalId",),
    ),
    FrameSpec(
        "init_producer_id_resp",
        INIT_PID,
        5,
        False,
        "init_producer_id",
        "InitProducerIdResponse",
        frozenset({"ErrorCode", "ProducerId", "ProducerEpoch"}),
        ("ProducerId",),
    ),
    FrameSpec(
        "end_txn_req",
        END_TXN,
        4,
        True,
        "end_txn",
        "EndTxnRequest",
        frozenset({"TransactionalId", "ProducerId", "ProducerEpoch", "Committed"}),
        ("ProducerId",),
    ),
    FrameSpec(
        "end_txn_resp",
        END_TXN,
        4,
        False,
        "end_txn",
        "EndTxnResponse",
        frozenset({"ErrorCode"}),
        ("ErrorCode",),
    ),
]

#: Mixes: frame name -> frames of that kind per mix unit (throughput is total frames / total time).
#: produce_fetch_heavy: a data-plane connection, 100 Produce requests and 100 Fetch responses for each
#: metadata refresh, rebalance and transaction round trip; balanced: one of every frame.
MIXES: dict[str, dict[str, int]] = {
    "produce_fetch_heavy": {
        "produce_req": 100,
        "fetch_resp": 100,
        "metadata_resp": 1,
        "join_group_req": 1,
        "join_group_resp": 1,
        "sync_group_req": 1,
        "sync_group_resp": 1,
        "api_versions_req": 1,
        "api_versions_resp": 1,
        "init_producer_id_req": 1,
        "init_producer_id_resp": 1,
        "end_txn_req": 1,
        "end_txn_resp": 1,
    },
    "balanced": {spec.name: 1 for spec in SPECS},
}

LIBRARIES = ("kpmon_full", "kpmon_projected", "kio_native", "kio_pure", "kafka_python")


# ----------------------------------------------------------------------------------------------------
# Workload


def _records(rng: random.Random, n: int, pid: int, epoch: int, seq: int, offset: int = 0) -> bytes:
    from codec.records import build_record_batch

    records = [
        (
            f"key-{rng.randrange(10**6)}".encode(),
            rng.randbytes(rng.randint(100, 1000)),
            [("trace-id", rng.randbytes(8))],
            i * 3,
        )
        for i in range(n)
    ]
    return build_record_batch(
        records,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
        base_offset=offset,
        base_timestamp=1_790_000_000_000,
    )


def _subscription(rng: random.Random, topics: Sequence[str]) -> bytes:
    from codec import encode_data

    body = {
        "Topics": list(topics),
        "UserData": None,
        "OwnedPartitions": [{"Topic": t, "Partitions": sorted(rng.sample(range(12), 3))} for t in topics],
        "GenerationId": 41,
        "RackId": "rack-a",
    }
    return b"\x00\x03" + encode_data("ConsumerProtocolSubscription", 3, body)


def _assignment(rng: random.Random, topics: Sequence[str]) -> bytes:
    from codec import encode_data

    body = {
        "AssignedPartitions": [{"Topic": t, "Partitions": sorted(rng.sample(range(12), 4))} for t in topics],
        "UserData": None,
    }
    return b"\x00\x03" + encode_data("ConsumerProtocolAssignment", 3, body)


def _bodies(rng: random.Random) -> dict[str, dict[str, Any]]:
    import uuid

    from codec import api_keys, supported_versions

    pid, epoch = 4242, 7
    produce = {
        "TransactionalId": "payments-app-0",
        "Acks": -1,
        "TimeoutMs": 30000,
        "TopicData": [
            {
                "Name": f"payments-{t}",
                "PartitionData": [
                    {"Index": p, "Records": _records(rng, 10, pid, epoch, 100 * p)} for p in range(5)
                ],
            }
            for t in range(2)
        ],
    }
    fetch = {
        "ThrottleTimeMs": 0,
        "ErrorCode": 0,
        "SessionId": 918,
        "Responses": [
            {
                "Topic": f"orders-{t}",
                "Partitions": [
                    {
                        "PartitionIndex": p,
                        "ErrorCode": 0,
                        "HighWatermark": 10_000 + p,
                        "LastStableOffset": 9_990 + p,
                        "LogStartOffset": 0,
                        "AbortedTransactions": [{"ProducerId": 77, "FirstOffset": 9_000}] if p == 0 else [],
                        "PreferredReadReplica": -1,
                        "Records": _records(rng, 10, 1000 + p, 0, 0, offset=9_000 + 10 * p),
                    }
                    for p in range(10)
                ],
            }
            for t in range(2)
        ],
    }
    metadata = {
        "ThrottleTimeMs": 0,
        "Brokers": [
            {"NodeId": b, "Host": f"broker-{b}.kafka.svc", "Port": 9092, "Rack": "rack-a"} for b in range(3)
        ],
        "ClusterId": "kpmon-bench-cluster",
        "ControllerId": 1,
        "Topics": [
            {
                "ErrorCode": 0,
                "Name": f"topic-{t:03d}",
                "TopicId": uuid.UUID(int=rng.getrandbits(128)),
                "IsInternal": False,
                "Partitions": [
                    {
                        "ErrorCode": 0,
                        "PartitionIndex": p,
                        "LeaderId": (t + p) % 3,
                        "LeaderEpoch": 5,
                        "ReplicaNodes": [0, 1, 2],
                        "IsrNodes": [0, 1, 2],
                        "OfflineReplicas": [],
                    }
                    for p in range(12)
                ],
                "TopicAuthorizedOperations": -2147483648,
            }
            for t in range(100)
        ],
    }
    topics = [f"orders-{t}" for t in range(4)]
    members = [f"consumer-app-{m}-{uuid.UUID(int=rng.getrandbits(128))}" for m in range(5)]
    join_req = {
        "GroupId": "orders-app",
        "SessionTimeoutMs": 45000,
        "RebalanceTimeoutMs": 300000,
        "MemberId": members[0],
        "GroupInstanceId": None,
        "ProtocolType": "consumer",
        "Protocols": [
            {"Name": "cooperative-sticky", "Metadata": _subscription(rng, topics)},
            {"Name": "range", "Metadata": _subscription(rng, topics)},
        ],
        "Reason": None,
    }
    join_resp = {
        "ThrottleTimeMs": 0,
        "ErrorCode": 0,
        "GenerationId": 42,
        "ProtocolType": "consumer",
        "ProtocolName": "cooperative-sticky",
        "Leader": members[0],
        "SkipAssignment": False,
        "MemberId": members[0],
        "Members": [
            {"MemberId": m, "GroupInstanceId": None, "Metadata": _subscription(rng, topics)} for m in members
        ],
    }
    sync_req = {
        "GroupId": "orders-app",
        "GenerationId": 42,
        "MemberId": members[0],
        "GroupInstanceId": None,
        "ProtocolType": "consumer",
        "ProtocolName": "cooperative-sticky",
        "Assignments": [{"MemberId": m, "Assignment": _assignment(rng, topics)} for m in members],
    }
    sync_resp = {
        "ThrottleTimeMs": 0,
        "ErrorCode": 0,
        "ProtocolType": "consumer",
        "ProtocolName": "cooperative-sticky",
        "Assignment": _assignment(rng, topics),
    }
    api_versions = {
        "ErrorCode": 0,
        "ApiKeys": [
            {"ApiKey": k, "MinVersion": supported_versions(k)[0], "MaxVersion": supported_versions(k)[1]}
            for k in api_keys()
        ],
        "ThrottleTimeMs": 0,
    }
    return {
        "produce_req": produce,
        "fetch_resp": fetch,
        "metadata_resp": metadata,
        "join_group_req": join_req,
        "join_group_resp": join_resp,
        "sync_group_req": sync_req,
        "sync_group_resp": sync_resp,
        "api_versions_req": {"ClientSoftwareName": "apache-kafka-java", "ClientSoftwareVersion": "4.1.0"},
        "api_versions_resp": api_versions,
        "init_producer_id_req": {
            "TransactionalId": "payments-app-0",
            "TransactionTimeoutMs": 60000,
            "ProducerId": -1,
            "ProducerEpoch": -1,
        },
        "init_producer_id_resp": {
            "ThrottleTimeMs": 0,
            "ErrorCode": 0,
            "ProducerId": pid,
            "ProducerEpoch": epoch,
        },
        "end_txn_req": {
            "TransactionalId": "payments-app-0",
            "ProducerId": pid,
            "ProducerEpoch": epoch,
            "Committed": True,
        },
        "end_txn_resp": {"ThrottleTimeMs": 0, "ErrorCode": 0},
    }


def build_frames(seed: int = 20261122) -> list[FrameSpec]:
    import codec

    bodies = _bodies(random.Random(seed))
    frames = []
    for i, spec in enumerate(SPECS):
        body = bodies[spec.name]
        if spec.is_request:
            data = codec.encode_request(spec.api_key, spec.version, 1000 + i, "bench-client", body)
        else:
            data = codec.encode_response(spec.api_key, spec.version, 1000 + i, body)
        frames.append(FrameSpec(**{**spec.__dict__, "data": data}))
    return frames


# ----------------------------------------------------------------------------------------------------
# Decoders: each returns (decode(frame) callable, correlation id + probe leaves extractor)

Decode = Callable[[bytes], Any]


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _leaf(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes | bytearray | memoryview) or hasattr(value, "__bytes__"):
        return bytes(value)
    return value


def _walk(value: Any, path: Sequence[str], get: Callable[[Any, str], Any]) -> list[Any]:
    if not path:
        return [_leaf(value)]
    head, rest = path[0], path[1:]
    if head == "*":
        return [leaf for item in value for leaf in _walk(item, rest, get)]
    return _walk(get(value, head), rest, get)


def kpmon_decoder(spec: FrameSpec, projected: bool) -> tuple[Decode, Callable[[Any], list[Any]]]:
    import codec

    fields = spec.fields if projected else None
    if spec.is_request:

        def decode(data: bytes) -> Any:
            return codec.decode_request(data, fields)

    else:
        key, version = spec.api_key, spec.version

        def decode(data: bytes) -> Any:
            return codec.decode_response(data, key, version, fields)

    if projected:
        # A projection keeps only its fields: compare every projected leaf instead of the probe path.
        paths = [_star_path(f, spec) for f in sorted(spec.fields)]

        def probe(msg: Any) -> list[Any]:
            return [msg.correlation_id, *(leaf for path in paths for leaf in _walk(msg.body, path, _get))]

    else:

        def probe(msg: Any) -> list[Any]:
            return [msg.correlation_id, *_walk(msg.body, spec.probe, _get)]

    return decode, probe


def _get(obj: Any, key: str) -> Any:
    return obj[key]


def _star_path(dotted: str, spec: FrameSpec) -> tuple[str, ...]:
    """``TopicData.PartitionData.Index`` -> ``TopicData * PartitionData * Index`` for this frame's arrays."""
    import codec

    body = codec.decode_request(spec.data).body if spec.is_request else None
    if body is None:
        body = codec.decode_response(spec.data, spec.api_key, spec.version).body
    out: list[str] = []
    node: Any = body
    for part in dotted.split("."):
        out.append(part)
        node = node[part] if isinstance(node, dict) else None
        if isinstance(node, list) and node and isinstance(node[0], dict):
            out.append("*")
            node = node[0]
    return tuple(out)


def kio_decoder(spec: FrameSpec) -> tuple[Decode, Callable[[Any], list[Any]]]:
    from kio.serial import entity_reader

    kind = "request" if spec.is_request else "response"
    module = importlib.import_module(f"kio.schema.{spec.kio_module}.v{spec.version}.{kind}")
    entity = getattr(module, spec.lib_class)
    import codec

    if spec.is_request:
        hv = codec.request_header_version(spec.api_key, spec.version)
        header = importlib.import_module(f"kio.schema.request_header.v{hv}.header").RequestHeader
    else:
        hv = codec.response_header_version(spec.api_key, spec.version)
        header = importlib.import_module(f"kio.schema.response_header.v{hv}.header").ResponseHeader
    read_header, read_body = entity_reader(header), entity_reader(entity)

    def decode(data: bytes) -> Any:
        head, used = read_header(data, 0)
        body, size = read_body(data, used)
        if used + size != len(data):
            raise ValueError(f"kio read {used + size} of {len(data)} bytes")
        return head, body

    def probe(msg: Any) -> list[Any]:
        head, body = msg
        return [head.correlation_id, *_walk(body, spec.probe, lambda o, k: getattr(o, _snake(k)))]

    return decode, probe


def kafka_python_decoder(spec: FrameSpec) -> tuple[Decode, Callable[[Any], list[Any]]]:
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer

    cls = None
    for mod in (kafka.protocol.producer, kafka.protocol.consumer, kafka.protocol.metadata):
        cls = getattr(mod, spec.lib_class, None)
        if cls is not None:
            break
    if cls is None:
        raise LookupError(spec.lib_class)
    version = spec.version

    def decode(data: bytes) -> Any:
        return cls.decode(data, version=version, header=True)

    def probe(msg: Any) -> list[Any]:
        return [msg._header.correlation_id, *_walk(msg, spec.probe, lambda o, k: getattr(o, _snake(k)))]

    return decode, probe


def decoder_for(library: str, spec: FrameSpec) -> tuple[Decode, Callable[[Any], list[Any]]]:
    if library == "kpmon_full":
        return kpmon_decoder(spec, projected=False)
    if library == "kpmon_projected":
        return kpmon_decoder(spec, projected=True)
    if library in ("kio_native", "kio_pure"):
        return kio_decoder(spec)
    if library == "kafka_python":
        return kafka_python_decoder(spec)
    raise ValueError(library)


# ----------------------------------------------------------------------------------------------------
# Measurement


def _calibrate(decode: Decode, data: bytes, seconds: float, reps: int) -> int:
    """Warm up (compile caches, first-call imports) and pick a loop count of ~seconds/reps per run."""
    clock = time.perf_counter
    start = clock()
    n = 0
    while clock() - start < min(0.2, seconds / 4) or n < 3:
        decode(data)
        n += 1
    per = (clock() - start) / n
    return max(1, int(seconds / reps / per))


def _timed(decode: Decode, data: bytes, loops: int) -> float:
    clock = time.perf_counter
    t0 = clock()
    for _ in range(loops):
        decode(data)
    return (clock() - t0) / loops


def _figures(samples: list[float], size: int, loops: int) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "seconds_per_frame": median,
        "frames_per_s": 1.0 / median,
        "mb_per_s": size / median / 1e6,
        "loops": loops,
        "reps": len(samples),
        "spread": (max(samples) - min(samples)) / median,
    }


def measure(
    libraries: Sequence[str],
    frames: Sequence[FrameSpec],
    expected: dict[str, list[Any]],
    seconds: float,
    reps: int,
) -> dict[str, dict[str, Any]]:
    """Per library and frame: decode-and-verify, then ``reps`` timed runs. The runs are interleaved
    (every library and frame once per round) so load drifting on the machine hits all of them alike."""
    out: dict[str, dict[str, Any]] = {lib: {} for lib in libraries}
    jobs: list[tuple[str, FrameSpec, Decode, int]] = []
    for library in libraries:
        for spec in frames:
            try:
                decode, probe = decoder_for(library, spec)
                got = probe(decode(spec.data))
            except Exception as exc:  # a library that cannot decode a frame is reported, not fatal
                out[library][spec.name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            want = expected[spec.name + "/projected" if library == "kpmon_projected" else spec.name]
            if got != want:
                out[library][spec.name] = {"error": "decoded values differ from the frame's source body"}
                continue
            jobs.append((library, spec, decode, _calibrate(decode, spec.data, seconds, reps)))
    samples: dict[tuple[str, str], list[float]] = {(lib, spec.name): [] for lib, spec, _, _ in jobs}
    for round_no in range(reps):
        print(f"  round {round_no + 1}/{reps}", file=sys.stderr, flush=True)
        for library, spec, decode, loops in jobs:
            samples[library, spec.name].append(_timed(decode, spec.data, loops))
    for library, spec, _, loops in jobs:
        out[library][spec.name] = _figures(samples[library, spec.name], len(spec.data), loops)
    return out


#: Paired rounds per frame in ``paired_projection_check``, and the one-sided p-value it flags at.
PAIRED_ROUNDS = 21
PAIRED_P = 0.01


def sign_test_bound(rounds: int, p: float) -> int:
    """The fewest rounds, of ``rounds``, that one side must win for a one-sided sign test to reject
    "both sides cost the same" at ``p``."""
    for wins in range(rounds + 1):
        tail = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds
        if tail < p:
            return wins
    return rounds + 1


def paired_projection_check(
    frames: Sequence[FrameSpec], seconds: float, rounds: int = PAIRED_ROUNDS
) -> dict[str, dict[str, Any]]:
    """Per frame, is the projected decode slower than the full one? Answered by pairs, not by the
    per-library medians: the two are timed back to back ``rounds`` times (which goes first alternates),
    and a frame counts as slower only when the projected decode lost at least the sign test's bound of
    the rounds (p < ``PAIRED_P`` that equal costs would lose that often). Where a projection keeps every
    field the two decodes run the very same plan, and the medians of separate runs differ by this
    benchmark's spread (up to 30 %) either way; the pairs cancel the machine's drift between them."""
    bound = sign_test_bound(rounds, PAIRED_P)
    out: dict[str, dict[str, Any]] = {}
    for spec in frames:
        full, _ = kpmon_decoder(spec, projected=False)
        projected, _ = kpmon_decoder(spec, projected=True)
        loops = _calibrate(full, spec.data, seconds, rounds)
        _calibrate(projected, spec.data, seconds, rounds)  # its warm-up
        ratios: list[float] = []
        lost = 0
        for round_no in range(rounds):
            if round_no % 2:
                t_projected = _timed(projected, spec.data, loops)
                t_full = _timed(full, spec.data, loops)
            else:
                t_full = _timed(full, spec.data, loops)
                t_projected = _timed(projected, spec.data, loops)
            ratios.append(t_full / t_projected)
            lost += t_projected > t_full
        out[spec.name] = {
            "projected_over_full": statistics.median(ratios),
            "rounds": rounds,
            "rounds_projected_slower": lost,
            "slower": lost >= bound,
        }
    return out


def expected_probes(frames: Sequence[FrameSpec]) -> dict[str, list[Any]]:
    """What every library must decode: the correlation id and probe leaves of our full decode, which
    is itself checked to re-encode byte for byte."""
    import codec

    out = {}
    for spec in frames:
        decode, probe = kpmon_decoder(spec, projected=False)
        msg = decode(spec.data)
        if codec.encode(msg) != spec.data:
            raise AssertionError(f"{spec.name}: kpmon does not round-trip its own frame")
        out[spec.name] = probe(msg)
        _, projected_probe = kpmon_decoder(spec, projected=True)
        out[spec.name + "/projected"] = projected_probe(msg)
    return out


def _apply_gc(mode: str) -> None:
    """A full decode of a large frame allocates thousands of containers (a Metadata v12 one: a dict
    and three lists per partition), so with CPython's default thresholds the collector's passes over
    them, and the full collections over the whole heap they bring on, are a large and heap-dependent
    part of its time (docs/codec.md). ``worker`` times every library under the settings the streaming
    job's workers use."""
    if mode == "worker":
        from streaming.workergc import tune_worker_gc

        tune_worker_gc()


KIO_PURE_RELEASE = "kio==0.5.0"


def ensure_kio_pure(path: Path) -> str | None:
    """Install kio's last pure-Python release into ``path`` unless it is there (pip, from PyPI, once);
    None when it is ready, else why it is not."""
    parser = path / "kio" / "serial" / "_parse.py"  # only the pure-Python release has it
    if parser.exists():
        return None
    print(f"installing {KIO_PURE_RELEASE} into {path} (once)...", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(path), KIO_PURE_RELEASE]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not parser.exists():
        return f"could not install {KIO_PURE_RELEASE} at {path}: {done.stderr.strip()[-300:]}"
    return None


def run_kio_pure(
    path: Path, frames: Sequence[FrameSpec], seconds: float, reps: int, gc_mode: str = "default"
) -> dict[str, Any]:
    """kio's pure-Python release, in a child process so it cannot meet the native one."""
    missing = ensure_kio_pure(path)
    if missing is not None:
        return {"_unavailable": missing}
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "frames.pickle"
        blob.write_bytes(pickle.dumps([spec.data for spec in frames]))
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.codec_bench",
            "--worker-kio-pure",
            str(path.resolve()),
            "--worker-frames",
            str(blob),
            "--seconds",
            str(seconds),
            "--reps",
            str(reps),
            "--gc",
            gc_mode,
        ]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"_unavailable": f"kio-pure worker failed: {done.stderr[-500:]}"}
    return json.loads(done.stdout)


def kio_pure_worker(path: str, blob: str, seconds: float, reps: int) -> None:
    sys.path.insert(0, path)
    import kio

    if not kio.__file__ or not kio.__file__.startswith(path):
        raise SystemExit(f"kio imported from {kio.__file__}, not {path}")
    datas = pickle.loads(Path(blob).read_bytes())
    frames = [FrameSpec(**{**spec.__dict__, "data": data}) for spec, data in zip(SPECS, datas, strict=True)]
    result: dict[str, Any] = measure(["kio_pure"], frames, expected_probes(frames), seconds, reps)["kio_pure"]
    result["_version"] = importlib.metadata.version("kio") if _dist_on(path) else "unknown"
    print(json.dumps(result))


def _dist_on(path: str) -> bool:
    return any(p.name.startswith("kio-") for p in Path(path).glob("*.dist-info"))


# ----------------------------------------------------------------------------------------------------
# Report


def mix_figures(
    per_frame: dict[str, Any], frames: Sequence[FrameSpec], weights: dict[str, int]
) -> dict[str, Any]:
    sizes = {spec.name: len(spec.data) for spec in frames}
    covered = {n: w for n, w in weights.items() if "seconds_per_frame" in per_frame.get(n, {})}
    if not covered:
        return {}
    total_t = sum(w * per_frame[n]["seconds_per_frame"] for n, w in covered.items())
    return {
        "frames_per_s": sum(covered.values()) / total_t,
        "mb_per_s": sum(w * sizes[n] for n, w in covered.items()) / total_t / 1e6,
        "frames": sorted(covered),
        "complete": len(covered) == len(weights),
    }


def ratio_on_intersection(
    results: dict[str, Any], frames: Sequence[FrameSpec], mix: dict[str, int], a: str, b: str
) -> float | None:
    """Frames/s of ``a`` over ``b`` on the frames of ``mix`` that both libraries decoded."""
    common = {
        n: w
        for n, w in mix.items()
        if "seconds_per_frame" in results.get(a, {}).get(n, {})
        and "seconds_per_frame" in results.get(b, {}).get(n, {})
    }
    if not common:
        return None
    ta = sum(w * results[a][n]["seconds_per_frame"] for n, w in common.items())
    tb = sum(w * results[b][n]["seconds_per_frame"] for n, w in common.items())
    return tb / ta


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        **machine(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "implementation": platform.python_implementation(),
    }
    info["load_average_1_5_15"] = info.pop("load_before")
    return info


def library_versions(kio_pure: dict[str, Any]) -> dict[str, str]:
    from importlib.metadata import version

    return {
        "kafka-protocol-monitor": version("kafka-protocol-monitor"),
        "kio (native)": version("kio"),
        "kio (pure-Python, child process)": str(kio_pure.get("_version", "unavailable")),
        "kafka-python": version("kafka-python"),
    }


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if unit == "x":
        return f"{x:.2f}x"
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def print_table(report: dict[str, Any], frames: Sequence[FrameSpec]) -> None:
    results = report["per_frame"]
    libs = [lib for lib in LIBRARIES if lib in results and not results[lib].get("_unavailable")]
    print("\nframes/s (MB/s) per frame type, median of repetitions")
    header = f"{'frame':<24}{'bytes':>8}" + "".join(f"{lib:>22}" for lib in libs)
    print(header)
    print("-" * len(header))
    for spec in frames:
        row = f"{spec.name:<24}{len(spec.data):>8}"
        for lib in libs:
            fig = results[lib].get(spec.name, {})
            cell = (
                f"{_fmt(fig['frames_per_s'])} ({_fmt(fig['mb_per_s'])})" if "frames_per_s" in fig else "error"
            )
            row += f"{cell:>22}"
        print(row)
    for mix_name, mix in report["mixes"].items():
        row = f"{'mix: ' + mix_name:<32}"
        for lib in libs:
            fig = mix.get(lib, {})
            cell = f"{_fmt(fig.get('frames_per_s'))} ({_fmt(fig.get('mb_per_s'))})" if fig else "n/a"
            row += f"{cell:>22}"
        print(row)
    print("\nratios (frames/s; on the frames both sides decoded)")
    for mix_name, ratios in report["ratios"].items():
        print(f"  {mix_name}: " + ", ".join(f"{k} {_fmt(v, 'x')}" for k, v in ratios.items()))
    paired = report["projected_vs_full_paired"]
    print(
        f"\nprojected vs full, paired ({paired['rounds']} rounds; slower when it lost at least "
        f"{paired['slower_when_lost_at_least']}, p < {paired['p']})"
    )
    for name, check in paired["per_frame"].items():
        flag = "  SLOWER" if check["slower"] else ""
        print(
            f"  {name:<24}{_fmt(check['projected_over_full'], 'x'):>8}  "
            f"lost {check['rounds_projected_slower']:>2}/{check['rounds']}{flag}"
        )
    print("\ntargets")
    for name, target in report["targets"].items():
        verdict = "reported" if target["met"] is None else "MET" if target["met"] else "MISSED"
        figure = _fmt(target["value"], "x")
        if "slower_frames" in target:  # the paired check: its lowest ratio, and the frames it flagged
            figure = f"lowest {figure}" + "".join(f", slower: {n}" for n in target["slower_frames"])
        print(f"  {name}: {verdict} ({figure})")
    for note in report["notes"]:
        print(f"note: {note}")


RATIOS = (
    ("ours/kafka-python", "kpmon_full", "kafka_python"),
    ("ours/kio-pure", "kpmon_full", "kio_pure"),
    ("ours/kio-native", "kpmon_full", "kio_native"),
    ("projected/kafka-python", "kpmon_projected", "kafka_python"),
    ("projected/kio-native", "kpmon_projected", "kio_native"),
    ("projected/full", "kpmon_projected", "kpmon_full"),
)


def build_report(
    results: dict[str, Any],
    frames: Sequence[FrameSpec],
    args: argparse.Namespace,
    paired: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    mixes = {
        name: {
            lib: mix_figures(results[lib], frames, weights)
            for lib in results
            if "_unavailable" not in results[lib]
        }
        for name, weights in MIXES.items()
    }
    ratios = {
        name: {label: ratio_on_intersection(results, frames, weights, a, b) for label, a, b in RATIOS}
        for name, weights in MIXES.items()
    }
    heavy = ratios["produce_fetch_heavy"]
    targets: dict[str, dict[str, Any]] = {}
    for label, key, bound in (
        ("full >= 2x kafka-python (produce_fetch_heavy)", "ours/kafka-python", 2.0),
        ("full >= kio pure-Python (produce_fetch_heavy)", "ours/kio-pure", 1.0),
        ("projected >= 5x full (produce_fetch_heavy)", "projected/full", 5.0),
    ):
        value = heavy.get(key)
        targets[label] = {"value": value, "bound": bound, "met": value is not None and value >= bound}
    slower = sorted(name for name, check in paired.items() if check["slower"])
    targets["projected never slower than full on any frame (paired sign test)"] = {
        "value": min((check["projected_over_full"] for check in paired.values()), default=None),
        "bound": None,
        "met": not slower,
        "slower_frames": slower,
    }
    targets["full vs kio native (reported, no target)"] = {
        "value": heavy.get("ours/kio-native"),
        "bound": None,
        "met": None,
    }
    notes = [
        "kafka-python and kio return records fields as raw bytes; kpmon parses every record batch header "
        "(RecordBatches, records on demand) and expands consumer-protocol subscriptions/assignments in "
        "JoinGroup/SyncGroup, in both full and projected decodes.",
        "Versions (highest every library supports): Produce v9, Fetch v12, Metadata v12, JoinGroup v9, "
        "SyncGroup v5, ApiVersions v3, InitProducerId v5, EndTxn v4.",
        "kio 0.6.x has no pure-Python parser (kio.serial re-exports the Rust _kio_native entity_reader); "
        "kio_pure is kio 0.5.0, its last pure-Python release, in a child process.",
    ]
    for lib, per in results.items():
        if "_unavailable" in per:
            notes.append(f"{lib}: {per['_unavailable']}")
        for name, fig in per.items():
            if isinstance(fig, dict) and "error" in fig:
                notes.append(f"{lib} could not decode {name}: {fig['error']}")
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "libraries": library_versions(results.get("kio_pure", {})),
        "settings": {
            "seconds_per_measurement": args.seconds,
            "reps": args.reps,
            "quick": args.quick,
            "gc": args.gc,
        },
        "frames": {
            spec.name: {
                "api_key": spec.api_key,
                "version": spec.version,
                "kind": "request" if spec.is_request else "response",
                "bytes": len(spec.data),
                "projection": sorted(spec.fields),
            }
            for spec in frames
        },
        "mix_weights": MIXES,
        "per_frame": {
            lib: {k: v for k, v in per.items() if not k.startswith("_version")}
            for lib, per in results.items()
        },
        "mixes": mixes,
        "ratios": ratios,
        "projected_vs_full_paired": {
            "rounds": PAIRED_ROUNDS,
            "slower_when_lost_at_least": sign_test_bound(PAIRED_ROUNDS, PAIRED_P),
            "p": PAIRED_P,
            "per_frame": paired,
        },
        "targets": targets,
        "notes": notes,
    }


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=1.5, help="timed seconds per (library, frame)")
    parser.add_argument("--reps", type=int, default=9, help="repetitions per measurement (median)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.15 s and 3 repetitions each")
    parser.add_argument("--kio-pure-path", type=Path, default=DEFAULT_KIO_PURE)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--gc",
        choices=("default", "worker"),
        default="default",
        help="collector settings while timing: CPython's defaults, or the streaming workers' "
        "(streaming.workergc: freeze what is alive, collect every 50,000 allocations); see docs/codec.md",
    )
    parser.add_argument("--worker-kio-pure", help=argparse.SUPPRESS)
    parser.add_argument("--worker-frames", help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.quick:
        args.seconds, args.reps = 0.15, 3
    if args.worker_kio_pure:
        _apply_gc(args.gc)
        kio_pure_worker(args.worker_kio_pure, args.worker_frames, args.seconds, args.reps)
        return 0

    frames = build_frames()
    expected = expected_probes(frames)
    _apply_gc(args.gc)
    print("measuring kpmon_full, kpmon_projected, kio_native, kafka_python...", file=sys.stderr, flush=True)
    in_process = ["kpmon_full", "kpmon_projected", "kio_native", "kafka_python"]
    results: dict[str, Any] = dict(measure(in_process, frames, expected, args.seconds, args.reps))
    print("measuring kio_pure (child process)...", file=sys.stderr, flush=True)
    results["kio_pure"] = run_kio_pure(args.kio_pure_path, frames, args.seconds, args.reps, args.gc)
    print("measuring projected against full, paired...", file=sys.stderr, flush=True)
    paired = paired_projection_check(frames, args.seconds)
    report = build_report(results, frames, args, paired)
    print_table(report, frames)
    if not args.no_write:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
        print(f"\nwrote {args.output.relative_to(REPO) if args.output.is_relative_to(REPO) else args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
