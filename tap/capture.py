"""Capture policy and secret redaction: a pure function from one frame to the tap record's value.

Nothing here touches sockets or the producer, so every policy and every secret can be tested on
bytes alone. Secrets never leave in any policy: secret-bearing frames are decoded, the secret
fields blanked and the frame re-encoded; when that is impossible the record carries the frame
header only (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import codec
import codec.peek
from codec.errors import DecodeError
from codec.protocol import ApiKey
from codec.taprecord import SASL_TOKEN, Header
from tap.secret_configs import is_password_config
from tap.strip import strip_frame

Policy = Literal["full", "headers", "meta"]
Direction = Literal["req", "resp"]


#: Secret-bearing fields per (api key, direction), as dotted paths; ``[]`` walks an array.
SECRETS: dict[tuple[int, Direction], tuple[str, ...]] = {
    (ApiKey.SASL_AUTHENTICATE, "req"): ("AuthBytes",),
    (ApiKey.SASL_AUTHENTICATE, "resp"): ("AuthBytes",),
    (ApiKey.ALTER_USER_SCRAM_CREDENTIALS, "req"): ("Upsertions[].Salt", "Upsertions[].SaltedPassword"),
    (ApiKey.CREATE_DELEGATION_TOKEN, "resp"): ("Hmac",),
    (ApiKey.RENEW_DELEGATION_TOKEN, "req"): ("Hmac",),
    (ApiKey.EXPIRE_DELEGATION_TOKEN, "req"): ("Hmac",),
    (ApiKey.DESCRIBE_DELEGATION_TOKEN, "resp"): ("Tokens[].Hmac",),
}


@dataclass(frozen=True, slots=True)
class ConfigEntries:
    """Where a message carries config name/value pairs: ``path`` walks to the entry list."""

    path: str
    name: str = "Name"
    value: str = "Value"
    #: What a secret value becomes: null where the field is nullable (Kafka's own DescribeConfigs
    #: answer for a sensitive config), else the empty string.
    blank: str | None = None


_TOPIC_CONFIGS = ("RepartitionSourceTopics[].TopicConfigs[]", "StateChangelogTopics[].TopicConfigs[]")

#: Every message that carries config values (from the schema table: fields named Configs/TopicConfigs
#: with a Value). The values of password-type configs (``tap/secret_configs.py``) are blanked.
CONFIG_VALUES: dict[tuple[int, Direction], tuple[ConfigEntries, ...]] = {
    (ApiKey.CREATE_TOPICS, "req"): (ConfigEntries("Topics[].Configs[]"),),
    (ApiKey.CREATE_TOPICS, "resp"): (ConfigEntries("Topics[].Configs[]"),),
    (ApiKey.ALTER_CONFIGS, "req"): (ConfigEntries("Resources[].Configs[]"),),
    (ApiKey.INCREMENTAL_ALTER_CONFIGS, "req"): (ConfigEntries("Resources[].Configs[]"),),
    (ApiKey.DESCRIBE_CONFIGS, "resp"): (ConfigEntries("Results[].Configs[]"),),
    (ApiKey.STREAMS_GROUP_HEARTBEAT, "req"): tuple(
        ConfigEntries(f"Topology.Subtopologies[].{p}", "Key", blank="") for p in _TOPIC_CONFIGS
    ),
    (ApiKey.STREAMS_GROUP_DESCRIBE, "resp"): tuple(
        ConfigEntries(f"Groups[].Topology.Subtopologies[].{p}", "Key", blank="") for p in _TOPIC_CONFIGS
    ),
}
#: ``DescribeConfigsResponse.ConfigType`` of a password (Kafka's ``ConfigDef.Type.PASSWORD``).
CONFIG_TYPE_PASSWORD = 9

_SECRET_REQUEST_KEYS = frozenset(k for (k, d) in SECRETS if d == "req")
_SECRET_RESPONSE_KEYS = frozenset(k for (k, d) in SECRETS if d == "resp")
#: Inner APIs whose whole Envelope request is hidden: a secret field may sit anywhere in it.
_HIDDEN_ENVELOPE_REQUESTS = _SECRET_REQUEST_KEYS | _SECRET_RESPONSE_KEYS
#: Inner APIs whose Envelope response is hidden: the inner answer cannot be decoded without the inner
#: request's version, so answers that may carry secrets or config values go header-only.
_HIDDEN_ENVELOPE_RESPONSES = _HIDDEN_ENVELOPE_REQUESTS | frozenset(
    k for (k, d) in CONFIG_VALUES if d == "resp"
)
#: Inner requests that may carry config values: the Envelope keeps its body, the inner values are blanked
#: (KIP-590 forwards CreateTopics and IncrementalAlterConfigs in Envelopes; the envelope check needs them).
_CONFIG_REQUEST_KEYS = frozenset(k for (k, d) in CONFIG_VALUES if d == "req")

#: Where the headers policy strips record payloads.
_RECORDS: frozenset[tuple[int, Direction]] = frozenset(
    {(ApiKey.PRODUCE, "req"), (ApiKey.FETCH, "resp"), (ApiKey.SHARE_FETCH, "resp")}
)


@dataclass(frozen=True, slots=True)
class FrameInfo:
    direction: Direction
    #: Original frame size (without the size prefix); ``head`` may hold fewer bytes.
    size: int
    api_key: int | None = None
    api_version: int | None = None
    #: A raw SASL token (after SaslHandshake v0): no Kafka header, all secret.
    sasl_token: bool = False
    #: A response whose request was secret-bearing in a way the response cannot show (an Envelope).
    sensitive: bool = False


@dataclass(frozen=True, slots=True)
class Captured:
    value: bytes
    redacted: tuple[str, ...] = ()
    #: Extra record headers: ``truncated``, ``orig_size``, ``redaction_failed``, ``capture_fallback``.
    flags: dict[str, str] = field(default_factory=dict)


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 28:
            raise DecodeError("bad unsigned varint", pos, what="ResponseHeader")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def header_end(head: bytes, info: FrameInfo) -> int:
    """Length of the frame's Kafka header (0 for raw SASL tokens). Raises DecodeError."""
    if info.sasl_token:
        return 0
    if info.direction == "req":
        return codec.decode_request_header(head)[2]
    if len(head) < 4:
        raise DecodeError("response header needs 4 bytes", 0, what="ResponseHeader")
    if info.api_key is None or info.api_version is None:
        return 4
    try:
        hv = codec.response_header_version(info.api_key, info.api_version)
    except (DecodeError, KeyError, ValueError):
        return 4
    if hv == 0:
        return 4
    count, pos = _uvarint(head, 4)
    for _ in range(count):
        _, pos = _uvarint(head, pos)
        size, pos = _uvarint(head, pos)
        pos += size
    if pos > len(head):
        raise DecodeError("tagged fields run past the frame", pos, what="ResponseHeader")
    return pos


def _blank(node: Any, parts: list[str]) -> bool:
    """Blank the field at ``parts`` under ``node``; True if at least one value was present."""
    if not parts or node is None:
        return False
    name, rest = parts[0], parts[1:]
    if name.endswith("[]"):
        items = node.get(name[:-2]) if isinstance(node, dict) else None
        hit = False
        for item in items or ():
            hit = _blank(item, rest) or hit
        return hit
    if not isinstance(node, dict) or name not in node:
        return False
    if rest:
        return _blank(node[name], rest)
    node[name] = b"" if node[name] is not None else None
    return True


def _walk(node: Any, parts: list[str]) -> list[dict[str, Any]]:
    """The dicts at ``parts`` under ``node`` (``name[]`` walks an array, a plain name a struct)."""
    if node is None:
        return []
    if not parts:
        return [node] if isinstance(node, dict) else []
    if not isinstance(node, dict):
        return []
    name, rest = parts[0], parts[1:]
    if name.endswith("[]"):
        return [hit for item in node.get(name[:-2]) or () for hit in _walk(item, rest)]
    return _walk(node.get(name), rest)


def _is_secret_entry(entry: dict[str, Any], where: ConfigEntries) -> bool:
    return bool(
        is_password_config(entry.get(where.name))
        or entry.get("IsSensitive")
        or entry.get("ConfigType") == CONFIG_TYPE_PASSWORD
    )


def redact_configs(body: dict[str, Any], places: tuple[ConfigEntries, ...]) -> list[str]:
    """Blank the value of every password-type config in ``body``; the names of those that had one.

    DescribeConfigs synonyms of a secret config are blanked with it (they hold the same kind of value,
    set at another level).
    """
    names: list[str] = []
    for where in places:
        for entry in _walk(body, where.path.split(".")):
            secret = _is_secret_entry(entry, where)
            hit = False
            if secret and entry.get(where.value) not in (None, ""):
                entry[where.value] = where.blank
                hit = True
            for synonym in entry.get("Synonyms") or ():
                if (secret or is_password_config(synonym.get("Name"))) and synonym.get("Value") not in (
                    None,
                    "",
                ):
                    synonym["Value"] = where.blank
                    hit = True
            if hit:
                names.append(f"config:{entry.get(where.name)}")
    return names


def _strip_records(node: Any, strip: Callable[[bytes], bytes]) -> None:
    if isinstance(node, list):
        for item in node:
            _strip_records(item, strip)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Records" and value is not None:
                raw = value if isinstance(value, bytes | bytearray) else getattr(value, "raw", None)
                if raw is not None:
                    node[key] = strip(bytes(raw))
            elif isinstance(value, list | dict):
                _strip_records(value, strip)


def _strip_payloads() -> Callable[[bytes], bytes] | None:
    try:
        from codec.records import strip_payloads  # written alongside the codec; may land later
    except ImportError:
        return None
    fn: Callable[[bytes], bytes] = strip_payloads
    return fn


def _stripped(frame: bytes, info: FrameInfo, strip: Callable[[bytes], bytes]) -> bytes:
    """``frame`` with its record payloads stripped: spliced where the frame walks (tap/strip.py),
    else decoded, stripped and encoded again."""
    assert info.api_key is not None
    if info.api_version is not None:
        try:
            return strip_frame(
                frame, header_end(frame, info), info.api_key, info.direction == "req", info.api_version, strip
            )
        except DecodeError:
            pass
    message = _decode(frame, info)
    _strip_records(message.body, strip)
    return codec.encode(message)


def _inner_api_key(frame: bytes) -> int | None:
    """The API key of an Envelope request's inner request; None when it cannot be read."""
    try:
        request = codec.decode_request(frame)
        data = request.body.get("RequestData")
        raw = getattr(data, "raw", data)
        if not isinstance(raw, bytes | bytearray):
            return None
        return int(codec.peek.peek_request_header(bytes(raw)).api_key)
    except Exception:
        return None


def request_is_sensitive_envelope(frame: bytes) -> bool:
    """An Envelope request whose response must be hidden: its inner request carries secrets, its inner
    answer may carry config values, or it cannot be read (fail closed)."""
    inner = _inner_api_key(frame)
    return inner is None or inner in _HIDDEN_ENVELOPE_RESPONSES


def _redact_envelope_configs(message: codec.Request) -> list[str]:
    """Blank password-type config values inside an Envelope's inner request; the configs' names."""
    data = message.body.get("RequestData")
    raw = getattr(data, "raw", data)
    if not isinstance(raw, bytes | bytearray):
        raise DecodeError("Envelope without readable RequestData", 0, what="Envelope")
    inner = codec.decode_request(bytes(raw))
    names = redact_configs(inner.body, CONFIG_VALUES.get((inner.api_key, "req"), ()))
    if names:
        message.body["RequestData"] = codec.encode(inner)
    return names


def secret_fields(info: FrameInfo) -> tuple[str, ...]:
    if info.sasl_token:
        return (SASL_TOKEN,)
    if info.api_key is None:
        return ()
    if info.api_key == ApiKey.ENVELOPE and info.sensitive:
        return ("ResponseData",)
    return SECRETS.get((info.api_key, info.direction), ())


def _decode(frame: bytes, info: FrameInfo) -> codec.Request | codec.Response:
    if info.direction == "req":
        return codec.decode_request(frame)
    if info.api_key is None or info.api_version is None:
        raise DecodeError("response without a matching request", 0, what="ResponseHeader")
    return codec.decode_response(frame, info.api_key, info.api_version)


def capture(head: bytes, info: FrameInfo, policy: Policy, max_bytes: int) -> Captured:
    """The tap record value for one frame: ``head`` is the frame (or its first bytes if truncated)."""
    flags: dict[str, str] = {}
    secrets = secret_fields(info)
    if info.sasl_token:
        return Captured(b"", secrets, {Header.ORIG_SIZE: str(info.size)})
    envelope_configs = False
    if info.api_key == ApiKey.ENVELOPE and info.direction == "req" and len(head) == info.size:
        inner = _inner_api_key(head)
        if inner is None or inner in _HIDDEN_ENVELOPE_REQUESTS:
            secrets = ("RequestData",)
        envelope_configs = inner in _CONFIG_REQUEST_KEYS

    def header_only(extra: dict[str, str] | None = None) -> Captured:
        # The header is located lazily: the full policy's common case never needs it. An unreadable
        # header leaves nothing that is known to be safe, so the value is then empty.
        try:
            value = head[: header_end(head, info)]
        except DecodeError:
            value = b""
            extra = {**(extra or {}), Header.HEADER_ERROR: "1"}
        return Captured(value, secrets, {**flags, **(extra or {})})

    if policy == "meta":
        return header_only()
    if len(head) < info.size or info.size > max_bytes:
        flags.update({Header.TRUNCATED: "1", Header.ORIG_SIZE: str(info.size)})
        return header_only()
    if info.api_key == ApiKey.ENVELOPE and secrets:
        return header_only()
    value = head
    configs = CONFIG_VALUES.get((info.api_key, info.direction), ()) if info.api_key is not None else ()
    if secrets or configs or envelope_configs:
        try:
            message = _decode(head, info)
            for path in secrets:
                _blank(message.body, path.split("."))
            config_names = redact_configs(message.body, configs)
            if envelope_configs:
                config_names += _redact_envelope_configs(message)  # type: ignore[arg-type]
            if secrets or config_names:
                value = codec.encode(message)
        except Exception:
            # Fail closed: a secret-bearing frame we cannot rewrite is mirrored header-only.
            return header_only({Header.REDACTION_FAILED: "1"})
        secrets = (*secrets, *config_names)
    if policy == "headers" and info.api_key is not None and (info.api_key, info.direction) in _RECORDS:
        strip = _strip_payloads()
        try:
            if strip is None:
                raise RuntimeError("codec.records.strip_payloads is not available")
            value = _stripped(value, info, strip)
        except Exception:
            return header_only({Header.CAPTURE_FALLBACK: "meta"})
    if len(value) > max_bytes:
        flags.update({Header.TRUNCATED: "1", Header.ORIG_SIZE: str(info.size)})
        return header_only()
    return Captured(value, secrets, flags)
