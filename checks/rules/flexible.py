"""Flexible versions and tagged fields (KIP-482), keyed by connection.

``flex.header_version`` (warning)
    A frame whose header version does not match whether its API version is flexible: a flexible
    request needs request header v2 (v1 plus a tagged-field section), a flexible response needs
    response header v1 (ApiVersions answers always use v0). Such a frame is either undecodable, or
    decodes with bytes left over, because every body field is read one byte off. The rule re-decodes
    the raw frame with the other header version(s); if that decodes cleanly, with nothing left over, the
    header version was the fault. Needs ``TapFrame.raw`` (the mirrored bytes); frames captured without
    their body cannot be judged. Undecodable frames reach the rule through ``on_undecodable`` (the
    engine still reports ``frame.decode_error`` for them: they are undecodable as sent).
    Once per connection, direction, api and version.

``flex.tagged_fields``
    Walks the decoded header and body (nested structs, arrays and decoded consumer-protocol payloads)
    for the codec's KIP-482 evidence. ``_tag_anomalies`` -- tags not ascending, repeated, or a known tag
    whose value does not fill its declared size -- are ``warning``: a strict peer rejects such a frame.
    ``_unknown_tags`` are ``info``: newer peers may legitimately send tags this codec does not know.
    Once per connection, direction, api, version, tag (and problem).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import codec
from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, State
from codec.api import Request, Response
from codec.nested import EmbeddedRequest, EmbeddedResponse, VersionedData
from codec.records import RecordBatches
from codec.taprecord import TapFrame

RULE_HEADER = "flex.header_version"
RULE_TAGS = "flex.tagged_fields"


def walk_tags(value: Any, path: str = "") -> Iterator[tuple[str, str, dict[str, Any]]]:
    """("anomaly" | "unknown", path, detail) for every tagged-field finding in a decoded value.

    Envelope payloads are skipped: the engine dispatches the inner request and response as exchanges
    of their own, which this rule then walks (under ``envelope.inner_``).
    """
    if isinstance(value, dict):
        for anomaly in value.get("_tag_anomalies") or []:
            yield "anomaly", path, dict(anomaly)
        for tag, data in (value.get("_unknown_tags") or {}).items():
            yield "unknown", path, {"tag": int(tag), "size": len(data)}
        for name, child in value.items():
            if not name.startswith("_"):
                yield from walk_tags(child, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from walk_tags(child, f"{path}[{i}]")
    elif isinstance(value, VersionedData) and value.value is not None:
        yield from walk_tags(value.value, path)
    elif isinstance(value, EmbeddedRequest | EmbeddedResponse):
        return


def has_tag_evidence(value: Any) -> bool:
    """Whether ``walk_tags`` could yield anything for ``value``: a cheap scan without paths.

    Almost every frame has empty tagged sections, so the rule checks this first and walks (building
    paths) only when there is something to report. Iterative and type-dispatched: a generator per
    node made the walk the most expensive part of the whole catalogue (see benchmarks/checks_bench.py).
    It may look into more than ``walk_tags`` does (``_``-keys, Envelope payloads), never less.
    """
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        kind = type(node)
        if kind is dict:
            if "_tag_anomalies" in node or "_unknown_tags" in node:
                return True
            children: Any = node.values()
        elif kind is list:
            children = node
        elif isinstance(node, VersionedData):
            if node.value is not None:
                push(node.value)
            continue
        else:
            continue
        for child in children:
            if type(child) not in _LEAVES:
                push(child)
    return False


#: Value types that never hold tagged fields (everything the codec decodes to except dicts, lists and
#: nested payloads; record sets have no tagged sections).
_LEAVES = frozenset({int, str, bytes, bool, float, type(None), uuid.UUID, RecordBatches})


def redecode(frame: TapFrame, request_api: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """(header version used, header version expected) when the frame decodes cleanly only with another.

    ``request_api`` gives (api key, version) for responses, whose header does not name them.
    """
    raw = frame.raw
    if not raw:
        return None
    try:
        if frame.direction == "req":
            if len(raw) < 4:
                return None
            api_key = int.from_bytes(raw[0:2], "big", signed=True)
            version = int.from_bytes(raw[2:4], "big", signed=True)
            expected = codec.request_header_version(api_key, version)
            candidates = [hv for hv in (2, 1, 0) if hv != expected]
        else:
            if request_api is None:
                return None
            api_key, version = request_api
            expected = codec.response_header_version(api_key, version)
            candidates = [1 - expected]
    except codec.DecodeError:
        return None
    for hv in candidates:
        try:
            if frame.direction == "req":
                body = codec.decode_request(raw, header_version=hv).body
            else:
                body = codec.decode_response(raw, api_key, version, header_version=hv).body
        except codec.DecodeError:
            continue
        if "_trailing" not in body:
            return hv, expected
    return None


#: (api key, version) -> whether that version is flexible (False for one the codec does not know):
#: asked for every exchange, and the codec's answer walks its schema table.
_FLEXIBLE: dict[tuple[int, int], bool] = {}


def _flexible(api_key: int, api_version: int) -> bool:
    found = _FLEXIBLE.get((api_key, api_version))
    if found is None:
        try:
            found = codec.is_flexible(api_key, api_version)
        except codec.DecodeError:
            found = False
        if len(_FLEXIBLE) >= 4096:
            _FLEXIBLE.clear()
        _FLEXIBLE[(api_key, api_version)] = found
    return found


class FlexibleRule(Rule):
    name = "flex"
    key_kind = "conn"

    def keys(self, ex: Exchange) -> list[str]:
        return [ex.conn]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        req = ex.req
        self._tags(state, ex, "req", req, ctx)
        if "_trailing" in req.body and ex.envelope is None:
            self._header(state, ex.request, ex, None, ctx)

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if resp is None:
            return
        self._tags(state, ex, "resp", resp, ctx)
        if "_trailing" in resp.body and ex.response is not None:
            self._header(state, ex.response, ex, (ex.api_key, ex.api_version), ctx)

    def on_quiet(self, state: State, hook: str, seq: int, api: tuple[int, int, int]) -> bool:
        """An exchange known by its headers carries no tagged-field evidence and no bytes left over
        (``checks.projections.TRANSITIONS``): nothing to judge."""
        return True

    def on_undecodable(self, state: State, key: str, frame: TapFrame, ctx: RuleContext) -> None:
        """An undecodable frame (engine hook): was its header version the fault?"""
        api = None
        if frame.direction == "resp" and frame.api_key is not None and frame.api_version is not None:
            api = (frame.api_key, frame.api_version)
        self._header(state, frame, None, api, ctx)

    def _header(
        self,
        state: State,
        frame: TapFrame,
        ex: Exchange | None,
        api: tuple[int, int] | None,
        ctx: RuleContext,
    ) -> None:
        found = redecode(frame, api)
        if found is None:
            return
        used, expected = found
        if frame.direction == "req" and frame.raw is not None:
            api_key = int.from_bytes(frame.raw[0:2], "big", signed=True)
            version = int.from_bytes(frame.raw[2:4], "big", signed=True)
        else:
            assert api is not None
            api_key, version = api
        sig = f"hdr|{frame.direction}|{api_key}|{version}"
        if not self._first(state, sig, ctx):
            return
        flexible = codec.is_flexible(api_key, version)
        kind = "request" if frame.direction == "req" else "response"
        evidence = ex.evidence() if ex is not None else {**frame.evidence(), "offsets": [frame.at()]}
        ctx.emit(
            RULE_HEADER,
            Severity.WARNING,
            f"conn:{frame.conn}",
            f"{codec.api_name(api_key)} v{version} {kind} uses {kind} header v{used}; that version is "
            f"{'flexible' if flexible else 'not flexible'}, so it needs header v{expected} (KIP-482)",
            frame.ts_ns,
            {
                **evidence,
                "direction": frame.direction,
                "api_key": api_key,
                "api_version": version,
                "header_version": used,
                "expected_header_version": expected,
                "client": frame.client,
                "broker": frame.broker,
            },
            conns=(frame.conn,),
        )

    def _tags(
        self, state: State, ex: Exchange, direction: str, message: Request | Response, ctx: RuleContext
    ) -> None:
        if not _flexible(ex.api_key, ex.api_version):
            return  # no tagged sections anywhere: skip walking big non-flexible bodies
        if message.tag_extras is False:
            return  # the decode saw no unknown tag and no anomaly: nothing to walk for
        header, body = message.header, message.body
        if not has_tag_evidence([header, body]):
            return
        frame = ex.request if direction == "req" else ex.response
        assert frame is not None
        for kind, path, detail in [
            *((k, "header" + ("." + p if p else ""), d) for k, p, d in walk_tags(header)),
            *((k, p, d) for k, p, d in walk_tags(body)),
        ]:
            anomaly = kind == "anomaly"
            problem = str(detail.get("problem", "unknown tag"))
            sig = (
                f"tag|{direction}|{ex.api_key}|{ex.api_version}|{detail['tag']}|{problem if anomaly else ''}"
            )
            if not self._first(state, sig, ctx):
                continue
            where = path or "body"
            what = f"{problem} (tag {detail['tag']})" if anomaly else f"unknown tag {detail['tag']}"
            ctx.emit(
                RULE_TAGS,
                Severity.WARNING if anomaly else Severity.INFO,
                f"conn:{ex.conn}",
                f"{codec.api_name(ex.api_key)} v{ex.api_version} {'request' if direction == 'req' else 'response'}: "
                f"{what} in {where}",
                frame.ts_ns,
                {**ex.evidence(), "direction": direction, "path": where, **detail},
                conns=(ex.conn,),
            )

    @staticmethod
    def _first(state: State, sig: str, ctx: RuleContext) -> bool:
        seen: list[str] = state.setdefault("reported", [])
        if sig in seen:
            return False
        seen.append(sig)
        ctx.trim(seen)
        return True


RULES: list[type[Rule]] = [FlexibleRule]
