"""Build the compiled per-frame cores (``codec.native.MODULES``) with mypyc into ``build/native/``.

``kpmon deploy native`` (``make native``, part of ``make setup``; or ``python -m deploy.native``)
compiles the modules, then writes ``build/native/manifest.json``: the interpreter's extension ABI,
the shared library's name and each module's source digest (taken before the build, so a source
edited during it reads as stale), which ``codec.native`` checks at import. It builds into a fresh
directory and swaps it in only when the build succeeded, so a failed build leaves the last good one
(or none: plain Python). Nothing here runs on the hot path.

``--check`` only reports whether the build is usable, and which tap core runs (``deploy/tapcore.py``);
``--clean`` removes it. With ``KPMON_NATIVE=0``
nothing is compiled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codec.native import BUILD_DIR, ENV, MANIFEST, MODULES, ROOT, abi_tag, disabled, source_digest, status

#: Runs in a child Python whose working directory is a scratch directory: from the project root,
#: setuptools would read the project's pyproject.toml, and mypyc writes its C files under the working
#: directory. mypyc writes a C file per module (``multi_file``), and they compile on every CPU at once:
#: as one file, the C compiler took nine tenths of the build on one CPU. distutils compiles an
#: extension's files one after another, so its ``compile`` is replaced by the same steps over a pool
#: (each file is a compiler process); a distutils without those steps keeps its own.
_SETUP = """
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from setuptools import setup
from distutils import ccompiler
from mypyc.build import mypycify


def compile_on_every_cpu(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                         extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs
    )
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

    def one(obj):
        if obj in build:
            src, ext = build[obj]
            self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(max(1, cpus or 1)) as pool:
        list(pool.map(one, objects))
    return objects


if all(hasattr(ccompiler.CCompiler, step) for step in ("_setup_compile", "_get_cc_args", "_compile")):
    ccompiler.CCompiler.compile = compile_on_every_cpu
paths, lib = sys.argv[1:-1], sys.argv[-1]
setup(
    name="kpmon-native",
    packages=[],
    py_modules=[],
    ext_modules=mypycify(paths, opt_level="3", multi_file=True),
    script_args=["build_ext", "--build-lib", lib, "--build-temp", "tmp"],
)
"""


class NativeBuildError(RuntimeError):
    """mypyc or the C compiler failed; the message holds the end of their output."""


def build(out: Path = BUILD_DIR) -> Path:
    """Compile ``MODULES`` into ``out``; return the manifest's path."""
    digests = {path: source_digest(path) for path in MODULES}
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="native-", dir=out.parent))
    try:
        lib = work / "lib"
        env = {**os.environ, ENV: "0", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", _SETUP, *(str(ROOT / path) for path in MODULES), str(lib)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
            raise NativeBuildError(f"mypyc build failed (exit {done.returncode}):\n{tail}")
        groups = [p.name for p in lib.glob(f"*__mypyc{abi_tag()}")]
        if len(groups) != 1:
            raise NativeBuildError(f"expected one mypyc shared library in {lib}, found {groups}")
        manifest = {
            "abi": abi_tag(),
            "group": groups[0],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "modules": digests,
        }
        (lib / MANIFEST.name).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        lib.rename(out)
        return out / MANIFEST.name
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(check: bool = False, clean: bool = False) -> int:
    """Build (the default), ``check`` or ``clean`` (``kpmon deploy native``); the exit code."""
    if check:
        from deploy import tapcore

        used, why = status()
        print(f"kpmon: compiled cores {why}")
        tap_used, tap_why = tapcore.check()
        print(f"kpmon: tap core {tap_why}")
        return 0 if used and tap_used else 1
    if clean:
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        print(f"kpmon: removed {BUILD_DIR}")
        return 0
    if disabled():
        print(f"kpmon: {ENV}={os.environ[ENV]}: not compiling the per-frame cores (plain Python)")
        return 0
    print(f"kpmon: compiling {len(MODULES)} modules with mypyc into {BUILD_DIR} (about a minute)", flush=True)
    started = time.monotonic()
    try:
        build()
    except NativeBuildError as exc:
        print(f"kpmon: {exc}", file=sys.stderr)
        return 1
    print(f"kpmon: compiled in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run())
