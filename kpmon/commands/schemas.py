"""``kpmon schemas``: what the codec knows, per API, and where each definition came from."""

from __future__ import annotations

import argparse
import json
from typing import Any

from codec.schema import load_table


def run(args: argparse.Namespace) -> int:
    table = load_table()
    rows: list[dict[str, Any]] = []
    for key, spec in sorted(table.requests.items()):
        rows.append(
            {
                "api_key": key,
                "api_name": table.api_name(key),
                "versions": [spec.min_version, spec.max_version],
                "segments": [{"release": s.release, "versions": list(s.valid)} for s in spec.segments],
                "flexible_from": next(
                    (s.flexible[0] for s in sorted(spec.segments, key=lambda s: s.valid) if s.flexible), None
                ),
            }
        )
    if args.json:
        print(json.dumps({"sources": table.sources, "apis": rows}, indent=2))
        return 0
    print("sources: " + ", ".join(f"kafka-clients {r}" for r in table.sources))
    print(f"{'key':>4}  {'api':<36} {'versions':<9} {'flexible':<8} from")
    for row in rows:
        lo, hi = row["versions"]
        flex = "-" if row["flexible_from"] is None else f"v{row['flexible_from']}+"
        origin = ", ".join(f"{s['release']}: v{s['versions'][0]}-{s['versions'][1]}" for s in row["segments"])
        print(f"{row['api_key']:>4}  {row['api_name']:<36} v{lo}-v{hi:<6} {flex:<8} {origin}")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser("schemas", help="list every API and version the codec decodes")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
