"""Figures picked out of the benchmarks' results files (``benchmarks/results/*.json``), sans-I/O.

A figure is the number at a dotted key of one results file, with the CPU model of the run that wrote it
(the file's ``machine`` record) and when it ran. A figure the file does not hold, or a file that is a
``--quick`` smoke run, is carried as missing with the reason, never filled in from elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FigureSpec:
    """Where a figure lives: a results file and a dotted key in it."""

    name: str
    file: str
    key: str
    unit: str
    what: str
    #: Byte counts computed from frames do not depend on the CPU they were computed on.
    host_independent: bool = False


@dataclass(frozen=True)
class Figure:
    name: str
    file: str
    key: str
    unit: str
    what: str
    value: float | None
    #: The CPU model of the run (``machine.cpu_model``), or why there is none.
    host: str
    measured_at: str | None
    #: Why ``value`` is None.
    missing: str | None = None

    def cite(self) -> str:
        """``file key`` and the host, as every number's source reads."""
        return f"{self.file} {self.key} ({self.host})"


def _lookup(record: Mapping[str, Any], key: str) -> Any:
    node: Any = record
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _host(record: Mapping[str, Any]) -> str:
    machine = record.get("machine")
    model = machine.get("cpu_model") if isinstance(machine, Mapping) else None
    return str(model) if model else "CPU model not recorded"


def pick(specs: Iterable[FigureSpec], results: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Figure]:
    """The figures ``specs`` name, out of parsed results files (file name -> JSON, None if absent)."""
    figures: dict[str, Figure] = {}
    for spec in specs:
        record = results.get(spec.file)
        value: float | None = None
        missing: str | None = None
        if record is None:
            missing = f"benchmarks/results/{spec.file} does not exist"
            host, when = "not measured", None
        else:
            host = "host-independent" if spec.host_independent else _host(record)
            raw_when = record.get("measured_at") or record.get("when")
            when = str(raw_when) if raw_when else None
            raw = _lookup(record, spec.key)
            if record.get("quick"):
                missing = f"{spec.file} is a --quick smoke run, not a measurement"
            elif isinstance(raw, bool) or not isinstance(raw, int | float):
                missing = f"{spec.file} has no number at {spec.key}"
            else:
                value = float(raw)
        figures[spec.name] = Figure(
            spec.name, spec.file, spec.key, spec.unit, spec.what, value, host, when, missing
        )
    return figures


def figures_to_json(figures: Mapping[str, Figure]) -> dict[str, Any]:
    return {"figures": {name: asdict(fig) for name, fig in sorted(figures.items())}}


def figures_from_json(data: Mapping[str, Any]) -> dict[str, Figure]:
    return {name: Figure(**fields) for name, fields in data["figures"].items()}
