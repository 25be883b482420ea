"""Airflow for the DAG tests: a private AIRFLOW_HOME with SQLite, set before anything imports Airflow.

Airflow reads its configuration when first imported, so the environment is set here, at collection
time: nothing depends on an Airflow set-up on the machine, and a fresh clone runs these tests as is.
The metadata database (needed by ``dag.test()`` only) is created once per session, on first use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "airflow_dags"
_HOME = Path(tempfile.mkdtemp(prefix="kpmon-airflow-"))

os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__DAG_IGNORE_FILE_SYNTAX": "glob",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
)


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[Path]:
    yield _HOME
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db(airflow_home: Path) -> Path:
    """The metadata database, created from the ORM (``airflow db migrate`` does the same, slower)."""
    from airflow.utils import db

    db.initdb()
    return airflow_home / "airflow.db"
