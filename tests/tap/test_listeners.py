"""Listeners opened on the fly for broker ids that address rewriting finds without a tap listener."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import uuid
from collections.abc import Iterator

import pytest

import codec
from codec.samples import random_response_body
from deploy.local.stack import LocalStack
from tap.listeners import DynamicListeners, ListenerSpec, listen_socket
from tap.mirror import MemoryMirror
from tap.proxy import Tap, TapSettings
from tap.rewrite import rewrite_response
from tests.tap.harness import TapThread, start_stack
from tests.tap.helpers import api_versions_request, frame, parsed, parts

TEMPLATE = ListenerSpec("127.0.0.1", 29092, "broker1", 9092, 1)


def _broker(node: int, port: int = 9092) -> dict[str, object]:
    return {"NodeId": node, "Host": f"broker{node}", "Port": port, "Rack": None}


def _metadata(brokers: list[dict[str, object]], corr: int = 7) -> bytes:
    body = random_response_body(3, 12, random.Random(corr))
    body["Brokers"] = brokers
    return codec.encode_response(3, 12, corr, body)


# ----- sans-I/O: the rewriter asks the resolver about ids it has no address for ------------------------


def test_rewriter_asks_the_resolver_only_for_unknown_ids() -> None:
    asked: list[tuple[int, str, int]] = []

    def resolve(node_id: int, host: str, port: int) -> tuple[str, int] | None:
        asked.append((node_id, host, port))
        return ("tap", 30000 + node_id) if node_id == 2 else None

    raw = _metadata([_broker(1), _broker(2), _broker(3)])
    out = rewrite_response(raw, 3, 12, {1: ("tap", 29092)}, resolve=resolve)
    assert out is not None
    brokers = codec.decode_response(out, 3, 12).body["Brokers"]
    assert [(b["Host"], b["Port"]) for b in brokers] == [("tap", 29092), ("tap", 30002), ("broker3", 9092)]
    assert asked == [(2, "broker2", 9092), (3, "broker3", 9092)]


@pytest.mark.parametrize(("version", "shape"), [(3, "top level"), (6, "coordinators")])
def test_find_coordinator_errors_never_open_listeners(version: int, shape: str) -> None:
    asked: list[int] = []
    body = random_response_body(10, version, random.Random(version))
    if shape == "top level":
        body.update(ErrorCode=15, NodeId=-1, Host="", Port=-1)
    else:
        body["Coordinators"] = [
            {"Key": "g", "NodeId": -1, "Host": "", "Port": -1, "ErrorCode": 15, "ErrorMessage": None},
            {"Key": "h", "NodeId": 4, "Host": "broker4", "Port": 9092, "ErrorCode": 0, "ErrorMessage": None},
        ]
    raw = codec.encode_response(10, version, 1, body)

    def resolve(node_id: int, host: str, port: int) -> None:
        asked.append(node_id)

    rewrite_response(raw, 10, version, {}, resolve=resolve)
    assert asked == ([] if shape == "top level" else [4])


def test_describe_cluster_and_node_endpoints_use_the_resolver() -> None:
    def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
        return ("tap", 31000 + node_id)

    body = random_response_body(60, 1, random.Random(2))
    body["Brokers"] = [{"BrokerId": 5, "Host": "broker5", "Port": 9092, "Rack": None}]
    out = rewrite_response(codec.encode_response(60, 1, 1, body), 60, 1, {}, resolve=resolve)
    assert out is not None
    (broker,) = codec.decode_response(out, 60, 1).body["Brokers"]
    assert (broker["Host"], broker["Port"]) == ("tap", 31005)
    body = random_response_body(0, 12, random.Random(3))
    body["NodeEndpoints"] = [{"NodeId": 6, "Host": "broker6", "Port": 9092, "Rack": None}]
    out = rewrite_response(codec.encode_response(0, 12, 1, body), 0, 12, {}, resolve=resolve)
    assert out is not None
    (endpoint,) = codec.decode_response(out, 0, 12).body["NodeEndpoints"]
    assert (endpoint["Host"], endpoint["Port"]) == ("tap", 31006)


# ----- DynamicListeners: the decisions, on real sockets, without an event loop -------------------------


class _Served:
    """The ``serve`` side of DynamicListeners: keeps the bound sockets so the test can dial and close them."""

    def __init__(self) -> None:
        self.sockets: dict[int, socket.socket] = {}
        self.events: list[str] = []

    def serve(self, spec: ListenerSpec, sock: socket.socket) -> None:
        assert spec.broker_id is not None
        self.sockets[spec.broker_id] = sock

    def event(self, event: str, **fields: object) -> None:
        self.events.append(event)

    def close(self) -> None:
        for sock in self.sockets.values():
            sock.close()


@pytest.fixture
def served() -> Iterator[_Served]:
    s = _Served()
    yield s
    s.close()


def _free_range(size: int) -> tuple[int, int]:
    """``size`` consecutive ports that are free right now (good enough for a test)."""
    for base in range(40000, 60000, 97):
        socks = []
        try:
            for port in range(base, base + size):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base, base + size - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def test_a_new_broker_gets_a_listening_port_from_the_range(served: _Served) -> None:
    low, high = _free_range(3)
    dyn = DynamicListeners(served.serve, lambda: [("127.0.0.1", 29092)], (low, high), on_event=served.event)
    first = dyn.resolve(TEMPLATE, 2, "broker2", 9092)
    assert first == ("127.0.0.1", low)
    # Listening already: a client may connect before the event loop serves the socket.
    socket.create_connection(first, 2).close()
    assert dyn.resolve(TEMPLATE, 2, "broker2", 9092) == first, "one listener per broker id"
    assert dyn.resolve(TEMPLATE, 3, "broker3", 9092) == ("127.0.0.1", low + 1)
    spec = dyn.specs[3]
    assert (spec.broker_host, spec.broker_port, spec.broker_id, spec.listen_port) == (
        "broker3",
        9092,
        3,
        low + 1,
    )
    assert served.events == ["dynamic_listener", "dynamic_listener"]


def test_a_taken_range_fails_once_and_keeps_the_broker_address(served: _Served) -> None:
    low, high = _free_range(1)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", low))
    blocker.listen()
    try:
        dyn = DynamicListeners(served.serve, list, (low, high), on_event=served.event)
        assert dyn.resolve(TEMPLATE, 2, "broker2", 9092) is None
        assert dyn.resolve(TEMPLATE, 2, "broker2", 9092) is None
    finally:
        blocker.close()
    assert served.events == ["dynamic_listener_failed"], "not retried on every response"
    assert dyn.failed == {2} and not served.sockets


def test_limit_and_own_addresses(served: _Served) -> None:
    dyn = DynamicListeners(served.serve, lambda: [("tap", 29093)], None, limit=1, on_event=served.event)
    # A broker that already advertises the tap: a listener for it would forward the tap to itself.
    assert dyn.resolve(TEMPLATE, 2, "tap", 29093) is None
    assert dyn.resolve(TEMPLATE, 3, "broker3", 9092) is not None
    assert dyn.resolve(TEMPLATE, 4, "broker4", 9092) is None
    assert served.events == ["dynamic_listener", "dynamic_listener_failed"]


def test_a_moved_broker_is_followed(served: _Served) -> None:
    dyn = DynamicListeners(served.serve, list, None, on_event=served.event)
    address = dyn.resolve(TEMPLATE, 2, "broker2", 9092)
    assert dyn.resolve(TEMPLATE, 2, "broker2-new", 9093) == address
    assert (dyn.specs[2].broker_host, dyn.specs[2].broker_port) == ("broker2-new", 9093)
    # Reports through another kind of listener carry that listener's address: not a move.
    sasl = ListenerSpec("127.0.0.1", 29094, "broker1", 9094, 1, listener_name="SASL_PLAINTEXT")
    assert dyn.resolve(sasl, 2, "broker2", 9094) == address
    assert dyn.specs[2].broker_port == 9093
    assert served.events == ["dynamic_listener", "dynamic_listener_retarget"]


def test_advertised_template_keeps_its_host(served: _Served) -> None:
    template = ListenerSpec("127.0.0.1", 29092, "broker1", 9092, 1, advertise=("tap.example", 29092))
    dyn = DynamicListeners(served.serve, list)
    host, port = dyn.resolve(template, 2, "broker2", 9092) or ("", 0)
    assert host == "tap.example" and port == served.sockets[2].getsockname()[1]


def test_listen_socket_skips_taken_ports() -> None:
    low, high = _free_range(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", low))
    try:
        sock = listen_socket("127.0.0.1", range(low, high + 1))
        assert sock is not None and sock.getsockname()[1] == high
        sock.close()
    finally:
        blocker.close()


# ----- the tap: a client follows a rewritten Metadata response to a broker it was never told about -----


class _Broker:
    """A broker that answers Metadata with ``brokers`` and any other request with an empty body."""

    def __init__(self, brokers: list[dict[str, object]]) -> None:
        self.brokers = brokers
        self.api_keys: list[int] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                req = await reader.readexactly(size)
                api_key, corr = struct.unpack_from(">h", req)[0], struct.unpack_from(">i", req, 4)[0]
                self.api_keys.append(api_key)
                if api_key == 3:
                    writer.write(frame(_metadata(self.brokers, corr)))
                else:
                    writer.write(frame(struct.pack(">i", corr) + b"\x00\x00"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


_METADATA_REQUEST = {
    "Topics": None,
    "AllowAutoTopicCreation": False,
    "IncludeTopicAuthorizedOperations": False,
}


async def _call(address: tuple[str, int], payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(frame(payload))
    await writer.drain()
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    body = await reader.readexactly(size)
    writer.close()
    return body


async def _brokers_via(address: tuple[str, int]) -> dict[int, tuple[str, int]]:
    body = await _call(address, codec.encode_request(3, 12, 5, "c", _METADATA_REQUEST))
    return {b["NodeId"]: (b["Host"], b["Port"]) for b in codec.decode_response(body, 3, 12).body["Brokers"]}


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_client_reaches_a_broker_the_tap_was_not_configured_for(loop_kind: str) -> None:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        asyncio.run(_dynamic_case())
    finally:
        asyncio.set_event_loop_policy(None)


async def _dynamic_case() -> None:
    one, two, two_moved = _Broker([]), _Broker([]), _Broker([])
    for broker in (one, two, two_moved):
        await broker.start()
    one.brokers = [_broker(1, one.port) | {"Host": "127.0.0.1"}, _broker(2, two.port) | {"Host": "127.0.0.1"}]
    sink = MemoryMirror()
    tap = Tap(
        [ListenerSpec("127.0.0.1", 0, "127.0.0.1", one.port, 1)],
        sink,
        TapSettings(rewrite_broker_addresses=True),
    )
    ((_, port),) = await tap.start()
    try:
        brokers = await _brokers_via(("127.0.0.1", port))
        assert brokers[1] == ("127.0.0.1", port)
        assert brokers[2][0] == "127.0.0.1" and brokers[2][1] not in (port, two.port), (
            "broker 2 is on the tap"
        )
        # The new listener forwards like a configured one.
        response = await _call(brokers[2], api_versions_request(9))
        assert struct.unpack_from(">i", response)[0] == 9
        assert two.api_keys == [18]
        # Broker 2 moves: the next Metadata says so, and new connections follow; clients keep the tap's address.
        one.brokers[1]["Port"] = two_moved.port
        assert (await _brokers_via(("127.0.0.1", port)))[2] == brokers[2]
        await _call(brokers[2], api_versions_request(10))
        assert two_moved.api_keys == [18] and two.api_keys == [18]
        metric = tap.metrics.registry.get_sample_value
        assert metric("kpmon_tap_dynamic_listeners_total", {"result": "opened"}) == 1
        assert metric("kpmon_tap_dynamic_listeners_total", {"result": "retargeted"}) == 1
        mirrored = {record.connection.broker_id for record in parsed(sink.records)}
        assert 2 in mirrored, "traffic of the new listener is mirrored with its broker id"
    finally:
        await tap.stop()
        for broker in (one, two, two_moved):
            await broker.stop()


def test_no_dynamic_listeners_when_turned_off() -> None:
    async def run() -> None:
        one, two = _Broker([]), _Broker([])
        await one.start()
        await two.start()
        one.brokers = [_broker(2, two.port) | {"Host": "127.0.0.1"}]
        tap = Tap(
            [ListenerSpec("127.0.0.1", 0, "127.0.0.1", one.port, 1)],
            MemoryMirror(),
            TapSettings(rewrite_broker_addresses=True, dynamic_listeners=False),
        )
        ((_, port),) = await tap.start()
        try:
            assert (await _brokers_via(("127.0.0.1", port)))[2] == ("127.0.0.1", two.port)
            assert not tap.dynamic.specs
        finally:
            await tap.stop()
            await one.stop()
            await two.stop()

    asyncio.run(run())


# ----- a real 3-broker cluster, a tap that only knows broker 1 ----------------------------------------


@pytest.mark.integration
def test_real_client_reaches_brokers_2_and_3_through_listeners_made_on_the_fly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    stack = LocalStack(tmp_path_factory.mktemp("three-brokers"), brokers=3)
    start_stack(stack)
    try:
        direct = {b.node_id: b for b in stack.brokers}
        admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
        topic = f"dyn-{uuid.uuid4().hex[:6]}"
        # One partition led by each broker, so the client must reach all three.
        new = NewTopic(topic, num_partitions=3, replica_assignment=[[1], [2], [3]])
        admin.create_topics([new])[topic].result(30)

        sink = MemoryMirror()
        host, port = direct[1].host, direct[1].port
        t = TapThread(
            [ListenerSpec("127.0.0.1", 0, host, port, 1)], sink, TapSettings(rewrite_broker_addresses=True)
        ).start()
        try:
            bootstrap = f"127.0.0.1:{t.bound[0][1]}"
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
            for partition in range(3):
                producer.produce(topic, f"p{partition}".encode(), partition=partition)
            assert producer.flush(60) == 0
            seen = {b.id: (b.host, b.port) for b in producer.list_topics(topic, timeout=10).brokers.values()}
            consumer = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"dyn-{uuid.uuid4().hex[:6]}",
                    "enable.auto.commit": False,
                }
            )
            consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
            values = set()
            for _ in range(200):
                msg = consumer.poll(0.5)
                if msg is not None and not msg.error():
                    values.add(msg.value())
                if len(values) == 3:
                    break
            consumer.close()
            del producer
            t.wait_idle()
        finally:
            t.stop()
    finally:
        stack.down()

    assert values == {b"p0", b"p1", b"p2"}
    dynamic = t.tap.dynamic.specs
    assert sorted(dynamic) == [2, 3]
    for node_id in (2, 3):
        assert (dynamic[node_id].broker_host, dynamic[node_id].broker_port) == (
            direct[node_id].host,
            direct[node_id].port,
        )
        assert seen[node_id] == dynamic[node_id].advertise, "the client was given the tap's address"
        assert seen[node_id] != (direct[node_id].host, direct[node_id].port)
    # Produce and Fetch to the partitions of brokers 2 and 3 went through their new listeners.
    reqs = [(r.connection.broker_id, p.api_key) for r, p in parts(sink.records) if p.direction == "req"]
    for broker_id in (2, 3):
        apis = {api for broker, api in reqs if broker == broker_id}
        assert {0, 1} <= apis, f"produce and fetch through broker {broker_id}'s tap listener"


def test_broker_context_picks_the_clients_identity_and_refuses_the_rest() -> None:
    import ssl as ssl_module

    from tap.listeners import NoBrokerIdentity, broker_context, client_common_name

    default = ssl_module.create_default_context()
    alice = ssl_module.create_default_context()
    plain = ListenerSpec("127.0.0.1", 0, "127.0.0.1", 9092, broker_ssl=default)
    assert broker_context(plain, None) is default
    spec = ListenerSpec(
        "127.0.0.1", 0, "127.0.0.1", 9092, broker_ssl=default, broker_identities=(("alice", alice),)
    )
    assert broker_context(spec, "alice") is alice
    for cn in ("bob", None):
        with pytest.raises(NoBrokerIdentity):
            broker_context(spec, cn)
    peer: dict[str, object] = {"subject": ((("organizationName", "x"),), (("commonName", "alice"),))}
    assert client_common_name(peer) == "alice" and client_common_name(None) is None


def test_broker_identities_need_verified_client_certificates() -> None:
    from kpconfig.model import BrokerIdentity, TapListenerConfig

    identity = {"alice": BrokerIdentity(certfile="a.pem", keyfile="a.key")}
    with pytest.raises(ValueError, match="broker_identities need"):
        TapListenerConfig(listen="127.0.0.1:1", broker="b:9093", broker_tls=True, broker_identities=identity)
    TapListenerConfig(
        listen="127.0.0.1:1",
        broker="b:9093",
        tls_certfile="t.pem",
        tls_keyfile="t.key",
        tls_client_cafile="ca.pem",
        broker_tls=True,
        broker_identities=identity,
    )
