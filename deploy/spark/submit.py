"""Plan a spark-submit of the streaming job onto Spark standalone, YARN or Kubernetes.

``plan_submit`` is pure: config and options in, a ``SubmitPlan`` (argv, environment, the resolved config to
ship, notes) out. ``materialize`` and ``run`` are the only parts that touch the disk or start a process.
The spark settings come from ``common.conf`` then ``<target>.conf`` next to this file, then what the plan
derives (connector, Python environment, config shipping), then ``--conf`` overrides.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlparse

import yaml

from deploy.versions import SCALA_BINARY
from kpconfig.model import KpmonConfig, write_private

Target = Literal["standalone", "yarn", "k8s"]
Connector = Literal["packages", "jars", "provided"]
TARGETS: tuple[Target, ...] = ("standalone", "yarn", "k8s")

HERE = Path(__file__).resolve().parent
DRIVER_FILE = HERE / "kpmon_stream.py"
POD_TEMPLATE = HERE / "k8s-pod-template.yaml"
#: Where the kpmon image keeps the project (docs/cluster-mode.md, "The image"); the SparkApplication agrees.
IMAGE_DRIVER_FILE = "local:///opt/kpmon/deploy/spark/kpmon_stream.py"
#: The name the venv archive unpacks under in every container's working directory.
ENV_ALIAS = "environment"
ARCHIVE_PYTHON = f"./{ENV_ALIAS}/bin/python"
#: The name the shipped config has in a YARN container's working directory.
SHIPPED_CONFIG = "kpmon.yaml"

#: Hadoop filesystems every executor reaches at the same URI (a checkpoint written by one is read by all).
SHARED_SCHEMES = frozenset(
    {
        "hdfs",
        "viewfs",
        "s3a",
        "s3",
        "gs",
        "abfs",
        "abfss",
        "wasb",
        "wasbs",
        "adl",
        "ofs",
        "o3fs",
        "oss",
        "cosn",
        "obs",
        "maprfs",
        "dbfs",
        "alluxio",
        "jfs",
    }
)
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
#: Settings a target's master URL must match.
MASTER_PREFIX: dict[Target, str] = {"standalone": "spark://", "yarn": "yarn", "k8s": "k8s://"}


class SubmitError(ValueError):
    """Options or a config that cannot make a working cluster submit; the message says what to change."""


@dataclass(frozen=True)
class SubmitOptions:
    target: Target | None = None
    deploy_mode: Literal["client", "cluster"] | None = None
    connector: Connector = "packages"
    #: Pre-resolved connector jars (``kpmon deploy fetch-connector``); default: the local cache.
    jars_dir: Path | None = None
    extra_packages: tuple[str, ...] = ()
    #: A ``venv-pack`` archive (local path or URI) unpacked as ./environment on every node.
    archive: str | None = None
    #: Or an interpreter with kpmon installed at this path on every node.
    executor_python: str | None = None
    #: The operator asserts that a plain checkpoint path is the same shared mount on every node.
    shared_checkpoint: bool = False
    conf: Mapping[str, str] = field(default_factory=dict)
    name: str = "kpmon-stream"
    spark_submit: str | None = None
    pod_template: Path = POD_TEMPLATE
    spark_version: str | None = None


@dataclass(frozen=True)
class SubmitPlan:
    argv: list[str]
    env: dict[str, str]
    target: Target
    deploy_mode: str
    conf: dict[str, str]
    #: The effective config (file, then KPMON__* overrides) the driver reads, and where it is written.
    config_yaml: str
    config_file: Path
    notes: list[str]
    #: Client mode with an archive: spark-submit runs here, where ./environment is this machine's venv.
    workdir: Path | None = None

    def shell(self) -> str:
        """The command as one shell line: directory, environment, argv."""
        line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])
        return f"cd {shlex.quote(str(self.workdir))} && {line}" if self.workdir else line


_CONF_LINE = re.compile(r"^(?P<key>[^\s=]+)(?:\s*=\s*|\s+)(?P<value>\S.*)$")


def read_conf(path: Path) -> dict[str, str]:
    """A spark-defaults style file: ``key value`` or ``key=value`` per line, ``#`` comments."""
    conf: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _CONF_LINE.match(line)
        if match is None:
            raise SubmitError(f"{path}:{number}: expected 'key value', got {raw!r}")
        conf[match["key"]] = match["value"].strip()
    return conf


def target_defaults(target: Target) -> dict[str, str]:
    return read_conf(HERE / "common.conf") | read_conf(HERE / f"{target}.conf")


def connector_coordinate(spark_version: str) -> str:
    return f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{spark_version}"


def infer_target(master: str) -> Target:
    for target, prefix in MASTER_PREFIX.items():
        if master == prefix or (prefix.endswith("//") and master.startswith(prefix)):
            return target
    raise SubmitError(
        f"stream.master is {master!r}: not a cluster master. Set it to spark://HOST:PORT (standalone), "
        "yarn, or k8s://https://API-SERVER (in the config or KPMON__STREAM__MASTER)"
    )


def pvc_mounts(pod_template: Path) -> list[PurePosixPath]:
    """Mount paths in a pod template that are backed by a PersistentVolumeClaim."""
    pod = yaml.safe_load(pod_template.read_text()) or {}
    spec = pod.get("spec") or {}
    claims = {v["name"] for v in spec.get("volumes") or [] if "persistentVolumeClaim" in v}
    return [
        PurePosixPath(m["mountPath"])
        for c in spec.get("containers") or []
        for m in c.get("volumeMounts") or []
        if m.get("name") in claims
    ]


def check_checkpoint(
    checkpoint: str | None, target: Target, shared_checkpoint: bool, pvc_paths: Sequence[PurePosixPath]
) -> list[str]:
    """Refuse checkpoints that only one node can see; returns notes for the operator."""
    if not checkpoint:
        raise SubmitError(
            "stream.checkpoint_dir is not set: a cluster job keeps offsets and state there, on a filesystem "
            "every node reaches (hdfs://, s3a://, gs://, abfss://, or a shared mount)"
        )
    parsed = urlparse(checkpoint)
    scheme = parsed.scheme.lower()
    if scheme in SHARED_SCHEMES:
        return []
    if scheme not in ("", "file"):
        return [
            f"checkpoint scheme {scheme}:// is not a known shared filesystem; every executor must reach it"
        ]
    path = PurePosixPath(parsed.path if scheme == "file" else checkpoint)
    if not path.is_absolute():
        raise SubmitError(
            f"stream.checkpoint_dir {checkpoint!r} is relative: on a cluster it would land in a container's "
            "scratch directory. Use hdfs://, s3a://... or an absolute path on a shared mount"
        )
    if target == "k8s":
        if any(path == m or m in path.parents for m in pvc_paths):
            return []
        mounts = ", ".join(str(m) for m in pvc_paths) or "none"
        raise SubmitError(
            f"stream.checkpoint_dir {checkpoint!r} is not under a PersistentVolumeClaim mount of the pod "
            f"template ({mounts}); pods would each write their own copy. Use s3a://... or a path under "
            "a ReadWriteMany claim"
        )
    if not shared_checkpoint:
        raise SubmitError(
            f"stream.checkpoint_dir {checkpoint!r} is a local path: executors on other nodes would write "
            "state where the driver cannot read it. Use hdfs://, s3a://... or pass --shared-checkpoint if "
            "it is the same shared mount (NFS, CephFS...) on every node"
        )
    return [f"checkpoint {checkpoint} is taken to be a shared mount on every node (--shared-checkpoint)"]


def _is_uri(location: str) -> bool:
    return "://" in location


def _connector_conf(options: SubmitOptions, spark_version: str) -> dict[str, str]:
    packages = list(options.extra_packages)
    conf: dict[str, str] = {}
    if options.connector == "packages":
        packages.insert(0, connector_coordinate(spark_version))
    elif options.connector == "jars":
        if options.jars_dir is None:
            from streaming.connector import connector_dir

            jars_dir = connector_dir(spark_version)
        else:
            jars_dir = options.jars_dir
        jars = sorted(jars_dir.glob("*.jar")) if jars_dir.is_dir() else []
        wanted = f"spark-sql-kafka-0-10_{SCALA_BINARY}-{spark_version}.jar"
        if not any(j.name == wanted for j in jars):
            raise SubmitError(
                f"{jars_dir} has no {wanted}: resolve the connector once where Maven Central is reachable "
                "(`kpmon deploy fetch-connector`) and copy that directory here, or use --connector packages"
            )
        conf["spark.jars"] = ",".join(str(j.resolve()) for j in jars)
    if packages:
        conf["spark.jars.packages"] = ",".join(packages)
    return conf


def _python_conf(
    options: SubmitOptions, target: Target, mode: str, defaults: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Spark settings and launcher environment for the Python workers (and the driver)."""
    conf: dict[str, str] = {}
    env: dict[str, str] = {}
    if options.archive and options.executor_python:
        raise SubmitError("give either --archive or --executor-python, not both")
    if options.archive:
        if not options.archive.endswith(ARCHIVE_SUFFIXES):
            raise SubmitError(
                f"--archive {options.archive!r} is not a .tar.gz/.tgz/.tar/.zip (venv-pack output)"
            )
        if not _is_uri(options.archive) and not Path(options.archive).is_file():
            raise SubmitError(
                f"--archive {options.archive} does not exist; build it with `kpmon deploy pack-venv`"
            )
        python = ARCHIVE_PYTHON
        conf["spark.pyspark.python"] = python
        for key in ("spark.executorEnv.PYSPARK_PYTHON", "spark.yarn.appMasterEnv.PYSPARK_PYTHON"):
            if key in defaults:
                conf[key] = python
        if target == "k8s":
            conf["spark.executorEnv.PYSPARK_PYTHON"] = python
            conf["spark.kubernetes.driverEnv.PYSPARK_PYTHON"] = python
        env["PYSPARK_PYTHON"] = python
    elif options.executor_python:
        python = options.executor_python
        if mode == "client" and not Path(python).is_file():
            raise SubmitError(
                f"--executor-python {python} does not exist here: in client mode the driver starts Python "
                "workers with it too (transformWithState), so it must exist on this machine as well"
            )
        conf["spark.pyspark.python"] = python
        for key in (
            "spark.executorEnv.PYSPARK_PYTHON",
            "spark.yarn.appMasterEnv.PYSPARK_PYTHON",
            "spark.kubernetes.driverEnv.PYSPARK_PYTHON",
        ):
            if key in defaults:
                conf[key] = python
        env["PYSPARK_PYTHON"] = python
    elif target != "k8s":
        raise SubmitError(
            "ship the Python environment: --archive ENV.tar.gz (built by `kpmon deploy pack-venv`) or "
            "--executor-python PATH (an interpreter with kpmon installed at that path on every node)"
        )
    else:
        env["PYSPARK_PYTHON"] = defaults["spark.pyspark.python"]
    if mode == "client":
        # The driver runs here, in the environment running kpmon, which has the job installed.
        conf["spark.pyspark.driver.python"] = sys.executable
    return conf, env


def resolved_config(config: KpmonConfig) -> str:
    """The effective config as YAML: the driver sees exactly what was validated here."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def shipped_config(config: KpmonConfig, connector_conf: Mapping[str, str]) -> KpmonConfig:
    """The config the driver gets: it must know that spark-submit ships the connector.

    The job fetches the connector with Maven unless ``stream.spark_conf`` names ``spark.jars`` or
    ``spark.jars.packages`` (streaming/session.py). ``spark.jars`` holds paths of this machine, which a
    cluster-mode driver must not re-apply, so the marker is always ``spark.jars.packages``: the same
    coordinates spark-submit resolved, or empty when the jars come from a directory or the cluster.
    """
    spark_conf = dict(config.stream.spark_conf)
    spark_conf.setdefault("spark.jars.packages", connector_conf.get("spark.jars.packages", ""))
    return config.model_copy(update={"stream": config.stream.model_copy(update={"spark_conf": spark_conf})})


def plan_submit(config: KpmonConfig, options: SubmitOptions, staging_dir: Path) -> SubmitPlan:
    master = config.stream.master
    inferred = infer_target(master)
    target = options.target or inferred
    if target != inferred:
        raise SubmitError(
            f"--target {target} needs stream.master {MASTER_PREFIX[target]}..., but it is {master!r}; "
            "fix stream.master (the job reads it too)"
        )
    defaults = target_defaults(target)
    mode = options.deploy_mode or defaults.get("spark.submit.deployMode", "client")
    if target == "standalone" and mode == "cluster":
        raise SubmitError(
            "spark-submit cannot submit a Python driver in standalone cluster mode; use --deploy-mode "
            "client, or let the Airflow DAGs submit it through the master's REST server (deploy.target: "
            "standalone, docs/operations.md)"
        )
    notes = check_checkpoint(
        config.stream.checkpoint_dir,
        target,
        options.shared_checkpoint,
        pvc_mounts(options.pod_template) if target == "k8s" else [],
    )
    if options.spark_version:
        spark_version = options.spark_version
    else:
        from streaming.connector import spark_version as installed_spark_version

        spark_version = installed_spark_version()

    conf = dict(defaults)
    conf["spark.submit.deployMode"] = mode
    connector = _connector_conf(options, spark_version)
    conf |= connector
    python_conf, env = _python_conf(options, target, mode, defaults)
    conf |= python_conf
    # The config's deploy section sizes the driver and adds properties, as for the DAGs' submissions;
    # --conf on the command line still wins.
    conf["spark.driver.cores"] = str(config.deploy.driver_cores)
    conf["spark.driver.memory"] = config.deploy.driver_memory
    conf |= config.deploy.spark_conf

    text = resolved_config(shipped_config(config, connector))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    config_file = staging_dir / f"kpmon-submit-{digest}.yaml"
    files: list[str] = []
    if mode == "client":
        config_arg = str(config_file)
        main_file = str(DRIVER_FILE)
    elif target == "yarn":
        files.append(f"{config_file}#{SHIPPED_CONFIG}")
        config_arg = SHIPPED_CONFIG
        main_file = str(DRIVER_FILE)
    else:
        template = str(options.pod_template.resolve())
        conf["spark.kubernetes.driver.podTemplateFile"] = template
        conf["spark.kubernetes.executor.podTemplateFile"] = template
        config_arg = "/etc/kpmon/kpmon.yaml"
        main_file = IMAGE_DRIVER_FILE
        notes.append(
            "the driver reads /etc/kpmon/kpmon.yaml from ConfigMap kpmon-config; publish this config there: "
            f"kubectl -n {conf.get('spark.kubernetes.namespace', 'default')} create configmap kpmon-config "
            f"--from-file=kpmon.yaml={config_file} --dry-run=client -o yaml | kubectl apply -f -"
        )
    if target == "k8s" and mode == "cluster":
        local_uploads = [a for a in (options.archive,) if a and not _is_uri(a)]
        if options.connector == "jars":
            local_uploads.append("connector jars")
        if local_uploads and "spark.kubernetes.file.upload.path" not in {**conf, **options.conf}:
            raise SubmitError(
                f"{', '.join(local_uploads)} must be uploaded for the driver pod: set --conf "
                "spark.kubernetes.file.upload.path=s3a://BUCKET/PATH (or bake them into the image)"
            )
    workdir = None
    if mode == "client" and options.archive:
        # PySpark hands the driver's PYSPARK_PYTHON (./environment/bin/python) to every Python worker,
        # and transformWithState starts one on the driver too (state schema pre-init): the driver's
        # working directory needs an ./environment as well, and this machine's venv is that.
        workdir = staging_dir / f"client-{digest}"
    if target == "yarn" and not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
        notes.append("spark-submit needs HADOOP_CONF_DIR or YARN_CONF_DIR to find the YARN resource manager")
    conf |= dict(options.conf)

    if options.spark_submit:
        binary = options.spark_submit
    else:
        binary, submit_env = spark_submit_binary()
        env |= submit_env
    argv = [binary, "--master", master, "--deploy-mode", mode]
    argv += ["--name", options.name]
    if options.archive:
        argv += ["--archives", f"{options.archive}#{ENV_ALIAS}"]
    if files:
        argv += ["--files", ",".join(files)]
    for key, value in conf.items():
        if key != "spark.submit.deployMode":
            argv += ["--conf", f"{key}={value}"]
    argv += [main_file, "--config", config_arg]
    return SubmitPlan(argv, env, target, mode, conf, text, config_file, notes, workdir)


def spark_submit_binary() -> tuple[str, dict[str, str]]:
    """spark-submit and the environment it needs: ``$SPARK_HOME``'s, else PATH's, else pyspark's own.

    pyspark's ``bin/spark-submit`` finds its Spark home with whatever ``python3`` is on PATH, which
    need not be the one with pyspark installed: it gets ``SPARK_HOME`` explicitly.
    """
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and (Path(spark_home) / "bin" / "spark-submit").is_file():
        return str(Path(spark_home) / "bin" / "spark-submit"), {}
    found = shutil.which("spark-submit")
    if found:
        return found, {}
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin:
        home = Path(spec.origin).parent
        return str(home / "bin" / "spark-submit"), {"SPARK_HOME": str(home)}
    return "spark-submit", {}


def write_config(plan: SubmitPlan) -> Path:
    """Write the resolved config (owner-only: it may hold SASL or TLS secrets)."""
    return write_private(plan.config_file, plan.config_yaml)


def materialize(plan: SubmitPlan) -> None:
    """Write what the command refers to: the resolved config, and the client-mode working directory."""
    write_config(plan)
    if plan.workdir is not None:
        plan.workdir.mkdir(parents=True, exist_ok=True)
        link = plan.workdir / ENV_ALIAS
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(Path(sys.prefix), target_is_directory=True)


def run(plan: SubmitPlan) -> int:
    materialize(plan)
    return subprocess.run(plan.argv, env=os.environ | plan.env, cwd=plan.workdir, check=False).returncode


@dataclass(frozen=True)
class ClusterSubmission:
    """A standalone cluster-mode driver for the master's REST server (``deploy.spark.rest``)."""

    properties: dict[str, str]
    #: The effective config the driver reads, and where it is written (the shared state directory).
    config_yaml: str
    config_file: Path
    notes: list[str]


def plan_cluster_submission(
    config: KpmonConfig, python: str, staging_dir: Path, spark_version: str | None = None
) -> ClusterSubmission:
    """The Spark properties of a standalone cluster-mode driver (``deploy.target: standalone``).

    The same settings as ``plan_submit`` (common.conf, standalone.conf, the connector), with the driver on
    a worker: ``python`` (the build's interpreter) must exist at that path on every worker, and the
    shipped config is written to ``staging_dir``, which the workers must see at the same path.
    """
    from streaming.paths import StreamPaths

    notes = check_checkpoint(StreamPaths.of(config).checkpoint(config), "standalone", True, [])
    if spark_version is None:
        from streaming.connector import spark_version as installed_spark_version

        spark_version = installed_spark_version()
    deploy = config.deploy
    options = SubmitOptions(
        target="standalone",
        connector=deploy.connector,
        jars_dir=Path(deploy.jars_dir) if deploy.jars_dir else None,
    )
    conf = target_defaults("standalone")
    connector = _connector_conf(options, spark_version)
    conf |= connector
    conf |= {
        "spark.master": config.stream.master,
        "spark.app.name": options.name,
        "spark.submit.deployMode": "cluster",
        # Restarts are the health DAG's decision (it alerts first): the master must not relaunch on its own.
        "spark.driver.supervise": "false",
        "spark.driver.cores": str(deploy.driver_cores),
        "spark.driver.memory": deploy.driver_memory,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
    }
    conf |= deploy.spark_conf
    text = resolved_config(shipped_config(config, connector))
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return ClusterSubmission(conf, text, staging_dir / f"kpmon-submit-{digest}.yaml", notes)
