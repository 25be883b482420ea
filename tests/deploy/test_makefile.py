"""The Makefile's choice of Python: any Python >= 3.11 the machine has, and a clear error otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _fake_pythons(bin_dir: Path, good: set[str]) -> None:
    """python3.13 .. python3 in ``bin_dir``: ``good`` ones run this interpreter; the rest fail as a pyenv
    shim for a version that is not installed does (found on the PATH, but exiting non-zero)."""
    bin_dir.mkdir()
    for name in ("python3.13", "python3.12", "python3.11", "python3"):
        script = bin_dir / name
        if name in good:
            script.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        else:
            script.write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
        script.chmod(0o755)


def _make(tmp_path: Path, *args: str, makefile: str = "Makefile") -> subprocess.CompletedProcess[str]:
    """``make`` on a copy of the Makefile whose venv step is the first thing it does."""
    work = tmp_path / "repo"
    work.mkdir(exist_ok=True)
    shutil.copy(REPO / "Makefile", work / "Makefile")
    (work / "pyproject.toml").write_text("")
    # Only the fake interpreters and the basic tools (sh, make): no real python3.x on this PATH.
    tools = tmp_path / "tools"
    if not tools.exists():
        tools.mkdir()
        for tool in ("sh", "make", "test", "echo", "env"):
            found = shutil.which(tool)
            assert found, tool
            (tools / tool).symlink_to(found)
    env = {"PATH": f"{tmp_path / 'bin'}:{tools}", "HOME": str(tmp_path), "KPMON_HOME": str(tmp_path)}
    return subprocess.run(
        ["make", "--no-print-directory", "-f", makefile, *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _chosen(tmp_path: Path) -> str:
    (tmp_path / "repo").mkdir(exist_ok=True)
    (tmp_path / "repo" / "show.mk").write_text("include Makefile\nshow-python:\n\t@echo $(PYTHON)\n")
    done = _make(tmp_path, "show-python", makefile="show.mk")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("good", "expected"),
    [
        ({"python3.12", "python3"}, "python3.12"),
        ({"python3.13", "python3.11"}, "python3.13"),
        ({"python3"}, "python3"),
    ],
)
def test_make_takes_the_newest_working_python(tmp_path: Path, good: set[str], expected: str) -> None:
    _fake_pythons(tmp_path / "bin", good)
    assert _chosen(tmp_path) == str(tmp_path / "bin" / expected)


def test_make_without_a_python_311_says_so(tmp_path: Path) -> None:
    _fake_pythons(tmp_path / "bin", set())
    done = _make(tmp_path, ".venv/.installed")
    assert done.returncode != 0
    assert "no Python >= 3.11 found" in done.stdout + done.stderr
    assert not (tmp_path / "repo" / ".venv").exists()


def test_make_refuses_an_old_python_given_by_hand(tmp_path: Path) -> None:
    _fake_pythons(tmp_path / "bin", set())
    old = tmp_path / "bin" / "python3.9"
    old.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Python 3.9.18'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    done = _make(tmp_path, ".venv/.installed", f"PYTHON={old}")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert f"{old} is not a Python >= 3.11 (found: Python 3.9.18)" in output, output
    assert not (tmp_path / "repo" / ".venv").exists()


def test_the_default_choice_on_this_machine_works() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MAKEFLAGS")}
    done = subprocess.run(
        ["make", "-s", "-f", "-", "show-python"],
        input=f"include {REPO / 'Makefile'}\nshow-python:\n\t@echo $(PYTHON)\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    chosen = done.stdout.strip()
    assert chosen, done.stderr
    version = subprocess.run(
        [chosen, "-c", "import sys; print(sys.version_info >= (3, 11))"], capture_output=True, text=True
    )
    assert version.stdout.strip() == "True"


def test_the_compiled_cores_are_rebuilt_when_any_of_their_sources_changes() -> None:
    """``make native`` (``$(NATIVE)``) must list every module mypyc compiles among its prerequisites, or
    an edit to one leaves a build that ``codec.native`` refuses as stale, and the cores run as plain Python."""
    import fnmatch
    import re

    from codec.native import MODULES

    rule = re.search(r"^\$\(NATIVE\): (.+)$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)
    assert rule is not None
    patterns = re.findall(r"[\w./*]+\.py", rule.group(1))
    missing = [
        m
        for m in MODULES
        if not any(fnmatch.fnmatch(m, p) and p.count("/") == m.count("/") for p in patterns)
    ]
    assert not missing, f"$(NATIVE) does not depend on {missing}"
