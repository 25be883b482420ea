"""Render deploy/grafana/kpmon-dashboard.json to a PNG from a real Prometheus, for the docs.

Each time-series panel's queries run against Prometheus's range API over the window, and the results
are drawn where the dashboard puts the panel (its 24-column grid), so the picture in
docs/operations.md shows what Grafana would, from real metrics. Grafana itself (and its image
renderer) is not needed.

    python -m deploy.dashboard --prometheus http://127.0.0.1:9090 --minutes 15 --out docs/images/kpmon-dashboard.png
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent / "grafana" / "kpmon-dashboard.json"
#: What the dashboard's template variables stand for when rendered for the docs.
VARIABLES = {"$tap_job": "kpmon-tap", "$stream_job": "kpmon-stream", "$tap": ".*"}

#: (expr, start, end, step) -> [(legend labels, [(t, value)...])]
QueryRange = Callable[[str, float, float, float], list[tuple[dict[str, str], list[tuple[float, float]]]]]


def substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(name, value)
    return expr


def prometheus_query_range(base_url: str) -> QueryRange:
    def query(
        expr: str, start: float, end: float, step: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
        with urllib.request.urlopen(
            f"{base_url.rstrip('/')}/api/v1/query_range?{params}", timeout=30
        ) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise RuntimeError(f"query failed: {expr}: {body}")
        return [
            (series["metric"], [(float(t), float(v)) for t, v in series["values"]])
            for series in body["data"]["result"]
        ]

    return query


def legend(template: str, labels: dict[str, str]) -> str:
    text = template
    for name, value in labels.items():
        text = text.replace("{{" + name + "}}", value)
    return text


def render(
    dashboard: dict[str, Any], query: QueryRange, start: float, end: float, out: Path, step: float = 15.0
) -> int:
    """Draw every panel; returns how many time series were drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    unit_height = 0.32
    fig = plt.figure(figsize=(24, rows * unit_height))
    drawn = 0
    for panel in panels:
        pos = panel["gridPos"]
        left, width = pos["x"] / 24, pos["w"] / 24
        bottom = 1 - (pos["y"] + pos["h"]) / rows
        height = pos["h"] / rows
        if panel["type"] == "row":
            fig.text(0.005, bottom + height / 2, panel["title"], fontsize=13, fontweight="bold", va="center")
            continue
        ax = fig.add_axes((left + 0.025, bottom + 0.22 * height, width - 0.035, 0.62 * height))
        ax.set_title(panel["title"], fontsize=10, loc="left")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for target in panel.get("targets", []):
            for labels, values in query(substitute(target["expr"]), start, end, step):
                if not values:
                    continue
                xs = [(t - start) / 60 for t, _ in values]
                ys = [v for _, v in values]
                ax.plot(xs, ys, linewidth=1, label=legend(target.get("legendFormat", ""), labels)[:40])
                drawn += 1
        ax.tick_params(labelsize=7)
        ax.set_xlabel("minutes", fontsize=7)
        if unit:
            ax.set_ylabel(unit, fontsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
    fig.suptitle(dashboard["title"], fontsize=15, y=0.999)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=60)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--minutes", type=float, default=15.0, help="window ending now")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    end = time.time()
    drawn = render(
        json.loads(DASHBOARD.read_text()),
        prometheus_query_range(args.prometheus),
        end - args.minutes * 60,
        end,
        args.out,
    )
    print(f"wrote {args.out}: {drawn} series")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
