"""The path a frame takes from the tap's socket to an alert hook, counted by tracing the code.

One Produce exchange and one JoinGroup exchange (its answer names another protocol type than its
request: ``group.protocol_type_mismatch``), encoded with the codec, go through a real tap over loopback
sockets (``tap.proxy``'s adapter over the reference core, ``tap.core.PyTapCore``, into
``tap.mirror.MemoryMirror``), the job's router and stateful stage as the
job runs them (``streaming.frames.record_rows``, ``streaming.stages.LocalStages`` over the job's pages),
the foreachBatch sink (``streaming.sink.BatchSink``) and a log hook (``streaming.hooks.AlertHooks``),
with ``sys.setprofile`` (``threading.setprofile`` for the hook's thread). No broker, no Spark.

**The counting rule** (what docs/architecture.md's figures mean):

- A value *carries the frame* when it holds some of the frames' own content: the client id, the topic,
  the group or the member id the exchanges were built with (``Markers``), found in it at any depth
  (bytes and text, containers, the attributes of the project's objects). A key or an id made from the
  frame carries it too.
- A **hop** is a module of the project's packages (``PACKAGES``) calling another (``A -> B``) with the
  frame: an argument other than the receiver, or the returned (or yielded) value, carries it; a
  returned tuple is that many values. However many calls, of however many functions, cross from A to B,
  that is one hop (the list names them).
- A **back-and-forth** is a pair of modules with hops both ways: A hands the frame to B, and B hands
  it (or what it made of it) back to A, as a callback, a generator A lends B, or a call back.
- A **shape** is the type of a value that carries the frame across a hop: its class (qualified name,
  ``str`` and ``bytes`` included, whatever their text or encoding holds); every ``dict`` is one shape,
  ``dict``. A list, tuple or set whose elements are all of one type is a collection: it has the shapes of
  its elements that carry the frame (a list of X moves X). One whose elements are of several types is a
  row, a shape of its own named by the types of its fields, None left out (``list[bool | bytes | int | str]``:
  a packed frame).
- A **pairing** is a call that finds a waiting request by its correlation id, to pair it with its answer or
  to stop waiting for one: a function of the project's packages handed the exchange's correlation id (an
  argument) but not the request, that returns (or yields) a value holding the request's own content (the
  client id, which only requests carry). Each exchange has a correlation id no
  other number on the path shares (``Markers``). The functions that pair are the *pairing
  implementations*; a call within one module counts as well as one between two.

``python -m benchmarks.frame_path --write`` writes the figures into docs/architecture.md between its
markers; tests/streaming/test_frame_path.py fails when the document and the code disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import inspect
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, Final

import codec
from checks.settings import ChecksSettings
from codec import native
from codec.native import ENV
from codec.records import build_record_batch
from kpconfig.model import KpmonConfig
from streaming.frames import record_rows
from streaming.hooks import AlertHooks
from streaming.pages import DictPageBackend, PagedBucketStore
from streaming.paths import StreamPaths
from streaming.sink import BatchResult, BatchSink
from streaming.stages import LocalStages
from tap import native_core as tap_native
from tap.flush import FlushLimits
from tap.mirror import MemoryMirror
from tap.proxy import ListenerSpec, Tap, TapSettings

#: The project's packages: a call between two of their modules is a hop.
PACKAGES: Final = frozenset({"codec", "tap", "checks", "streaming", "kpmon", "deploy", "airflow_dags"})
DOC: Final = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
BEGIN: Final = "<!-- python -m benchmarks.frame_path --write writes this block: do not edit it by hand -->"
END: Final = "<!-- end of the block benchmarks.frame_path writes -->"
#: The issue's targets (issue 35): hops from the tap's socket to a hook, none back and forth; shapes;
#: pairing implementations on the path, and pairings of each exchange.
MAX_HOPS: Final = 25
MAX_SHAPES: Final = 8
MAX_PAIRING_IMPLEMENTATIONS: Final = 1
MAX_PAIRINGS_PER_EXCHANGE: Final = 1

_PID: Final = 4242
#: Correlation ids are drawn from here: far above the small numbers (versions, counts, indices) a call
#: is otherwise handed, below int32's top.
_CORRELATION_IDS: Final = range(1 << 28, (1 << 31) - 1)
_PRODUCE, _JOIN_GROUP = 0, 11
_SIZE: Final = struct.Struct(">i")
#: Bounds on how far one value is searched for the frame's content (a state store can be large).
_MAX_NODES: Final = 5_000
_RECEIVERS: Final = ("self", "cls")


def _framed(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


@dataclass(frozen=True)
class Markers:
    """The frames' own content: a value that holds one of these carries the frame. New ones each run, so
    no cache a run filled (``checks.rule.SharedValues``) spares the next its first-time work."""

    client_id: str
    topic: str
    group: str
    member: str
    #: The Produce exchange's and the JoinGroup exchange's correlation ids.
    produce_corr: int
    join_corr: int

    @classmethod
    def fresh(cls) -> Markers:
        tag = uuid.uuid4().hex[:12]
        produce_corr, join_corr = random.sample(_CORRELATION_IDS, 2)
        return cls(
            f"path-client-{tag}",
            f"path-topic-{tag}",
            f"path-group-{tag}",
            f"path-member-{tag}",
            produce_corr,
            join_corr,
        )

    @property
    def exchanges(self) -> dict[int, str]:
        """Correlation id -> the exchange's name."""
        return {self.produce_corr: "Produce", self.join_corr: "JoinGroup"}

    @property
    def texts(self) -> tuple[str, ...]:
        return (self.client_id, self.topic, self.group, self.member)


def exchanges(markers: Markers) -> list[tuple[bytes, bytes]]:
    """The two exchanges as wire frames (request, response), encoded with the codec: an idempotent
    Produce answered without error, and a JoinGroup whose answer names ``connect`` for a ``consumer``
    request (``group.protocol_type_mismatch``)."""
    client_id, topic = markers.client_id, markers.topic
    batch = build_record_batch([(None, b"v0")], producer_id=_PID, producer_epoch=0, base_sequence=0)
    produce = codec.encode_request(
        _PRODUCE,
        9,
        markers.produce_corr,
        client_id,
        {
            "TransactionalId": None,
            "Acks": -1,
            "TimeoutMs": 30000,
            "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": batch}]}],
        },
    )
    produced = codec.encode_response(
        _PRODUCE,
        9,
        markers.produce_corr,
        {
            "Responses": [
                {"Name": topic, "PartitionResponses": [{"Index": 0, "ErrorCode": 0, "BaseOffset": 0}]}
            ]
        },
    )
    subscription = struct.pack(">h", 3) + codec.encode_data(
        "ConsumerProtocolSubscription",
        3,
        {"Topics": [topic], "UserData": None, "OwnedPartitions": [], "GenerationId": -1, "RackId": None},
    )
    join = codec.encode_request(
        _JOIN_GROUP,
        7,
        markers.join_corr,
        client_id,
        {
            "GroupId": markers.group,
            "SessionTimeoutMs": 10000,
            "RebalanceTimeoutMs": 10000,
            "MemberId": "",
            "GroupInstanceId": None,
            "ProtocolType": "consumer",
            "Protocols": [{"Name": "range", "Metadata": subscription}],
        },
    )
    joined = codec.encode_response(
        _JOIN_GROUP,
        7,
        markers.join_corr,
        {
            "ErrorCode": 0,
            "GenerationId": 1,
            "ProtocolType": "connect",
            "ProtocolName": "range",
            "Leader": markers.member,
            "MemberId": markers.member,
            "Members": [],
        },
    )
    return [(_framed(produce), _framed(produced)), (_framed(join), _framed(joined))]


async def _through_tap(pairs: list[tuple[bytes, bytes]]) -> list[bytes]:
    answers = iter([resp for _, resp in pairs])

    async def broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Answers each request frame with the next response, as a broker would.
        try:
            while True:
                size = _SIZE.unpack(await reader.readexactly(4))[0]
                await reader.readexactly(size)
                writer.write(next(answers))
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(broker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sink = MemoryMirror()
    # Flushed when the connection closes: the age bound would only split the same entries differently.
    settings = TapSettings(instance_id="tap-path", flush=FlushLimits(max_age_ns=60 * 10**9))
    tap = Tap([ListenerSpec("127.0.0.1", 0, "127.0.0.1", port, broker_id=1)], sink, settings)
    host, tap_port = (await tap.start())[0]
    reader, writer = await asyncio.open_connection(host, tap_port)
    for request, response in pairs:
        writer.write(request)
        await reader.readexactly(len(response))
    writer.close()
    await writer.wait_closed()
    await asyncio.wait_for(_closed(tap), 60)
    await tap.stop()
    server.close()
    await server.wait_closed()
    return [record.value for record in sink.take()]


async def _closed(tap: Tap) -> None:
    """Until the tap has seen the connection close: then it has written the connection's record."""
    while tap.connections:
        await asyncio.sleep(0.005)


def tap_records(pairs: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The tap records a real tap writes for ``pairs`` on one client connection: its adapter
    (``tap.proxy.TapConnection``) over the connection's core, the reference ``PyTapCore`` wherever
    ``measure`` counts (framing, pairing, capture, the flush)."""
    return asyncio.run(_through_tap(pairs))


def job(records: list[bytes], state_dir: Path) -> list[BatchResult]:
    """``records`` (one tap-topic partition) through the job's router and stateful stage, the sink and a
    log hook, in one micro-batch; then a batch with the watermark past everything, as an idle stream's
    timers fire. Each batch's result, once the hook delivered what the batches published."""
    config = ChecksSettings(watermark_seconds=2.0)
    # One bucket: the keys (made of the random markers) then meet in the same order every run.
    stages = LocalStages(config, 1, lambda: PagedBucketStore(DictPageBackend()))
    rows = [row for offset, value in enumerate(records) for row in record_rows({}, value, 0, offset)]
    paths = StreamPaths(state_dir / "stream")
    paths.make()
    log_hook = KpmonConfig.model_validate({"alerts": {"hooks": [{"kind": "log", "min_severity": "info"}]}})
    hooks = AlertHooks(log_hook, paths.spool)
    try:
        sink = BatchSink(paths, hooks, None)
        results = [
            sink.process(batch_id, [out._asdict() for out in stages.batch(batch, watermark_ms)])
            for batch_id, (batch, watermark_ms) in enumerate([(rows, 0), ([], 2**62 // 10**6)])
        ]
        if not hooks.flush(30.0):
            raise RuntimeError("the log hook did not deliver the alerts")
        delivered = sum(stats["delivered"] for stats in hooks.stats().values())
    finally:
        hooks.close()
    if not delivered:
        raise RuntimeError("the exchanges reached no hook: nothing found")
    return results


@dataclass
class Figures:
    """What one traced run measured."""

    #: ``A -> B`` (modules) -> the calls crossing it (``caller -> callee``, qualified names), in the
    #: order first crossed (the main thread's, then the hook thread's).
    hops: dict[str, list[str]] = field(default_factory=dict)
    #: ``A <-> B``: module pairs with hops both ways.
    back_and_forth: list[str] = field(default_factory=list)
    #: Shape -> the first call it crossed.
    shapes: dict[str, str] = field(default_factory=dict)
    #: The rules whose alerts reached the hook.
    rules: list[str] = field(default_factory=list)
    #: Exchange ("Produce", "JoinGroup") -> the pairings of it, in order: ``caller -> callee``.
    pairings: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pairing_implementations(self) -> list[str]:
        """The functions that paired an exchange (``module:qualified name``), in the order first seen."""
        return list(
            dict.fromkeys(
                call.split(", under ")[0].split(" -> ")[1]
                for calls in self.pairings.values()
                for call in calls
            )
        )


class _Content:
    """Whether a value holds some of the frames' own content (``Markers``), at any depth."""

    def __init__(self, markers: Markers) -> None:
        self.texts = markers.texts
        self.raw = tuple(text.encode() for text in self.texts)
        self.exchanges = markers.exchanges
        self._request = ((markers.client_id,), (markers.client_id.encode(),))

    def holds_request(self, value: Any) -> bool:
        """Whether ``value`` holds a request's own content (its client id: no answer carries one)."""
        return _holds(value, *self._request)

    def exchange_of(self, values: list[Any]) -> str | None:
        """The exchange whose correlation id is among ``values`` (an argument handed over as it is)."""
        for value in values:
            if type(value) is int and value in self.exchanges:
                return self.exchanges[value]
        return None

    def carries(self, value: Any) -> bool:
        return _holds(value, self.texts, self.raw)

    def shapes(self, value: Any) -> list[str]:
        """The shapes of a value that carries the frame (the module docstring's rule)."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            return ["bytes"]
        if isinstance(value, dict):
            return ["dict"]
        if type(value) in (list, tuple, set, frozenset):
            if len({type(item) for item in value}) == 1:
                # A collection moves its elements.
                return sorted({s for item in value if self.carries(item) for s in self.shapes(item)})
            fields = sorted({_type_name(type(item)) for item in value if item is not None})
            return [f"{type(value).__name__}[{' | '.join(fields)}]"]
        return [_type_name(type(value))]


def _holds(value: Any, texts: tuple[str, ...], raws: tuple[bytes, ...]) -> bool:
    """Whether ``value`` holds one of ``texts`` (as text, or as ``raws``: their UTF-8 bytes) at any depth."""
    seen: set[int] = set()
    stack = [value]
    nodes = 0
    while stack and nodes < _MAX_NODES:
        item = stack.pop()
        nodes += 1
        if item is None or isinstance(item, (bool, int, float)):
            continue
        if isinstance(item, str):
            if any(text in item for text in texts):
                return True
            continue
        if isinstance(item, (bytes, bytearray, memoryview)):
            data = bytes(item)
            if any(raw in data for raw in raws):
                return True
            continue
        if id(item) in seen or isinstance(item, (type, CodeType, FrameType)) or callable(item):
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        else:
            stack.extend(_attributes(item))
    return False


def _type_name(klass: type) -> str:
    return (
        klass.__qualname__ if klass.__module__ == "builtins" else f"{klass.__module__}.{klass.__qualname__}"
    )


def _attributes(obj: Any) -> Iterator[Any]:
    if type(obj).__module__.split(".")[0] not in PACKAGES:
        # Only the project's objects are opened: a library's (a lock, a socket, a registry) holds no frame.
        return
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        yield from attrs.values()
    if dataclasses.is_dataclass(obj):
        # A dataclass compiled by mypyc keeps its fields but neither ``__dict__`` nor ``__slots__``.
        for found in dataclasses.fields(obj):
            yield getattr(obj, found.name, None)
    for klass in type(obj).__mro__:
        for name in getattr(klass, "__slots__", ()):
            if hasattr(obj, name):
                yield getattr(obj, name)


def _arguments(frame: FrameType) -> list[Any]:
    """A call's arguments, without its receiver (``self``/``cls``)."""
    code = frame.f_code
    named = code.co_argcount + code.co_kwonlyargcount
    star = code.co_varnames[named] if code.co_flags & inspect.CO_VARARGS else None
    keywords = (
        code.co_varnames[named + (star is not None)] if code.co_flags & inspect.CO_VARKEYWORDS else None
    )
    local = frame.f_locals
    out = [local[n] for n in code.co_varnames[:named] if n not in _RECEIVERS and n in local]
    if star is not None:
        out.extend(local.get(star, ()))
    if keywords is not None:
        out.extend(local.get(keywords, {}).values())
    return out


class _Thread:
    """One thread's crossings, in order."""

    def __init__(self) -> None:
        #: (caller module, callee module) -> the calls crossing it.
        self.hops: dict[tuple[str, str], dict[str, None]] = {}
        self.shapes: dict[str, str] = {}
        #: Exchange -> the calls that paired it.
        self.pairings: dict[str, list[str]] = {}


class _Tracer:
    """The profile function (``sys.setprofile``): the hops and the shapes crossing them, per thread."""

    def __init__(self, content: _Content) -> None:
        self.content = content
        self.threads: dict[int, _Thread] = {}
        self._names: dict[CodeType, tuple[str, str] | None] = {}
        #: Running calls handed an exchange's correlation id: their frame -> (exchange, call).
        self._asked: dict[FrameType, tuple[str, str]] = {}

    def _name(self, frame: FrameType) -> tuple[str, str] | None:
        """(module, qualified name) of a function of the project's packages, else None."""
        code = frame.f_code
        if code in self._names:
            return self._names[code]
        module = frame.f_globals.get("__name__")
        name: tuple[str, str] | None = None
        if isinstance(module, str) and module.split(".")[0] in PACKAGES:
            name = (module, code.co_qualname)
            if code.co_name == "__init__" and "<locals>" in code.co_qualname:
                # A dataclass's generated __init__ (shared by no other class): named by its class.
                name = (module, f"{type(frame.f_locals.get('self')).__qualname__}.__init__")
        self._names[code] = name
        return name

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" and event != "return":
            return
        caller_frame = frame.f_back
        if caller_frame is None:
            return
        callee = self._name(frame)
        if callee is None:
            return
        caller = self._name(caller_frame)
        if caller is None:
            return
        content = self.content
        # A returned tuple is several values returned, as arguments are several values passed.
        values = _arguments(frame) if event == "call" else list(arg) if type(arg) is tuple else [arg]
        self._pairing(frame, event, values, arg, caller, callee)
        if caller[0] == callee[0]:
            return
        shapes = [shape for v in values if content.carries(v) for shape in content.shapes(v)]
        if not shapes:
            return
        thread = self._thread()
        call = f"{caller[0]}:{caller[1]} -> {callee[0]}:{callee[1]}"
        thread.hops.setdefault((caller[0], callee[0]), {}).setdefault(call, None)
        for shape in shapes:
            thread.shapes.setdefault(shape, call)

    def _outside(self, frame: FrameType, modules: set[str]) -> str:
        """The nearest caller of ``frame`` in another of the project's modules than ``modules``: where,
        on the path, a call within a module happened."""
        outer = frame.f_back
        while outer is not None:
            name = self._name(outer)
            if name is not None and name[0] not in modules:
                return f"{name[0]}:{name[1]}"
            outer = outer.f_back
        return "the driver"

    def _thread(self) -> _Thread:
        thread = self.threads.get(threading.get_ident())
        if thread is None:
            thread = self.threads[threading.get_ident()] = _Thread()
        return thread

    def _pairing(
        self,
        frame: FrameType,
        event: str,
        arguments: list[Any],
        arg: Any,
        caller: tuple[str, str],
        callee: tuple[str, str],
    ) -> None:
        """A call handed an exchange's correlation id is a pairing when it hands back its request
        (``arguments``: the call's, on its ``call`` event; ``arg``: what it returned)."""
        if event == "call":
            exchange = self.content.exchange_of(arguments)
            # Handed the request itself, a call builds from it (a frame, a message): it finds nothing.
            if exchange is not None and not any(self.content.holds_request(a) for a in arguments):
                call = f"{caller[0]}:{caller[1]} -> {callee[0]}:{callee[1]}"
                self._asked[frame] = (
                    exchange,
                    f"{call}, under {self._outside(frame, {caller[0], callee[0]})}",
                )
            return
        asked = self._asked.pop(frame, None)
        if asked is not None and self.content.holds_request(arg):
            exchange, call = asked
            self._thread().pairings.setdefault(exchange, []).append(call)

    def figures(self, main: int) -> Figures:
        ordered = sorted(self.threads.items(), key=lambda item: item[0] != main)
        hops: dict[tuple[str, str], dict[str, None]] = {}
        shapes: dict[str, str] = {}
        pairings: dict[str, list[str]] = {}
        for _, thread in ordered:
            for hop, calls in thread.hops.items():
                hops.setdefault(hop, {}).update(calls)
            for shape, call in thread.shapes.items():
                shapes.setdefault(shape, call)
            for exchange, paired in thread.pairings.items():
                pairings.setdefault(exchange, []).extend(paired)
        both = sorted({(min(a, b), max(a, b)) for a, b in hops if (b, a) in hops})
        return Figures(
            hops={f"{a} -> {b}": list(calls) for (a, b), calls in hops.items()},
            back_and_forth=[f"{a} <-> {b}" for a, b in both],
            shapes=shapes,
            pairings={name: pairings.get(name, []) for name in ("Produce", "JoinGroup")},
        )


def _reference_cores() -> bool:
    """Whether this process runs the plain-Python cores: the codec's and the checks' (not their mypyc
    build) and the tap's reference core (``tap.core.PyTapCore``, not ``kpmon_tapcore.TapCore``)."""
    return not native.status()[0] and not hasattr(tap_native.status()[0], "TapCore")


@functools.cache
def measure() -> Figures:
    """The figures, counted on the plain-Python cores: compiled code (the mypyc build of the cores, the
    native tap core) hides its calls from the profiler. Traced in this process when it runs them, else
    in a fresh interpreter with ``KPMON_NATIVE=0``."""
    if _reference_cores():
        return measure_here()
    env = {**os.environ, ENV: "0"}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.frame_path", "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"benchmarks.frame_path --json failed:\n{out.stderr}")
    return Figures(**json.loads(out.stdout))


def measure_here() -> Figures:
    """Drive the two exchanges from the tap's socket to the hook in this process, traced: the figures."""
    markers = Markers.fresh()
    pairs = exchanges(markers)
    tracer = _Tracer(_Content(markers))
    with tempfile.TemporaryDirectory(prefix="kpmon-path-") as tmp:
        previous, previous_threads = sys.getprofile(), threading.getprofile()
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            results = job(tap_records(pairs), Path(tmp))
        finally:
            sys.setprofile(previous)
            threading.setprofile(previous_threads)
    figures = tracer.figures(threading.get_ident())
    figures.rules = sorted({alert.rule for result in results for alert in result.alerts})
    return figures


def render(figures: Figures) -> str:
    """The block docs/architecture.md holds between ``BEGIN`` and ``END``."""
    lines = [
        BEGIN,
        "",
        f"**{len(figures.hops)} hops, {len(figures.back_and_forth)} back and forth, "
        f"{len(figures.shapes)} shapes** (targets: at most {MAX_HOPS} hops, none back and forth, "
        f"at most {MAX_SHAPES} shapes).",
        "",
        "<details><summary>The hops, in the order the frames first cross them, each with the calls that "
        "cross it</summary>",
        "",
        *[
            f"{n}. `{hop}`: " + ", ".join(f"`{_short(call)}`" for call in calls)
            for n, (hop, calls) in enumerate(figures.hops.items(), 1)
        ],
        "",
        "</details>",
        "",
        "Back and forth: " + (", ".join(f"`{pair}`" for pair in figures.back_and_forth) or "none") + ".",
        "",
        f"**{_counted(len(figures.pairing_implementations), 'pairing implementation')}, "
        + ", ".join(
            f"{name} paired {_counted(len(calls), 'time')}" for name, calls in figures.pairings.items()
        )
        + f"** (targets: at most {MAX_PAIRING_IMPLEMENTATIONS} implementation and "
        f"{MAX_PAIRINGS_PER_EXCHANGE} pairing per exchange):",
        "",
        *[
            f"- {name}: " + ", ".join(f"`{call}`" for call in calls)
            for name, calls in figures.pairings.items()
        ],
        "",
        "| shape | first crosses with |",
        "|---|---|",
        *[f"| `{shape}` | `{hop}` |" for shape, hop in figures.shapes.items()],
        "",
        END,
    ]
    return "\n".join(lines)


def _counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is one: "1 time", "3 times"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _short(call: str) -> str:
    """``a.b:f -> c.d:g`` as ``f -> g``: the hop it belongs to names the modules."""
    caller, callee = call.split(" -> ")
    return f"{caller.partition(':')[2]} -> {callee.partition(':')[2]}"


def documented(text: str) -> str:
    """The block between the markers in ``text`` (markers included)."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="write the figures into docs/architecture.md")
    parser.add_argument(
        "--json", action="store_true", help="trace in this process, print the figures as JSON"
    )
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(dataclasses.asdict(measure_here())))
        return 0
    block = render(measure())
    if args.write:
        text = DOC.read_text()
        DOC.write_text(text.replace(documented(text), block))
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
