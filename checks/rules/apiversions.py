"""ApiVersions (KIP-35) and the Kafka 4.0 readiness of the fleet (KIP-896).

Two rules share this module because they read the same exchanges at two scopes:

``apiversions`` (key: connection)
    ``apiversions.out_of_range`` (warning): a request whose (api, version) lies outside what the broker
    advertised on *that* connection (KIP-35: advertised ranges are only good for the connection they
    came on). Judged when the request is sent, against the newest successful ApiVersions answer before
    it. After an UNSUPPORTED_VERSION (35) answer the broker only lists ApiVersions' own range (the v0
    fallback, KIP-511), so until a full answer arrives only ApiVersions requests are judged: anything
    else would be a guess. Reported once per connection, api and version. Judged from the request
    header (``judges_headers``): a request whose body did not decode, or was mirrored header-only, is
    judged too; ``body`` in the evidence says which.

    ``apiversions.removed_version_rejected`` (warning): a request at a version that Kafka 4.0 removed
    (KIP-896), sent to a broker whose own release removed it, and the connection closed without an
    answer. The broker is known to be 4.x when its ApiVersions answer on the connection starts some
    API's range just above versions KIP-896 removed (Fetch from v4). Only versions it still advertises
    are judged here (Produce v0-v2, kept for librdkafka's version probe, KAFKA-18659): any other is
    ``apiversions.out_of_range``'s. Once per connection, api and version, when the connection closes.

    ``apiversions.no_handshake`` (info): the connection sent some other request before any
    ApiVersions. Only judged when the monitor saw the connection from its start (first request with
    ``seq`` <= 2: the tap's ``open`` record is seq 1, a capture has none), since a connection picked up
    mid-stream may have handshaken before the monitor started. Once per connection.

``apiversions.cluster`` (key: ``cluster``)
    ``apiversions.removed_in_4_0`` (info): a client software (name/version from ApiVersions v3+, else
    its client id) using an API version that Kafka 4.0 removed (KIP-896). Once per software, api and
    version. Judged from the request header too. The usage counts behind it are the fleet matrix (``fleet_matrix``/``coverage``), which the
    report renders.

    ``apiversions.cluster_skew`` (warning): brokers advertising different ranges for one API (rolling
    upgrades aside, clients then see per-broker behaviour), and, for APIs a broker forwards to the
    controller (KIP-590), a broker advertising versions its controller does not. Once per API and
    distinct set of ranges.

State is JSON-compatible: ranges are ``{"<api>": [min, max]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from checks.codes import API_VERSIONS, UNSUPPORTED_VERSION
from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, SharedValues, State
from codec.api import api_name
from codec.protocol import ApiKey
from codec.schema import load_table

CLUSTER_KEY = "cluster"

#: APIs a KRaft broker forwards to the controller (KIP-590's list): the broker may only advertise
#: versions the controller handles too, or clients are promised versions that then fail.
FORWARDABLE = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_ACLS,
        ApiKey.DELETE_ACLS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.CREATE_DELEGATION_TOKEN,
        ApiKey.RENEW_DELEGATION_TOKEN,
        ApiKey.EXPIRE_DELEGATION_TOKEN,
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.ALTER_CLIENT_QUOTAS,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey.UPDATE_FEATURES,
    }
)


@cache
def removed_in_4_0(api_key: int, version: int) -> bool:
    """Whether Kafka 4.0 removed this request version (KIP-896): it is defined only by a 3.x release.

    A 3.x release's unstable latest version (share groups' v0) was never released as stable, and is
    not a KIP-896 removal: 4.0 still served it (as early access); a later release dropped it.
    """
    spec = load_table().requests.get(api_key)
    if spec is None:
        return False
    seg = spec.segment(version)
    if seg is None or int(seg.release.split(".")[0]) >= 4:
        return False
    return not (seg.unstable_latest and version == seg.valid[1])


#: Advertised ranges, shared: every connection to a broker gets the same answer, and a copy per
#: connection held about 15 KB each (benchmarks/checks_bench.py). Shared values are never mutated.
_RANGES: SharedValues[tuple[tuple[int, int, int], ...], dict[str, list[int]]] = SharedValues(256)
#: Client software labels (``name/version``), one per connection in ``conn_software``: shared.
_LABELS: SharedValues[str, str] = SharedValues()


def removed_by_release(ranges: dict[str, list[int]]) -> bool:
    """Whether an ApiVersions answer comes from a broker whose release removed what KIP-896 removed
    (4.x): some API's advertised range starts just above versions only 3.x releases define."""
    return any(lo > 0 and removed_in_4_0(int(api), lo - 1) for api, (lo, _hi) in ranges.items())


def _ranges(body: dict[str, Any]) -> dict[str, list[int]]:
    key = tuple(
        (int(entry["ApiKey"]), int(entry["MinVersion"]), int(entry["MaxVersion"]))
        for entry in body.get("ApiKeys") or []
    )
    return _RANGES.get(key, {str(api): [lo, hi] for api, lo, hi in key})


def _answer_ranges(ex: Exchange) -> dict[str, list[int]]:
    """``_ranges`` of an ApiVersions answer, once per exchange (both rules read it)."""
    found: dict[str, list[int]] | None = ex.memo.get("api_ranges")
    if found is None:
        assert ex.resp is not None
        found = ex.memo["api_ranges"] = _ranges(ex.resp.body)
    return found


def _in_range(ranges: dict[str, list[int]], api_key: int, version: int) -> bool:
    rng = ranges.get(str(api_key))
    return rng is not None and rng[0] <= version <= rng[1]


def body_status(ex: Exchange) -> str:
    """``decoded``, ``undecodable`` or ``not captured``: how much of the request the rule saw (version
    coverage is judged from the header, whatever happened to the body)."""
    if ex.request.error is not None:
        return "undecodable"
    return "decoded" if ex.req.header_version >= 0 else "not captured"


def _fmt(rng: list[int] | None) -> str:
    return "absent" if rng is None else f"v{rng[0]}-v{rng[1]}"


class ApiVersionsRule(Rule):
    name = "apiversions"
    key_kind = "conn"
    judges_headers = True

    def keys(self, ex: Exchange) -> list[str]:
        return [ex.conn]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        api, version = ex.api_key, ex.api_version
        if "first_seq" not in state:
            state["first_seq"] = ex.request.seq
        if api == API_VERSIONS:
            state["handshake"] = True
        elif (
            not state.get("handshake")
            and not state.get("no_handshake_reported")
            # Judged only when the connection was seen from its start: the tap numbers its ``open``
            # record 1, so a connection's first frame is seq 2 (seq 0/1 where no open record came).
            and int(state["first_seq"]) <= 2
        ):
            state["no_handshake_reported"] = True
            ctx.emit(
                "apiversions.no_handshake",
                Severity.INFO,
                f"conn:{ex.conn}",
                f"{ex.req.api_name} v{version} sent before any ApiVersions on connection {ex.conn} "
                f"(client {ex.request.client}, client id {ex.req.client_id!r})",
                ex.ts_ns,
                ex.evidence(),
                conns=(ex.conn,),
            )
        ranges: dict[str, list[int]] | None = state.get("ranges")
        if ranges is None:
            return
        if not state.get("complete") and api != API_VERSIONS:
            return
        if _in_range(ranges, api, version):
            if state.get("removed_by_release") and removed_in_4_0(api, version):
                # Judged when the connection closes: the broker closes it instead of answering.
                held: dict[str, Any] = state.setdefault("removed_pending", {})
                held[str(ex.request.correlation_id)] = {
                    "api": api,
                    "version": version,
                    "name": ex.req.api_name,
                    "client_id": ex.req.client_id,
                    "advertised": ranges.get(str(api)),
                    "evidence": {**ex.evidence(), "body": body_status(ex)},
                }
                ctx.trim(held)
            return
        sig = f"{api}:{version}"
        reported: list[str] = state.setdefault("oor_reported", [])
        if sig in reported:
            return
        reported.append(sig)
        ctx.trim(reported)
        rng = ranges.get(str(api))
        ctx.emit(
            "apiversions.out_of_range",
            Severity.WARNING,
            f"conn:{ex.conn}",
            f"{ex.req.api_name} v{version} sent, but broker {ex.request.broker} advertised "
            f"{_fmt(rng)} on this connection",
            ex.ts_ns,
            {
                **ex.evidence(),
                "advertised": rng,
                "advertised_at": state.get("advertised_at"),
                "body": body_status(ex),
            },
            conns=(ex.conn,),
        )

    def on_quiet(self, state: State, hook: str, seq: int, api: tuple[int, int, int]) -> bool:
        """A request at a version Kafka 4.0 kept, answered, known by its headers: it only notes the
        connection's first request, unless it is the one that shows a missing handshake, lies outside
        the advertised ranges unreported, or its answer settles a held removed version."""
        api_key, version, corr = api
        if api_key == API_VERSIONS:
            return False
        if hook == "on_response":
            held: dict[str, Any] | None = state.get("removed_pending")
            return not (held and str(corr) in held)
        first = state.get("first_seq")
        if (
            not state.get("handshake")
            and not state.get("no_handshake_reported")
            and int(seq if first is None else first) <= 2
        ):
            return False
        ranges: dict[str, list[int]] | None = state.get("ranges")
        if ranges is not None and state.get("complete"):
            if _in_range(ranges, api_key, version):
                if state.get("removed_by_release") and removed_in_4_0(api_key, version):
                    return False
            elif f"{api_key}:{version}" not in state.get("oor_reported", ()):
                return False
        if first is None:
            state["first_seq"] = seq
        return True

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        held: dict[str, Any] | None = state.get("removed_pending")
        if held and resp is not None:
            held.pop(str(ex.request.correlation_id), None)  # answered: the connection was not closed on it
        if ex.api_key != API_VERSIONS or resp is None:
            return
        error = resp.body.get("ErrorCode")
        if error == 0:
            state["ranges"] = _answer_ranges(ex)
            state["removed_by_release"] = removed_by_release(state["ranges"])
            state["complete"] = True
        elif error == UNSUPPORTED_VERSION:
            # The v0 fallback: the broker names the ApiVersions versions it does support (KIP-511),
            # or nothing at all (older brokers), in which case v0 is the one version always accepted.
            ranges = _answer_ranges(ex)
            state["ranges"] = {str(ApiKey.API_VERSIONS): ranges.get(str(ApiKey.API_VERSIONS), [0, 0])}
            state["complete"] = False
        else:
            return
        assert ex.response is not None
        state["advertised_at"] = ex.response.at()

    def on_close(self, state: State, key: str, conn: str, ts_ns: int, ctx: RuleContext) -> bool:
        reported: list[str] = state.setdefault("oor_reported", [])
        for held in (state.pop("removed_pending", None) or {}).values():
            sig = f"removed:{held['api']}:{held['version']}"
            if sig in reported:
                continue
            reported.append(sig)
            evidence = held["evidence"]
            ctx.emit(
                "apiversions.removed_version_rejected",
                Severity.WARNING,
                f"conn:{conn}",
                f"{held['name']} v{held['version']} sent by client id {held['client_id']!r} at "
                f"{evidence.get('client')} to broker {evidence.get('broker')}, a Kafka 4.x broker: 4.0 removed "
                f"this version (KIP-896), and the broker closed the connection without answering (it still "
                f"advertises {_fmt(held['advertised'])} for old clients' version probes, KAFKA-18659)",
                ts_ns,
                {**evidence, "advertised": held["advertised"], "closed_ns": ts_ns},
                conns=(conn,),
            )
        return super().on_close(state, key, conn, ts_ns, ctx)


@dataclass(frozen=True)
class FleetRow:
    """One cell of the fleet readiness matrix: a client software using one api version."""

    software: str
    api_key: int
    api_name: str
    version: int
    count: int
    removed_in_4_0: bool


@dataclass(frozen=True)
class CoverageCell:
    """One (api, version) of the coverage heatmap: advertised by any broker, used by any client."""

    api_key: int
    api_name: str
    version: int
    advertised: bool
    used: int
    removed_in_4_0: bool


def software_label(ex: Exchange) -> str | None:
    """``name/version`` from an ApiVersions v3+ request, or None."""
    if ex.api_key != API_VERSIONS or ex.api_version < 3:
        return None
    name = ex.req.body.get("ClientSoftwareName")
    if not name:
        return None
    return _LABELS.share(f"{name}/{ex.req.body.get('ClientSoftwareVersion') or '?'}")


def fleet_matrix(state: State) -> list[FleetRow]:
    """The fleet readiness matrix from the ``apiversions.cluster`` state, sorted for display."""
    rows: list[FleetRow] = []
    for software, apis in sorted((state.get("used") or {}).items()):
        for api_s, versions in sorted(apis.items(), key=lambda kv: int(kv[0])):
            for ver_s, count in sorted(versions.items(), key=lambda kv: int(kv[0])):
                api, ver = int(api_s), int(ver_s)
                rows.append(FleetRow(software, api, api_name(api), ver, int(count), removed_in_4_0(api, ver)))
    return rows


def coverage(state: State) -> list[CoverageCell]:
    """Every (api, version) that some broker advertised or some client used, sorted."""
    advertised: set[tuple[int, int]] = set()
    for broker in (state.get("brokers") or {}).values():
        for api_s, (lo, hi) in broker.get("ranges", {}).items():
            advertised.update((int(api_s), v) for v in range(int(lo), int(hi) + 1))
    used: dict[tuple[int, int], int] = {}
    for apis in (state.get("used") or {}).values():
        for api_s, versions in apis.items():
            for ver_s, count in versions.items():
                cell = (int(api_s), int(ver_s))
                used[cell] = used.get(cell, 0) + int(count)
    return [
        CoverageCell(
            api,
            api_name(api),
            ver,
            (api, ver) in advertised,
            used.get((api, ver), 0),
            removed_in_4_0(api, ver),
        )
        for api, ver in sorted(advertised | set(used))
    ]


class ApiVersionsClusterRule(Rule):
    name = "apiversions.cluster"
    key_kind = "cluster"
    judges_headers = True

    def keys(self, ex: Exchange) -> list[str]:
        return [CLUSTER_KEY]

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        if ex.envelope is not None:
            # A forwarded request: the client's own request to the broker was already counted.
            return
        conns: dict[str, str] = state.setdefault("conn_software", {})
        conn = ex.conn
        label = software_label(ex) if ex.api_key == API_VERSIONS else None
        if label is None:
            label = conns.pop(conn, None)
        else:
            conns.pop(conn, None)
        if label is not None:
            # (Re-)inserted at the end on every request, so trimming drops the connections idle longest.
            conns[conn] = label
            ctx.trim(conns)
        software = label or f"client.id={ex.req.client_id or ''}"
        api, version = ex.api_key, ex.api_version
        # The matrix counts connections: each connection's use of an (api, version) once, however many
        # of its requests this rule is handed (the job's router hands it one per micro-batch).
        counted: dict[str, bool] = state.setdefault("conn_uses", {})
        use = f"{conn}|{api}|{version}"
        if use in counted:
            return
        counted[use] = True
        ctx.trim(counted)
        used: dict[str, Any] = state.setdefault("used", {})
        per_software: dict[str, dict[str, int]] | None = used.get(software)
        if per_software is None:
            per_software = used[software] = {}
        api_s, version_s = str(api), str(version)
        per_api: dict[str, int] | None = per_software.get(api_s)
        if per_api is None:
            per_api = per_software[api_s] = {}
        per_api[version_s] = int(per_api.get(version_s, 0)) + 1
        if not removed_in_4_0(api, version):
            return
        sig = f"{software}|{api}|{version}"
        reported: list[str] = state.setdefault("removed_reported", [])
        if sig in reported:
            return
        reported.append(sig)
        ctx.trim(reported)
        ctx.emit(
            "apiversions.removed_in_4_0",
            Severity.INFO,
            f"client:{software}",
            f"{software} uses {ex.req.api_name} v{version}, which Kafka 4.0 removed (KIP-896)",
            ex.ts_ns,
            {**ex.evidence(), "software": software, "body": body_status(ex)},
            conns=(ex.conn,),
        )

    def on_response(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        resp = ex.resp
        if ex.api_key != API_VERSIONS or resp is None or resp.body.get("ErrorCode") != 0:
            return
        frame = ex.response
        assert frame is not None
        ranges = _answer_ranges(ex)
        listener = (frame.listener or "").upper()
        # A KRaft controller serves BrokerRegistration; a broker does not, whatever its listener is named.
        role = (
            "controller"
            if str(ApiKey.BROKER_REGISTRATION) in ranges or listener == "CONTROLLER"
            else "broker"
        )
        ident = str(frame.broker_id) if frame.broker_id is not None else frame.broker
        label = f"{role}:{ident}"
        brokers: dict[str, Any] = state.setdefault("brokers", {})
        brokers[label] = {"role": role, "ranges": ranges, "at": frame.at()}
        brokers[label] = brokers.pop(label)
        ctx.trim(brokers)
        self._check_skew(state, brokers, ex, ctx)

    def _check_skew(self, state: State, brokers: dict[str, Any], ex: Exchange, ctx: RuleContext) -> None:
        plain = {b: v for b, v in brokers.items() if v["role"] == "broker"}
        controllers = {b: v for b, v in brokers.items() if v["role"] == "controller"}
        reported: list[str] = state.setdefault("skew_reported", [])
        apis = sorted({int(a) for v in plain.values() for a in v["ranges"]})
        for api in apis:
            per_broker = {b: v["ranges"].get(str(api)) for b, v in sorted(plain.items())}
            distinct = {tuple(r) if r else None for r in per_broker.values()}
            if len(plain) > 1 and len(distinct) > 1:
                detail = ", ".join(f"{b} {_fmt(r)}" for b, r in per_broker.items())
                self._report(
                    state,
                    reported,
                    f"brokers|{api}|{detail}",
                    api,
                    f"brokers disagree on {api_name(api)}: {detail}",
                    per_broker,
                    ex,
                    ctx,
                )
            if api not in FORWARDABLE:
                continue
            for ctrl, cv in sorted(controllers.items()):
                crng = cv["ranges"].get(str(api))
                for b, rng in per_broker.items():
                    if rng is None or (crng is not None and crng[0] <= rng[0] and rng[1] <= crng[1]):
                        continue
                    detail = f"{b} {_fmt(rng)}, {ctrl} {_fmt(crng)}"
                    self._report(
                        state,
                        reported,
                        f"controller|{api}|{detail}",
                        api,
                        f"{api_name(api)} is forwarded to the controller (KIP-590), but {b} advertises "
                        f"{_fmt(rng)} and controller {ctrl} handles {_fmt(crng)}",
                        {b: rng, ctrl: crng},
                        ex,
                        ctx,
                    )

    def _report(
        self,
        state: State,
        reported: list[str],
        sig: str,
        api: int,
        summary: str,
        ranges: dict[str, list[int] | None],
        ex: Exchange,
        ctx: RuleContext,
    ) -> None:
        if sig in reported:
            return
        reported.append(sig)
        ctx.trim(reported)
        ctx.emit(
            "apiversions.cluster_skew",
            Severity.WARNING,
            f"api:{api_name(api)}",
            summary,
            ex.ts_ns,
            {**ex.evidence(), "ranges": ranges},
        )


RULES: list[type[Rule]] = [ApiVersionsRule, ApiVersionsClusterRule]
