"""Coverage-guided fuzzing of the codec's decoders with atheris: only ``DecodeError`` may escape.

Not a pytest module (its name does not match ``test_*.py``); run it by hand, see README.md:

    .venv/bin/python tests/fuzz/fuzz_codec.py -max_total_time=300 .kpmon/fuzz/corpus

Input layout: byte 0 picks the entry point and the projection (bit 0: request or response; bit 1: full
or projected decode), bytes 1-2 pick the API key and version a response is decoded as, the rest is the
frame. The corpus is seeded with a valid request and response for every API and version.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import codec
    import codec.nested
    import codec.records
    from codec.samples import random_request_body, random_response_body

KEYS = codec.api_keys()
#: A projection that names fields in many APIs (unknown names are simply absent from the body).
FIELDS = frozenset(
    {
        "TransactionalId",
        "ErrorCode",
        "GroupId",
        "ProtocolType",
        "ProtocolName",
        "ProducerId",
        "ProducerEpoch",
        "TopicData.Name",
        "TopicData.PartitionData.Records",
        "Responses.Partitions.Records",
        "Topics.Partitions.ErrorCode",
        "ApiKeys.MaxVersion",
    }
)


def split(data: bytes) -> tuple[bool, bool, int, int, bytes]:
    if len(data) < 3:
        return True, False, 0, 0, data
    mode, key_byte, version_byte = data[0], data[1], data[2]
    api_key = KEYS[key_byte % len(KEYS)]
    low, high = codec.supported_versions(api_key)
    version = low + version_byte % (high - low + 1)
    return mode & 1 == 0, bool(mode & 2), api_key, version, data[3:]


def one_input(data: bytes) -> None:
    is_request, projected, api_key, version, frame = split(data)
    fields = FIELDS if projected else None
    try:
        if is_request:
            codec.decode_request(frame, fields)
        else:
            codec.decode_response(frame, api_key, version, fields)
    except codec.DecodeError:
        pass


def seed_corpus(directory: Path) -> None:
    """One valid request and response per API and version (prefixed for ``split``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        return
    rng = random.Random(7)
    for i, key in enumerate(KEYS):
        low, high = codec.supported_versions(key)
        for version in range(low, high + 1):
            prefix = bytes([i, version - low])
            request = codec.encode_request(key, version, 1, "fuzz", random_request_body(key, version, rng))
            response = codec.encode_response(key, version, 1, random_response_body(key, version, rng))
            (directory / f"req-{key}-{version}").write_bytes(bytes([0]) + prefix + request)
            (directory / f"resp-{key}-{version}").write_bytes(bytes([1]) + prefix + response)


def warm_up(directory: Path) -> None:
    """Decode every seed once so the generated per-version decoders exist before instrument_all()."""
    for path in directory.iterdir():
        data = path.read_bytes()
        for mode in (0, 2):
            one_input(bytes([data[0] | mode]) + data[1:])


def instrument_generated() -> int:
    """Add coverage feedback to the decoders the codec generated with exec() (instrument_imports() and
    instrument_all() skip code objects whose file name is not a real file)."""
    from codec.bodies import COMPILED

    done = 0
    for value in list(COMPILED.ns.values()):
        code = getattr(value, "__code__", None)
        if code is not None and code.co_filename.startswith("<kpmon:"):
            atheris.instrument_func(value)
            done += 1
    return done


def main() -> None:
    dirs = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    if dirs:
        seed_corpus(Path(dirs[0]))
        warm_up(Path(dirs[0]))
    instrument_generated()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
