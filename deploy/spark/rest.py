"""A Spark standalone master's REST submission server: submit a driver in cluster mode, ask its state,
kill it (``spark.master.rest.enabled``; Spark's ``StandaloneRestServer``, JSON over HTTP).

``spark-submit`` refuses a Python application in standalone cluster mode, but the master itself runs
any main class on a worker: the Python job is submitted as ``org.apache.spark.deploy.PythonRunner``
with the job's file as its first argument, which is what spark-submit runs for a Python driver in
client mode. ``create_request`` is pure; ``StandaloneRest`` is the only part that talks to the master.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

#: The master's REST port unless ``spark.master.rest.port`` says otherwise.
DEFAULT_REST_PORT = 6066
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"
#: Driver states (Spark's ``DriverState``) in which the driver runs or is about to.
ACTIVE_STATES = frozenset({"SUBMITTED", "RUNNING", "RELAUNCHING"})


class RestError(RuntimeError):
    """The master refused a request or could not be reached; the message says which and why."""


def rest_url_of(master: str, rest_url: str | None = None) -> str:
    """The REST server's base URL: ``rest_url``, else the master's host at the default REST port."""
    if rest_url:
        return rest_url.rstrip("/")
    if not master.startswith("spark://"):
        raise RestError(f"{master!r} is not a standalone master (spark://HOST:PORT)")
    host = urlparse(master).hostname
    return f"http://{host}:{DEFAULT_REST_PORT}"


def create_request(
    main_file: str,
    args: Sequence[str],
    spark_properties: Mapping[str, str],
    environment: Mapping[str, str],
    spark_version: str,
) -> dict[str, Any]:
    """A ``CreateSubmissionRequest`` running the Python file ``main_file`` with ``args`` on a worker.

    ``PythonRunner`` takes the Python file, then a comma-separated list of extra Python files (none:
    the job's environment has them installed), then the application's own arguments.
    """
    return {
        "action": "CreateSubmissionRequest",
        "clientSparkVersion": spark_version,
        "appResource": f"file:{main_file}" if "://" not in main_file else main_file,
        "mainClass": PYTHON_RUNNER,
        "appArgs": [main_file, "", *args],
        "sparkProperties": dict(spark_properties),
        "environmentVariables": dict(environment),
    }


@dataclass(frozen=True)
class DriverStatus:
    submission_id: str
    #: Spark's ``DriverState`` (SUBMITTED, RUNNING, FINISHED, FAILED, KILLED, ERROR, RELAUNCHING,
    #: UNKNOWN), or ``NOT_FOUND`` when the master does not know the id.
    state: str
    worker: str | None = None
    message: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


class StandaloneRest:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/v1/submissions/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json;charset=UTF-8"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            # The server answers errors with an ErrorResponse body: its message is the useful part.
            try:
                answer = json.load(exc)
            except ValueError:
                raise RestError(f"{method} {self.url}/v1/submissions/{path}: HTTP {exc.code}") from exc
        except (OSError, ValueError) as exc:
            raise RestError(f"{method} {self.url}/v1/submissions/{path}: {exc}") from exc
        if not isinstance(answer, dict):
            raise RestError(f"{method} {path}: the master answered {answer!r}")
        return answer

    def submit(self, request: Mapping[str, Any]) -> str:
        """Submit a driver; returns its submission id (``driver-<time>-<n>``)."""
        answer = self._call("POST", "create", request)
        submission = answer.get("submissionId")
        if not answer.get("success") or not submission:
            raise RestError(f"the master refused the submission: {answer.get('message') or answer}")
        return str(submission)

    def status(self, submission_id: str) -> DriverStatus:
        answer = self._call("GET", f"status/{submission_id}")
        if not answer.get("success"):
            # The master answers an unknown id with success=false and no state.
            return DriverStatus(submission_id, "NOT_FOUND", message=answer.get("message"))
        return DriverStatus(
            submission_id,
            str(answer.get("driverState", "UNKNOWN")),
            answer.get("workerHostPort"),
            answer.get("message"),
        )

    def kill(self, submission_id: str) -> bool:
        """Ask the master to kill the driver; False if it was not running (already ended or unknown)."""
        return bool(self._call("POST", f"kill/{submission_id}").get("success"))


#: States in which an application runs, is about to, or still has containers. The ResourceManager's
#: ``/apps/<id>/state`` answers with its internal ``RMAppState`` (seen on a real Hadoop 3.4.1), not the
#: ``YarnApplicationState`` of its other answers: ``KILLING``, ``FINAL_SAVING`` and ``FINISHING`` come
#: before the end, while the application master's container (the driver) may still run.
YARN_ACTIVE_STATES = frozenset(
    {"NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING", "FINAL_SAVING", "FINISHING", "KILLING"}
)


class ResourceManagerRest:
    """A YARN ResourceManager's REST API (``/ws/v1/cluster``): an application's state, and its kill.

    Applications are submitted by spark-submit (``deploy.spark.submit``), which stages the job's files
    in the cluster's filesystem; only the state and the kill go through here.
    """

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, app_id: str, body: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        path = f"{self.url}/ws/v1/cluster/apps/{app_id}/state"
        request = urllib.request.Request(
            path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise RestError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except (OSError, ValueError) as exc:
            raise RestError(f"{method} {path}: {exc}") from exc
        if not isinstance(answer, dict):
            raise RestError(f"{method} {path}: the ResourceManager answered {answer!r}")
        return answer

    def state(self, app_id: str) -> str:
        """The application's ``YarnApplicationState``, or ``NOT_FOUND``."""
        answer = self._call("GET", app_id)
        return "NOT_FOUND" if answer is None else str(answer.get("state", "UNKNOWN"))

    def kill(self, app_id: str) -> None:
        """Ask for the kill; the ResourceManager answers 202 while it is under way, 200 once done."""
        if self._call("PUT", app_id, {"state": "KILLED"}) is None:
            raise RestError(f"the ResourceManager does not know {app_id}")
