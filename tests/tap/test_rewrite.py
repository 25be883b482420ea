"""Opt-in response rewriting: broker addresses to the tap's, ApiVersions clamped to the codec."""

from __future__ import annotations

import asyncio
import random
import struct
import uuid

import pytest
from confluent_kafka import Producer

import codec
from codec.samples import random_response_body
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings
from tap.rewrite import rewrite_response
from tests.tap.conftest import TappedCluster
from tests.tap.harness import TapThread
from tests.tap.helpers import frame, parts

TAP = {1: ("tap.example", 29092), 2: ("tap.example", 29093)}


def _broker(node: int) -> dict[str, object]:
    return {"NodeId": node, "Host": f"broker{node}", "Port": 9092, "Rack": None}


METADATA_VERSIONS = range(codec.supported_versions(3)[0], codec.supported_versions(3)[1] + 1)


@pytest.mark.parametrize("version", METADATA_VERSIONS)
def test_metadata_brokers_point_at_the_tap(version: int) -> None:
    body = random_response_body(3, version, random.Random(version))
    body["Brokers"] = [_broker(1), _broker(2), _broker(3)]
    raw = codec.encode_response(3, version, 7, body)
    out = rewrite_response(raw, 3, version, TAP)
    assert out is not None
    brokers = codec.decode_response(out, 3, version).body["Brokers"]
    assert [(b["Host"], b["Port"]) for b in brokers] == [TAP[1], TAP[2], ("broker3", 9092)]
    assert rewrite_response(out, 3, version, TAP) is None  # already rewritten: unchanged


def test_find_coordinator_old_and_new_shapes() -> None:
    old = random_response_body(10, 3, random.Random(0))
    old.update(ErrorCode=0, NodeId=2, Host="broker2", Port=9092)
    out = rewrite_response(codec.encode_response(10, 3, 1, old), 10, 3, TAP)
    assert out is not None
    body = codec.decode_response(out, 10, 3).body
    assert (body["Host"], body["Port"]) == TAP[2]
    new = random_response_body(10, 6, random.Random(0))
    new["Coordinators"] = [
        {"Key": "g", "NodeId": 1, "Host": "broker1", "Port": 9092, "ErrorCode": 0, "ErrorMessage": None}
    ]
    out = rewrite_response(codec.encode_response(10, 6, 1, new), 10, 6, TAP)
    assert out is not None
    assert codec.decode_response(out, 10, 6).body["Coordinators"][0]["Host"] == "tap.example"


def test_api_versions_clamped_to_the_codec() -> None:
    body = {
        "ErrorCode": 0,
        "ApiKeys": [
            {"ApiKey": 0, "MinVersion": 0, "MaxVersion": 999},
            {"ApiKey": 3000, "MinVersion": 0, "MaxVersion": 1},
        ],
        "ThrottleTimeMs": 0,
    }
    out = rewrite_response(codec.encode_response(18, 3, 1, body), 18, 3, {}, clamp=True)
    assert out is not None
    keys = codec.decode_response(out, 18, 3).body["ApiKeys"]
    assert [(k["ApiKey"], k["MaxVersion"]) for k in keys] == [(0, codec.supported_versions(0)[1])]


def test_undecodable_response_is_forwarded_unchanged() -> None:
    assert rewrite_response(b"\x00\x00\x00\x01\xff", 3, 12, TAP) is None


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_proxy_reframes_held_responses_and_streams_the_rest(loop_kind: str) -> None:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        _reframe_case()
    finally:
        asyncio.set_event_loop_policy(None)


def _reframe_case() -> None:
    metadata = random_response_body(3, 12, random.Random(1))
    metadata["Brokers"] = [_broker(1)]

    async def run() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(3):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                req = await reader.readexactly(size)
                api_key, corr = struct.unpack_from(">h", req)[0], struct.unpack_from(">i", req, 4)[0]
                if api_key == 3:
                    # Sent in tiny pieces to exercise the reframer's partial states.
                    data = frame(codec.encode_response(3, 12, corr, metadata))
                    for i in range(len(data)):
                        writer.write(data[i : i + 1])
                        await writer.drain()
                else:
                    writer.write(frame(struct.pack(">i", corr) + b"\x00\x00"))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        tap = Tap(
            [ListenerSpec("127.0.0.1", 0, "127.0.0.1", server.sockets[0].getsockname()[1], 1)],
            MemoryMirror(),
            TapSettings(rewrite_broker_addresses=True),
        )
        ((_, port),) = await tap.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(codec.encode_request(18, 0, 1, "c", {})))
        writer.write(
            frame(
                codec.encode_request(
                    3,
                    12,
                    2,
                    "c",
                    {
                        "Topics": None,
                        "AllowAutoTopicCreation": False,
                        "IncludeTopicAuthorizedOperations": False,
                    },
                )
            )
        )
        writer.write(frame(codec.encode_request(18, 0, 3, "c", {})))
        await writer.drain()
        got = []
        for _ in range(3):
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            got.append(await reader.readexactly(size))
        assert struct.unpack_from(">i", got[0])[0] == 1 and struct.unpack_from(">i", got[2])[0] == 3
        body = codec.decode_response(got[1], 3, 12).body
        assert (body["Brokers"][0]["Host"], body["Brokers"][0]["Port"]) == ("127.0.0.1", port)
        writer.close()
        await tap.stop()
        server.close()

    asyncio.run(run())


@pytest.mark.integration
def test_real_client_stays_on_the_tap_without_advertised_listeners(tapped_cluster: TappedCluster) -> None:
    # The internal listener advertises the broker itself: only rewriting keeps the client on the tap.
    host, port = tapped_cluster.mirror_bootstrap.split(",")[0].rsplit(":", 1)
    sink = MemoryMirror()
    t = TapThread(
        [ListenerSpec("127.0.0.1", 0, host, int(port), 1)], sink, TapSettings(rewrite_broker_addresses=True)
    ).start()
    try:
        bootstrap = f"127.0.0.1:{t.bound[0][1]}"
        producer = Producer({"bootstrap.servers": bootstrap})
        topic = f"rw-{uuid.uuid4().hex[:6]}"
        for _ in range(10):
            producer.produce(topic, b"x")
        assert producer.flush(30) == 0
        del producer
        t.wait_idle()
    finally:
        t.stop()
    apis = {p.api_key for _, p in parts(sink.records) if p.direction == "req"}
    assert 0 in apis, "produce requests went through the tap"
    assert t.metric("kpmon_tap_rewritten_total") > 0


@pytest.mark.parametrize(("api_key", "version"), [(0, 10), (0, 13), (1, 16), (1, 18), (78, 2), (79, 2)])
def test_node_endpoints_point_at_the_tap(api_key: int, version: int) -> None:
    body = random_response_body(api_key, version, random.Random(api_key))
    body["NodeEndpoints"] = [{"NodeId": 2, "Host": "broker2", "Port": 9092, "Rack": None}]
    out = rewrite_response(codec.encode_response(api_key, version, 3, body), api_key, version, TAP)
    assert out is not None
    endpoint = codec.decode_response(out, api_key, version).body["NodeEndpoints"][0]
    assert (endpoint["Host"], endpoint["Port"]) == TAP[2]


def test_advertised_address_from_config_wins() -> None:
    from kpconfig.model import TapConfig, TapListenerConfig
    from tap.app import listener_specs

    cfg = TapConfig(
        listeners=[
            TapListenerConfig(
                listen="0.0.0.0:0", broker="127.0.0.1:9", broker_id=4, advertise="tap.example:29094"
            )
        ]
    )

    async def run() -> dict[int, tuple[str, int]]:
        tap = Tap(listener_specs(cfg), MemoryMirror(), TapSettings(rewrite_broker_addresses=True))
        await tap.start()
        await tap.stop()
        return tap.addresses

    assert asyncio.run(run()) == {4: ("tap.example", 29094)}


@pytest.mark.parametrize(("api_key", "version"), [(0, 9), (0, 10), (0, 13), (1, 15), (1, 16), (1, 18)])
def test_produce_and_fetch_responses_without_endpoints_are_not_decoded(
    api_key: int, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a response whose top-level tags hold ``NodeEndpoints`` is decoded: the others, nearly all
    of them, pass as they are, found by a walk over the frame's wire sizes."""
    import tap.rewrite

    decoded: list[int] = []
    real = codec.decode_response

    def counting(*args: object, **kwargs: object) -> object:
        decoded.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tap.rewrite.codec, "decode_response", counting)
    body = random_response_body(api_key, version, random.Random(version))
    body.pop("NodeEndpoints", None)
    plain = codec.encode_response(api_key, version, 3, body)
    assert not tap.rewrite.may_carry_endpoints(plain, api_key, version)
    assert rewrite_response(plain, api_key, version, TAP) is None
    assert decoded == []
    if version >= (10 if api_key == 0 else 16):
        body["NodeEndpoints"] = [{"NodeId": 2, "Host": "broker2", "Port": 9092, "Rack": None}]
        hinted = codec.encode_response(api_key, version, 3, body)
        assert tap.rewrite.may_carry_endpoints(hinted, api_key, version)
        assert rewrite_response(hinted, api_key, version, TAP) is not None
        assert decoded == [1]


@pytest.mark.parametrize("api_key", [0, 1, 78, 79])
@pytest.mark.parametrize("seed", range(5))
def test_the_tag_walk_reads_every_version_as_the_codec_does(api_key: int, seed: int) -> None:
    from tap.capture import FrameInfo, header_end
    from tap.rewrite import _endpoints_field
    from tap.strip import top_level_tags

    low, high = codec.supported_versions(api_key)
    for version in range(low, high + 1):
        body = random_response_body(api_key, version, random.Random(seed * 100 + version))
        raw = codec.encode_response(api_key, version, 3, body)
        tags = top_level_tags(
            raw, header_end(raw, FrameInfo("resp", len(raw), api_key, version)), api_key, False, version
        )
        field = _endpoints_field(api_key, version)
        if field is not None and field.tagged_at(version):
            assert (field.tag in tags) == bool(body.get("NodeEndpoints")), (
                version,
                body.get("NodeEndpoints"),
            )
