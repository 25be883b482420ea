"""``tap.workers``: N forwarding processes behind one acceptor (docs/tap.md "Workers", docs/decisions.md).

The supervisor, the process ``kpmon tap`` starts, owns every listening socket: the configured ones and
those opened on the fly for brokers that address rewriting discovers. It accepts each client connection
and hands the socket to a worker over a Unix socket (SCM_RIGHTS), in turn over the workers that are up.
A worker is a whole tap (tap/proxy.py) with its own event loop and mirror producer, serving the
connections it is handed; it terminates TLS itself. A worker asks the supervisor (a blocking round trip,
once per report of a broker with no listener) for the address of a listener opened on the fly, so every
worker rewrites a broker to the same address. The supervisor restarts a worker that dies (only that
worker's connections are lost: listening sockets and the other workers stay), serves the workers'
metrics summed into one endpoint, and on SIGTERM stops every worker, each closing its connections and
flushing its mirror queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import Metric

from codec import taprecord
from kpconfig.model import KpmonConfig
from tap.listeners import Address, DynamicListeners, ListenerSpec, client_address, listen_socket
from tap.mirror import MirrorRecord, MirrorSink, NullMirror

if TYPE_CHECKING:
    from tap.proxy import Tap

log = logging.getLogger("kpmon.tap")

#: Room for one control message (a hand-over, a resolve request or its answer).
_MESSAGE = 4096
#: How often a worker publishes its metrics to the supervisor (the endpoint is this stale at most).
SNAPSHOT_SECONDS = 1.0
#: A worker stopping on SIGTERM closes its connections and flushes its mirror queue (5 s at most);
#: past this the supervisor kills it.
STOP_SECONDS = 25.0
#: Connections accepted per readiness callback of one listener, so one busy listener cannot starve
#: the others or the control messages.
_ACCEPT_BATCH = 64
#: A worker that dies this soon after starting, this many times in a row, is a broken setup (a config
#: the worker cannot load, a tap-topic cluster it cannot reach): the supervisor stops instead of cycling.
_QUICK_EXIT_SECONDS = 10.0
#: At start, connections wait for every worker this long at most before the ones up take them.
_START_WAIT = 30.0
_QUICK_EXITS = 5
#: Gauges that describe one worker's own resources, labelled ``worker`` instead of summed: a full queue
#: in one worker drops records even when another's is empty.
PER_WORKER = frozenset({"kpmon_tap_mirror_queue_depth", "kpmon_tap_mirror_queue_capacity"})

#: Which listener a connection came through: ("s", index in tap.listeners) or ("d", broker id).
ListenerKey = tuple[str, int]
#: A metrics family as a worker publishes it: name, type, help, samples (name, labels, value).
Family = tuple[str, str, str, list[tuple[str, dict[str, str], float]]]


# --- metrics -----------------------------------------------------------------------------------------
def write_snapshot(registry: CollectorRegistry, path: str) -> None:
    """Publish ``registry``'s current values for the supervisor (replaced atomically)."""
    families: list[Family] = [
        (m.name, m.type, m.documentation, [(s.name, dict(s.labels), float(s.value)) for s in m.samples])
        for m in registry.collect()
    ]
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as out:
        pickle.dump(families, out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def read_snapshot(path: str) -> list[Family]:
    try:
        with open(path, "rb") as src:
            families: list[Family] = pickle.load(src)
    except (OSError, EOFError, pickle.UnpicklingError):
        return []
    return families


_Sums = dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]]


def merge(
    into: _Sums, families: Iterable[Family], worker: str | None = None, kinds: Iterable[str] = ()
) -> None:
    """Add ``families`` to ``into``, sample by sample; ``worker`` labels the PER_WORKER gauges, and
    ``kinds`` (when given) keeps only families of those types."""
    keep = set(kinds)
    for name, kind, doc, samples in families:
        if keep and kind not in keep:
            continue
        _, _, sums = into.setdefault(name, (kind, doc, {}))
        for sample, labels, value in samples:
            if sample.endswith("_created"):
                continue  # a creation time: no sum of those means anything
            if worker is not None and name in PER_WORKER:
                labels = {**labels, "worker": worker}
            key = (sample, tuple(sorted(labels.items())))
            sums[key] = sums.get(key, 0.0) + value


def as_families(sums: _Sums) -> list[Family]:
    return [
        (name, kind, doc, [(sample, dict(labels), value) for (sample, labels), value in samples.items()])
        for name, (kind, doc, samples) in sums.items()
    ]


def families_of(sums: _Sums) -> Iterator[Metric]:
    for name, (kind, doc, samples) in sums.items():
        family = Metric(name, doc, kind)
        for (sample, labels), value in samples.items():
            family.add_sample(sample, dict(labels), value)
        yield family


class SummedMetrics:
    """A Prometheus collector: the live workers' metrics, those of workers that died (counters and
    histograms only, so totals never go backwards when a worker restarts), and the supervisor's own."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        sums: _Sums = {}
        for worker in self.supervisor.workers:
            if worker is not None:
                merge(sums, read_snapshot(worker.snapshot), str(worker.index))
        merge(sums, self.supervisor.retired)
        merge(sums, _families(self.supervisor.registry))
        yield from families_of(sums)


def _families(registry: CollectorRegistry) -> list[Family]:
    return [
        (m.name, m.type, m.documentation, [(s.name, dict(s.labels), float(s.value)) for s in m.samples])
        for m in registry.collect()
    ]


class SupervisorMetrics:
    """The supervisor's own series, served with the workers' sums (``SummedMetrics``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.dynamic_listeners = Counter(
            "kpmon_tap_dynamic_listeners",
            "Listeners opened on the fly for new broker ids (result: opened, retargeted, failed)",
            ["result"],
            registry=self.registry,
        )
        self.worker_deaths = Counter(
            "kpmon_tap_worker_deaths",
            "Worker processes that died: their connections ended without a close record, and the records "
            "they had not mirrored yet were lost",
            registry=self.registry,
        )


# --- the worker side ---------------------------------------------------------------------------------
class RemoteListeners(DynamicListeners):
    """A worker's view of the supervisor's listeners opened on the fly: ``resolve`` asks it."""

    def __init__(self, rpc: socket.socket, static: list[ListenerSpec], timeout: float = 5.0) -> None:
        super().__init__(lambda spec, sock: None, lambda: ())
        self._rpc = rpc
        self._static = static
        self._timeout = timeout
        self._numbers = itertools.count(1)

    def resolve(self, template: ListenerSpec, broker_id: int, host: str, port: int) -> Address | None:
        key: ListenerKey
        if template in self._static:
            key = ("s", self._static.index(template))
        else:
            assert template.broker_id is not None  # a listener opened on the fly always has one
            key = ("d", template.broker_id)
        number = next(self._numbers)
        self._rpc.settimeout(self._timeout)
        try:
            self._rpc.sendall(pickle.dumps(("resolve", number, key, broker_id, host, port)))
            while True:
                reply = self._rpc.recv(_MESSAGE)
                if not reply:
                    return None
                answered, address = pickle.loads(reply)
                if answered == number:  # an answer that came too late for an earlier ask is skipped
                    return address
        except OSError:
            # No answer in time: the broker keeps its own address in this response, as when a listener
            # cannot be opened.
            return None


def _handed_spec(tap_listeners: list[ListenerSpec], message: tuple[Any, ...]) -> ListenerSpec:
    if message[0] == "s":
        return tap_listeners[message[1]]
    _, root, broker_id, host, port, listen_port, advertise = message
    return dataclasses.replace(
        tap_listeners[root],
        listen_port=listen_port,
        broker_host=host,
        broker_port=port,
        broker_id=broker_id,
        advertise=advertise,
    )


def worker_main(
    config: KpmonConfig,
    mirror: bool,
    index: int,
    prefix: str,
    handover: socket.socket,
    rpc: socket.socket,
    bound: list[Address],
    snapshot: str,
    log_level: int,
    incarnation_ns: int,
) -> None:
    """A worker process: a tap serving the connections the supervisor hands over, until SIGTERM.
    ``incarnation_ns``: when the supervisor started it (its connection ids' first incarnation)."""
    from tap.app import build_tap, setup_logging
    from tap.proxy import install_uvloop

    # Ctrl-C reaches the whole process group: the supervisor stops the workers in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(logging.getLevelName(log_level))
    install_uvloop()
    tap = build_tap(config, mirror, prefix)
    tap.incarnation_ns = 0
    tap.note_loss(incarnation_ns)
    tap.dynamic = RemoteListeners(rpc, tap.listeners)
    try:
        asyncio.run(_serve_worker(tap, index, handover, rpc, bound, snapshot))
    finally:
        tap.sink.close()
        write_snapshot(tap.metrics.registry, snapshot)


async def _serve_worker(
    tap: Tap, index: int, handover: socket.socket, rpc: socket.socket, bound: list[Address], snapshot: str
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    tap.start_adopted(bound)
    handover.setblocking(False)

    def take() -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(handover, _MESSAGE, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data:  # the supervisor is gone: nobody restarts or stops us
                for fd in fds:
                    os.close(fd)
                loop.remove_reader(handover.fileno())
                stop.set()
                return
            if not fds:
                message = pickle.loads(data)
                if message[0] == "loss":  # another worker died: its records may be lost
                    tap.note_loss(message[1])
                continue
            sock = socket.socket(fileno=fds[0])
            sock.setblocking(False)
            tap.adopt(sock, _handed_spec(tap.listeners, pickle.loads(data)))

    loop.add_reader(handover.fileno(), take)
    rpc.sendall(pickle.dumps(("ready",)))
    tap.log_event("worker_ready", worker=index, pid=os.getpid())

    async def publish() -> None:
        while True:
            write_snapshot(tap.metrics.registry, snapshot)
            await asyncio.sleep(SNAPSHOT_SECONDS)

    publisher = asyncio.ensure_future(publish())
    await stop.wait()
    loop.remove_reader(handover.fileno())
    publisher.cancel()
    tap.log_event("stopping", worker=index)
    await tap.stop()


# --- the supervisor ----------------------------------------------------------------------------------
@dataclass(eq=False)
class _Worker:
    index: int
    process: BaseProcess
    handover: socket.socket
    rpc: socket.socket
    snapshot: str
    started: float
    #: The prefix of its connection ids (each id adds an incarnation and a number).
    prefix: str
    ready: bool = False
    exited: bool = False


class Supervisor:
    """Accepts on every listener and hands connections to ``tap.workers`` worker processes."""

    def __init__(self, config: KpmonConfig, mirror: bool = True) -> None:
        from tap.app import listener_specs

        tap_cfg = config.tap
        self.instance = tap_cfg.instance_id or f"tap-{uuid.uuid4().hex[:8]}"
        # Every worker shares the instance id (the ``tap`` field of its records).
        self.config = config.model_copy(
            update={"tap": tap_cfg.model_copy(update={"instance_id": self.instance})}
        )
        self.mirror = mirror
        #: Where the supervisor writes the tap's own events (its start, a worker's death).
        self.sink: MirrorSink = NullMirror()
        self.count = tap_cfg.worker_count
        self.specs = listener_specs(tap_cfg)
        self.dynamic = DynamicListeners(
            self._serve_dynamic,
            self._own_addresses,
            tap_cfg.dynamic_listener_ports,
            on_event=self._dynamic_event,
        )
        #: Listener opened on the fly (broker id) -> the configured listener it descends from.
        self.roots: dict[int, int] = {}
        self._root = 0
        self.listening: list[tuple[socket.socket, ListenerKey]] = []
        self.bound: list[Address] = []
        self.addresses: dict[int, Address] = {}
        self.workers: list[_Worker | None] = [None] * self.count
        self.dir = tempfile.mkdtemp(prefix="kpmon-tap-workers-")
        #: Counters and histograms of workers that exited, so totals survive their restarts.
        self.retired: list[Family] = []
        self._retired_sums: _Sums = {}
        metrics = SupervisorMetrics()
        self.registry = metrics.registry
        self.dynamic_listeners = metrics.dynamic_listeners
        self.worker_deaths = metrics.worker_deaths
        self._turn = 0
        self._accepting = False
        #: Every worker has been up once (or the start wait ran out): accept with any worker up.
        self._started = False
        self._stopping = False
        self._quick_exits = 0
        self._stopped = asyncio.Event()
        self._failed = False
        self._all_exited = asyncio.Event()
        self._context = multiprocessing.get_context("spawn")

    def log_event(self, event: str, level: int = logging.INFO, **fields: object) -> None:
        if log.isEnabledFor(level):
            log.log(level, json.dumps({"event": event, "tap": self.instance, **fields}, default=str))

    # --- listeners ---------------------------------------------------------------------------
    def listen(self) -> None:
        for index, spec in enumerate(self.specs):
            sock = listen_socket(spec.listen_host, [spec.listen_port])
            if sock is None:
                raise OSError(f"cannot listen on {spec.listen_host}:{spec.listen_port}")
            host, port = sock.getsockname()[:2]
            self.listening.append((sock, ("s", index)))
            self.bound.append((host, port))
            if spec.broker_id is not None:
                self.addresses[spec.broker_id] = client_address(spec, port)
            self.log_event("listen", listen=f"{host}:{port}", broker=spec.broker)

    def _own_addresses(self) -> list[Address]:
        return [*self.addresses.values(), *self.bound]

    def _serve_dynamic(self, spec: ListenerSpec, sock: socket.socket) -> None:
        if self._stopping:
            sock.close()
            return
        assert spec.broker_id is not None
        self.roots[spec.broker_id] = self._root
        self.listening.append((sock, ("d", spec.broker_id)))
        if self._accepting:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock, ("d", spec.broker_id))

    def _dynamic_event(self, event: str, **fields: object) -> None:
        result = {"dynamic_listener": "opened", "dynamic_listener_retarget": "retargeted"}.get(
            event, "failed"
        )
        self.dynamic_listeners.labels(result).inc()
        self.log_event(event, logging.WARNING if result == "failed" else logging.INFO, **fields)

    def _set_accepting(self) -> None:
        """Accept only while a worker is up: until then connections wait in the listeners' backlogs.
        At start, wait for every worker (``_START_WAIT`` at most): the first one up would otherwise
        take every connection queued meanwhile."""
        ready = [w is not None and w.ready for w in self.workers]
        if all(ready):
            self._started = True
        want = not self._stopping and (any(ready) if self._started else all(ready))
        if want == self._accepting:
            return
        loop = asyncio.get_running_loop()
        for sock, key in self.listening:
            if want:
                loop.add_reader(sock.fileno(), self._accept, sock, key)
            else:
                loop.remove_reader(sock.fileno())
        self._accepting = want

    def _accept(self, listener: socket.socket, key: ListenerKey) -> None:
        # A worker that died is noted before anything is handed on: the live workers must know of the
        # loss before they open a connection that its clients may have come back on.
        self._reap()
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # Out of descriptors, or a connection reset while queued: this one is lost, not the listener.
                self.log_event("accept_failed", logging.WARNING, error=str(exc))
                return
            try:
                self._hand(conn, key)
            finally:
                conn.close()

    def _message(self, key: ListenerKey) -> bytes:
        if key[0] == "s":
            return pickle.dumps(key)
        spec = self.dynamic.specs[key[1]]
        return pickle.dumps(
            (
                "d",
                self.roots[key[1]],
                key[1],
                spec.broker_host,
                spec.broker_port,
                spec.listen_port,
                spec.advertise,
            )
        )

    def _hand(self, conn: socket.socket, key: ListenerKey) -> None:
        message = self._message(key)
        ready = [w for w in self.workers if w is not None and w.ready]
        for attempt in range(len(ready)):
            worker = ready[(self._turn + attempt) % len(ready)]
            try:
                socket.send_fds(worker.handover, [message], [conn.fileno()])
            except OSError:
                continue  # exiting, or too far behind to take more: the next one
            self._turn += attempt + 1
            return
        self.log_event("handover_failed", logging.WARNING, workers_ready=len(ready))

    # --- workers -----------------------------------------------------------------------------
    def _start_worker(self, index: int) -> None:
        if self._stopping:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rpc_ours, rpc_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Unique across workers; the worker adds its incarnation (from when it started) and a number, so
        # ids stay unique across its restarts and those of the tap, with any instance id.
        prefix = f"{self.instance}-{index}"
        started_ns = time.time_ns()
        snapshot = os.path.join(self.dir, f"worker-{index}.metrics")
        process = self._context.Process(
            target=worker_main,
            args=(
                self.config,
                self.mirror,
                index,
                prefix,
                theirs,
                rpc_theirs,
                self.bound,
                snapshot,
                logging.getLogger("kpmon").getEffectiveLevel(),
                started_ns,
            ),
            name=f"kpmon-tap-worker-{index}",
        )
        process.start()
        theirs.close()
        rpc_theirs.close()
        ours.setblocking(False)
        rpc_ours.setblocking(False)
        worker = _Worker(index, process, ours, rpc_ours, snapshot, time.monotonic(), prefix)
        self.workers[index] = worker
        loop = asyncio.get_running_loop()
        loop.add_reader(rpc_ours.fileno(), self._control, worker)
        assert process.sentinel is not None
        loop.add_reader(process.sentinel, self._exited, worker)
        self.log_event(
            "worker_start",
            worker=index,
            pid=process.pid,
            connections=f"{prefix}.{taprecord.incarnation(started_ns)}",
        )

    def _control(self, worker: _Worker) -> None:
        try:
            data = worker.rpc.recv(_MESSAGE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(worker.rpc.fileno())
            return
        message = pickle.loads(data)
        if message[0] == "ready":
            worker.ready = True
            self._set_accepting()
            if all(w is not None and w.ready for w in self.workers):
                self.log_event(
                    "ready",
                    listeners=[f"{h}:{p}" for h, p in self.bound],
                    workers=self.count,
                    metrics_port=self.config.tap.metrics_port,
                )
        elif message[0] == "resolve":
            _, number, key, broker_id, host, port = message
            if key[0] == "s":
                template, self._root = self.specs[key[1]], key[1]
            else:
                template, self._root = self.dynamic.specs[key[1]], self.roots[key[1]]
            address = self.dynamic.resolve(template, broker_id, host, port)
            try:
                worker.rpc.send(pickle.dumps((number, address)))
            except OSError:
                pass

    def _reap(self) -> None:
        """Note the workers that died and are not noted yet (their sentinels are ready)."""
        live = {w.process.sentinel: w for w in self.workers if w is not None and not w.exited}
        if not live:
            return
        for sentinel in multiprocessing.connection.wait(list(live), 0):
            self._exited(live[cast(int, sentinel)])

    def _exited(self, worker: _Worker) -> None:
        if worker.exited:
            return
        worker.exited = True
        loss_ns = time.time_ns()
        loop = asyncio.get_running_loop()
        loop.remove_reader(worker.rpc.fileno())
        assert worker.process.sentinel is not None
        loop.remove_reader(worker.process.sentinel)
        worker.process.join(1)
        worker.handover.close()
        worker.rpc.close()
        if self.workers[worker.index] is worker:
            self.workers[worker.index] = None
        merge(self._retired_sums, read_snapshot(worker.snapshot), kinds=("counter", "histogram"))
        self.retired = as_families(self._retired_sums)
        try:
            os.unlink(worker.snapshot)
        except OSError:
            pass
        self._set_accepting()
        if self._stopping:
            self.log_event("worker_stopped", worker=worker.index, exitcode=worker.process.exitcode)
            if all(w is None for w in self.workers):
                self._all_exited.set()
            return
        self._worker_lost(worker, loss_ns)
        quick = time.monotonic() - worker.started < _QUICK_EXIT_SECONDS
        self._quick_exits = self._quick_exits + 1 if quick else 0
        self.log_event(
            "worker_exit",
            logging.WARNING,
            worker=worker.index,
            pid=worker.process.pid,
            exitcode=worker.process.exitcode,
        )
        if self._quick_exits >= _QUICK_EXITS:
            self.log_event("workers_failing", logging.ERROR, exits=self._quick_exits)
            self._failed = True
            self._stopped.set()
            return
        loop.call_later(min(0.2 * 2**self._quick_exits, 5.0), self._start_worker, worker.index)

    def _worker_lost(self, worker: _Worker, loss_ns: int) -> None:
        """A worker died: what it had not mirrored yet is lost, and its connections end with no
        ``close`` record. Say so in the tap topic, and tell the live workers, whose connections opened
        from now on then carry the loss in their ids (a client of the dead worker comes back on one)."""
        self.worker_deaths.inc()
        info = {
            "worker": worker.index,
            "pid": worker.process.pid,
            "exitcode": worker.process.exitcode,
            "opened_before": loss_ns,
        }
        value = taprecord.pack_tap_event(taprecord.WORKER_LOST, worker.prefix, self.instance, loss_ns, info)
        if not self.sink.offer(MirrorRecord(worker.prefix.encode(), value)):
            self.log_event("worker_lost_unrecorded", logging.WARNING, worker=worker.index)
        notice = pickle.dumps(("loss", loss_ns))
        for other in self.workers:
            if other is not None and other is not worker and not other.exited:
                try:
                    other.handover.send(notice)
                except OSError:
                    pass  # exiting too: its own death is noted when it comes

    def _start_wait_over(self) -> None:
        if not self._started:
            self._started = True
            self.log_event(
                "workers_slow_to_start",
                logging.WARNING,
                ready=sum(w is not None and w.ready for w in self.workers),
            )
            self._set_accepting()

    def pids(self) -> list[int | None]:
        return [w.process.pid if w is not None else None for w in self.workers]

    # --- run ---------------------------------------------------------------------------------
    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopped.set)
        self.listen()
        self._announce()
        for index in range(self.count):
            self._start_worker(index)
        loop.call_later(_START_WAIT, self._start_wait_over)
        tap_cfg = self.config.tap
        if tap_cfg.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(SummedMetrics(self))
            start_http_server(tap_cfg.metrics_port, tap_cfg.metrics_host, registry=registry)
        await self._stopped.wait()
        await self.stop()
        return 1 if self._failed else 0

    def _announce(self) -> None:
        """The tap's start record: readers then know that its earlier runs' connections without a
        ``close`` ended with them, their loss unknown."""
        if not self.mirror:
            return
        from tap.app import mirror_sink

        self.sink = mirror_sink(self.config, lambda err: None)
        now = time.time_ns()
        conn = f"{self.instance}.{taprecord.incarnation(now)}"
        value = taprecord.pack_tap_event(
            taprecord.TAP_START, conn, self.instance, now, {"pid": os.getpid(), "workers": self.count}
        )
        self.sink.offer(MirrorRecord(conn.encode(), value))
        self.log_event("tap_start", connections=conn)

    async def stop(self) -> None:
        self.log_event("stopping", workers=self.count)
        self._stopping = True
        self._set_accepting()
        for sock, _ in self.listening:
            sock.close()
        live = [w for w in self.workers if w is not None]
        if not live:
            return
        for worker in live:
            if worker.process.is_alive():
                worker.process.terminate()  # SIGTERM: close connections, flush the mirror queue
        try:
            await asyncio.wait_for(self._all_exited.wait(), STOP_SECONDS)
        except TimeoutError:
            for left in self.workers:
                if left is not None and left.process.is_alive():
                    self.log_event("worker_killed", logging.WARNING, worker=left.index)
                    left.process.kill()
            await asyncio.wait_for(self._all_exited.wait(), 5.0)


def run_workers(config: KpmonConfig, mirror: bool = True) -> int:
    from tap.app import no_listeners
    from tap.proxy import install_uvloop

    if no_listeners(config):
        return 2
    install_uvloop()
    supervisor = Supervisor(config, mirror)
    try:
        return asyncio.run(supervisor.serve())
    finally:
        supervisor.sink.close()
        shutil.rmtree(supervisor.dir, ignore_errors=True)
