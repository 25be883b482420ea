"""``kpmon codec dump``: prints the decoder source the codec generates, and rejects what it does not know."""

from __future__ import annotations

import linecache

import pytest

import codec
from kpmon.cli import main


def test_dump_prints_the_source_that_decodes_the_frame(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["codec", "dump", "--api", "Produce", "--version", "9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ProduceRequest v9: Kafka 4.4.0 definition, flexible, request header v2")
    entry = codec.request_plan(0, 9).body.decoder
    assert f"def {entry.__name__}(b, p, L):" in out
    # What is printed is exactly what runs: the source linecache holds for the decoder's code.
    registered = "".join(linecache.getlines(entry.__code__.co_filename))
    assert registered and registered in out
    # Nested struct decoders come along: TopicData's, which decodes each PartitionData in its loop.
    assert out.count("def _d") >= 2
    assert "_records(b, p, e)" in out and "'Records': g1" in out


def test_dump_of_a_projection_and_of_a_response(capsys: pytest.CaptureFixture[str]) -> None:
    fields = "TransactionalId,TopicData.PartitionData.Records"
    assert main(["codec", "dump", "--api", "produce", "--version", "9", "--fields", fields]) == 0
    out = capsys.readouterr().out
    projected = codec.request_plan(0, 9, fields.split(",")).body.decoder
    assert "# projection: TransactionalId, TopicData.PartitionData.Records" in out
    assert f"def {projected.__name__}(b, p, L):" in out and "'Acks'" not in out

    assert main(["codec", "dump", "--api", "18", "--version", "3", "--response", "--header"]) == 0
    out = capsys.readouterr().out
    assert "ApiVersionsResponse v3" in out and "response header v0" in out
    assert "# shared constants" in out  # the tagged-field table of its flexible structs


def test_dump_says_when_a_projection_is_the_full_decoder(capsys: pytest.CaptureFixture[str]) -> None:
    fields = "TransactionalId,Acks,TimeoutMs,TopicData"
    assert main(["codec", "dump", "--api", "Produce", "--version", "9", "--fields", fields]) == 0
    assert "reuses the full decoder" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--api", "Prodce", "--version", "9"], "unknown API 'Prodce'; did you mean Produce"),
        (["--api", "999"], "unknown API key 999"),
        (["--api", "Produce", "--version", "99"], "ProduceRequest v99 is not defined (known: v0-v13)"),
        (["--api", "Produce", "--version", "9", "--fields", "TopicData.Nme"], "did you mean Name"),
        (["--api", "Produce", "--version", "9", "--fields", "Acks.X"], "Acks has no fields"),
    ],
)
def test_unknown_api_version_or_field_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["codec", "dump", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_codec_without_an_action_shows_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["codec"]) == 2
    assert "dump" in capsys.readouterr().err
