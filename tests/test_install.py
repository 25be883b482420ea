"""An install that fits a tap host: the tap runs without Spark, Great Expectations, matplotlib or Airflow.

Two checks: a tap started with those packages made unimportable (fast: what the tap's code imports),
and a real ``pip install .[tap]`` into a clean venv that then runs ``kpmon tap --help`` (slow: what the
distribution's metadata pulls in).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Top-level modules of the extras a tap host must not need.
NOT_ON_A_TAP_HOST = (
    "pyspark",
    "great_expectations",
    "matplotlib",
    "airflow",
    "pandas",
    "pyarrow",
    "kafka",  # kafka-python: the demo's clients
    "numpy",
)

#: Run before the code under test: any import of those modules fails, as on a tap-only install.
_BLOCKER = textwrap.dedent(
    f"""
    import importlib.abc, sys
    BLOCKED = {NOT_ON_A_TAP_HOST!r}
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}} (not installed on a tap host)", name=name)
            return None
    sys.meta_path.insert(0, Block())
    """
)


def test_the_extras_split_the_distribution() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    for heavy in ("pyspark", "great-expectations", "matplotlib", "apache-airflow", "pandas", "pyarrow"):
        assert heavy not in base, f"{heavy} is in the base install a tap host gets"
    extras = project["optional-dependencies"]
    assert extras["tap"] == []
    assert any("pyspark" in d for d in extras["stream"]) and any("matplotlib" in d for d in extras["report"])
    assert any("apache-airflow" in d for d in extras["ops"])


def test_the_tap_runs_without_the_other_extras(tmp_path: Path) -> None:
    """``kpmon tap`` from the CLI, mirroring nowhere, serving one listener, then SIGTERM."""
    from tests.tap.conftest import free_port

    config = tmp_path / "kpmon.yaml"
    listen = free_port()
    config.write_text(
        f"tap:\n  listeners:\n    - listen: 127.0.0.1:{listen}\n      broker: 127.0.0.1:9\n  metrics_port: null\n"
    )
    code = _BLOCKER + textwrap.dedent(
        f"""
        import sys
        from kpmon.cli import main
        sys.exit(main(["tap", "--config", {str(config)!r}, "--no-mirror"]))
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if '"event": "ready"' in line or "Traceback" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    text = "".join(output) + rest
    assert '"event": "ready"' in text, text
    assert "not installed on a tap host" not in text, text
    assert proc.returncode == 0, text


def test_tap_help_needs_none_of_the_other_extras() -> None:
    code = _BLOCKER + "from kpmon.cli import main\nmain(['tap', '--help'])\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: kpmon tap" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pip_install_tap_extra_into_a_clean_venv(tmp_path: Path) -> None:
    """The real thing: ``pip install <repo>[tap]`` (from the package index, as a tap host would) and
    ``kpmon tap --help``; the venv must hold none of the other extras' packages."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_USER")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{ROOT}[tap]"],
        capture_output=True,
        text=True,
        env=clean_env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, env=clean_env
    ).stdout.lower()
    for heavy in (
        "pyspark",
        "great-expectations",
        "great_expectations",
        "matplotlib",
        "apache-airflow",
        "pandas",
    ):
        assert f"{heavy}==" not in listed, f"{heavy} came with the tap extra:\n{listed}"
    helped = subprocess.run(
        [str(env_dir / "bin" / "kpmon"), "tap", "--help"],
        capture_output=True,
        text=True,
        env=clean_env,
        cwd=tmp_path,
    )
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "usage: kpmon tap" in helped.stdout


def test_a_command_that_needs_another_extra_says_which(tmp_path: Path) -> None:
    code = _BLOCKER + textwrap.dedent(
        f"""
        import sys
        from kpmon.cli import main
        sys.exit(main(["report", "--capture", {str(ROOT / "tests" / "data" / "tap_frames.jsonl")!r},
                       "--out", {str(tmp_path / "r.html")!r}]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'kafka-protocol-monitor[report]'" in done.stderr and "Traceback" not in done.stderr
