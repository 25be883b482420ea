"""Kubernetes manifests (deploy/k8s), the spark pod template and the systemd unit, against the config model.

Every check here reads the real files. Schema validation runs kubeconform (a Go binary) and/or
kubernetes-validate (PyPI) when installed; the agreement checks below need neither.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import kpconfig
from deploy import manifests
from deploy.spark.submit import (
    IMAGE_DRIVER_FILE,
    POD_TEMPLATE,
    check_checkpoint,
    connector_coordinate,
    pvc_mounts,
    target_defaults,
)
from kpconfig.model import ConfigError, KpmonConfig, TapListenerConfig, load_config
from kpmon.cli import build_parser
from kpmon.commands.tap import configure as tap_configure
from streaming.connector import spark_version

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SYSTEMD = ROOT / "deploy" / "systemd"
NAMESPACE = "kpmon"


def docs_of(path: Path) -> list[dict[str, Any]]:
    return manifests.load_documents(path)


@functools.cache
def all_docs() -> list[tuple[Path, dict[str, Any]]]:
    """Every document, parsed once: read them, never change them."""
    return [(p, d) for p in [*sorted(K8S.rglob("*.yaml")), POD_TEMPLATE] for d in docs_of(p)]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d for _, d in all_docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def kind(name: str) -> list[dict[str, Any]]:
    return [d for p, d in all_docs() if d["kind"] == name and "sidecar" not in p.parts]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ConfigMap's kpmon.yaml, as the pods see it at /etc/kpmon/kpmon.yaml."""
    path = tmp_path_factory.mktemp("configmap") / "kpmon.yaml"
    path.write_text(one("ConfigMap", "kpmon-config")["data"]["kpmon.yaml"])
    return path


@pytest.fixture(scope="module")
def config(config_file: Path) -> KpmonConfig:
    return load_config(config_file, environ={})


def quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9, "": 1}
    match = re.fullmatch(r"(\d+)([KMG]i|[kMG])?", text)
    assert match, text
    return int(match[1]) * units[match[2] or ""]


def container_argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def parse_kpmon(argv: list[str], config_file: Path) -> Any:
    """Parse a container's kpmon command line with kpmon's own parser, the mounted config swapped in."""
    assert Path(argv[0]).name == "kpmon", argv
    args = [str(config_file) if a == "/etc/kpmon/kpmon.yaml" else a for a in argv[1:]]
    return build_parser().parse_args(args)


# ----- every manifest -------------------------------------------------------------------------------


def test_every_manifest_parses_and_names_itself() -> None:
    documents = all_docs()
    assert len(documents) >= 14
    for path, doc in documents:
        assert {"apiVersion", "kind"} <= doc.keys(), path
        if doc["kind"] not in ("Kustomization", "Pod"):
            assert doc["metadata"]["name"], path
        if doc["kind"] not in ("Kustomization", "Pod", "Namespace") and "sidecar" not in path.parts:
            assert doc["metadata"]["namespace"] == NAMESPACE, (path, doc["metadata"]["name"])


#: Each kustomization: the taps and their monitoring (the default), what the job needs whoever submits
#: it, and the job without Airflow (that plus the SparkApplication).
KUSTOMIZATIONS = {"": [], "job": [], "spark": ["../job"]}


def kustomized_kinds(directory: Path) -> list[str]:
    """The kinds of every object ``kubectl apply -k directory`` creates (its resources, recursively)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == NAMESPACE, directory
    kinds: list[str] = []
    for resource in kustomization["resources"]:
        path = directory / resource
        kinds += kustomized_kinds(path) if path.is_dir() else [d["kind"] for d in docs_of(path)]
    return kinds


def test_each_kustomization_lists_every_manifest_of_its_directory() -> None:
    for name, bases in KUSTOMIZATIONS.items():
        directory = K8S / name
        resources = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
        assert sorted(resources) == sorted(
            [*bases, *(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml")]
        ), name
    assert {p.parent for p in K8S.rglob("kustomization.yaml")} == {K8S / name for name in KUSTOMIZATIONS}


def test_the_default_kustomization_is_the_taps_and_the_job_is_apart() -> None:
    """When Airflow manages the job its DAGs create the SparkApplication: the taps' apply must not."""
    taps, job, spark = (kustomized_kinds(K8S / name) for name in KUSTOMIZATIONS)
    assert "SparkApplication" not in taps + job and spark.count("SparkApplication") == 1
    assert {"Deployment", "Service", "ConfigMap", "PodMonitor", "PrometheusRule"} <= set(taps)
    assert {"PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding"} <= set(job)
    assert sorted(spark) == sorted([*job, "SparkApplication"])
    every = [d["kind"] for p, d in all_docs() if p != POD_TEMPLATE and "sidecar" not in p.parts]
    assert sorted(k for k in every if k != "Kustomization") == sorted(taps + spark)


def test_kustomize_builds_when_kubectl_is_installed() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    for name in KUSTOMIZATIONS:
        done = subprocess.run(
            [kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        built = [d for d in yaml.safe_load_all(done.stdout) if d]
        assert sorted(d["kind"] for d in built) == sorted(kustomized_kinds(K8S / name))


# ----- the shared config ----------------------------------------------------------------------------


def test_configmap_config_is_a_valid_kpmon_config(config: KpmonConfig) -> None:
    assert len(config.tap.listeners) == 3
    assert config.stream.master.startswith("k8s://")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("capture: headers", "capture: everything", "tap.capture"),
        ("broker_id: 1", "broker_id: one", "broker_id"),
        ("trigger_seconds: 5", "trigger_secs: 5", "trigger_secs"),
        ("stream:\n", "stream: [\n", "not valid YAML"),
    ],
)
def test_a_broken_configmap_config_fails(tmp_path: Path, old: str, new: str, message: str) -> None:
    text = one("ConfigMap", "kpmon-config")["data"]["kpmon.yaml"]
    assert old in text
    path = tmp_path / "kpmon.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=message):
        load_config(path, environ={})


# ----- the SparkApplication -------------------------------------------------------------------------

#: k8s.conf keys that the SparkApplication expresses as fields, and where.
FIELD_OF_CONF = {
    "spark.submit.deployMode": ("mode",),
    "spark.kubernetes.namespace": ("@namespace",),
    "spark.kubernetes.container.image": ("image",),
    "spark.kubernetes.authenticate.driver.serviceAccountName": ("driver", "serviceAccount"),
    "spark.kubernetes.driverEnv.PYSPARK_PYTHON": ("driver", "$PYSPARK_PYTHON"),
    "spark.executorEnv.PYSPARK_PYTHON": ("executor", "$PYSPARK_PYTHON"),
    "spark.executor.instances": ("executor", "instances"),
    "spark.executor.cores": ("executor", "cores"),
    "spark.executor.memory": ("executor", "memory"),
    "spark.executor.memoryOverhead": ("executor", "memoryOverhead"),
    "spark.driver.memory": ("driver", "memory"),
}


def field_value(app: dict[str, Any], path: tuple[str, ...]) -> str:
    if path == ("@namespace",):
        return str(app["metadata"]["namespace"])
    node: Any = app["spec"]
    for part in path:
        if part.startswith("$"):
            return str(next(e["value"] for e in node["env"] if e["name"] == part[1:]))
        node = node[part]
    return str(node)


def test_sparkapplication_carries_the_k8s_defaults() -> None:
    app = one("SparkApplication", "kpmon-stream")
    defaults = target_defaults("k8s")
    spark_conf = app["spec"]["sparkConf"]
    for key, value in defaults.items():
        if key in FIELD_OF_CONF:
            assert field_value(app, FIELD_OF_CONF[key]) == value, key
        else:
            assert spark_conf.get(key) == value, key
    assert set(spark_conf) <= set(defaults), set(spark_conf) - set(defaults)


def test_sparkapplication_runs_the_pinned_spark_connector_and_driver_file() -> None:
    spec = one("SparkApplication")["spec"]
    assert spec["type"] == "Python"
    assert spec["sparkVersion"] == spark_version()
    assert spec["deps"]["packages"] == [connector_coordinate(spark_version())]
    assert spec["mainApplicationFile"] == IMAGE_DRIVER_FILE
    # The image holds the project at /opt/kpmon: the file named there must exist in this repository.
    assert (ROOT / IMAGE_DRIVER_FILE.removeprefix("local:///opt/kpmon/")).is_file()


def test_one_image_everywhere_tagged_with_kpmons_version() -> None:
    images = {
        one("SparkApplication")["spec"]["image"],
        target_defaults("k8s")["spark.kubernetes.container.image"],
    }
    for deployment in kind("Deployment"):
        images |= {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    sidecar = docs_of(K8S / "sidecar" / "tap-sidecar-patch.yaml")[0]
    images |= {c["image"] for c in sidecar["spec"]["template"]["spec"]["containers"]}
    assert images == {f"kpmon:{kpconfig.__version__}"}


def mounts_of(pod: dict[str, Any]) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in pod.get("volumeMounts", [])}


def test_sparkapplication_reads_the_configmap_config(config: KpmonConfig) -> None:
    spec = one("SparkApplication")["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_volume = next(n for n, v in volumes.items() if "configMap" in v)
    configmap = one("ConfigMap", volumes[config_volume]["configMap"]["name"])
    assert "kpmon.yaml" in configmap["data"]
    assert spec["arguments"] == ["--config", f"{mounts_of(spec['driver'])[config_volume]}/kpmon.yaml"]
    # The job sees a connector shipped by the operator and must not fetch its own.
    assert config.stream.spark_conf["spark.jars.packages"] == ",".join(spec["deps"]["packages"])
    assert spec["driver"]["ports"] == [
        {"name": "metrics", "protocol": "TCP", "containerPort": config.stream.metrics_port}
    ]


def test_checkpoint_is_on_a_shared_claim_mounted_by_driver_and_executors(config: KpmonConfig) -> None:
    spec = one("SparkApplication")["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    for role in ("driver", "executor"):
        paths = [Path(p) for n, p in mounts_of(spec[role]).items() if n in claims]
        # The same rule as `kpmon deploy submit --target k8s`: a plain path must sit on a claim.
        assert check_checkpoint(config.stream.checkpoint_dir, "k8s", False, paths) == [], role  # type: ignore[arg-type]
    for claim in claims.values():
        pvc = one("PersistentVolumeClaim", claim)
        assert "ReadWriteMany" in pvc["spec"]["accessModes"]


def test_stateful_partitions_match_the_executor_slots(config: KpmonConfig) -> None:
    executor = one("SparkApplication")["spec"]["executor"]
    assert config.stream.shuffle_partitions % (executor["instances"] * executor["cores"]) == 0


def test_driver_service_account_may_manage_executor_pods() -> None:
    account = one("SparkApplication")["spec"]["driver"]["serviceAccount"]
    assert one("ServiceAccount", account)
    role = bound_role(account)
    pods = next(r for r in role["rules"] if "pods" in r["resources"])
    assert {"create", "delete", "watch", "list"} <= set(pods["verbs"])


def bound_role(account: str) -> dict[str, Any]:
    """The one Role bound to ServiceAccount ``account`` of the namespace."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    (binding,) = [b for b in kind("RoleBinding") if subject in b["subjects"]]
    return one("Role", binding["roleRef"]["name"])


def test_the_airflow_account_may_manage_sparkapplications_and_nothing_else() -> None:
    """What deploy/spark/sparkapplication.py calls for deploy.target kubernetes: create, read and delete
    an application, read its driver pod."""
    from deploy.spark import sparkapplication

    assert one("ServiceAccount", "kpmon-airflow")
    assert bound_role("kpmon-airflow")["rules"] == [
        {
            "apiGroups": [sparkapplication.GROUP],
            "resources": [sparkapplication.PLURAL],
            "verbs": ["create", "get", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]


def test_pod_template_agrees_with_the_manifests() -> None:
    template = docs_of(POD_TEMPLATE)[0]
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert one("ConfigMap", volumes["kpmon-config"]["configMap"]["name"])
    assert one("PersistentVolumeClaim", volumes["checkpoints"]["persistentVolumeClaim"]["claimName"])
    app = one("SparkApplication")["spec"]
    assert mounts_of(template["spec"]["containers"][0]) == mounts_of(app["driver"])
    assert [str(p) for p in pvc_mounts(POD_TEMPLATE)] == ["/var/lib/kpmon"]


# ----- the taps -------------------------------------------------------------------------------------


def tap_deployments() -> list[dict[str, Any]]:
    return [d for d in kind("Deployment") if d["metadata"]["labels"]["app.kubernetes.io/name"] == "kpmon-tap"]


def test_one_tap_deployment_per_configured_listener(config: KpmonConfig, config_file: Path) -> None:
    served: list[TapListenerConfig] = []
    for deployment in tap_deployments():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        args = parse_kpmon(container_argv(container), config_file)
        assert args.command == "tap"
        tap = tap_configure(args).tap
        (listener,) = tap.listeners
        served.append(listener)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["kafka"] == int(listener.listen.rpartition(":")[2])
        assert ports["metrics"] == tap.metrics_port == config.tap.metrics_port
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(config.tap.metrics_port)
        env = {e["name"]: e for e in container["env"]}
        assert env["KPMON__TAP__INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        mounts = mounts_of(container)
        assert mounts["kpmon-config"] == "/etc/kpmon"
        # Each worker's mirror queue may fill up to queue_max_bytes before it drops: the limit must hold them.
        limit = quantity(container["resources"]["limits"]["memory"])
        assert limit >= tap.worker_count * config.tap.queue_max_bytes + 256 * 2**20
        # The workers publish their metrics through a temporary directory: writable despite the read-only root.
        assert mounts["tmp"] == "/tmp"
    key = [(entry.listen, entry.broker, entry.broker_id) for entry in config.tap.listeners]
    assert sorted((entry.listen, entry.broker, entry.broker_id) for entry in served) == sorted(key)


def test_each_tap_service_is_what_its_broker_advertises(config: KpmonConfig) -> None:
    services = {s["metadata"]["name"]: s for s in kind("Service")}
    deployments = {d["metadata"]["name"]: d for d in tap_deployments()}
    assert set(services) == set(deployments)
    for listener in config.tap.listeners:
        assert listener.advertise
        host, _, port = listener.advertise.rpartition(":")
        name, namespace, *rest = host.split(".")
        assert (namespace, rest) == (NAMESPACE, ["svc", "cluster", "local"])
        service = services[name]
        pod = deployments[name]["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        by_name = {p["name"]: p["containerPort"] for p in container["ports"]}
        kafka = next(p for p in service["spec"]["ports"] if p["name"] == "kafka")
        assert kafka["port"] == int(port)
        assert by_name[kafka["targetPort"]] == int(listener.listen.rpartition(":")[2])
        args = container_argv(container)
        assert args[args.index("--listen") + 1].endswith(f"{listener.broker}@{listener.broker_id}")


def test_sidecar_variant_parses_and_agrees(config_file: Path) -> None:
    patch = docs_of(K8S / "sidecar" / "tap-sidecar-patch.yaml")[0]
    assert (patch["kind"], patch["metadata"]["name"]) == ("StatefulSet", "kafka")
    pod = patch["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = [a.replace("$(BROKER_ID)", "0") for a in container_argv(container)]
    (listener,) = tap_configure(parse_kpmon(argv, config_file)).tap.listeners
    assert listener.broker == "127.0.0.1:9092" and listener.broker_id == 0
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["kafka-tap"] == int(listener.listen.rpartition(":")[2])
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert env["BROKER_ID"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert {v["name"]: v["configMap"]["name"] for v in pod["volumes"]} == {"kpmon-config": "kpmon-config"}


@pytest.fixture(scope="module")
def tls_config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ConfigMap's kpmon.yaml with each listener's TLS settings as docs/rollout.md's SASL_SSL example
    config gives them (its listener's certificate named after each broker)."""
    rollout = (ROOT / "docs" / "rollout.md").read_text()
    example = yaml.safe_load(re.search(r"## 4\. The config.*?```yaml\n(.*?)```", rollout, re.S)[1])  # type: ignore[index]
    (documented,) = example["tap"]["listeners"]
    tls = {k: v for k, v in documented.items() if k not in ("listen", "broker", "broker_id", "advertise")}
    assert tls["broker_tls"] and tls["tls_certfile"] and tls["listener_name"] == "CLIENT", tls
    data = yaml.safe_load(one("ConfigMap", "kpmon-config")["data"]["kpmon.yaml"])
    for entry in data["tap"]["listeners"]:
        n = entry["broker_id"]
        entry.update({k: v.replace("tap-1", f"tap-{n}") if isinstance(v, str) else v for k, v in tls.items()})
    path = tmp_path_factory.mktemp("tls-configmap") / "kpmon.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_tap_command_lines_keep_every_listener_setting(tls_config_file: Path) -> None:
    """Each Deployment's ``--listen`` selects its configured listener: TLS to clients and to the broker,
    the listener name and the advertised address all survive (a replaced listener relayed ciphertext)."""
    configured = {entry.broker_id: entry for entry in load_config(tls_config_file, environ={}).tap.listeners}
    deployments = tap_deployments()
    assert len(deployments) == len(configured)
    for deployment in deployments:
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        (listener,) = tap_configure(parse_kpmon(container_argv(container), tls_config_file)).tap.listeners
        assert listener == configured[listener.broker_id]
        assert listener.broker_tls and listener.tls_certfile and listener.listener_name == "CLIENT"


def test_sidecar_command_line_keeps_its_brokers_listener_settings(tls_config_file: Path) -> None:
    patch = docs_of(K8S / "sidecar" / "tap-sidecar-patch.yaml")[0]
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    configured = {entry.broker_id: entry for entry in load_config(tls_config_file, environ={}).tap.listeners}
    for broker_id, entry in configured.items():
        argv = [a.replace("$(BROKER_ID)", str(broker_id)) for a in container_argv(container)]
        (listener,) = tap_configure(parse_kpmon(argv, tls_config_file)).tap.listeners
        # The sidecar listens on its own port in front of its own broker; the rest is the config's.
        assert listener.broker == "127.0.0.1:9092"
        assert listener.model_copy(update={"listen": entry.listen, "broker": entry.broker}) == entry


# ----- Prometheus Operator scraping ------------------------------------------------------------------


def rule_jobs() -> set[str]:
    """The ``job`` label values the alert rules select (``up{job="kpmon-tap"}``)."""
    return set(
        re.findall(r'job="([^"]+)"', (ROOT / "deploy" / "prometheus" / "kpmon-rules.yaml").read_text())
    )


def scraped_pods() -> list[tuple[dict[str, str], set[str]]]:
    """Labels and port names of every pod the manifests run: the taps, the job's driver and executors."""
    pods = []
    for deployment in kind("Deployment"):
        template = deployment["spec"]["template"]
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        pods.append((template["metadata"]["labels"], ports))
    app = one("SparkApplication")["spec"]
    for role in ("driver", "executor"):
        pods.append((app[role]["labels"], {p["name"] for p in app[role].get("ports", [])}))
    return pods


def test_a_pod_monitor_gives_each_job_the_rules_select_its_pods() -> None:
    """Each job the rules watch is set by a PodMonitor that scrapes a metrics port of its pods, and no
    pod is scraped under two jobs."""
    monitors = kind("PodMonitor")
    jobs: dict[str, int] = {}
    for monitor in monitors:
        spec = monitor["spec"]
        (endpoint,) = spec["podMetricsEndpoints"]
        (relabel,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
        assert relabel["action"] == "replace" and "sourceLabels" not in relabel
        selected = [
            ports
            for labels, ports in scraped_pods()
            if spec["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert selected and all(endpoint["port"] in ports for ports in selected), monitor["metadata"]["name"]
        jobs[relabel["replacement"]] = len(selected)
    assert set(jobs) == rule_jobs() == {"kpmon-tap", "kpmon-stream"}
    assert jobs == {"kpmon-tap": len(tap_deployments()), "kpmon-stream": 1}


# ----- schema validation (when the tools are installed) ---------------------------------------------


def sidecar_statefulset() -> dict[str, Any]:
    """The patch merged into a minimal broker StatefulSet, so the tap container is checked in place."""
    patch = docs_of(K8S / "sidecar" / "tap-sidecar-patch.yaml")[0]
    labels = {"app": "kafka"}
    template = patch["spec"]["template"]
    template["metadata"] = {"labels": labels}
    template["spec"]["containers"].insert(0, {"name": "kafka", "image": "apache/kafka:4.1.0"})
    patch["spec"] |= {"selector": {"matchLabels": labels}, "serviceName": "kafka-headless", "replicas": 3}
    return patch


@pytest.fixture(scope="module")
def kubeconform(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    binary = manifests.find_kubeconform()
    source = manifests.bundled_schemas()
    if binary is None or source is None:
        pytest.skip("kubeconform and kubernetes-validate are needed (python -m deploy.manifests --help)")
    return binary, manifests.prepare_schemas(source, tmp_path_factory.mktemp("k8s-schemas"))


def test_kubeconform_accepts_every_manifest(kubeconform: tuple[str, Path], tmp_path: Path) -> None:
    binary, schemas = kubeconform
    sidecar = tmp_path / "sidecar-statefulset.yaml"
    sidecar.write_text(yaml.safe_dump(sidecar_statefulset()))
    files = [str(p) for p in manifests.manifest_files()] + [str(sidecar)]
    done = subprocess.run(
        manifests.kubeconform_argv(binary, schemas, files), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    # Nothing skipped: SparkApplication is checked too (kpmon's CRD subset schema).
    assert re.search(r"Valid: (\d+), Invalid: 0, Errors: 0, Skipped: 0", summary), summary
    documents = sum(len(docs_of(Path(f))) for f in files)
    assert f"Valid: {documents}," in summary, summary


def test_kubeconform_rejects_broken_manifests(kubeconform: tuple[str, Path], tmp_path: Path) -> None:
    binary, schemas = kubeconform
    taps = (K8S / "taps.yaml").read_text().replace("readOnlyRootFilesystem", "readOnlyRootFileSystem", 1)
    app = (K8S / "spark" / "sparkapplication.yaml").read_text().replace("instances: 2", "instances: 0")
    monitor = (K8S / "podmonitor.yaml").read_text().replace("targetLabel:", "target_label:")
    for name, text, expected in (
        ("taps.yaml", taps, "readOnlyRootFileSystem"),
        ("app.yaml", app, "/spec/executor/instances"),
        ("podmonitor.yaml", monitor, "target_label"),
    ):
        path = tmp_path / name
        path.write_text(text)
        done = subprocess.run(
            manifests.kubeconform_argv(binary, schemas, [str(path)]),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 1 and expected in done.stdout, done.stdout


def test_kubernetes_validate_accepts_the_core_objects() -> None:
    validator = pytest.importorskip("kubernetes_validate")
    checked = 0
    for path, doc in [*all_docs(), (Path("sidecar"), sidecar_statefulset())]:
        if (
            doc["kind"] in ("Kustomization", "SparkApplication", "PrometheusRule", "PodMonitor")
            or path.name == "tap-sidecar-patch.yaml"
        ):
            continue
        validator.validate(doc, manifests.KUBERNETES_VERSION, strict=True)
        checked += 1
    assert checked >= 13


# ----- systemd --------------------------------------------------------------------------------------


def unit_entries(text: str) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as section -> [(key, value)]; keys repeat (Environment=, SystemCallFilter=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None and re.fullmatch(r"[A-Za-z]+", key), f"line {number}: {raw!r}"
        current.append((key, value))
    return sections


def test_systemd_unit_structure_and_command(tmp_path: Path) -> None:
    unit = unit_entries((SYSTEMD / "kpmon-tap.service").read_text())
    assert set(unit) == {"Unit", "Service", "Install"}
    service = dict(unit["Service"])
    assert service["Restart"] == "on-failure" and service["RestartPreventExitStatus"] == "2"
    assert service["KillSignal"] == "SIGTERM" and service["TimeoutStopSec"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices", "RestrictSUIDSGID"):
        assert service[key] == "yes", key
    assert service["ProtectSystem"] == "strict"
    assert service["CapabilityBoundingSet"] == ""
    assert dict(unit["Install"])["WantedBy"] == "multi-user.target"
    assert service["EnvironmentFile"].startswith("-")  # optional: the unit starts without it
    config = tmp_path / "kpmon.yaml"
    config.write_text(one("ConfigMap")["data"]["kpmon.yaml"])
    argv = service["ExecStart"].split()
    args = parse_kpmon(
        [argv[0], *[str(config) if a == "/etc/kpmon/kpmon.yaml" else a for a in argv[1:]]], config
    )
    assert args.command == "tap" and args.config == str(config)
    assert len(tap_configure(args).tap.listeners) == 3


def test_systemd_env_file_examples_are_valid_overrides(config_file: Path) -> None:
    examples = re.findall(r"^#?(KPMON__[A-Z0-9_]+)=(.*)$", (SYSTEMD / "kpmon-tap.env").read_text(), re.M)
    assert len(examples) >= 4
    unit = unit_entries((SYSTEMD / "kpmon-tap.service").read_text())["Service"]
    for key, value in unit:
        if key == "Environment" and value.startswith("KPMON__"):
            name, _, setting = value.partition("=")
            examples.append((name, setting))
    for name, value in examples:
        node: Any = load_config(config_file, environ={name: value})
        for part in name.removeprefix("KPMON__").lower().split("__"):
            node = getattr(node, part)
        assert node == yaml.safe_load(value), name


def verify(unit: Path) -> list[str]:
    """systemd-analyze verify's complaints about ``unit`` (it exits 0 on unknown keys and bad values)."""
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    return [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line] + (
        [f"exit {done.returncode}"] if done.returncode else []
    )


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    text = (SYSTEMD / "kpmon-tap.service").read_text()
    # verify insists that ExecStart exists: point it at this environment's kpmon.
    kpmon_bin = Path(sys.executable).parent / "kpmon"
    unit = tmp_path / "kpmon-tap.service"
    unit.write_text(text.replace("/opt/kpmon/venv/bin/kpmon", str(kpmon_bin)))
    assert verify(unit) == []
    broken = tmp_path / "broken" / "kpmon-tap.service"
    broken.parent.mkdir()
    broken.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    assert any("restart" in line.lower() for line in verify(broken))


# ----- the image --------------------------------------------------------------------------------------


def test_the_containerfile_runs_the_readmes_set_up_where_the_manifests_look() -> None:
    """Not built here (no Docker): its steps are the Makefile's set-up and its paths the manifests'."""
    text = (ROOT / "Containerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    flags = "--only-binary=:all: --no-binary=pyspark -e"
    assert flags in makefile and flags in text
    assert "python -m deploy.native" in makefile.replace("$(PY)", "python") and "-m deploy.native" in text
    (spark,) = re.findall(r"^ARG SPARK_IMAGE=apache/spark:(\S+)-scala2\.13-java17-python3", text, re.M)
    assert spark == spark_version() == one("SparkApplication")["spec"]["sparkVersion"]
    (python,) = re.findall(r"python3\.(\d+) -m venv /opt/kpmon/venv", text)
    assert int(python) >= 11
    for argv in [
        container_argv(c) for d in tap_deployments() for c in d["spec"]["template"]["spec"]["containers"]
    ]:
        assert argv[0] == "/opt/kpmon/venv/bin/kpmon"
    main = one("SparkApplication")["spec"]["mainApplicationFile"].removeprefix("local://")
    assert main.startswith("/opt/kpmon/") and (ROOT / main.removeprefix("/opt/kpmon/")).is_file()
    assert "COPY . /opt/kpmon" in text and "chmod -R a+rX /opt/kpmon" in text
