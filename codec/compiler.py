"""Compile schema segments into specialised Python decode, skip and encode functions.

Interpreting the schema field by field for every frame is several times slower than running code that
was written for one message version. So, like Kafka's MessageGenerator (which writes Java), this module
writes Python source for a (message, version, projection) the first time it is needed, ``exec``s it once
and caches the functions. The generated code:

- groups runs of fixed-width fields into one ``struct`` unpack;
- checks every length against the bytes left before slicing or looping, so a hostile length can neither
  allocate more than the input nor spin (array lengths are checked against the element's minimum size);
- turns any low-level failure into ``DecodeError`` carrying the offset where the failing read began;
- skips unprojected fields without building them.
"""

from __future__ import annotations

import linecache
import re
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence, ValuesView
from itertools import count
from typing import Any

from codec.errors import DecodeError
from codec.schema import FIXED_FORMATS, FIXED_SIZES, FieldSpec, Segment
from codec.wire import (
    EncodeError,
    read_tagged_section,
    read_uvarint,
    skip_tagged_section,
    uuid_bytes,
    write_uvarint,
)

#: A projection: field name → sub-projection (None = the whole field). None at the top = everything.
Projection = Mapping[str, "Projection | None"]

Decoder = Callable[[bytes, int, int], tuple[dict[str, Any], int]]
Skipper = Callable[[bytes, int, int], int]
Encoder = Callable[[Mapping[str, Any], bytearray], None]

_ids = count()


#: Element counts a one-byte compact array length gives (uvarint 1-127 is n + 1).
_SHORT_ARRAY = 127

#: Array element counts whose Struct is kept; longer arrays (rare, and a hostile frame could make
#: every count distinct) build theirs per call.
_ARRAY_STRUCT_CACHE_LIMIT = 256


def _array_struct(cache: dict[int, struct.Struct], fmt: str, count: int) -> struct.Struct:
    compiled = struct.Struct(f">{count}{fmt}")
    if count < _ARRAY_STRUCT_CACHE_LIMIT:
        cache[count] = compiled
    return compiled


#: Elements per run of ``_DecodeWriter.layout_runs``; an array of fewer than ``_RUN_MIN`` elements
#: is decoded element by element (the run's set-up costs about as much as a few elements).
_RUN = 64
_RUN_MIN = 4
#: A run's arrays hold at most this many values each (longer ones take the element-by-element path).
_RUN_ARRAY_LIMIT = 32
#: Layouts (array lengths and run length) kept per struct, and builders (array lengths) generated per
#: struct: a hostile frame can make many layouts, so the caches stop growing here.
_RUN_LAYOUTS = 512
_RUN_BUILDERS = 64
#: Values (unpacked or checked) the cached run plans may cover, per struct and per namespace: at about
#: 24 bytes each, at most ~1.5 MiB of Structs per struct and ~50 MiB in all, whatever a frame holds.
_RUN_VALUES = 1 << 16
_RUN_VALUES_TOTAL = 1 << 21


def _run_key(lengths: list[str], size: str) -> str:
    """The expression packing one-byte array lengths and a run length (< 256 each) into one int."""
    expr = ""
    for var in lengths:
        expr = f"({expr}) << 8 | {var}" if expr else var
    return f"({expr}) << 8 | {size}" if expr else size


class _LayoutRuns(dict[int, Any]):
    """Run plans of one struct (and projection), by run key: the key packs each array's raw one-byte
    compact length and the run's element count. A plan is ``(Struct, size, run)``: the Struct unpacks
    the values of the whole run, and ``run(b, p, count, Struct)``, generated for those array lengths,
    checks every length byte and tag byte of the run in the frame and builds its list of dicts (None
    when a byte is not what the layout assumed). False for a key that cannot be a run (a null or long
    array, a frame cut short)."""

    def __init__(self, ns: _Namespace, fields: list[FieldSpec], proj: Projection | None, what: str) -> None:
        super().__init__()
        self.ns = ns
        self.fields = fields
        self.proj = proj
        self.what = what
        self.arrays = sum(1 for f in fields if f.is_array)
        self.builders: dict[tuple[int, ...], Callable[..., list[dict[str, Any]] | None]] = {}
        #: Values the cached plans unpack and check (see ``plan``).
        self.cost = 0

    def __repr__(self) -> str:
        return f"<layout runs of {self.what}: {len(self)} layouts, {len(self.builders)} builders>"

    def __missing__(self, key: int) -> Any:
        if len(self) >= _RUN_LAYOUTS:
            return False
        plan = self[key] = self.plan(key)
        return plan

    def plan(self, key: int) -> Any:
        if key < 0:
            return False
        size = key & 255
        raw = [(key >> (8 * (self.arrays - i))) & 255 for i in range(self.arrays)]
        if key >> (8 * (self.arrays + 1)) or not all(1 <= r <= _RUN_ARRAY_LIMIT + 1 for r in raw):
            return False
        lengths = tuple(r - 1 for r in raw)
        build = self.builders.get(lengths)
        if build is None:
            if len(self.builders) >= _RUN_BUILDERS:
                return False
            build = self.builders[lengths] = self.builder(lengths)
        fmt, width = self.element_layout(lengths)
        # A Struct holds about 24 bytes per value it unpacks: what the plans may hold is bounded per
        # struct and for the whole namespace.
        cost = (width + 1) * size
        if self.cost + cost > _RUN_VALUES or self.ns.run_values + cost > _RUN_VALUES_TOTAL:
            return False
        self.cost += cost
        self.ns.run_values += cost
        run = struct.Struct(">" + fmt * size)
        return (run, run.size, build)

    def wanted(self, f: FieldSpec) -> bool:
        return self.proj is None or f.name in self.proj

    def element_layout(self, lengths: tuple[int, ...]) -> tuple[str, int]:
        """One element's Struct format (its length bytes and tag byte are pad bytes: the run's
        function checks them in the frame) and how many values it unpacks to."""
        fmt: list[str] = []
        width = 0
        arrays = iter(lengths)
        for f in self.fields:
            if f.is_array:
                count = next(arrays)
                efmt = FIXED_FORMATS[str(f.element)]
                if count and self.wanted(f):
                    fmt.append(f"x{count}{efmt}")
                    width += count
                else:
                    fmt.append(f"{1 + count * FIXED_SIZES[efmt]}x")
            elif self.wanted(f):
                fmt.append(FIXED_FORMATS[f.type])
                width += 1
            else:
                fmt.append(f"{FIXED_SIZES[FIXED_FORMATS[f.type]]}x")
        fmt.append("x")  # the tag section
        return "".join(fmt), width

    def builder(self, lengths: tuple[int, ...]) -> Callable[..., list[dict[str, Any]] | None]:
        """Generate the function taking a run of these array lengths: ``(b, p, count, Struct)`` → the
        run's list of dicts, or None when some element's length or tag byte is not what the layout
        assumes. Each checked byte is one strided slice of the run (``b[at:end:element size]``)
        compared with that byte repeated ``count`` times."""
        names: list[str] = []
        items: list[str] = []
        checks: list[tuple[int, int]] = []  # (offset in the element, expected byte)
        offset = 0
        arrays = iter(lengths)
        for i, f in enumerate(self.fields):
            if f.is_array:
                count = next(arrays)
                checks.append((offset, count + 1))
                offset += 1 + count * FIXED_SIZES[FIXED_FORMATS[str(f.element)]]
                if self.wanted(f):
                    values = [f"v{i}_{j}" for j in range(count)]
                    names.extend(values)
                    items.append(f"{f.name!r}: [{', '.join(values)}]")
            else:
                offset += FIXED_SIZES[FIXED_FORMATS[f.type]]
                if self.wanted(f):
                    names.append(f"v{i}")
                    items.append(f"{f.name!r}: v{i}")
        checks.append((offset, 0))  # an empty tag section
        size = offset + 1
        test = " or ".join(f"b[p + {at}:e:{size}] != {bytes([value])!r} * m" for at, value in checks)
        dict_expr = f"{{{', '.join(items)}}}"
        if not names:
            build = f"[{dict_expr} for _ in range(m)]"
        elif len(names) == 1:
            build = f"[{dict_expr} for {names[0]} in st.unpack_from(b, p)]"
        else:
            its = ", ".join(["it"] * len(names))
            build = f"[{dict_expr} for {', '.join(names)} in zip({its})]"
        name = f"_r{next(_ids)}"
        src = f"def {name}(b, p, m, st):\n    e = p + m * {size}\n    if {test}: return None\n"
        if len(names) > 1:
            src += "    it = iter(st.unpack_from(b, p))\n"
        src += f"    return {build}\n"
        _define(self.ns, name, src, "decode-run", f"{self.what} {list(lengths)}")
        fn: Callable[..., list[dict[str, Any]] | None] = self.ns[name]
        return fn


def _bind_records(ns: _Namespace) -> None:
    """Bind what generated code reads a ``records`` field with: ``_records`` (``section``), ``_lazy``
    (``lazy_section``) and ``_blen``. Done when the first decoder with a records field is compiled, not at import:
    records.py pulls in compression."""
    if "_records" in ns:
        return
    from codec.records import batch_length_at, lazy_section, section

    ns["_records"] = section
    ns["_lazy"] = lazy_section
    ns["_blen"] = batch_length_at


class _Namespace:
    """Globals shared by all generated functions: helpers and compiled struct formats.

    The globals are a plain ``dict`` (``self.globals``) behind a small mapping interface, not a dict
    subclass: CPython specialises global lookups only in exact dicts, and with a subclass every
    builtin a generated function names (``list``, ``range``) raised and caught a KeyError first.
    That made a Metadata partition's decode about a third slower.
    """

    def __init__(self, **helpers: Any) -> None:
        self.globals: dict[str, Any] = dict(helpers)
        #: (kind, id(fields), version, flexible[, projection]) → generated function name.
        self.cache: dict[tuple[Any, ...], str] = {}
        #: Values covered by every ``_LayoutRuns`` plan made in this namespace (bounded by _RUN_VALUES_TOTAL).
        self.run_values = 0
        #: Generated function name → its source, for ``kpmon codec dump`` and :func:`generated_source`.
        self.sources: dict[str, str] = {}

    def __getitem__(self, name: str) -> Any:
        return self.globals[name]

    def __setitem__(self, name: str, value: Any) -> None:
        self.globals[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self.globals

    def get(self, name: str, default: Any = None) -> Any:
        return self.globals.get(name, default)

    def values(self) -> ValuesView[Any]:
        return self.globals.values()

    def struct(self, fmt: str) -> str:
        name = "_S_" + fmt.replace("?", "o")
        if name not in self:
            self[name] = struct.Struct(">" + fmt)
        return name

    def array_structs(self, fmt: str) -> str:
        """Name of the dict caching ``Struct('>{n}{fmt}')`` per element count ``n``."""
        name = "_A_" + fmt.replace("?", "o")
        if name not in self:
            self[name] = {}
        return name

    def short_array_structs(self, fmt: str) -> str:
        """Name of the list holding ``Struct('>{n}{fmt}')`` for every ``n`` a one-byte compact length
        can give (0-126), built once: short arrays index it instead of looking up a cache."""
        name = "_AL_" + fmt.replace("?", "o")
        if name not in self:
            self[name] = [struct.Struct(f">{n}{fmt}") for n in range(_SHORT_ARRAY)]
        return name

    def const(self, value: Any) -> str:
        name = f"_C{next(_ids)}"
        self[name] = value
        return name


def _base_namespace() -> _Namespace:
    ns = _Namespace(
        _E=DecodeError,
        _EE=EncodeError,
        _SE=struct.error,
        _uv=read_uvarint,
        _wuv=write_uvarint,
        _tags=read_tagged_section,
        _skiptags=skip_tagged_section,
        _UUID=uuid.UUID,
        _new=object.__new__,
        _osa=object.__setattr__,
        _ifb=int.from_bytes,
        _USAFE=uuid.SafeUUID.unknown,
        _uuidb=uuid_bytes,
        _unpack=struct.unpack_from,
        _pack=struct.pack,
        _arrst=_array_struct,
    )
    return ns


class _Code:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def indent(self) -> None:
        self.depth += 1

    def dedent(self) -> None:
        self.depth -= 1


def _define(ns: _Namespace, name: str, src: str, kind: str, what: str) -> None:
    """Compile and run generated source, and register it in ``linecache``.

    The pseudo-filename names the message, version and struct path, so a traceback, pdb or a profile
    shows where the generated code came from, and ``linecache`` lets them print its lines. The
    ``<kpmon:`` prefix is what tests/fuzz/fuzz_codec.py looks for to instrument generated code.
    """
    filename = f"<kpmon:codec {what} {kind} {name}>"
    # mtime None marks a non-file entry: linecache.checkcache() keeps it instead of dropping it.
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    ns.sources[name] = src
    exec(compile(src, filename, "exec"), ns.globals)


def _default_literal(ns: _Namespace, field: FieldSpec, version: int, flexible: bool) -> str:
    """A Python expression for the field's default (what Java puts in a fresh message)."""
    if field.has_default and field.default is None:
        return "None"
    if field.is_array:
        return "[]"
    if field.is_struct:
        # A dict literal, not a call: it is evaluated on every decode where the field is absent.
        items = ", ".join(
            f"{f.name!r}: {_default_literal(ns, f, version, flexible)}"
            for f in field.fields or ()
            if f.present(version)
        )
        return f"{{{items}}}"
    t = field.type
    if field.has_default:
        if t == "uuid":
            return (
                ns.const(uuid.UUID(int=0))
                if field.default in (None, "")
                else ns.const(uuid.UUID(field.default))
            )
        return repr(field.default)
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        return "0"
    if t == "float64":
        return "0.0"
    if t == "bool":
        return "False"
    if t == "string":
        return "''"
    if t == "bytes":
        return "b''"
    if t == "records":
        return "None"
    if t == "uuid":
        return ns.const(uuid.UUID(int=0))
    raise ValueError(f"no default for type {t}")


def _fresh_default(ns: _Namespace, field: FieldSpec, version: int, flexible: bool) -> str:
    """The default as a decoder writes it into every struct where the (tagged) field is absent.

    A struct default whose values are all immutable (a Fetch v12 partition's ``DivergingEpoch``,
    ``CurrentLeader`` and ``SnapshotId``: three per partition) is ``.copy()`` of one prebuilt dict:
    copying a small dict costs about two thirds of building it from a literal, and each decode still
    gets its own dict. Anything else is the literal of :func:`_default_literal`.
    """
    literal = _default_literal(ns, field, version, flexible)
    if not field.is_struct or field.is_array or not literal.startswith("{"):
        return literal
    # The generator's own literal, evaluated as the decoder would evaluate it.
    value = eval(literal, dict(ns.globals))
    if any(isinstance(v, dict | list) for v in value.values()):
        return literal  # a shallow copy would share the nested value between decodes
    return f"{ns.const(value)}.copy()"


def _min_size(field: FieldSpec, version: int, flexible: bool) -> int:
    """The fewest bytes a value of this field can occupy (bounds array lengths before looping)."""
    fflex = field.flexible_at(version, flexible)
    if field.is_array:
        return 1 if fflex else 4
    if field.is_struct:
        if field.nullable_at(version):
            return 1
        return struct_min_size(field.fields or (), version, flexible)
    fmt = FIXED_FORMATS.get(field.type)
    if fmt:
        return FIXED_SIZES[fmt]
    if field.type == "uuid":
        return 16
    if field.type == "string":
        return 1 if fflex else 2
    return 1 if fflex else 4  # bytes, records


def struct_min_size(fields: tuple[FieldSpec, ...], version: int, flexible: bool) -> int:
    total = 1 if flexible else 0
    for f in fields:
        if f.present(version) and not f.tagged_at(version):
            total += _min_size(f, version, flexible)
    return total


def _element_field(field: FieldSpec) -> FieldSpec:
    return FieldSpec(
        name=field.name,
        type=field.element,
        versions=field.versions,
        nullable=None,
        tagged=None,
        tag=None,
        flexible_override=field.flexible_override,
        default=None,
        has_default=False,
        map_key=False,
        fields=field.fields,
    )


class _DecodeWriter:
    """Writes decode (``build=True``) or skip (``build=False``) code for one struct version."""

    def __init__(
        self, ns: _Namespace, code: _Code, version: int, flexible: bool, what: str, nested: bool = False
    ) -> None:
        self.ns = ns
        self.c = code
        self.version = version
        self.flexible = flexible
        self.what = what
        self.tmp = count()
        #: Writing a struct inlined into its parent's array loop: own names, and no further inlining.
        self.nested = nested

    def var(self) -> str:
        return f"{'u' if self.nested else 't'}{next(self.tmp)}"

    def length(self, fflex: bool, width: str) -> None:
        """Read a length into ``n``: compact (uvarint - 1) or int16/int32."""
        c = self.c
        if fflex:
            c.emit("n = b[p]")
            c.emit("if n < 128: p += 1")
            c.emit("else:")
            c.indent()
            # Two-byte lengths (127 B to 16 KiB: most records fields) inline too; longer ones call _uv.
            c.emit("m = b[p + 1]")
            c.emit("if m < 128: n = (n & 127) | (m << 7); p += 2")
            c.emit("else: n, p = _uv(b, p)")
            c.dedent()
            c.emit("n -= 1")
        else:
            c.emit(f"n, = {self.ns.struct(width)}.unpack_from(b, p); p += {FIXED_SIZES[width]}")

    def null_check(self, target: str | None, nullable: bool, label: str) -> None:
        c = self.c
        c.emit("if n < 0:")
        c.indent()
        if nullable:
            c.emit(f"{target} = None" if target else "pass")
        else:
            c.emit(f"raise _E('non-nullable {label} is null', p)")
        c.dedent()

    def records(self, target: str) -> None:
        """Emit ``target = RecordBatches`` of ``b[p:e]`` (``n`` bytes); see ``codec.records.section``.

        The commonest section by far, exactly one whole magic-2 batch (every Produce partition, most
        Fetch ones), is tested for here in the loop and built by ``codec.records.lazy_section``
        (``codec.records.one_batch_source`` writes both): ``section``'s own test and its fallback were
        about a fifth of what a partition's records field cost. Every other section goes through
        ``section``.
        """
        from codec.records import one_batch_source

        _bind_records(self.ns)
        test, build = one_batch_source(target)
        c = self.c
        c.emit(f"if {test}:")
        c.indent()
        c.emit(build)
        c.dedent()
        c.emit(f"else: {target} = _records(b, p, e)")

    def field(self, f: FieldSpec, target: str | None, proj: Projection | None) -> None:
        """Emit code reading field ``f`` into local ``target`` (None: skip it)."""
        c, v = self.c, self.version
        fflex = f.flexible_at(v, self.flexible)
        nullable = f.nullable_at(v)
        label = f"{f.type} {f.name}"
        if f.is_array:
            fmt = FIXED_FORMATS.get(f.element)
            short = bool(fmt and fflex)
            if short and not target:
                # Skipped: one bounds check instead of the general length read.
                c.emit("n = b[p] - 1")
                c.emit(f"if 0 <= n < {_SHORT_ARRAY}:")
                c.indent()
                c.emit(f"p += 1 + n * {FIXED_SIZES[str(fmt)]}")
                c.emit(f"if p > L: raise _E(f'array {f.name} length {{n}} exceeds the bytes left', p)")
                c.dedent()
                c.emit("else:")
                c.indent()
            elif fflex and not fmt:
                # An empty array of structs or strings (a Fetch partition's AbortedTransactions...)
                # is one byte, 0x01: one comparison instead of the length read, bounds check and loop.
                short = True
                c.emit("if b[p] == 1:")
                c.indent()
                c.emit(f"p += 1; {target} = []" if target else "p += 1")
                c.dedent()
                c.emit("else:")
                c.indent()
            elif short:
                # The common case of a fixed-width array (replica lists, partition ids...): a one-byte
                # compact length, then one unpack with a prebuilt Struct. A short buffer makes the
                # unpack raise struct.error, which becomes the DecodeError. Longer, null or
                # non-compact arrays take the general path below.
                c.emit("n = b[p] - 1")
                c.emit(f"if 0 <= n < {_SHORT_ARRAY}:")
                c.indent()
                c.emit(
                    f"p += 1; {target} = list({self.ns.short_array_structs(str(fmt))}[n].unpack_from(b, p))"
                )
                c.emit(f"p += n * {FIXED_SIZES[str(fmt)]}")
                c.dedent()
                c.emit("else:")
                c.indent()
            self.length(fflex, "i")
            self.null_check(target, nullable, label)
            c.emit("else:")
            c.indent()
            elem = _element_field(f)
            ms = max(1, _min_size(elem, v, self.flexible))
            c.emit(f"if n * {ms} > L - p: raise _E(f'array {f.name} length {{n}} exceeds the bytes left', p)")
            fmt = FIXED_FORMATS.get(f.element)
            if fmt:
                if target:
                    # One cached Struct per element count: building an f-string format and looking it
                    # up in struct's own cache cost more than the unpack for short arrays.
                    cache = self.ns.array_structs(fmt)
                    c.emit(f"st = {cache}.get(n)")
                    c.emit(f"if st is None: st = _arrst({cache}, {fmt!r}, n)")
                    c.emit(f"{target} = list(st.unpack_from(b, p))")
                c.emit(f"p += n * {FIXED_SIZES[fmt]}")
            elif target and elem.is_struct:
                c.emit(f"{target} = []")
                if not self.layout_runs(elem, target, proj):
                    self.struct_elements(elem, target, proj, "n")
            elif target:
                item = self.var()
                c.emit(f"{target} = []")
                c.emit("for _ in range(n):")
                c.indent()
                self.scalar_or_struct(elem, item, proj, fflex)
                c.emit(f"{target}.append({item})")
                c.dedent()
            else:
                c.emit("for _ in range(n):")
                c.indent()
                self.scalar_or_struct(elem, None, proj, fflex)
                c.dedent()
            c.dedent()
            if short:
                c.dedent()
            return
        if f.is_struct:
            if nullable:
                c.emit("m = b[p]; p += 1")
                c.emit("if m > 127:")
                c.indent()
                c.emit(f"{target} = None" if target else "pass")
                c.dedent()
                c.emit("else:")
                c.indent()
                self.scalar_or_struct(f, target, proj, fflex)
                c.dedent()
            else:
                self.scalar_or_struct(f, target, proj, fflex)
            return
        self.scalar_or_struct(f, target, proj, fflex, nullable)

    def fixed_struct(self, elem: FieldSpec) -> bool:
        """A struct of fixed-width fields only, none tagged (what inline_fixed_elements decodes)."""
        if not elem.is_struct:
            return False
        present = [f for f in elem.fields or () if f.present(self.version)]
        if not present or any(f.tagged_at(self.version) for f in present):
            return False
        return not any(f.is_array or f.type not in FIXED_FORMATS for f in present)

    def leaf(self, elem: FieldSpec) -> bool:
        """An array element worth decoding in its parent's loop: the innermost level of structs (its
        own arrays are of scalars or of fixed-width structs), where the calls are the most."""
        return all(
            self.fixed_struct(_element_field(f))
            for f in elem.fields or ()
            if f.present(self.version) and f.is_array and f.fields is not None
        )

    def struct_elements(self, elem: FieldSpec, target: str, proj: Projection | None, count: str) -> None:
        """Emit a loop decoding ``count`` struct elements at ``p``, appending each to the list ``target``."""
        c = self.c
        if self.fixed_struct(elem):
            self.inline_fixed_elements(elem, target, proj, count)
        elif not self.nested and self.leaf(elem):
            # Each element decoded in the loop itself, not by a call per element (Metadata's
            # partitions, Produce and Fetch partitions): the call, its result tuple and the
            # unpacking of it cost about a tenth of a small struct's decode.
            c.emit(f"for _ in range({count}):")
            c.indent()
            inner = _DecodeWriter(
                self.ns, c, self.version, self.flexible, f"{self.what}.{elem.name}", nested=True
            )
            _struct_body(
                inner, elem.fields or (), proj, "g", f"{target}.append({{}}); p += 1; continue", target
            )
            c.dedent()
        else:
            item = self.var()
            c.emit(f"for _ in range({count}):")
            c.indent()
            self.scalar_or_struct(elem, item, proj, self.flexible)
            c.emit(f"{target}.append({item})")
            c.dedent()

    def layout_runs(self, elem: FieldSpec, target: str, proj: Projection | None) -> bool:
        """Decode runs of up to ``_RUN`` elements that share one layout with one unpack each.

        For a flexible struct made of fixed-width fields and compact arrays of fixed-width values, with
        no tagged fields (Metadata's partitions, ApiVersions' ApiKeys...), the byte layout of an element
        depends only on its arrays' lengths. The generated code reads those lengths at the start of a
        run and asks ``_LayoutRuns`` (a dict per struct and projection, keyed by the lengths and the run
        length) for a Struct covering the whole run and a function, generated for those lengths, that
        builds the run's dicts from the unpacked tuple. The tuple keeps every length byte and tag byte,
        and they are compared with what the layout expects; only when every one matches (and the run
        fits in the frame) is the run taken, so what it reads is exactly what the element-by-element
        path reads. Otherwise that run's elements take the element-by-element path, which also raises
        the same errors as before. Returns False (emitting nothing) when the element does not qualify.
        """
        if not self.flexible:
            return False
        v = self.version
        present = [f for f in elem.fields or () if f.present(v)]
        if not present:
            return False
        for f in present:
            if f.tagged_at(v):
                return False
            if f.is_array:
                if f.fields is not None or f.element not in FIXED_FORMATS or not f.flexible_at(v, True):
                    return False
            elif f.type not in FIXED_FORMATS:
                return False
        runs = _LayoutRuns(self.ns, present, proj, f"{self.what}.{elem.name}")
        name = self.ns.const(runs)
        c = self.c
        k, size, q, key, plan, t = (self.var() for _ in range(6))
        c.emit(f"{k} = n")
        c.emit(f"while {k}:")
        c.indent()
        c.emit(f"{size} = {k} if {k} < {_RUN} else {_RUN}")
        c.emit(f"if {size} >= {_RUN_MIN}:")
        c.indent()
        # The run's key: each array's one-byte compact length, then the run length, in one int.
        c.emit("try:")
        c.indent()
        parts: list[str] = []
        fixed = 0
        advance = ""  # past the previous array's length byte and values
        for f in present:
            if not f.is_array:
                fixed += FIXED_SIZES[FIXED_FORMATS[f.type]]
                continue
            step = f"{advance} + {fixed}" if fixed else advance
            c.emit(f"{q} = p + {fixed}" if not parts else f"{q} += {step}")
            var = self.var()
            c.emit(f"{var} = b[{q}]")
            parts.append(var)
            # A length byte of l is followed by l - 1 values: the next field is l * width + 1 - width on.
            width = FIXED_SIZES[FIXED_FORMATS[str(f.element)]]
            advance = f"{var} * {width} - {width - 1}"
            fixed = 0
        c.emit(f"{key} = {_run_key(parts, size)}")
        c.dedent()
        c.emit("except IndexError:")
        c.indent()
        c.emit(f"{key} = -1")
        c.dedent()
        c.emit(f"{plan} = {name}[{key}]")
        c.emit(f"if {plan} and p + {plan}[1] <= L:")
        c.indent()
        c.emit(f"{t} = {plan}[2](b, p, {size}, {plan}[0])")
        c.emit(f"if {t} is not None:")
        c.indent()
        c.emit(f"{target} += {t}; p += {plan}[1]; {k} -= {size}; continue")
        c.dedent()
        c.dedent()
        c.dedent()
        c.emit(f"{k} -= {size}")
        self.struct_elements(elem, target, proj, size)
        c.dedent()
        return True

    def inline_fixed_elements(
        self, elem: FieldSpec, target: str, proj: Projection | None, count: str
    ) -> None:
        """Decode an array of structs made only of fixed-width fields (ApiVersions' ApiKeys, topic
        and partition id pairs...) in the loop itself, without a call per element.

        Only the common case is inline: no tagged fields known at this version and, when flexible, an
        empty tag section. An element with tags is decoded again from its start by the struct's own
        function, which keeps unknown tags and reports anomalies.
        """
        present = [f for f in elem.fields or () if f.present(self.version)]
        c, ns = self.c, self.ns
        fmt = "".join(FIXED_FORMATS[f.type] for f in present)
        size = sum(FIXED_SIZES[ch] for ch in fmt)
        values = [self.var() for _ in present]
        start = self.var()
        fn = compile_decoder(
            ns, elem.fields or (), self.version, self.flexible, proj, f"{self.what}.{elem.name}"
        )
        items = ", ".join(
            f"{f.name!r}: {v}" for f, v in zip(present, values, strict=True) if proj is None or f.name in proj
        )
        c.emit(f"for _ in range({count}):")
        c.indent()
        c.emit(f"{start} = p")
        c.emit(f"{', '.join(values)}, = {ns.struct(fmt)}.unpack_from(b, p); p += {size}")
        if self.flexible:
            c.emit("if b[p] == 0: p += 1")
            c.emit(f"else: {values[0]}, p = {fn}(b, {start}, L); {target}.append({values[0]}); continue")
        c.emit(f"{target}.append({{{items}}})")
        c.dedent()

    def scalar_or_struct(
        self, f: FieldSpec, target: str | None, proj: Projection | None, fflex: bool, nullable: bool = False
    ) -> None:
        c, ns = self.c, self.ns
        if f.is_struct:
            fields = f.fields or ()
            if target:
                fn = compile_decoder(ns, fields, self.version, self.flexible, proj, f"{self.what}.{f.name}")
                c.emit(f"{target}, p = {fn}(b, p, L)")
            else:
                fn = compile_skipper(ns, fields, self.version, self.flexible, f"{self.what}.{f.name}")
                c.emit(f"p = {fn}(b, p, L)")
            return
        t = f.type
        fmt = FIXED_FORMATS.get(t)
        if fmt:
            if target:
                c.emit(f"{target}, = {ns.struct(fmt)}.unpack_from(b, p); p += {FIXED_SIZES[fmt]}")
            else:
                c.emit(f"p += {FIXED_SIZES[fmt]}")
            return
        if t == "uuid":
            if target:
                # The UUID built as UUID.__init__ leaves it (its int, is_safe unknown) without running
                # __init__'s checks of its other arguments: a third of the time of UUID(bytes=...).
                c.emit(
                    f"{target} = _new(_UUID); _osa({target}, 'int', _ifb({ns.struct('16s')}.unpack_from(b, p)[0], 'big'))"
                )
                c.emit(f"_osa({target}, 'is_safe', _USAFE); p += 16")
            else:
                c.emit("p += 16")
            return
        if t in ("string", "bytes", "records"):
            self.length(fflex, "h" if t == "string" else "i")
            self.null_check(target, nullable, f"{t} {f.name}")
            c.emit("else:")
            c.indent()
            c.emit("e = p + n")
            c.emit(f"if e > L: raise _E(f'{t} {f.name} length {{n}} exceeds the {{L - p}} bytes left', p)")
            if target:
                if t == "string":
                    c.emit(f"{target} = b[p:e].decode()")
                elif t == "bytes":
                    c.emit(f"{target} = b[p:e]")
                else:
                    self.records(target)
            c.emit("p = e")
            c.dedent()
            return
        raise ValueError(f"unknown type {t}")


def _known_tags(
    ns: _Namespace,
    present: Sequence[FieldSpec],
    version: int,
    flexible: bool,
    what: str,
    proj: Projection | None,
) -> str:
    """The name of the constant mapping every tag known at this version to its field's name and reader
    (``read_tagged_section``'s ``known``), the projected fields read as ``proj`` keeps them and the others
    whole: a projected decode or a skip builds no value it leaves out, but tells a known tag from an
    unknown one and checks its size as the whole decode does (``TAG_EXTRAS``)."""
    known = {
        f.tag: (
            f.name,
            ns[_tag_fn(ns, f, version, flexible, what, None if proj is None else proj.get(f.name))],
        )
        for f in present
        if f.tagged_at(version)
    }
    return ns.const(known)


def _tag_fn(
    ns: _Namespace, f: FieldSpec, version: int, flexible: bool, what: str, proj: Projection | None
) -> str:
    """A function reading one tagged field's value (the bytes after its tag and size)."""
    name = f"_t{next(_ids)}"
    code = _Code()
    w = _DecodeWriter(ns, code, version, flexible, what)
    code.emit("try:")
    code.indent()
    w.field(f, "x", proj)
    code.emit("return x, p")
    code.dedent()
    code.emit("except (_SE, IndexError, UnicodeDecodeError) as exc:")
    code.indent()
    code.emit(f"raise _E(f'truncated or malformed tagged field {f.name}: {{exc}}', p) from None")
    code.dedent()
    src = f"def {name}(b, p, L):\n" + "\n".join(code.lines) + "\n"
    _define(ns, name, src, "tag", f"{what}.{f.name}")
    return name


def projection_key(proj: Projection | None) -> Any:
    """A hashable, order-independent key for a projection tree (None = everything)."""
    if proj is None:
        return None
    return tuple(sorted((k, projection_key(v)) for k, v in proj.items()))


_proj_key = projection_key


def normalize_projection(
    fields: tuple[FieldSpec, ...], version: int, proj: Projection | None
) -> Projection | None:
    """``proj`` restricted to what exists at ``version``, with None wherever it keeps everything.

    A projection that names every field of a struct (and all of each nested struct it names) is a
    full decode of that struct: returning None there lets the caller reuse the full decoder instead
    of compiling a projected copy that does the same work. Names absent at this version are dropped,
    so projections that differ only in them share one compiled decoder.
    """
    if proj is None:
        return None
    out: dict[str, Projection | None] = {}
    keeps_all = True
    for f in fields:
        if not f.present(version):
            continue
        if f.name not in proj:
            keeps_all = False
            continue
        sub = proj[f.name]
        # A path below a scalar or records field ("Records.X") selects the whole field.
        sub = normalize_projection(f.fields, version, sub) if f.fields is not None else None
        if sub is not None:
            keeps_all = False
        out[f.name] = sub
    return None if keeps_all else out


def compile_decoder(
    ns: _Namespace,
    fields: tuple[FieldSpec, ...],
    version: int,
    flexible: bool,
    proj: Projection | None,
    what: str,
) -> str:
    """Name (in ``ns``) of a function ``(b, p, L) -> (dict, p)`` decoding this struct."""
    key = ("d", id(fields), version, flexible, projection_key(proj))
    cached = ns.cache.get(key)
    if cached:
        return cached
    name = f"_d{next(_ids)}"
    ns.cache[key] = name
    code = _Code()
    code.emit("try:")
    code.indent()
    _struct_body(
        _DecodeWriter(ns, code, version, flexible, what), fields, proj, "f", "return {}, p + 1", None
    )
    code.dedent()
    code.emit("except (_SE, IndexError, UnicodeDecodeError) as exc:")
    code.indent()
    code.emit(f"raise _E(f'truncated or malformed {what}: {{exc}}', p) from None")
    code.dedent()
    src = f"def {name}(b, p, L):\n" + "\n".join(code.lines) + "\n"
    _define(ns, name, src, "decode" if proj is None else "decode-projected", what)
    return name


def _struct_body(
    w: _DecodeWriter,
    fields: tuple[FieldSpec, ...],
    proj: Projection | None,
    prefix: str,
    fast_exit: str,
    into: str | None,
) -> None:
    """Emit the code decoding one struct at ``p`` into a dict. The locals holding its fields are named
    ``{prefix}{i}``. With ``into`` None the code returns ``(dict, p)`` (a function's body); otherwise it
    appends the dict to the list ``into`` (the body of an array loop). ``fast_exit`` is the statement
    for an empty tag section, ``{}`` standing for the dict literal."""
    ns, code, version, flexible, what = w.ns, w.c, w.version, w.flexible, w.what
    present = [f for f in fields if f.present(version)]
    wanted = [f for f in present if proj is None or f.name in proj]
    local = {f.name: f"{prefix}{i}" for i, f in enumerate(present)}
    run: list[FieldSpec] = []

    def flush_fixed() -> None:
        if not run:
            return
        size = sum(FIXED_SIZES[FIXED_FORMATS[f.type]] for f in run)
        wanted_run = [f for f in run if proj is None or f.name in proj]
        if wanted_run:
            # Fields the projection leaves out become pad bytes: the unpack builds no value for them,
            # and it stops after the last wanted field.
            last = run.index(wanted_run[-1])
            fmt = "".join(
                FIXED_FORMATS[f.type] if f in wanted_run else f"{FIXED_SIZES[FIXED_FORMATS[f.type]]}x"
                for f in run[: last + 1]
            )
            targets = ", ".join(local[f.name] for f in wanted_run)
            code.emit(f"{targets}, = {ns.struct(fmt)}.unpack_from(b, p); p += {size}")
        else:
            code.emit(f"p += {size}")
        run.clear()

    for f in present:
        if f.tagged_at(version):
            continue
        if f.type in FIXED_FORMATS and not f.is_array:
            run.append(f)
            continue
        flush_fixed()
        selected = proj is None or f.name in proj
        sub = proj.get(f.name) if proj is not None and selected else None
        w.field(f, local[f.name] if selected else None, sub)
    flush_fixed()
    tagged = [f for f in wanted if f.tagged_at(version)]
    items = ", ".join(f"{f.name!r}: {local[f.name]}" for f in wanted)
    if flexible:
        defaults = {f.name: _fresh_default(ns, f, version, flexible) for f in tagged}
        # The common case, an empty tag section, returns at once with the tagged fields' defaults
        # written into the dict literal: no default is built only to be replaced.
        fast = ", ".join(f"{f.name!r}: {defaults.get(f.name, local[f.name])}" for f in wanted)
        code.emit("if b[p] == 0: " + fast_exit.format(f"{{{fast}}}"))
        known = _known_tags(ns, present, version, flexible, what, proj)
        code.emit(f"T, U, p = _tags(b, p, L, {known}{'' if proj is None else ', False'})")
        for f in tagged:
            code.emit(f"{local[f.name]} = T[{f.name!r}] if {f.name!r} in T else {defaults[f.name]}")
        code.emit(f"r = {{{items}}}")
        code.emit("if U: r.update(U)")
    else:
        code.emit(f"r = {{{items}}}")
    code.emit("return r, p" if into is None else f"{into}.append(r)")


def compile_skipper(
    ns: _Namespace, fields: tuple[FieldSpec, ...], version: int, flexible: bool, what: str
) -> str:
    """Name of a function ``(b, p, L) -> p`` stepping over this struct without building it."""
    key = ("s", id(fields), version, flexible)
    cached = ns.cache.get(key)
    if cached:
        return cached
    name = f"_s{next(_ids)}"
    ns.cache[key] = name
    code = _Code()
    w = _DecodeWriter(ns, code, version, flexible, what)
    code.emit("try:")
    code.indent()
    fixed = 0
    for f in fields:
        if not f.present(version) or f.tagged_at(version):
            continue
        if f.type in FIXED_FORMATS and not f.is_array:
            fixed += FIXED_SIZES[FIXED_FORMATS[f.type]]
            continue
        if fixed:
            code.emit(f"p += {fixed}")
            fixed = 0
        w.field(f, None, None)
    if fixed:
        code.emit(f"p += {fixed}")
    if flexible:
        present = [f for f in fields if f.present(version)]
        code.emit(f"p = _skiptags(b, p, L, {_known_tags(ns, present, version, flexible, what, None)})")
    code.emit("if p > L: raise _E('struct runs past the end of the frame', L)")
    code.emit("return p")
    code.dedent()
    code.emit("except (_SE, IndexError) as exc:")
    code.indent()
    code.emit(f"raise _E(f'truncated or malformed {what}: {{exc}}', p) from None")
    code.dedent()
    src = f"def {name}(b, p, L):\n" + "\n".join(code.lines) + "\n"
    _define(ns, name, src, "skip", what)
    return name


class _EncodeWriter:
    def __init__(self, ns: _Namespace, code: _Code, version: int, flexible: bool, what: str) -> None:
        self.ns = ns
        self.c = code
        self.version = version
        self.flexible = flexible
        self.what = what
        self.tmp = count()

    def length(self, expr: str, fflex: bool, width: str) -> None:
        if fflex:
            self.c.emit(f"_wuv(w, {expr} + 1)")
        else:
            self.c.emit(f"w += {self.ns.struct(width)}.pack({expr})")

    def null(self, fflex: bool, width: str) -> None:
        if fflex:
            self.c.emit("w.append(0)")
        else:
            self.c.emit(f"w += {self.ns.struct(width)}.pack(-1)")

    def value(self, f: FieldSpec, expr: str, fflex: bool, nullable: bool) -> None:
        """Emit code writing the value held in local ``expr``."""
        c, ns, v = self.c, self.ns, self.version
        if f.is_array:
            c.emit(f"if {expr} is None:")
            c.indent()
            if nullable:
                self.null(fflex, "i")
            else:
                c.emit(f"raise _EE('non-nullable array {f.name} is None')")
            c.dedent()
            c.emit("else:")
            c.indent()
            self.length(f"len({expr})", fflex, "i")
            fmt = FIXED_FORMATS.get(f.element)
            if fmt:
                c.emit(f"w += _pack(f'>{{len({expr})}}{fmt}', *{expr})")
            else:
                item = f"i{next(self.tmp)}"
                c.emit(f"for {item} in {expr}:")
                c.indent()
                self.value(_element_field(f), item, fflex, False)
                c.dedent()
            c.dedent()
            return
        if f.is_struct:
            fn = compile_encoder(ns, f.fields or (), v, self.flexible, f"{self.what}.{f.name}")
            if nullable:
                c.emit(f"if {expr} is None: w.append(255)")
                c.emit(f"else: w.append(1); {fn}({expr}, w)")
            else:
                c.emit(f"if {expr} is None: raise _EE('non-nullable struct {f.name} is None')")
                c.emit(f"{fn}({expr}, w)")
            return
        t = f.type
        fmt = FIXED_FORMATS.get(t)
        if fmt:
            c.emit(f"w += {ns.struct(fmt)}.pack({expr})")
            return
        if t == "uuid":
            c.emit(f"w += _uuidb({expr})")
            return
        width = "h" if t == "string" else "i"
        c.emit(f"if {expr} is None:")
        c.indent()
        if nullable:
            self.null(fflex, width)
        else:
            c.emit(f"raise _EE('non-nullable {t} {f.name} is None')")
        c.dedent()
        c.emit("else:")
        c.indent()
        raw = f"x{next(self.tmp)}"
        if t == "string":
            c.emit(f"{raw} = {expr}.encode()")
        else:
            c.emit(f"{raw} = bytes({expr})")
        self.length(f"len({raw})", fflex, width)
        c.emit(f"w += {raw}")
        c.dedent()


def compile_encoder(
    ns: _Namespace, fields: tuple[FieldSpec, ...], version: int, flexible: bool, what: str
) -> str:
    """Name of a function ``(dict, bytearray) -> None`` appending this struct's encoding."""
    key = ("e", id(fields), version, flexible)
    cached = ns.cache.get(key)
    if cached:
        return cached
    name = f"_e{next(_ids)}"
    ns.cache[key] = name
    code = _Code()
    w = _EncodeWriter(ns, code, version, flexible, what)
    present = [f for f in fields if f.present(version)]
    run: list[FieldSpec] = []

    def flush_fixed() -> None:
        if not run:
            return
        fmt = "".join(FIXED_FORMATS[f.type] for f in run)
        args = ", ".join(f"o.get({f.name!r}, {_default_literal(ns, f, version, flexible)})" for f in run)
        code.emit(f"w += {ns.struct(fmt)}.pack({args})")
        run.clear()

    for f in present:
        if f.tagged_at(version):
            continue
        if f.type in FIXED_FORMATS and not f.is_array:
            run.append(f)
            continue
        flush_fixed()
        code.emit(f"v = o.get({f.name!r}, {_default_literal(ns, f, version, flexible)})")
        w.value(f, "v", f.flexible_at(version, flexible), f.nullable_at(version))
    flush_fixed()
    if flexible:
        tagged = sorted((f for f in present if f.tagged_at(version)), key=lambda f: f.tag or 0)
        code.emit("tags = []")
        for f in tagged:
            code.emit(f"v = o.get({f.name!r}, {_default_literal(ns, f, version, flexible)})")
            code.emit(f"if v != {_default_literal(ns, f, version, flexible)}:")
            code.indent()
            code.emit("outer = w; w = bytearray()")
            w.value(f, "v", f.flexible_at(version, flexible), f.nullable_at(version))
            code.emit(f"tags.append(({f.tag}, bytes(w))); w = outer")
            code.dedent()
        code.emit("u = o.get('_unknown_tags')")
        code.emit("if u: tags.extend(u.items()); tags.sort()")
        code.emit("_wuv(w, len(tags))")
        code.emit("for tag, data in tags:")
        code.indent()
        code.emit("_wuv(w, tag); _wuv(w, len(data)); w += data")
        code.dedent()
    if not code.lines:
        code.emit("pass")
    body = "\n".join(code.lines)
    src = (
        f"def {name}(o, w):\n    try:\n"
        + "\n".join("    " + line for line in body.split("\n"))
        + f"\n    except (_SE, AttributeError, TypeError, ValueError, OverflowError) as exc:\n"
        f"        if isinstance(exc, _EE): raise\n"
        f"        raise _EE(f'cannot encode {what}: {{exc}}') from None\n"
    )
    _define(ns, name, src, "encode", what)
    return name


_GENERATED_NAME = re.compile(r"\b_[dstze]\d+\b|\b_C\d+\b")


def generated_functions(ns: Mapping[str, Any], sources: Mapping[str, str], root: str) -> list[str]:
    """``root`` and every generated function it calls, directly or through a constant, root first."""
    order: list[str] = []
    pending = [root]
    while pending:
        name = pending.pop(0)
        if name in order or name not in sources:
            continue
        order.append(name)
        for ref in _GENERATED_NAME.findall(sources[name]):
            if ref in sources:
                pending.append(ref)
            elif isinstance(ns.get(ref), dict):
                # Tagged-field readers are reached through a {tag: (name, reader)} constant.
                for entry in ns[ref].values():
                    reader = entry[1] if isinstance(entry, tuple) and len(entry) == 2 else None
                    if callable(reader):
                        pending.append(getattr(reader, "__name__", ""))
    return order


class CompiledSchema:
    """Compiled functions for one schema, cached per (segment, version, projection)."""

    def __init__(self) -> None:
        self.ns = _base_namespace()
        self._decoders: dict[tuple[int, int, Any], Decoder] = {}
        self._encoders: dict[tuple[int, int], Encoder] = {}

    def decoder(self, segment: Segment, version: int, proj: Projection | None, what: str) -> Decoder:
        key = (id(segment), version, projection_key(proj))
        fn = self._decoders.get(key)
        if fn is None:
            name = compile_decoder(self.ns, segment.fields, version, segment.flexible_at(version), proj, what)
            fn = self._decoders[key] = self.ns[name]
        return fn

    def source(self, fn: Callable[..., Any]) -> str:
        """The generated source of ``fn`` and of every generated function it uses, root first."""
        names = generated_functions(self.ns.globals, self.ns.sources, fn.__name__)
        return "\n\n".join(self.ns.sources[name].rstrip("\n") for name in names) + "\n"

    def encoder(self, segment: Segment, version: int, what: str) -> Encoder:
        key = (id(segment), version)
        fn = self._encoders.get(key)
        if fn is None:
            name = compile_encoder(self.ns, segment.fields, version, segment.flexible_at(version), what)
            fn = self._encoders[key] = self.ns[name]
        return fn
