from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import codec
from kpmon.cli import main


def _frames() -> tuple[bytes, bytes]:
    request = codec.encode_request(
        18, 3, 7, "rdkafka", {"ClientSoftwareName": "librdkafka", "ClientSoftwareVersion": "2.16.1"}
    )
    response = codec.encode_response(
        18, 3, 7, {"ErrorCode": 0, "ApiKeys": [{"ApiKey": 0, "MinVersion": 3, "MaxVersion": 13}]}
    )
    return request, response


def test_decodes_hex_request(capsys: pytest.CaptureFixture[str]) -> None:
    request, _ = _frames()
    assert main(["decode", request.hex()]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["api_name"] == "ApiVersions" and out["body"]["ClientSoftwareName"] == "librdkafka"


def test_response_needs_its_request_version(capsys: pytest.CaptureFixture[str]) -> None:
    _, response = _frames()
    assert (
        main(["decode", "--direction", "response", "--api-key", "18", "--api-version", "3", response.hex()])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["type"] == "response" and out["body"]["ApiKeys"][0]["MaxVersion"] == 13


def test_capture_file_pairs_responses_by_correlation_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request, response = _frames()
    capture = tmp_path / "capture.bin"
    capture.write_bytes(b"".join(struct.pack(">i", len(f)) + f for f in (request, response)))
    assert main(["decode", "--file", str(capture)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["type"] for line in lines] == ["request", "response"]
    assert lines[1]["api_version"] == 3


def test_bad_hex_and_truncated_capture_give_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["decode", "not-hex"]) == 2
    assert "not hex" in capsys.readouterr().err
    capture = tmp_path / "bad.bin"
    capture.write_bytes(struct.pack(">i", 100) + b"\x00" * 10)
    assert main(["decode", "--file", str(capture)]) == 2
    assert "declares 100 bytes" in capsys.readouterr().err


def test_malformed_frame_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    request, _ = _frames()
    assert main(["decode", request[:12].hex()]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["error"] == "decode_error" and out["api_key"] == 18 and out["offset"] > 0


def test_schemas_lists_every_api(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schemas", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    produce = next(a for a in data["apis"] if a["api_key"] == 0)
    assert produce["versions"][0] == 0 and {s["release"] for s in produce["segments"]} == {"4.4.0", "3.9.2"}
