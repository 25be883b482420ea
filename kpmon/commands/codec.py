"""``kpmon codec``: look inside the codec. ``kpmon codec dump`` prints the Python source it generates.

The codec writes and compiles a decoder per (message, version, projection) the first time one is
needed (docs/codec.md). Reading that source is the quickest way to see what a decode of a given frame
does, why a projection is or is not cheaper, or which line a traceback points at.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

import codec
from codec.api import generated_constants, generated_source, request_spec, response_spec
from codec.schema import FieldSpec, MessageSpec, load_table

EXIT_USAGE = 2


class UsageError(ValueError):
    """An API, version or field the codec does not know: reported on stderr with exit code 2."""


def resolve_api(text: str) -> int:
    """An API key from a number (``0``) or a name (``Produce``, ``ProduceRequest``, any case)."""
    table = load_table()
    if text.lstrip("-").isdigit():
        key = int(text)
        if key not in table.requests:
            raise UsageError(f"unknown API key {key} (kpmon schemas lists every API)")
        return key
    names = {table.api_name(key).lower(): key for key in table.requests}
    wanted = text.lower().removesuffix("request").removesuffix("response")
    if wanted in names:
        return names[wanted]
    close = difflib.get_close_matches(wanted, names, n=3)
    hint = f"; did you mean {', '.join(table.api_name(names[c]) for c in close)}?" if close else ""
    raise UsageError(f"unknown API {text!r}{hint} (kpmon schemas lists every API)")


def _check_version(spec: MessageSpec, version: int) -> None:
    if spec.segment(version) is None:
        raise UsageError(
            f"{spec.name} v{version} is not defined (known: v{spec.min_version}-v{spec.max_version})"
        )


def _check_field(fields: tuple[FieldSpec, ...], version: int, path: str, message: str) -> None:
    """Every dotted component must name a field present at ``version`` (a typo would silently
    project nothing)."""
    level: tuple[FieldSpec, ...] | None = fields
    walked: list[str] = []
    for part in path.split("."):
        if level is None:
            raise UsageError(f"{message}: {'.'.join(walked)} has no fields, so {path!r} selects nothing")
        present = {f.name: f for f in level if f.present(version)}
        if part not in present:
            close = difflib.get_close_matches(part, present, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; fields here: {', '.join(present)}"
            where = ".".join(walked) or "the top level"
            raise UsageError(f"{message}: no field {part!r} in {where}{hint}")
        walked.append(part)
        level = present[part].fields


def _render_constant(value: Any) -> str:
    if isinstance(value, dict) and all(isinstance(v, tuple) and len(v) == 2 for v in value.values()):
        # A tagged-field table: {tag: (name, reader)}; show readers by their generated name.
        entries = ", ".join(
            f"{tag}: ({name!r}, {getattr(reader, '__name__', reader)})"
            for tag, (name, reader) in value.items()
        )
        return f"{{{entries}}}"
    return repr(value)


def dump(args: argparse.Namespace) -> int:
    try:
        api_key = resolve_api(args.api)
        spec = response_spec(api_key) if args.response else request_spec(api_key)
        version = spec.max_version if args.version is None else args.version
        _check_version(spec, version)
        seg = spec.segment(version)
        assert seg is not None  # checked above
        fields = [path.strip() for path in args.fields.split(",") if path.strip()] if args.fields else None
        for path in fields or ():
            _check_field(seg.fields, version, path, f"{spec.name} v{version}")
    except UsageError as exc:
        print(f"kpmon codec dump: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.response:
        plan = codec.response_plan(api_key, version, fields)
        header_version, header, body = plan.header_version, plan.header, plan.body
    else:
        request = codec.request_plan(api_key, version, fields)
        header_version, header, body = request.header_version, request.header, request.body
    assert body is not None  # the version was checked above
    kind = "response" if args.response else "request"
    lines = [
        f"# {spec.name} v{version}: Kafka {seg.release} definition, "
        f"{'flexible' if seg.flexible_at(version) else 'not flexible'}, {kind} header v{header_version}",
    ]
    if fields is None:
        lines.append("# projection: none (full decode)")
    elif body.projection is None:
        lines.append(f"# projection: {', '.join(fields)}")
        lines.append("# it keeps every field, so the plan reuses the full decoder below")
    else:
        lines.append(f"# projection: {', '.join(fields)}")
    lines.append(f"# entry point: {body.decoder.__name__}(b, p, L) -> (body dict, end offset)")
    sources = []
    if args.header:
        sources.append(generated_source(header))
    sources.append(generated_source(body.decoder))
    text = "\n\n".join(source.rstrip("\n") for source in sources)
    constants = generated_constants(text)
    print("\n".join(lines))
    print()
    print(text)
    if constants:
        print()
        print("# shared constants")
        for name, value in constants.items():
            print(f"# {name} = {_render_constant(value)}")
    return 0


def run(args: argparse.Namespace) -> int:
    args.codec_parser.print_help(sys.stderr)
    return EXIT_USAGE


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "codec",
        help="look inside the codec (dump the decoders it generates)",
        description="Inspect the codec: the Python it generates and compiles per message, version and projection.",
    )
    parser.set_defaults(func=run, codec_parser=parser)
    actions = parser.add_subparsers(dest="codec_command", metavar="ACTION")
    dumper = actions.add_parser(
        "dump",
        help="print the generated decoder source for an API version",
        description=(
            "Print the Python source the codec generates to decode one API version's request (or, with "
            "--response, response) body, and every generated function it calls. With --fields, the "
            "projected decoder those dotted paths select; a projection that keeps every field shows the "
            "full decoder, which is what it runs."
        ),
        epilog="examples:\n  kpmon codec dump --api Produce --version 9\n"
        "  kpmon codec dump --api Fetch --version 12 --response --fields Responses.Partitions.Records\n"
        "  kpmon codec dump --api 18 --header",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dumper.add_argument("--api", required=True, help="API name (Produce, ApiVersions...) or key number")
    dumper.add_argument("--version", type=int, help="API version (default: the newest the codec knows)")
    dumper.add_argument("--response", action="store_true", help="the response body instead of the request's")
    dumper.add_argument(
        "--fields",
        help="comma-separated dotted field paths to project to, e.g. TopicData.Name,TransactionalId",
    )
    dumper.add_argument("--header", action="store_true", help="also print the header decoder it uses")
    dumper.set_defaults(func=dump)
