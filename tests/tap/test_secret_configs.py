"""Password-type config values never leave the tap: the generated list, the name rule, every carrier."""

from __future__ import annotations

import random
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codec
from codec.protocol import ApiKey
from codec.samples import random_request_body, random_response_body
from tap.capture import (
    CONFIG_TYPE_PASSWORD,
    CONFIG_VALUES,
    Direction,
    FrameInfo,
    capture,
    request_is_sensitive_envelope,
)
from tap.secret_configs import JSON_PATH, is_password_config, password_configs

MARKER = "s3cr3t-CONFIG-value-9f2"
KEEP = "kept-ordinary-value-71c"
POLICIES = ("full", "headers", "meta")
PREFIXES = ("", "listener.name.sasl_ssl.", "listener.name.external.scram-sha-512.", "producer.override.")


def test_the_committed_list_is_what_the_jars_define() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "deploy.password_configs_gen", "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert JSON_PATH.is_file()


def test_kafkas_password_configs_are_in_the_list() -> None:
    names = password_configs()
    for name in ("sasl.jaas.config", "ssl.keystore.password", "ssl.key.password", "ssl.truststore.password"):
        assert name in names
    assert "password.encoder.secret" in names  # 3.9's, still redacted for 3.x brokers


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("ssl.keystore.password", True),
        ("listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config", True),
        ("listener.name.internal.ssl.key.password", True),
        ("consumer.override.sasl.jaas.config", True),
        ("SSL.KEYSTORE.PASSWORD", True),
        ("my.plugin.client.secret", True),
        ("vault.credentials", True),
        ("ssl.keystore.location", False),
        ("retention.ms", False),
        ("cleanup.policy", False),
        ("sasl.enabled.mechanisms", False),
        ("secretary.name", False),
        ("", False),
        (None, False),
    ],
)
def test_which_names_are_secret(name: str | None, secret: bool) -> None:
    assert is_password_config(name) is secret


def _entries(node: Any, parts: list[str]) -> list[dict[str, Any]]:
    if node is None:
        return []
    if not parts:
        return [node]
    name, rest = parts[0], parts[1:]
    if name.endswith("[]"):
        return [e for item in node.get(name[:-2]) or () for e in _entries(item, rest)]
    return _entries(node.get(name), rest)


def _config_frame(
    api_key: int, direction: Direction, version: int, seed: int, secret_name: str
) -> bytes | None:
    """A valid frame whose first config entry is ``secret_name`` = MARKER and the others ordinary."""
    rng = random.Random(seed)
    for _ in range(300):
        body = (random_request_body if direction == "req" else random_response_body)(api_key, version, rng)
        entries = [
            (where, e)
            for where in CONFIG_VALUES[(api_key, direction)]
            for e in _entries(body, where.path.split("."))
        ]
        if any(where.value in e for where, e in entries):
            break
    else:
        return None
    planted = False
    for where, entry in entries:
        if where.value not in entry:
            continue
        entry[where.name] = secret_name if not planted else f"ordinary.setting.{rng.randrange(99)}"
        entry[where.value] = MARKER if not planted else KEEP
        if planted:
            for key, ordinary in (("IsSensitive", False), ("ConfigType", 2)):
                if key in entry:
                    entry[key] = ordinary
        for synonym in entry.get("Synonyms") or ():
            synonym["Name"], synonym["Value"] = entry[where.name], entry[where.value]
        planted = True
    if direction == "req":
        return codec.encode_request(api_key, version, 42, "admin", body)
    return codec.encode_response(api_key, version, 42, body)


#: CreateTopics answers carry configs from v5 on.
_FIRST_VERSION: dict[tuple[int, Direction], int] = {(ApiKey.CREATE_TOPICS, "resp"): 5}
CASES = [
    (api_key, direction, version)
    for (api_key, direction) in CONFIG_VALUES
    for version in range(
        max(codec.supported_versions(api_key)[0], _FIRST_VERSION.get((api_key, direction), 0)),
        codec.supported_versions(api_key)[1] + 1,
    )
]


@pytest.mark.parametrize(("api_key", "direction", "version"), CASES)
@settings(max_examples=8, deadline=None)
@given(
    name=st.sampled_from(sorted(password_configs())),
    prefix=st.sampled_from(PREFIXES),
    policy=st.sampled_from(POLICIES),
    seed=st.integers(0, 1000),
)
def test_password_config_values_never_leave(
    api_key: int, direction: Direction, version: int, name: str, prefix: str, policy: str, seed: int
) -> None:
    frame = _config_frame(api_key, direction, version, seed, prefix + name)
    assert frame is not None, "no sample body with a config entry"
    assert MARKER.encode() in frame
    info = FrameInfo(direction, len(frame), api_key, version)
    out = capture(frame, info, policy, 900_000)  # type: ignore[arg-type]
    assert MARKER.encode() not in out.value
    if policy == "meta":
        return
    assert f"config:{prefix}{name}" in out.redacted
    # Only the secret went: the frame still decodes and ordinary configs keep their values.
    assert (KEEP.encode() in out.value) == (KEEP.encode() in frame)
    if direction == "req":
        assert codec.decode_request(out.value).api_key == api_key
    else:
        codec.decode_response(out.value, api_key, version)


def test_frames_without_password_configs_are_mirrored_byte_for_byte() -> None:
    body = {
        "Resources": [
            {"ResourceType": 2, "ResourceName": "t", "Configs": [{"Name": "retention.ms", "Value": "1"}]}
        ],
        "ValidateOnly": False,
    }
    frame = codec.encode_request(ApiKey.ALTER_CONFIGS, 2, 5, "admin", body)
    out = capture(frame, FrameInfo("req", len(frame), ApiKey.ALTER_CONFIGS, 2), "full", 900_000)
    assert out.value == frame and out.redacted == ()


def _describe_configs_response(name: str, sensitive: bool, config_type: int) -> bytes:
    entry = {
        "Name": name,
        "Value": MARKER,
        "ReadOnly": False,
        "ConfigSource": 1,
        "IsSensitive": sensitive,
        "Synonyms": [{"Name": name, "Value": MARKER, "Source": 1}],
        "ConfigType": config_type,
        "Documentation": None,
    }
    body = {
        "ThrottleTimeMs": 0,
        "Results": [
            {"ErrorCode": 0, "ErrorMessage": None, "ResourceType": 4, "ResourceName": "1", "Configs": [entry]}
        ],
    }
    return codec.encode_response(ApiKey.DESCRIBE_CONFIGS, 4, 3, body)


@pytest.mark.parametrize(("sensitive", "config_type"), [(True, 2), (False, CONFIG_TYPE_PASSWORD)])
def test_describe_configs_trusts_the_brokers_own_flags(sensitive: bool, config_type: int) -> None:
    # A plug-in's secret that no jar names: the broker marks it sensitive (or typed PASSWORD).
    frame = _describe_configs_response("custom.plugin.token.value", sensitive, config_type)
    out = capture(frame, FrameInfo("resp", len(frame), ApiKey.DESCRIBE_CONFIGS, 4), "full", 900_000)
    assert MARKER.encode() not in out.value
    entry = codec.decode_response(out.value, ApiKey.DESCRIBE_CONFIGS, 4).body["Results"][0]["Configs"][0]
    assert entry["Value"] is None and entry["Synonyms"][0]["Value"] is None


def _envelope(inner: bytes) -> bytes:
    body = {"RequestData": inner, "RequestPrincipal": b"User:admin", "ClientHostAddress": b"\x7f\x00\x00\x01"}
    return codec.encode_request(ApiKey.ENVELOPE, 0, 9, "broker", body)


def test_an_envelope_keeps_its_body_with_the_inner_password_blanked() -> None:
    """KIP-590 forwards config requests in Envelopes; the envelope check needs the inner request."""
    configs = [{"Name": "sasl.jaas.config", "Value": MARKER}, {"Name": "retention.ms", "Value": KEEP}]
    inner = codec.encode_request(
        ApiKey.ALTER_CONFIGS,
        2,
        1,
        "admin",
        {"Resources": [{"ResourceType": 4, "ResourceName": "1", "Configs": configs}], "ValidateOnly": False},
    )
    frame = _envelope(inner)
    out = capture(frame, FrameInfo("req", len(frame), ApiKey.ENVELOPE, 0), "full", 900_000)
    assert MARKER.encode() not in out.value and out.redacted == ("config:sasl.jaas.config",)
    data = codec.decode_request(out.value).body["RequestData"]
    entries = codec.decode_request(bytes(data.raw)).body["Resources"][0]["Configs"]
    assert [(e["Name"], e["Value"]) for e in entries] == [("sasl.jaas.config", None), ("retention.ms", KEEP)]
    for policy in ("headers", "meta"):
        hidden = capture(frame, FrameInfo("req", len(frame), ApiKey.ENVELOPE, 0), policy, 900_000)
        assert MARKER.encode() not in hidden.value
    # Its answer cannot carry configs: shown. A CreateTopics answer can: hidden.
    assert not request_is_sensitive_envelope(frame)
    create = codec.encode_request(
        ApiKey.CREATE_TOPICS, 7, 1, "forged", {"Topics": [], "ValidateOnly": True, "TimeoutMs": 1}
    )
    assert request_is_sensitive_envelope(_envelope(create))
    plain = _envelope(create)
    assert capture(plain, FrameInfo("req", len(plain), ApiKey.ENVELOPE, 0), "full", 900_000).value == plain
