"""The standalone master's REST submission protocol (deploy/spark/rest.py): the request it sends.

The client itself runs against a real master in tests/airflow_dags/test_standalone.py.
"""

from __future__ import annotations

import pytest

from deploy.spark.rest import PYTHON_RUNNER, DriverStatus, RestError, create_request, rest_url_of


def test_a_python_driver_is_submitted_as_pythonrunner_with_its_file_first() -> None:
    request = create_request(
        "/opt/kpmon/deploy/spark/kpmon_stream.py",
        ["--config", "/shared/kpmon.yaml"],
        {"spark.master": "spark://m:7077"},
        {"KPMON_MARK": "1"},
        "4.2.0",
    )
    assert request["action"] == "CreateSubmissionRequest" and request["clientSparkVersion"] == "4.2.0"
    assert request["mainClass"] == PYTHON_RUNNER
    assert request["appResource"] == "file:/opt/kpmon/deploy/spark/kpmon_stream.py"
    # PythonRunner's arguments: the Python file, the extra Python files (none), the job's own arguments.
    assert request["appArgs"] == [
        "/opt/kpmon/deploy/spark/kpmon_stream.py",
        "",
        "--config",
        "/shared/kpmon.yaml",
    ]
    assert request["sparkProperties"] == {"spark.master": "spark://m:7077"}
    assert request["environmentVariables"] == {"KPMON_MARK": "1"}
    assert (
        create_request("hdfs://nn/kpmon_stream.py", [], {}, {}, "4.2.0")["appResource"]
        == "hdfs://nn/kpmon_stream.py"
    )


def test_the_rest_url_defaults_to_the_masters_host_at_6066() -> None:
    assert rest_url_of("spark://master.example:7077") == "http://master.example:6066"
    assert rest_url_of("spark://m:7077", "http://rest.example:16066/") == "http://rest.example:16066"
    with pytest.raises(RestError, match="not a standalone master"):
        rest_url_of("yarn")


def test_only_submitted_running_or_relaunching_drivers_are_active() -> None:
    active = {s for s in ("SUBMITTED", "RUNNING", "RELAUNCHING", "FINISHED", "FAILED", "KILLED", "ERROR",
                          "UNKNOWN", "NOT_FOUND") if DriverStatus("d", s).active}  # fmt: skip
    assert active == {"SUBMITTED", "RUNNING", "RELAUNCHING"}
