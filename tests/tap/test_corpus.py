"""Golden real-client frames captured by the tap (tests/data/tap_frames.jsonl, see make_corpus.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import codec
from tap.capture import FrameInfo, capture, header_end

CORPUS = Path(__file__).resolve().parents[1] / "data" / "tap_frames.jsonl"
FRAMES: list[dict[str, Any]] = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def _id(frame: dict[str, Any]) -> str:
    return (
        f"{frame['source'][:12]}-{frame['dir']}-{frame['api_key']}v{frame['api_version']}-c{frame['corr_id']}"
    )


def test_corpus_is_small_and_varied() -> None:
    assert CORPUS.stat().st_size < 2 * 1024 * 1024
    assert {f["api_key"] for f in FRAMES} >= {0, 1, 3, 10, 11, 14, 18, 22, 24, 26}


@pytest.mark.parametrize("frame", FRAMES, ids=_id)
def test_golden_frame_decodes_and_round_trips(frame: dict[str, Any]) -> None:
    raw = bytes.fromhex(frame["hex"])
    if frame["dir"] == "req":
        message: codec.Request | codec.Response = codec.decode_request(raw)
    else:
        message = codec.decode_response(raw, frame["api_key"], frame["api_version"])
    assert message.correlation_id == frame["corr_id"]
    assert codec.encode(message) == raw


@pytest.mark.parametrize("frame", FRAMES, ids=_id)
def test_golden_frame_capture_policies(frame: dict[str, Any]) -> None:
    raw = bytes.fromhex(frame["hex"])
    info = FrameInfo(frame["dir"], len(raw), frame["api_key"], frame["api_version"])
    assert capture(raw, info, "full", 900_000).value == raw
    meta = capture(raw, info, "meta", 900_000).value
    assert meta == raw[: header_end(raw, info)]
    headers = capture(raw, info, "headers", 900_000)
    assert "capture_fallback" not in headers.flags
    if (frame["api_key"], frame["dir"]) in ((0, "req"), (1, "resp")):
        assert len(headers.value) <= len(raw)
        # Stripped frames still decode: batch headers (producer id, sequence, count) are kept.
        if frame["dir"] == "req":
            codec.decode_request(headers.value)
        else:
            codec.decode_response(headers.value, frame["api_key"], frame["api_version"])
    else:
        assert headers.value == raw
