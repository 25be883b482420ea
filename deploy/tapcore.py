"""Build the tap's native core (``tap/native``, the ``kpmon_tapcore`` module) with maturin and install
it into this Python's environment.

``make tapcore`` (part of ``make setup``; or ``python -m deploy.tapcore``) builds a release wheel into
``build/tapcore/wheels/`` (one wheel for every CPython >= 3.11: the stable ABI; that file is what a
broker host without a Rust toolchain installs, docs/tap.md), stamps the sources' digest into the
module (``tap.native_core`` refuses a build older than its source), installs it, and writes
``build/tapcore/installed`` for make. Without cargo (on the PATH, in ``$CARGO_HOME/bin`` or
``~/.cargo/bin``) it says so and builds nothing: the tap then runs its Python reference core. Nothing
here runs on the hot path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from codec.native import ENV, ROOT, disabled
from tap.native_core import CRATE, MODULE, source_digest

BUILD_DIR = ROOT / "build" / "tapcore"
WHEELS = BUILD_DIR / "wheels"
STAMP = BUILD_DIR / "installed"


class TapcoreBuildError(RuntimeError):
    """maturin, cargo or pip failed; the message holds the end of their output."""


def find_cargo() -> str | None:
    """cargo from ``KPMON_CARGO`` (the Makefile's), the PATH, ``$CARGO_HOME/bin`` or ``~/.cargo/bin``
    (rustup's default, often missing from a CI runner's PATH)."""
    candidates = [os.environ.get("KPMON_CARGO"), shutil.which("cargo")]
    candidates.append(str(Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo") / "bin" / "cargo"))
    for found in candidates:
        if found and os.access(found, os.X_OK):
            return found
    return None


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise TapcoreBuildError(f"{what} failed (exit {done.returncode}):\n{tail}")


def unpack(wheel: Path, into: Path) -> None:
    """Put the wheel's extension module into ``into`` (a directory put first on ``PYTHONPATH``)
    instead of installing it: a git worktree tests its own build beside a shared environment's."""
    into.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(f"{MODULE}/") and name.endswith((".so", ".pyd")):
                (into / Path(name).name).write_bytes(zf.read(name))


def build(cargo: str, into: Path | None = None) -> Path:
    """Build the wheel with ``cargo`` and install it (or unpack it into ``into``); return the wheel's
    path."""
    digest = source_digest()
    if digest is None:
        raise TapcoreBuildError(f"no crate sources in {CRATE}")
    env = {
        **os.environ,
        "PATH": f"{Path(cargo).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CARGO_TARGET_DIR": str(BUILD_DIR / "target"),
        "KPMON_TAPCORE_DIGEST": digest,
    }
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="wheels-", dir=BUILD_DIR))
    try:
        _run(
            [sys.executable, "-m", "maturin", "build", "--release", "--locked", "-m", str(CRATE / "Cargo.toml"),
             "-i", sys.executable, "-o", str(work)],
            env, "maturin build",
        )  # fmt: skip
        wheels = sorted(work.glob(f"{MODULE}-*.whl"))
        if len(wheels) != 1:
            raise TapcoreBuildError(
                f"expected one {MODULE} wheel in {work}, found {[w.name for w in wheels]}"
            )
        if into is not None:
            unpack(wheels[0], into)
        else:
            _run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheels[0])],
                env, "pip install",
            )  # fmt: skip
        shutil.rmtree(WHEELS, ignore_errors=True)
        work.rename(WHEELS)
        if into is None:
            STAMP.write_text(digest + "\n")
        return WHEELS / wheels[0].name
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check() -> tuple[bool, str]:
    """(whether the tap runs the native core, why), in a fresh interpreter: this one may have imported
    an older build before it was replaced."""
    code = "from tap.native_core import status; m, why = status(); print(why); raise SystemExit(m is None)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return done.returncode == 0, lines[-1] if lines else f"unknown (exit {done.returncode})"


def run(argv: list[str] | None = None) -> int:
    """Build and install (``make tapcore``); the exit code. A missing cargo is not a failure.
    ``--into DIR``: unpack the module into DIR instead of installing it."""
    args = argv if argv is not None else sys.argv[1:]
    into = Path(args[args.index("--into") + 1]).resolve() if "--into" in args else None
    if disabled():
        print(f"kpmon: {ENV}={os.environ[ENV]}: not building the tap's native core (Python reference)")
        return 0
    cargo = find_cargo()
    if cargo is None:
        print(
            "kpmon: cargo not found (PATH, $CARGO_HOME/bin, ~/.cargo/bin): the tap runs its Python reference "
            "core (install Rust with rustup, then make setup)"
        )
        return 0
    print(f"kpmon: building the tap's native core ({MODULE}) with {cargo}", flush=True)
    started = time.monotonic()
    try:
        wheel = build(cargo, into)
    except TapcoreBuildError as exc:
        print(f"kpmon: {exc}", file=sys.stderr)
        return 1
    done = "installed" if into is None else f"unpacked into {into}"
    print(f"kpmon: built and {done} {wheel.relative_to(ROOT)} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run())
