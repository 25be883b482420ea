"""Which tap core runs: the native one (``kpmon_tapcore``, built from ``tap/native`` by ``make setup``)
or the Python reference (``tap/framing.py``, ``codec/peek.py``, ``codec/taprecord.py``).

The native module is used when it imports, ``KPMON_NATIVE`` does not ask for plain Python, and, next
to its source tree, it was built from that very source (a build older than the source would run
code nobody tests: it is refused, and says so). A broker host that installed the wheel has no source
tree beside it and uses the wheel as it is. Otherwise the tap runs the reference, with one log line
saying why (``log_core``) and ``kpmon_tap_core_info{core="python"}`` (tap/metrics.py).

The tables the native pieces need are built here from the codec's schema table, so protocol
knowledge stays generated from Kafka's definitions.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Final

from codec.errors import DecodeError
from codec.native import ENV, disabled
from codec.protocol import ApiKey
from tap.framing import REBALANCE_WAITS, FrameError, HoldLimits

if TYPE_CHECKING:
    # Typed by tap/native/kpmon_tapcore.pyi (mypy_path), built or not.
    import kpmon_tapcore

#: The crate's directory: present in a source checkout, absent where only the wheel is installed.
CRATE: Final = Path(__file__).resolve().parent / "native"
#: What a build depends on (``deploy/tapcore.py`` stamps their digest into the module).
SOURCE_GLOBS: Final = ("Cargo.toml", "Cargo.lock", "src/*.rs")
MODULE: Final = "kpmon_tapcore"
NATIVE: Final = "native"
PYTHON: Final = "python"


def source_digest(crate: Path = CRATE) -> str | None:
    """The digest of the crate's sources, or None when there is no source tree here."""
    files = sorted(path for pattern in SOURCE_GLOBS for path in crate.glob(pattern))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(crate).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def verdict(built_digest: str, source: str | None) -> str | None:
    """Why a module built from ``built_digest`` must not run beside sources of digest ``source``."""
    if source is not None and built_digest != source:
        return f"{MODULE} is out of date with {CRATE.name}/ (make setup, or kpmon deploy native)"
    return None


@cache
def status() -> tuple[ModuleType | None, str]:
    """(the native module, or None for the reference; why), decided once per process."""
    if disabled():
        return None, f"{ENV}=0: the Python reference core"
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        return None, f"{MODULE} is not built (make setup, or kpmon deploy native): the Python reference core"
    refused = verdict(str(getattr(module, "SOURCE_DIGEST", "")), source_digest())
    if refused is not None:
        return None, f"{refused}: the Python reference core"
    # The reference's exception types, so one ``except`` catches what either core raises.
    module.use_errors(FrameError, DecodeError)
    return module, f"native ({MODULE} {module.__version__})"


def core_name() -> str:
    """``native`` or ``python``: the ``core`` label of ``kpmon_tap_core_info``."""
    return NATIVE if status()[0] is not None else PYTHON


def log_core(log: logging.Logger) -> None:
    """The one line that says which core this process runs, and why: a warning when the native core
    should run and cannot (not built, or out of date)."""
    module, why = status()
    entry = json.dumps({"event": "tap_core", "core": core_name(), "why": why})
    if module is None and not disabled():
        log.warning(entry)
    else:
        log.info(entry)


def produce_table(native: ModuleType) -> kpmon_tapcore.ProduceTable:
    """The native ``ProduceTable``: per Produce version, its request header version and the layout
    of the fields before ``Acks``, from the schema table (``codec.peek``, ``codec.api``)."""
    from codec.api import request_header_version
    from codec.peek import _acks_layout
    from codec.schema import load_table

    spec = load_table().requests[ApiKey.PRODUCE]
    versions = spec.versions()
    table: kpmon_tapcore.ProduceTable = native.ProduceTable(
        {v: request_header_version(ApiKey.PRODUCE, v) for v in versions},
        {v: _acks_layout(v) for v in versions},
    )
    return table


def correlations(
    native: ModuleType, limits: HoldLimits, budget: kpmon_tapcore.HeldBudget | None = None
) -> kpmon_tapcore.Correlations:
    """A native ``Correlations`` with the reference's bounds (``HoldLimits``, ``REBALANCE_WAITS``)."""
    found: kpmon_tapcore.Correlations = native.Correlations(
        limits.max_in_flight,
        limits.max_bytes,
        limits.max_age_ns,
        limits.max_rebalance_age_ns,
        sorted(int(api) for api in REBALANCE_WAITS),
        budget,
    )
    return found
