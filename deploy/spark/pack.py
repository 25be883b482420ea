"""Pack kpmon's Python environment with venv-pack, for ``spark-submit --archives env.tar.gz#environment``.

venv-pack refuses editable installs, so by default a fresh venv is built with a plain (non-editable)
``pip install`` of the project, then packed. The archive holds the packages but links ``bin/python`` to
the base interpreter: every node needs that Python at the same path (or ``--python-prefix``).
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
#: The JVM side of pip's pyspark; on a cluster the JVM is the cluster's Spark, so these are dead weight.
PYSPARK_JARS = "lib/python*/site-packages/pyspark/jars/*"
INSTALL_HINT = (
    "venv-pack is not installed. Install it next to kpmon (.venv/bin/pip install venv-pack) "
    "or on PATH (pipx install venv-pack), then run this again"
)


class PackError(RuntimeError):
    """The archive could not be built; the message says which step failed."""


@dataclass(frozen=True)
class PackOptions:
    output: Path
    #: Pack this existing (non-editable) venv instead of building one.
    venv: Path | None = None
    build_dir: Path | None = None
    python: str = sys.executable
    #: Where ``python`` lives on the cluster nodes, if not where it lives here (venv-pack --python-prefix).
    python_prefix: str | None = None
    #: Install from these wheels only (air-gapped build machine).
    wheelhouse: Path | None = None
    keep_pyspark_jars: bool = False


def find_venv_pack() -> list[str] | None:
    """The venv-pack command: its script on PATH or beside this interpreter, or its module here."""
    script = shutil.which("venv-pack") or shutil.which("venv-pack", path=str(Path(sys.executable).parent))
    if script:
        return [script]
    if importlib.util.find_spec("venv_pack") is not None:
        return [sys.executable, "-m", "venv_pack"]
    return None


def plan_pack(options: PackOptions, venv_pack: Sequence[str]) -> list[list[str]]:
    """The commands, in order: build the venv (unless given one), then pack it."""
    steps: list[list[str]] = []
    venv = options.venv
    if venv is None:
        if options.build_dir is None:
            raise PackError("give a venv to pack or a build directory to create one in")
        venv = options.build_dir
        steps.append([options.python, "-m", "venv", "--clear", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        if options.wheelhouse is not None:
            pip += ["--no-index", "--find-links", str(options.wheelhouse)]
        steps.append([*pip, str(PROJECT_ROOT)])
    pack = [*venv_pack, "--prefix", str(venv), "--output", str(options.output), "--force"]
    if options.python_prefix:
        pack += ["--python-prefix", options.python_prefix]
    if not options.keep_pyspark_jars:
        pack += ["--exclude", PYSPARK_JARS]
    steps.append(pack)
    return steps


def pack(options: PackOptions) -> Path:
    venv_pack = find_venv_pack()
    if venv_pack is None:
        raise PackError(INSTALL_HINT)
    if options.venv is not None and not (options.venv / "pyvenv.cfg").is_file():
        raise PackError(f"{options.venv} is not a virtual environment (no pyvenv.cfg)")
    options.output.parent.mkdir(parents=True, exist_ok=True)
    for step in plan_pack(options, venv_pack):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PackError(f"{shlex.join(step)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return options.output
