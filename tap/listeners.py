"""Tap listeners opened on the fly for brokers that address rewriting finds with no listener yet.

When the tap rewrites broker addresses and a Metadata, DescribeCluster, FindCoordinator or
``NodeEndpoints`` entry names a broker id that no configured listener serves, clients would otherwise
dial that broker directly and leave the tap. ``DynamicListeners.resolve`` binds a new listening socket
(from a configured port range, or an ephemeral port) on the receiving listener's host, right away and
synchronously, so the response being rewritten can already carry its address: a client that connects
before the server starts accepting waits in the socket's backlog. The server itself is started by the
``serve`` callback (the event loop's job).
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    listen_host: str
    listen_port: int
    broker_host: str
    broker_port: int
    broker_id: int | None = None
    listener_name: str = "PLAINTEXT"
    #: TLS towards clients (the tap terminates it) and towards the broker; None = plaintext.
    server_ssl: ssl.SSLContext | None = None
    broker_ssl: ssl.SSLContext | None = None
    #: The address clients should use for this broker (address rewriting); default: the bound one.
    advertise: Address | None = None
    #: mTLS re-presentation: (client certificate CN, TLS context holding the identity the tap presents
    #: to the broker for that client). See ``broker_context`` and docs/decisions.md.
    broker_identities: tuple[tuple[str, ssl.SSLContext], ...] = ()

    @property
    def broker(self) -> str:
        return f"{self.broker_host}:{self.broker_port}"


_WILDCARDS = ("", "0.0.0.0", "::")
_BACKLOG = 128


def client_address(spec: ListenerSpec, bound_port: int) -> Address:
    """What clients should dial for a listener: its ``advertise``, else its bound host and port."""
    if spec.advertise is not None:
        return spec.advertise
    host = spec.listen_host
    if host in _WILDCARDS:
        host = socket.getfqdn()  # a wildcard bind is no address a client can dial
    return host, bound_port


def listen_socket(host: str, ports: Iterable[int]) -> socket.socket | None:
    """A non-blocking listening TCP socket on the first of ``ports`` that binds (0 = ephemeral)."""
    for port in ports:
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError:
            return None
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(_BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            continue
        return sock
    return None


class DynamicListeners:
    """Broker id -> a listener the tap opened itself, following the addresses brokers report.

    ``own`` gives the addresses clients already reach the tap on: a broker reported at one of them is
    the tap itself (brokers that advertise the tap), and must not get a listener that would loop.
    """

    def __init__(
        self,
        serve: Callable[[ListenerSpec, socket.socket], None],
        own: Callable[[], Iterable[Address]],
        ports: tuple[int, int] | None = None,
        limit: int = 256,
        on_event: Callable[..., None] | None = None,
    ) -> None:
        self._serve = serve
        self._own = own
        self._ports = ports
        self._limit = limit
        self._on_event = on_event or (lambda event, **fields: None)
        #: Broker id -> its listener (``advertise`` holds the address clients are given).
        self.specs: dict[int, ListenerSpec] = {}
        #: Broker ids whose listener could not be opened; not retried (each try costs a bind sweep).
        self.failed: set[int] = set()
        self._used_ports: set[int] = set()

    def resolve(self, template: ListenerSpec, broker_id: int, host: str, port: int) -> Address | None:
        """The tap's address for ``broker_id`` (reported by a broker at ``host:port``), or None to keep it.

        ``template`` is the listener the report came through: the new listener copies its host, TLS
        settings and listener name. A known broker reported at a new address is followed: later
        connections go there.
        """
        spec = self.specs.get(broker_id)
        if spec is not None:
            # Only reports through the same kind of listener: another listener name may well carry
            # another address of the same broker (a SASL listener next to a plaintext one).
            moved = (spec.broker_host, spec.broker_port) != (host, port)
            if moved and spec.listener_name == template.listener_name and not self._is_own(host, port):
                self.specs[broker_id] = dataclasses.replace(spec, broker_host=host, broker_port=port)
                self._on_event("dynamic_listener_retarget", broker_id=broker_id, broker=f"{host}:{port}")
            return spec.advertise
        if broker_id in self.failed or self._is_own(host, port):
            return None
        if len(self.specs) >= self._limit:
            self._fail(broker_id, host, port, f"limit of {self._limit} dynamic listeners reached")
            return None
        ports: Iterable[int] = [0]
        if self._ports is not None:
            low, high = self._ports
            ports = (p for p in range(low, high + 1) if p not in self._used_ports)
        sock = listen_socket(template.listen_host, ports)
        if sock is None:
            self._fail(broker_id, host, port, f"no free port in {self._ports or 'ephemeral'}")
            return None
        bound_port = int(sock.getsockname()[1])
        self._used_ports.add(bound_port)
        advertise: Address
        if template.advertise is not None:
            advertise = (template.advertise[0], bound_port)
        else:
            advertise = client_address(template, bound_port)
        spec = dataclasses.replace(
            template,
            listen_port=bound_port,
            broker_host=host,
            broker_port=port,
            broker_id=broker_id,
            advertise=advertise,
        )
        self.specs[broker_id] = spec
        self._serve(spec, sock)
        self._on_event(
            "dynamic_listener",
            broker_id=broker_id,
            broker=f"{host}:{port}",
            listen=f"{template.listen_host}:{bound_port}",
            advertise=f"{advertise[0]}:{advertise[1]}",
        )
        return advertise

    def _is_own(self, host: str, port: int) -> bool:
        if (host, port) in set(self._own()):
            return True
        return any(spec.advertise == (host, port) for spec in self.specs.values())

    def _fail(self, broker_id: int, host: str, port: int, reason: str) -> None:
        self.failed.add(broker_id)
        self._on_event("dynamic_listener_failed", broker_id=broker_id, broker=f"{host}:{port}", reason=reason)


class NoBrokerIdentity(LookupError):
    """A client whose certificate maps to no identity the tap may present to the broker."""


def client_common_name(peercert: dict[str, object] | None) -> str | None:
    """The subject CN of a verified client certificate (``SSLObject.getpeercert()``), or None."""
    for rdn in (peercert or {}).get("subject", ()):  # type: ignore[attr-defined]
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def broker_context(spec: ListenerSpec, client_cn: str | None) -> ssl.SSLContext | None:
    """The TLS context the tap connects to the broker with, for a client with certificate CN ``client_cn``.

    Without ``broker_identities``: the listener's ``broker_ssl`` (plaintext when None). With them: the
    identity mapped to the client's CN; a client with no mapped identity is refused (NoBrokerIdentity),
    never passed on under another principal.
    """
    if not spec.broker_identities:
        return spec.broker_ssl
    for cn, context in spec.broker_identities:
        if cn == client_cn:
            return context
    raise NoBrokerIdentity(f"no broker identity for client certificate CN={client_cn!r}")
