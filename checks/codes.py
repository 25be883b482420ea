"""Module-level aliases of the ``codec.protocol`` members that the checks' hot paths compare against.

On CPython 3.11 looking up an enum member (``ApiKey.PRODUCE``) costs about 150 ns, a module global
about 20 ns, and one exchange made about twenty such lookups in the engine and the rules. These are
the members themselves, so the constants still come from the one generated module; cold code (module
constants, messages) names ``ApiKey`` and ``ErrorCode`` directly.
"""

from __future__ import annotations

from typing import Final

from codec.protocol import ApiKey, ErrorCode

ADD_OFFSETS_TO_TXN: Final = ApiKey.ADD_OFFSETS_TO_TXN
ADD_PARTITIONS_TO_TXN: Final = ApiKey.ADD_PARTITIONS_TO_TXN
API_VERSIONS: Final = ApiKey.API_VERSIONS
END_TXN: Final = ApiKey.END_TXN
ENVELOPE: Final = ApiKey.ENVELOPE
INIT_PRODUCER_ID: Final = ApiKey.INIT_PRODUCER_ID
PRODUCE: Final = ApiKey.PRODUCE
TXN_OFFSET_COMMIT: Final = ApiKey.TXN_OFFSET_COMMIT
WRITE_TXN_MARKERS: Final = ApiKey.WRITE_TXN_MARKERS

DUPLICATE_SEQUENCE_NUMBER: Final = ErrorCode.DUPLICATE_SEQUENCE_NUMBER
INVALID_PRODUCER_EPOCH: Final = ErrorCode.INVALID_PRODUCER_EPOCH
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
PRODUCER_FENCED: Final = ErrorCode.PRODUCER_FENCED
UNSUPPORTED_VERSION: Final = ErrorCode.UNSUPPORTED_VERSION
