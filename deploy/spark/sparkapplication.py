"""The streaming job as a spark-operator SparkApplication (``sparkoperator.k8s.io/v1beta2``): built from a
config, then created, read and deleted through the Kubernetes API (``deploy.target: kubernetes``).

``deploy/k8s/spark/sparkapplication.yaml`` is the one description of that object: ``build`` starts from it and
sets only what a config decides (name, namespace, image, the config file the driver reads, the driver's
resources, extra Spark properties, where the connector comes from), so what ``kubectl apply -k deploy/k8s/spark``
runs and what the DAGs create cannot drift apart (tests/deploy/test_sparkapplication.py).
``build`` and ``plan_application`` are pure; ``SparkApplications`` is the only part that talks to the API
server, through the official ``kubernetes`` client (its kubeconfig and in-cluster auth).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from deploy.spark.submit import SubmitError, check_checkpoint, resolved_config, shipped_config
from kpconfig.model import KpmonConfig, KubernetesDeployConfig

MANIFEST = Path(__file__).resolve().parents[1] / "k8s" / "spark" / "sparkapplication.yaml"
GROUP = "sparkoperator.k8s.io"
VERSION = "v1beta2"
PLURAL = "sparkapplications"
#: The operator's ``.status.applicationState.state`` values in which the driver runs or is about to
#: (a failing driver under ``restartPolicy: OnFailure`` is resubmitted). ``NEW`` stands for the empty
#: state of an application the operator has not picked up yet. ``UNKNOWN`` (the driver pod's node is
#: unreachable) counts as running: a second driver on the same checkpoint is worse than waiting.
#: ``DRIVER_TERMINATING``: the object is gone but its driver pod is not yet.
ACTIVE_STATES = frozenset(
    {
        "NEW",
        "SUBMITTED",
        "RUNNING",
        "PENDING_RERUN",
        "INVALIDATING",
        "SUCCEEDING",
        "FAILING",
        "UNKNOWN",
        "DRIVER_TERMINATING",
    }
)
# Every other state has ended for good: COMPLETED (the driver exited 0, as after the stop marker),
# FAILED (out of retries), SUBMISSION_FAILED; NOT_FOUND: neither the object nor its driver pod is left.


class OperatorError(RuntimeError):
    """The API server refused a request or could not be reached; the message says which and why."""


@functools.cache
def _template() -> dict[str, Any]:
    loaded = yaml.safe_load(MANIFEST.read_text())
    assert isinstance(loaded, dict) and loaded.get("kind") == "SparkApplication", MANIFEST
    return loaded


def template() -> dict[str, Any]:
    """deploy/k8s/spark/sparkapplication.yaml, parsed (a copy: change it freely)."""
    return copy.deepcopy(_template())


def claim_mounts(app: Mapping[str, Any], role: str) -> list[PurePosixPath]:
    """Mount paths of ``role`` (``driver``, ``executor``) backed by a PersistentVolumeClaim."""
    spec = app["spec"]
    claims = {v["name"] for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}
    return [
        PurePosixPath(m["mountPath"]) for m in spec[role].get("volumeMounts") or [] if m.get("name") in claims
    ]


def connector_packages(app: Mapping[str, Any]) -> str:
    """The Maven coordinates the operator resolves for the driver (``deps.packages``), comma-separated."""
    return ",".join((app["spec"].get("deps") or {}).get("packages") or [])


def build(config: KpmonConfig, name: str, config_path: str) -> dict[str, Any]:
    """The SparkApplication ``name`` running the job with the config file ``config_path`` (a path the
    driver sees), from deploy/k8s/spark/sparkapplication.yaml with what ``config`` decides."""
    app = template()
    deploy = config.deploy
    app["metadata"]["name"] = name
    app["metadata"]["namespace"] = deploy.kubernetes.namespace
    spec = app["spec"]
    if deploy.kubernetes.image:
        spec["image"] = deploy.kubernetes.image
    if deploy.kubernetes.mount_path:
        claims = {v["name"] for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}
        for role in ("driver", "executor"):
            for mount in spec[role].get("volumeMounts") or []:
                if mount.get("name") in claims:
                    mount["mountPath"] = deploy.kubernetes.mount_path
    spec["arguments"] = ["--config", config_path]
    spec["sparkConf"] = {**spec.get("sparkConf", {}), **deploy.spark_conf}
    spec["driver"]["cores"] = deploy.driver_cores
    spec["driver"]["memory"] = deploy.driver_memory
    if deploy.connector == "provided":
        # The image has the connector on its classpath: nothing for the operator to resolve.
        spec.pop("deps", None)
    return app


@dataclass(frozen=True)
class ApplicationPlan:
    application: dict[str, Any]
    #: The effective config the driver reads, and where it is written (on the shared claim).
    config_yaml: str
    config_file: Path
    notes: list[str]


def plan_application(config: KpmonConfig, name: str, staging_dir: Path) -> ApplicationPlan:
    """The SparkApplication for a start of the job, and the config file it reads.

    The driver and the DAGs meet in the state directory (the stop marker, ``progress.json``, the shipped
    config): it must be on the application's PersistentVolumeClaim, mounted at the same path in the
    Airflow worker, and so must ``staging_dir``. Raises ``SubmitError`` when they are not.
    """
    from streaming.paths import StreamPaths

    app = build(config, name, "")
    driver_mounts = claim_mounts(app, "driver")
    state_dir = PurePosixPath(config.state_dir)
    staged = PurePosixPath(staging_dir.as_posix())
    for what, path in (("state_dir", state_dir), ("the shipped config's directory", staged)):
        if not any(path == m or m in path.parents for m in driver_mounts):
            mounts = ", ".join(str(m) for m in driver_mounts) or "none"
            raise SubmitError(
                f"{what} {path} is not on the SparkApplication's claim (driver mounts: {mounts}); the DAGs "
                "and the driver meet there: mount the claim at the same path on the Airflow worker and "
                "put state_dir under it"
            )
    checkpoint = StreamPaths.of(config).checkpoint(config)
    notes: list[str] = []
    for role in ("driver", "executor"):
        notes += check_checkpoint(checkpoint, "k8s", False, claim_mounts(app, role))
    # The job must know the operator ships the connector (or the image has it), and not fetch its own.
    text = resolved_config(shipped_config(config, {"spark.jars.packages": connector_packages(app)}))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    config_file = staging_dir / f"kpmon-submit-{digest}.yaml"
    return ApplicationPlan(build(config, name, str(config_file)), text, config_file, sorted(set(notes)))


@dataclass(frozen=True)
class ApplicationStatus:
    name: str
    #: ``.status.applicationState.state``; ``NEW`` before the operator set one, ``NOT_FOUND`` without
    #: the object.
    state: str
    #: ``.status.applicationState.errorMessage`` (why it failed).
    message: str | None = None
    #: The object is being deleted (its pods are going).
    deleting: bool = False

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def _status_message(body: Any) -> str:
    """The ``message`` of the API server's ``Status`` answer, else the raw body (shortened)."""
    try:
        answer = json.loads(body) if isinstance(body, str | bytes) else body
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("message"):
        return str(answer["message"])
    return str(body or "")[:300]


def api_client(settings: KubernetesDeployConfig) -> Any:
    """An API client authenticated as ``settings.auth`` says (``kubernetes.client.ApiClient``)."""
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    try:
        if settings.auth == "in_cluster":
            kube_config.load_incluster_config(client_configuration=configuration)
        else:
            kube_config.load_kube_config(
                config_file=settings.kubeconfig,
                context=settings.context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (kube_config.ConfigException, OSError, ValueError) as exc:
        where = "in-cluster service account" if settings.auth == "in_cluster" else "kubeconfig"
        raise OperatorError(f"cannot authenticate to the Kubernetes API ({where}): {exc}") from exc
    return client.ApiClient(configuration)


class SparkApplications:
    """SparkApplications of one namespace, through the ``kubernetes`` client's custom-objects API."""

    def __init__(self, api_client: Any, namespace: str, timeout: float = 30.0) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.timeout = timeout

    @classmethod
    def connect(cls, settings: KubernetesDeployConfig, timeout: float = 30.0) -> SparkApplications:
        return cls(api_client(settings), settings.namespace, timeout)

    def _call(self, what: str, call: Callable[[], Any], missing_ok: bool = False) -> Any:
        """``call``'s answer, with the API's errors as ``OperatorError``; None for a 404 if
        ``missing_ok``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            raise OperatorError(
                f"{what} in namespace {self.namespace}: HTTP {exc.status} {exc.reason}: "
                f"{_status_message(exc.body)}"
            ) from exc
        except (HTTPError, OSError) as exc:
            raise OperatorError(f"{what} in namespace {self.namespace}: {exc}") from exc

    def create(self, application: Mapping[str, Any]) -> str:
        """Create the application; returns its name."""
        name = str(application["metadata"]["name"])
        self._call(
            f"create SparkApplication {name}",
            lambda: self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, dict(application), _request_timeout=self.timeout
            ),
        )
        return name

    def status(self, name: str) -> ApplicationStatus:
        found = self._call(
            f"read SparkApplication {name}",
            lambda: self.api.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=self.timeout
            ),
            missing_ok=True,
        )
        if not isinstance(found, dict):
            # Whether deleting the object also waited for its driver pod depends on how the operator
            # owns the pod: the pod itself says whether it still runs.
            phase = self.driver_phase(name)
            running = phase is not None and phase not in ("Succeeded", "Failed")
            return ApplicationStatus(name, "DRIVER_TERMINATING" if running else "NOT_FOUND")
        state = (found.get("status") or {}).get("applicationState") or {}
        return ApplicationStatus(
            name,
            str(state.get("state") or "NEW"),
            state.get("errorMessage"),
            bool((found.get("metadata") or {}).get("deletionTimestamp")),
        )

    def driver_phase(self, name: str) -> str | None:
        """The phase of the application's driver pod (the operator names it ``<name>-driver``), or None
        without one."""
        from kubernetes import client

        pod = self._call(
            f"read pod {name}-driver",
            lambda: client.CoreV1Api(self.api.api_client).read_namespaced_pod(
                f"{name}-driver", self.namespace, _request_timeout=self.timeout
            ),
            missing_ok=True,
        )
        if pod is None:
            return None
        return str(getattr(pod.status, "phase", None) or "Unknown")

    def delete(self, name: str) -> bool:
        """Delete the application in the foreground (the object stays, marked as being deleted, until
        the dependents that block it are gone); False if there was none."""
        from kubernetes import client

        answer = self._call(
            f"delete SparkApplication {name}",
            lambda: self.api.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
                _request_timeout=self.timeout,
            ),
            missing_ok=True,
        )
        return answer is not None
