"""Who may send an Envelope (KIP-590), keyed by connection.

``envelope.untrusted_source`` (critical)
    An Envelope request carries another principal's request: a broker forwards it to the controller,
    which then acts for that principal. Only brokers may send one, over an inter-broker or controller
    listener; from a client connection it is an impersonation attempt (the controller should reject it
    with CLUSTER_AUTHORIZATION_FAILED, but the attempt is the news). A connection counts as a broker's
    when its tap listener name is in ``checks.broker_listeners``, its client address (host, or
    host:port) is in ``checks.broker_client_addresses``, or it sent a BrokerRegistration earlier.
    Every such Envelope is reported: each one is an attempt.
"""

from __future__ import annotations

from checks.model import Exchange, Severity
from checks.rule import Rule, RuleContext, State
from codec.nested import EmbeddedRequest
from codec.protocol import ApiKey


class EnvelopeRule(Rule):
    name = "envelope"
    key_kind = "conn"
    api_keys = frozenset({ApiKey.ENVELOPE, ApiKey.BROKER_REGISTRATION})

    def keys(self, ex: Exchange) -> list[str]:
        # Inner exchanges of an Envelope are not the connection's own traffic.
        return [ex.conn] if ex.envelope is None else []

    def on_request(self, state: State, key: str, ex: Exchange, ctx: RuleContext) -> None:
        frame = ex.request
        if ex.api_key == ApiKey.BROKER_REGISTRATION:
            state["broker_registration"] = frame.at()
            return
        config = ctx.config
        listeners = {name.upper() for name in config.broker_listeners}
        if (frame.listener or "").upper() in listeners:
            return
        if (
            frame.client in config.broker_client_addresses
            or frame.client_host in config.broker_client_addresses
        ):
            return
        if "broker_registration" in state:
            return
        data = ex.req.body.get("RequestData")
        inner = data.request if isinstance(data, EmbeddedRequest) else None
        carried = f"{inner.api_name} v{inner.api_version}" if inner is not None else "an undecodable request"
        ctx.emit(
            "envelope.untrusted_source",
            Severity.CRITICAL,
            f"conn:{ex.conn}",
            f"Envelope carrying {carried} from {frame.client} (listener {frame.listener or 'unknown'}, client id "
            f"{ex.req.client_id!r}), which is not a broker connection",
            ex.ts_ns,
            {
                **ex.evidence(),
                "listener": frame.listener,
                "inner_api_key": inner.api_key if inner is not None else None,
                "inner_api_version": inner.api_version if inner is not None else None,
                "inner_client_id": inner.client_id if inner is not None else None,
            },
            conns=(ex.conn,),
        )


RULES: list[type[Rule]] = [EnvelopeRule]
