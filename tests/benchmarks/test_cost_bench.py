"""cost_bench's arithmetic, from recorded figures: what a wire frame is, and the per-frame ratios."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.cost_bench import MIB, summarize, wire_counts


def test_wire_counts_sum_every_connection_of_a_client() -> None:
    # The shape of a librdkafka statistics report (trimmed): the bootstrap connection, the learned
    # broker, the group coordinator's own connection, and the internal broker that never sends.
    report = {
        "name": "cost-bench-consumer-0#consumer-2",
        "brokers": {
            "127.0.0.1:9093/bootstrap": {"nodeid": -1, "tx": 2, "rx": 2, "txbytes": 90, "rxbytes": 900},
            "127.0.0.1:9093/1": {"nodeid": 1, "tx": 40, "rx": 39, "txbytes": 4000, "rxbytes": 80000},
            "GroupCoordinator": {"nodeid": 1, "tx": 7, "rx": 7, "txbytes": 700, "rxbytes": 650},
            ":0/internal": {"nodeid": -1, "tx": 0, "rx": 0, "txbytes": 0, "rxbytes": 0},
        },
    }
    assert wire_counts(report) == {"requests": 49, "responses": 48, "tx_bytes": 4790, "rx_bytes": 81550}
    assert wire_counts({"name": "no connection yet"}) == {
        "requests": 0,
        "responses": 0,
        "tx_bytes": 0,
        "rx_bytes": 0,
    }


def _phase(round_no: int, mode: str, frames: int, broker: float, tap: float | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "round": round_no,
        "mode": mode,
        "frames": frames,
        "wire_bytes": MIB,
        "broker_cpu_s": broker,
        "records_produced": frames // 2,
    }
    if tap is not None:
        entry.update(tap_cpu_s=tap, tap_counted_frames=frames + 100)
    return entry


PHASES = [
    _phase(0, "direct", 10_000, 1.0),
    _phase(0, "tap", 10_000, 1.2, 0.5),
    _phase(1, "tap", 10_000, 1.6, 0.7),
    _phase(1, "direct", 14_000, 1.4),
]
TOPIC = {"records": 10_050, "wire_frames": 20_100, "wire_bytes": 3 * MIB}


def test_figures_are_summed_over_rounds_and_anchored_on_the_broker_direct() -> None:
    out = summarize(PHASES, TOPIC, {"cpu_seconds": 3.015})
    figures = out["figures"]
    # 2.4 CPU s over 24,000 frames direct; 2.8 and 1.2 over 20,000 tapped; the job over the topic's
    # 20,100 wire frames (every frame the tap forwarded), not over its 10,050 records.
    assert figures["broker_direct"]["us_per_frame"] == 100.0
    assert figures["broker_mirroring"]["us_per_frame"] == 140.0
    assert figures["tap"]["us_per_frame"] == 60.0
    assert figures["job"]["us_per_frame"] == 150.0
    assert out["ratios"] == {
        "tap_over_broker": 0.6,
        "job_over_broker": 1.5,
        "broker_mirroring_over_direct": 1.4,
    }
    # Per MiB: 2 MiB direct, 2 MiB tapped, 3 MiB through the tap in its lifetime.
    assert figures["broker_direct"]["ms_per_mib"] == 1200.0
    assert out["ratios_per_mib"] == {
        "tap_over_broker": 0.5,
        "job_over_broker": pytest.approx(1005 / 1200, abs=1e-4),
        "broker_mirroring_over_direct": pytest.approx(1400 / 1200, abs=1e-4),
    }
    assert out["records_per_wire_frame"] == 0.5
    assert out["tap_counted_over_client_counted"] == 1.01
    assert out["records_produced_per_frame"] == {"direct": 0.5, "tap": 0.5}


def test_each_round_is_anchored_on_its_own_direct_phase() -> None:
    rounds = summarize(PHASES, TOPIC, {"cpu_seconds": 3.015})["ratios_per_round"]
    assert [(r["round"], r["order"]) for r in rounds] == [(0, ["direct", "tap"]), (1, ["tap", "direct"])]
    assert [r["broker_direct_us_per_frame"] for r in rounds] == [100.0, 100.0]
    assert [r["broker_mirroring_over_direct"] for r in rounds] == [1.2, 1.6]
    assert [r["tap_over_broker"] for r in rounds] == [0.5, 0.7]


def test_no_job_run_leaves_its_ratio_empty() -> None:
    out = summarize(PHASES, TOPIC, None)
    assert out["figures"]["job"] is None
    assert out["ratios"]["job_over_broker"] is None
    assert out["ratios"]["tap_over_broker"] == 0.6
