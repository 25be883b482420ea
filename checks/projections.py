"""The body fields each keyed rule reads, per API: what a frame keeps when it is routed to an entity key.

The job's router (``streaming.router``) decodes a frame once; the connection-scoped rules
(``checks.sharding.ConnectionShard``) see all of it. A copy ``checks.sharding.Router`` sends to an
entity key (a producer id, a transactional id, a group, the cluster) carries only the body fields
that the rules of that key kind declare here, plus the few the engine itself reads; the request and
response headers travel whole. So the routes, the shuffle and the entity entries' state hold the
facts those rules need and nothing else. The routes a summary stands for (``checks.summaries``) are
the one exception on the way: they travel whole, as their frames' bytes, and the keyed shard projects
them the same way if it has to read them.

Paths are dotted field names, as in a codec projection (``codec.projection``): list elements share
their list's path, and a path ending at a struct, a list of structs, a record set or a nested payload
keeps it whole. A path named only as a prefix of longer ones keeps just those.

The declarations are checked, not trusted: every test in tests/checks runs the keyed rules over
bodies that record what is read (``tests/checks/recording.py``), and a read outside these paths fails
the test that made it. The staged-pipeline proofs then show the routed facts are enough.
"""

from __future__ import annotations

import itertools
import linecache
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from codec.api import kept_whole
from codec.errors import DecodeError
from codec.messages import Request, Response
from codec.protocol import ApiKey
from codec.taprecord import TapFrame

#: A run of a producer's ordinary Produce exchanges (``checks.summaries.ProduceRun``).
PRODUCE_RUN: Final = "produce_run"
#: A run of a group member's steady heartbeats (``checks.summaries.HeartbeatRun``).
HEARTBEAT_RUN: Final = "heartbeat_run"

#: (request paths, response paths) of one API.
Reads = tuple[tuple[str, ...], tuple[str, ...]]
#: A projection as a tree: field name -> the tree below it, or None to keep the field whole.
Tree = dict[str, "Tree | None"]

_TOPIC_DATA = (
    "TopicData.Name",
    "TopicData.TopicId",
    "TopicData.PartitionData.Index",
    "TopicData.PartitionData.Records",
)
_PRODUCE_ANSWERS = (
    "Responses.Name",
    "Responses.TopicId",
    "Responses.PartitionResponses.Index",
    "Responses.PartitionResponses.ErrorCode",
    "Responses.PartitionResponses.BaseOffset",
)
_TXN_CLAIM = ("TransactionalId", "ProducerId", "ProducerEpoch")
_ADD_PARTITIONS_REQUEST = (
    "V3AndBelowTransactionalId",
    "V3AndBelowProducerId",
    "V3AndBelowProducerEpoch",
    "Transactions.TransactionalId",
    "Transactions.ProducerId",
    "Transactions.ProducerEpoch",
    "Transactions.VerifyOnly",
)
#: The partitions an AddPartitionsToTxn asks for (the txn rule tells an unanswered add from a missing one).
_ADD_PARTITIONS_ASKED = (
    "V3AndBelowTopics.Name",
    "V3AndBelowTopics.Partitions",
    "Transactions.Topics.Name",
    "Transactions.Topics.Partitions",
)
_ADD_PARTITIONS_ANSWERS = (
    "ErrorCode",
    "ResultsByTopicV3AndBelow.Name",
    "ResultsByTopicV3AndBelow.ResultsByPartition.PartitionIndex",
    "ResultsByTopicV3AndBelow.ResultsByPartition.PartitionErrorCode",
    "ResultsByTransaction.TransactionalId",
    "ResultsByTransaction.TopicResults.Name",
    "ResultsByTransaction.TopicResults.ResultsByPartition.PartitionIndex",
    "ResultsByTransaction.TopicResults.ResultsByPartition.PartitionErrorCode",
)
_TXN_OFFSET_ANSWERS = ("Topics.Partitions.ErrorCode",)
_MEMBER_HEARTBEAT: Reads = (
    ("GroupId", "MemberId", "MemberEpoch"),
    ("ErrorCode", "ErrorMessage", "MemberId", "MemberEpoch"),
)
_GROUP_DESCRIBE: Reads = (
    ("GroupIds",),
    (
        "Groups.GroupId",
        "Groups.ErrorCode",
        "Groups.GroupState",
        "Groups.GroupEpoch",
        "Groups.AssignorName",
        "Groups.Members",
    ),
)

#: Rule name -> API -> (request paths, response paths). Only keyed rules: the connection-scoped ones
#: get whole bodies where they read them (``CONNECTION_BODIES``, ``project_for_connection``).
READS: Final[Mapping[str, Mapping[int, Reads]]] = {
    "producer": {
        ApiKey.PRODUCE: (("TransactionalId", *_TOPIC_DATA), _PRODUCE_ANSWERS),
        ApiKey.INIT_PRODUCER_ID: (("TransactionalId",), ("ErrorCode", "ProducerId", "ProducerEpoch")),
        ApiKey.ADD_PARTITIONS_TO_TXN: (_ADD_PARTITIONS_REQUEST, _ADD_PARTITIONS_ANSWERS),
        ApiKey.ADD_OFFSETS_TO_TXN: (_TXN_CLAIM, ("ErrorCode",)),
        ApiKey.END_TXN: (_TXN_CLAIM, ("ErrorCode", "ProducerId", "ProducerEpoch")),
        ApiKey.WRITE_TXN_MARKERS: (
            ("Markers.ProducerId", "Markers.ProducerEpoch"),
            ("Markers.ProducerId", "Markers.Topics.Partitions.ErrorCode"),
        ),
        ApiKey.TXN_OFFSET_COMMIT: (_TXN_CLAIM, _TXN_OFFSET_ANSWERS),
    },
    "txn_pid": {
        ApiKey.PRODUCE: (("TransactionalId", *_TOPIC_DATA), ("ErrorCode",)),
        ApiKey.INIT_PRODUCER_ID: (("TransactionalId",), ("ErrorCode", "ProducerId", "ProducerEpoch")),
        ApiKey.ADD_PARTITIONS_TO_TXN: (_ADD_PARTITIONS_REQUEST, ("ErrorCode",)),
        ApiKey.ADD_OFFSETS_TO_TXN: (_TXN_CLAIM, ("ErrorCode",)),
        ApiKey.END_TXN: (_TXN_CLAIM, ("ErrorCode", "ProducerId", "ProducerEpoch")),
        ApiKey.TXN_OFFSET_COMMIT: (_TXN_CLAIM, ("ErrorCode",)),
    },
    "txn": {
        ApiKey.PRODUCE: (("TransactionalId", *_TOPIC_DATA), _PRODUCE_ANSWERS),
        ApiKey.INIT_PRODUCER_ID: (
            ("TransactionalId", "TransactionTimeoutMs"),
            ("ErrorCode", "ProducerId", "ProducerEpoch"),
        ),
        ApiKey.ADD_PARTITIONS_TO_TXN: (
            (*_ADD_PARTITIONS_REQUEST, *_ADD_PARTITIONS_ASKED),
            _ADD_PARTITIONS_ANSWERS,
        ),
        ApiKey.ADD_OFFSETS_TO_TXN: (_TXN_CLAIM, ("ErrorCode",)),
        ApiKey.END_TXN: (_TXN_CLAIM, ("ErrorCode", "ProducerId", "ProducerEpoch")),
        ApiKey.TXN_OFFSET_COMMIT: (_TXN_CLAIM, _TXN_OFFSET_ANSWERS),
    },
    "group": {
        ApiKey.JOIN_GROUP: (
            ("GroupId", "MemberId", "ProtocolType", "Protocols.Name", "Protocols.Metadata"),
            (
                "ErrorCode",
                "GenerationId",
                "MemberId",
                "ProtocolType",
                "ProtocolName",
                "Members.MemberId",
                "Members.Metadata",
            ),
        ),
        ApiKey.SYNC_GROUP: (
            (
                "GroupId",
                "MemberId",
                "GenerationId",
                "ProtocolType",
                "ProtocolName",
                "Assignments.MemberId",
                "Assignments.Assignment",
            ),
            ("ErrorCode", "ProtocolType", "ProtocolName", "Assignment"),
        ),
        ApiKey.DESCRIBE_GROUPS: (
            ("Groups",),
            (
                "Groups.GroupId",
                "Groups.ErrorCode",
                "Groups.GroupState",
                "Groups.ProtocolType",
                "Groups.Members.MemberId",
                "Groups.Members.MemberMetadata",
                "Groups.Members.MemberAssignment",
            ),
        ),
        ApiKey.LEAVE_GROUP: (
            ("GroupId", "MemberId"),
            ("ErrorCode", "Members.MemberId", "Members.ErrorCode"),
        ),
    },
    "group_protocol": {
        ApiKey.JOIN_GROUP: (("GroupId",), ("ErrorCode",)),
        ApiKey.SYNC_GROUP: (("GroupId",), ("ErrorCode",)),
        ApiKey.CONSUMER_GROUP_HEARTBEAT: ((*_MEMBER_HEARTBEAT[0], "ServerAssignor"), _MEMBER_HEARTBEAT[1]),
        ApiKey.SHARE_GROUP_HEARTBEAT: _MEMBER_HEARTBEAT,
        ApiKey.STREAMS_GROUP_HEARTBEAT: _MEMBER_HEARTBEAT,
        ApiKey.CONSUMER_GROUP_DESCRIBE: _GROUP_DESCRIBE,
        ApiKey.SHARE_GROUP_DESCRIBE: _GROUP_DESCRIBE,
        ApiKey.STREAMS_GROUP_DESCRIBE: _GROUP_DESCRIBE,
    },
    "apiversions.cluster": {
        ApiKey.API_VERSIONS: (
            ("ClientSoftwareName", "ClientSoftwareVersion"),
            ("ErrorCode", "ApiKeys.ApiKey", "ApiKeys.MinVersion", "ApiKeys.MaxVersion"),
        ),
    },
}

#: Rule name -> the APIs whose answer can add to the rule's state keys (``Rule.keys``): the producer id
#: an InitProducerId answer assigns, or an EndTxn answer (KIP-890) replaces. The router works those
#: keys out again when the response comes; every other rule's keys are its request's, so the response
#: goes where the request went. Checked like the reads: in every test in tests/checks, a keyed rule
#: whose keys differ with and without the response, for an API not named here, fails the test.
ANSWER_KEYED: Final[Mapping[str, frozenset[int]]] = {
    "producer": frozenset({ApiKey.INIT_PRODUCER_ID, ApiKey.END_TXN}),
    "txn_pid": frozenset({ApiKey.INIT_PRODUCER_ID}),
}


@dataclass(frozen=True)
class Transitions:
    """The exchanges that can change a rule's state or make it report: its *transitions*. The router
    sends the stateful stage only what some rule declares here (``checks.sharding``); a frame no rule
    names never reaches it."""

    #: Every exchange of these APIs, with its body as ``READS`` (keyed rules) or ``CONNECTION_BODIES``
    #: (connection-scoped ones) keep it.
    apis: frozenset[int] = frozenset()
    #: Requests at a version Kafka 4.0 removed (KIP-896), and their answers.
    removed_versions: bool = False
    #: Frames that carry tagged-field evidence or bytes left over after the body (KIP-482), and
    #: undecodable ones.
    tag_evidence: bool = False
    #: Of every other exchange, its headers only (api, version, correlation id, client id, header
    #: versions, times and place): connection-scoped rules that judge every request by its header
    #: get such an exchange as a ``checks.engine.HeaderExchange``, packed without its bodies. Such a
    #: rule keys every exchange by its connection and says in ``Rule.on_quiet`` when its hook would
    #: only note the exchange.
    headers: bool = False
    #: Of every other request, a connection's first use of each (api, version) in a batch (the
    #: first-use-only key kinds, ``checks.sharding.FIRST_USE_ONLY``).
    first_use: bool = False
    #: The rule keeps nothing from one exchange to the next that could change a finding: the router
    #: judges it where it reads the tap records, and its exchanges need not reach the stateful stage.
    in_router: bool = False
    #: The summaries (``checks.summaries``) the rule can apply instead of the runs of exchanges they
    #: stand for (``Rule.on_summary``). A key kind gets them only when all its rules accept them.
    summaries: frozenset[str] = frozenset()

    def names_api(self, api_key: int) -> bool:
        """Whether every exchange of ``api_key`` is a transition of the rule (or may be: first uses)."""
        return api_key in self.apis or self.first_use


#: Rule name -> its transitions. Every rule of the catalogue declares them (``checks.sharding``
#: refuses a catalogue with a rule that does not, and tests/checks/test_projections.py fails): a rule
#: whose frames were silently never sent would be a rule that cannot fire.
TRANSITIONS: Final[Mapping[str, Transitions]] = {
    # Connection-scoped: the whole exchange where a rule reads its body, the headers of the rest.
    "apiversions": Transitions(apis=frozenset({ApiKey.API_VERSIONS}), removed_versions=True, headers=True),
    "flex": Transitions(tag_evidence=True, headers=True),
    "envelope": Transitions(apis=frozenset({ApiKey.ENVELOPE, ApiKey.BROKER_REGISTRATION})),
    "txn_read": Transitions(apis=frozenset({ApiKey.FETCH}), in_router=True),
    # Keyed: the exchanges of the APIs whose fields they read.
    **{
        rule: Transitions(apis=frozenset(READS[rule]), summaries=frozenset({PRODUCE_RUN}))
        for rule in ("producer", "txn_pid")
    },
    "txn": Transitions(apis=frozenset(READS["txn"])),
    "group": Transitions(apis=frozenset(READS["group"])),
    "group_protocol": Transitions(
        apis=frozenset(READS["group_protocol"]), summaries=frozenset({HEARTBEAT_RUN})
    ),
    "apiversions.cluster": Transitions(apis=frozenset({ApiKey.API_VERSIONS}), first_use=True),
}


#: The APIs whose exchanges each summary kind stands for: a key kind gets a summary kind when every
#: rule of it that names one of these APIs accepts it (``Transitions.summaries``).
SUMMARY_APIS: Final[Mapping[str, frozenset[int]]] = {
    PRODUCE_RUN: frozenset({ApiKey.PRODUCE}),
    HEARTBEAT_RUN: frozenset(
        {ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.STREAMS_GROUP_HEARTBEAT}
    ),
}


#: What the engine reads of a body whatever the rules: a Produce's acks (acks=0 completes the
#: exchange at once) and an Envelope's inner request and response (it unwraps them for the rules).
ENGINE_READS: Final[Mapping[int, Reads]] = {
    ApiKey.PRODUCE: (("Acks",), ()),
    ApiKey.ENVELOPE: (("RequestData", "RequestPrincipal"), ("ResponseData",)),
}


def tree_of(paths: Iterable[str]) -> Tree:
    """Dotted paths as a tree; a path that ends at a node keeps it whole (None)."""
    tree: Tree = {}
    # Unique in the order declared (a set's order would follow the process's string hashing, and the
    # pruned bodies' field order, so the packed facts, with it), shallowest first.
    for path in sorted(dict.fromkeys(paths), key=lambda p: p.count(".")):
        node = tree
        *parents, leaf = path.split(".")
        for name in parents:
            child = node.get(name, {})
            if child is None:
                break  # an ancestor is kept whole already
            node = node.setdefault(name, child)  # type: ignore[assignment]
        else:
            if leaf not in node:
                node[leaf] = None
    return tree


def covers(tree: Tree, path: str) -> bool:
    """Whether a projection with ``tree`` keeps the field at ``path`` (or everything read below it)."""
    node: Tree | None = tree
    for name in path.split("."):
        if node is None:
            return True
        if name not in node:
            return False
        node = node[name]
    return True


def rule_tree(rule: str, api_key: int, response: bool) -> Tree:
    """The fields ``rule`` declares for one side of an API, with the engine's own."""
    side = 1 if response else 0
    paths = [*READS.get(rule, {}).get(api_key, ((), ()))[side], *ENGINE_READS.get(api_key, ((), ()))[side]]
    return tree_of(paths)


@cache
def kind_tree(rules: tuple[str, ...], api_key: int, response: bool) -> Tree:
    """The union of ``rules``' declarations for one side of an API (the rules of one key kind)."""
    side = 1 if response else 0
    paths: list[str] = list(ENGINE_READS.get(api_key, ((), ()))[side])
    for rule in rules:
        paths += READS.get(rule, {}).get(api_key, ((), ()))[side]
    return tree_of(paths)


def pruner(tree: Tree) -> Callable[[Any], Any]:
    """A function that keeps only the fields ``tree`` names (lists pruned element by element), made
    once per tree: it runs for every routed frame.

    The function is generated source, one function per node of the tree with each field's test
    written out, registered in ``linecache`` under a ``<kpmon:projection ...>`` name so tracebacks and
    profiles show it. A closure that looped over the tree's fields cost about twice as much: on these
    few fields the loop and its tuple unpacking were most of the work (the router prunes every routed
    frame). Fields come out in the tree's order, as they always did: packed facts are byte-identical."""
    lines: list[str] = []
    names = itertools.count()

    def define(node: Tree) -> str:
        name = f"_keep{next(names)}"
        below = {field: define(sub) for field, sub in node.items() if sub is not None}
        lines.extend((f"def {name}(value):", "    if type(value) is dict:", "        out = {}"))
        for field in node:
            key = repr(field)
            child = below.get(field)
            if child is None:
                lines.append(f"        if {key} in value: out[{key}] = value[{key}]")
                continue
            lines.extend(
                (
                    f"        if {key} in value:",
                    f"            item = value[{key}]",
                    f"            out[{key}] = list(map({child}, item)) if type(item) is list else {child}(item)",
                )
            )
        lines.extend(
            ("        return out", "    if type(value) is list:", f"        return list(map({name}, value))")
        )
        lines.append("    return value")
        return name

    root = define(tree)
    source = "\n".join(lines) + "\n"
    filename = f"<kpmon:projection {next(_PRUNER_IDS)}>"
    # mtime None marks a non-file entry: linecache.checkcache() keeps it.
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), namespace)
    keep: Callable[[Any], Any] = namespace[root]
    return keep


_PRUNER_IDS = itertools.count()


def prune(value: Any, tree: Tree) -> Any:
    """``value`` with only the fields ``tree`` names (lists pruned element by element)."""
    return pruner(tree)(value)


@cache
def kind_pruner(rules: tuple[str, ...], api_key: int, response: bool) -> Callable[[Any], Any]:
    """``pruner`` of ``kind_tree``: what a frame routed to the rules of one key kind keeps."""
    return pruner(kind_tree(rules, api_key, response))


def _same(value: Any) -> Any:
    return value


@cache
def version_pruner(
    rules: tuple[str, ...], api_key: int, api_version: int, response: bool
) -> Callable[[Any], Any]:
    """``kind_pruner`` for bodies decoded at ``api_version`` with nothing but that version's fields
    (no tagged-field evidence, no bytes left over): a struct whose every field the tree keeps at this
    version is kept as it is, the same object, instead of copied field by field. A Produce routed to a
    producer key drops only ``TimeoutMs``: its topics, partitions and record sets are not copied. A
    struct kept whole keeps its fields in the order the frame has them, not the tree's."""
    tree = kind_tree(rules, api_key, response)
    try:
        normal = kept_whole(api_key, api_version, response, tree)
    except DecodeError:
        return kind_pruner(rules, api_key, response)
    whole = _whole_nodes(tree, normal)
    return _same if whole is None else pruner(whole)


def _whole_nodes(tree: Tree, normal: Mapping[str, Any] | None) -> Tree | None:
    """``tree`` in its own order with each node that ``normal`` (``codec.api.kept_whole``) keeps whole
    made a leaf; None when the whole body is kept. A field ``normal`` lacks is absent at its version:
    its node stays as it is and never matches."""
    if normal is None:
        return None
    out: Tree = {}
    for name, sub in tree.items():
        out[name] = sub if sub is None or name not in normal else _whole_nodes(sub, normal[name])
    return out


def project_frame(frame: TapFrame, rules: tuple[str, ...]) -> TapFrame:
    """``frame`` with a body that keeps only what ``rules`` (and the engine) read: a copy, or the frame
    itself where that is all of it. The parts of the body kept whole are shared with ``frame``, whose
    body nothing changes once decoded and expanded."""
    message = frame.message
    api_key = frame.api_key
    if message is None or api_key is None:
        return frame
    if _has_extra_keys(message):
        # Keys beyond the version's fields (``_unknown_tags``, ``_tag_anomalies``, ``_trailing``), or
        # evidence not known yet (a response waiting for its request to expand): the tree alone says
        # what stays.
        keep = kind_pruner(rules, api_key, frame.direction != "req")
        return frame.with_message(message.with_body(keep(message.body)))
    return _project_plain(frame, message, api_key, rules)


def _has_extra_keys(message: Request | Response) -> bool:
    """Whether ``message``'s body may hold keys its version's fields do not name."""
    return message.tag_extras is not False or "_trailing" in message.body


def _project_plain(
    frame: TapFrame, message: Request | Response, api_key: int, rules: tuple[str, ...]
) -> TapFrame:
    """``project_frame`` of a frame whose body holds its version's fields and nothing else."""
    keep = version_pruner(rules, api_key, message.api_version, frame.direction != "req")
    if keep is _same:
        return frame
    return frame.with_message(message.with_body(keep(message.body)))


#: APIs whose whole bodies the connection shard's rules read: ApiVersions (the advertised ranges),
#: Envelope and BrokerRegistration (KIP-590 trust); the read-committed check reads Fetch bodies in the
#: router (``Transitions.in_router``). Of every other API they read the headers (version ranges) and the tagged-field evidence (KIP-482: ``flex``), which the
#: codec flags on the message (``tag_extras``) and in a body decoded with bytes left over (``_trailing``).
CONNECTION_BODIES: Final = frozenset({ApiKey.API_VERSIONS, ApiKey.ENVELOPE, ApiKey.BROKER_REGISTRATION})


def project_for_connection(frame: TapFrame) -> TapFrame:
    """A copy of ``frame`` with what its connection's own key reads: the whole body where a
    connection-scoped rule reads it (``CONNECTION_BODIES``, or tagged-field evidence), otherwise only
    what the engine reads (``ENGINE_READS``)."""
    message = frame.message
    api_key = frame.api_key
    if message is None or api_key is None or api_key in CONNECTION_BODIES:
        return frame
    if _has_extra_keys(message):
        return frame
    return _project_plain(frame, message, api_key, ())
