"""A sans-I/O codec for every Kafka API and version, generated from Apache Kafka's message definitions.

Frames are passed without their 4-byte size prefix. See ``docs/codec.md`` and ARCHITECTURE.md.
"""

from codec.native import attach

# The compiled cores, when built and current, are found first (before any submodule is imported).
attach(__name__, __path__)

from codec.api import (
    FieldProjection,
    Request,
    Response,
    api_keys,
    api_name,
    decode_request,
    decode_request_header,
    decode_response,
    encode,
    encode_request,
    encode_response,
    is_flexible,
    projection,
    request_header_version,
    request_plan,
    response_header_version,
    response_plan,
    supported_versions,
)
from codec.bodies import decode_data, encode_data
from codec.errors import DecodeError
from codec.wire import EncodeError

__all__ = [
    "DecodeError",
    "EncodeError",
    "FieldProjection",
    "Request",
    "Response",
    "api_keys",
    "api_name",
    "decode_data",
    "decode_request",
    "decode_request_header",
    "decode_response",
    "encode",
    "encode_data",
    "encode_request",
    "encode_response",
    "is_flexible",
    "projection",
    "request_header_version",
    "request_plan",
    "response_header_version",
    "response_plan",
    "supported_versions",
]
