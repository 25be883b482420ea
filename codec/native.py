"""The per-frame cores, compiled: the same Python source built into C extensions by mypyc.

The monitor's per-frame work (the checks engine, its rules, the sharding and the stage steps, the
tap-record contract and the facts) is plain typed Python. ``make setup`` compiles exactly these
modules with mypyc into ``build/native/`` (``deploy/native.py``); this module decides, once per
process, whether to use what it built. There is no second implementation: the compiled modules are
the reference source, so they cannot drift from it (docs/decisions.md, "The per-frame cores,
compiled with mypyc").

They are used only when all of these hold, else every module runs as plain Python:

- ``KPMON_NATIVE`` is not ``0`` (set it to debug with pdb, or to compare);
- ``build/native/manifest.json`` exists and was built for this interpreter's ABI;
- every compiled module's source is byte for byte the one it was built from. A source edited after
  the build would otherwise run as its old compiled self; it is refused instead, with one warning
  saying to run ``kpmon deploy native`` (``make native``).

Each package that holds compiled modules calls ``attach`` first thing in its ``__init__``: the build
directory's copy of the package goes first on the package's ``__path__``, so its submodules are found
there, and the modules' shared library (mypyc's group module) is loaded by file, not from
``sys.path``, which would let the build directory shadow the packages themselves.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
import warnings
from collections.abc import MutableSequence
from functools import cache
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
#: Where ``deploy/native.py`` builds the extensions (``build/`` is not in git).
BUILD_DIR: Final = ROOT / "build" / "native"
MANIFEST: Final = BUILD_DIR / "manifest.json"
#: ``0``, ``off`` or ``false``: run everything as plain Python.
ENV: Final = "KPMON_NATIVE"

#: The compiled modules, as paths from the repository root: the per-frame path of both stateful
#: stages (docs/benchmarks.md profiles it). Every module here must be mypy-clean; a class that code
#: outside this list subclasses needs ``mypyc_attr(allow_interpreted_subclasses=True)``.
MODULES: Final = (
    "codec/taprecord.py",
    "codec/facts.py",
    "codec/records.py",
    "codec/messages.py",
    "codec/bodies.py",
    "codec/api.py",
    "checks/model.py",
    "checks/rule.py",
    "checks/engine.py",
    "checks/projections.py",
    "checks/sharding.py",
    "checks/summaries.py",
    "checks/routes.py",
    "checks/rules/apiversions.py",
    "checks/rules/envelope.py",
    "checks/rules/flexible.py",
    "checks/rules/groups.py",
    "checks/rules/producers.py",
    "checks/rules/transactions.py",
    "streaming/frames.py",
    "streaming/rows.py",
    "streaming/router.py",
    "streaming/stages.py",
)


def source_digest(path: str) -> str:
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()


def abi_tag() -> str:
    """The extension suffix the build is for (``.cpython-311-x86_64-linux-gnu.so``)."""
    return str(sysconfig.get_config_var("EXT_SUFFIX"))


def disabled() -> bool:
    """Whether ``KPMON_NATIVE`` asks for plain Python."""
    return os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no")


def verdict(manifest: dict[str, Any] | None, digests: dict[str, str], abi: str) -> str | None:
    """Why a build described by ``manifest`` must not be used for sources of ``digests`` on an
    interpreter of ``abi``; None when it may. Pure: ``status`` reads the files."""
    if manifest is None:
        return "not built (kpmon deploy native)"
    if manifest.get("abi") != abi:
        return f"built for {manifest.get('abi')}, this Python is {abi} (kpmon deploy native)"
    built = manifest.get("modules") or {}
    stale = sorted(path for path, digest in digests.items() if built.get(path) != digest)
    if stale:
        return f"out of date with the source ({', '.join(stale)}; kpmon deploy native)"
    if not manifest.get("group"):
        return "a manifest without its shared library (kpmon deploy native)"
    return None


def refusal() -> tuple[str | None, dict[str, Any] | None]:
    """Why a process starting now would run plain Python (None: it would use the compiled modules),
    with the manifest read; read afresh on every call (``status`` keeps its process's first answer)."""
    if disabled():
        return f"{ENV}={os.environ[ENV]}", None
    try:
        manifest: dict[str, Any] | None = json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        manifest = None
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}", None
    return verdict(manifest, {path: source_digest(path) for path in MODULES}, abi_tag()), manifest


@cache
def status() -> tuple[bool, str]:
    """(whether the compiled modules are used, why): decided once per process."""
    refused, manifest = refusal()
    if refused is not None or manifest is None:
        return False, f"{refused}: plain Python"
    group = BUILD_DIR / str(manifest["group"])
    name = group.name.split(".")[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, group)
        if spec is None or spec.loader is None or not group.is_file():
            return False, f"cannot load {group} (kpmon deploy native): plain Python"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return True, f"compiled ({len(MODULES)} modules in {BUILD_DIR})"


#: The one warning about an unusable build, once per process (each package attaches).
_WARNED: list[str] = []


def attach(package: str, path: MutableSequence[str]) -> None:
    """Put the compiled copy of ``package`` first on its ``__path__`` when the build is usable."""
    used, why = status()
    if not used:
        if ("out of date" in why or "built for" in why) and not _WARNED:
            _WARNED.append(why)
            warnings.warn(f"kpmon: compiled cores {why}", RuntimeWarning, stacklevel=3)
        return
    portion = BUILD_DIR.joinpath(*package.split("."))
    if portion.is_dir() and str(portion) not in path:
        path.insert(0, str(portion))


def compiled(module: Any) -> bool:
    """Whether an imported module is the compiled build (an extension, not a ``.py``)."""
    return str(getattr(module, "__file__", "")).endswith(abi_tag())
