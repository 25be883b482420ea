"""The spark-submit planner (deploy/spark/submit.py), venv packing (pack.py) and ``kpmon deploy``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.spark import pack as pack_module
from deploy.spark.pack import PYSPARK_JARS, PackError, PackOptions, find_venv_pack, plan_pack
from deploy.spark.submit import (
    DRIVER_FILE,
    IMAGE_DRIVER_FILE,
    SubmitError,
    SubmitOptions,
    SubmitPlan,
    connector_coordinate,
    materialize,
    plan_submit,
    read_conf,
    spark_submit_binary,
    target_defaults,
    write_config,
)
from kpconfig.model import KpmonConfig, load_config
from kpmon.cli import main
from streaming.connector import connector_dir, connector_jars, spark_version

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def config(master: str, checkpoint: str | None, **stream: Any) -> KpmonConfig:
    return KpmonConfig.model_validate({"stream": {"master": master, "checkpoint_dir": checkpoint, **stream}})


@pytest.fixture
def archive(tmp_path: Path) -> str:
    """A real (tiny) gzip tarball standing where venv-pack's output would be."""
    path = tmp_path / "kpmon-env.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(__file__, arcname="bin/placeholder")
    return str(path)


def confs(plan: SubmitPlan) -> dict[str, str]:
    """The --conf pairs as spark-submit will see them."""
    argv = plan.argv
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def flag(plan: SubmitPlan, name: str) -> str:
    return plan.argv[plan.argv.index(name) + 1]


def app_args(plan: SubmitPlan) -> list[str]:
    """The main file and its arguments, which end the command line."""
    return plan.argv[-3:]


# ----- per-target command lines ---------------------------------------------------------------------


def test_yarn_ships_archive_config_and_packages(tmp_path: Path, archive: str) -> None:
    plan = plan_submit(
        config("yarn", "hdfs:///kpmon/checkpoints"), SubmitOptions(target="yarn", archive=archive), tmp_path
    )
    assert flag(plan, "--master") == "yarn"
    assert flag(plan, "--deploy-mode") == "cluster"
    assert flag(plan, "--archives") == f"{archive}#environment"
    assert flag(plan, "--files") == f"{plan.config_file}#kpmon.yaml"
    conf = confs(plan)
    assert conf["spark.jars.packages"] == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version()}"
    assert "spark.jars" not in conf
    assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert conf["spark.sql.streaming.stateStore.encodingFormat"] == "avro"
    for key in (
        "spark.pyspark.python",
        "spark.yarn.appMasterEnv.PYSPARK_PYTHON",
        "spark.executorEnv.PYSPARK_PYTHON",
    ):
        assert conf[key] == "./environment/bin/python"
    assert plan.env["PYSPARK_PYTHON"] == "./environment/bin/python"
    # The driver runs in the application master: it finds the shipped config in its working directory.
    assert app_args(plan) == [str(DRIVER_FILE), "--config", "kpmon.yaml"]
    assert "spark.pyspark.driver.python" not in conf
    assert plan.workdir is None  # the application master unpacks ./environment itself


def test_standalone_runs_the_driver_here_with_preresolved_jars(tmp_path: Path, archive: str) -> None:
    jars = connector_jars()  # the real cache (`make jars` resolves it), as an air-gapped site would copy it
    plan = plan_submit(
        config("spark://master.example:7077", "/mnt/shared/kpmon/checkpoints"),
        SubmitOptions(connector="jars", jars_dir=connector_dir(), archive=archive, shared_checkpoint=True),
        tmp_path,
    )
    assert plan.target == "standalone"
    assert flag(plan, "--master") == "spark://master.example:7077"
    assert flag(plan, "--deploy-mode") == "client"
    conf = confs(plan)
    assert conf["spark.jars"].split(",") == [str(j.resolve()) for j in jars]
    assert "spark.jars.packages" not in conf
    assert conf["spark.cores.max"] == "4"
    assert conf["spark.pyspark.python"] == "./environment/bin/python"
    assert conf["spark.pyspark.driver.python"] == sys.executable
    assert "--files" not in plan.argv
    assert app_args(plan) == [str(DRIVER_FILE), "--config", str(plan.config_file)]
    assert any("shared mount" in note for note in plan.notes)
    # The driver's own Python workers run ./environment/bin/python too: here it is this venv.
    assert plan.workdir is not None
    materialize(plan)
    driver_python = plan.workdir / "environment" / "bin" / "python"
    done = subprocess.run(
        [driver_python, "-c", "import sys, kpmon; print(sys.prefix)"], capture_output=True, text=True
    )
    assert done.returncode == 0 and Path(done.stdout.strip()).resolve() == Path(sys.prefix).resolve()
    assert plan.shell().startswith(f"cd {plan.workdir} && PYSPARK_PYTHON=./environment/bin/python ")


def test_k8s_uses_the_image_the_pod_template_and_the_configmap(tmp_path: Path) -> None:
    plan = plan_submit(
        config("k8s://https://api.example:6443", "/var/lib/kpmon/checkpoints/stream"),
        SubmitOptions(target="k8s"),
        tmp_path,
    )
    assert flag(plan, "--deploy-mode") == "cluster"
    conf = confs(plan)
    template = conf["spark.kubernetes.driver.podTemplateFile"]
    assert template == conf["spark.kubernetes.executor.podTemplateFile"]
    assert Path(template).name == "k8s-pod-template.yaml" and Path(template).is_file()
    assert conf["spark.kubernetes.container.image"] == "kpmon:0.1.0"
    assert conf["spark.pyspark.python"] == "/opt/kpmon/venv/bin/python"
    assert conf["spark.jars.packages"] == connector_coordinate(spark_version())
    assert "--archives" not in plan.argv
    assert app_args(plan) == [IMAGE_DRIVER_FILE, "--config", "/etc/kpmon/kpmon.yaml"]
    assert any("create configmap kpmon-config" in note for note in plan.notes)


def test_k8s_archive_from_this_machine_needs_an_upload_path(tmp_path: Path, archive: str) -> None:
    cfg = config("k8s://https://api.example:6443", "s3a://bucket/kpmon/checkpoints")
    with pytest.raises(SubmitError, match=r"spark\.kubernetes\.file\.upload\.path"):
        plan_submit(cfg, SubmitOptions(archive=archive), tmp_path)
    upload = {"spark.kubernetes.file.upload.path": "s3a://bucket/kpmon/upload"}
    plan = plan_submit(cfg, SubmitOptions(archive=archive, conf=upload), tmp_path)
    conf = confs(plan)
    assert flag(plan, "--archives") == f"{archive}#environment"
    for key in (
        "spark.pyspark.python",
        "spark.executorEnv.PYSPARK_PYTHON",
        "spark.kubernetes.driverEnv.PYSPARK_PYTHON",
    ):
        assert conf[key] == "./environment/bin/python"


def test_command_line_conf_wins_and_extra_packages_are_appended(tmp_path: Path, archive: str) -> None:
    plan = plan_submit(
        config("yarn", "s3a://bucket/ckpt"),
        SubmitOptions(
            archive=archive,
            conf={"spark.executor.instances": "8", "spark.yarn.queue": "streaming"},
            extra_packages=("org.apache.hadoop:hadoop-aws:3.4.1",),
        ),
        tmp_path,
    )
    conf = confs(plan)
    assert conf["spark.executor.instances"] == "8"
    assert conf["spark.yarn.queue"] == "streaming"
    assert conf["spark.jars.packages"].split(",") == [
        connector_coordinate(spark_version()),
        "org.apache.hadoop:hadoop-aws:3.4.1",
    ]


def test_executor_python_instead_of_an_archive(tmp_path: Path) -> None:
    plan = plan_submit(
        config("yarn", "hdfs:///ckpt"), SubmitOptions(executor_python="/opt/kpmon/venv/bin/python"), tmp_path
    )
    conf = confs(plan)
    assert (
        conf["spark.pyspark.python"]
        == conf["spark.yarn.appMasterEnv.PYSPARK_PYTHON"]
        == "/opt/kpmon/venv/bin/python"
    )
    assert "--archives" not in plan.argv
    with pytest.raises(SubmitError, match="driver starts Python workers"):
        plan_submit(
            config("yarn", "hdfs:///ckpt"),
            SubmitOptions(deploy_mode="client", executor_python="/opt/kpmon/venv/bin/python"),
            tmp_path,
        )


def test_pysparks_own_spark_submit_runs_without_path_or_spark_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no venv on PATH, as when .venv/bin/kpmon runs directly
    binary, env = spark_submit_binary()
    assert Path(binary).is_file() and env == {"SPARK_HOME": str(Path(binary).parents[1])}
    done = subprocess.run(
        [binary, "--version"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"version {spark_version()}" in done.stdout + done.stderr


# ----- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("master", "target", "message"),
    [
        ("local[*]", None, "not a cluster master"),
        ("local[*]", "yarn", "not a cluster master"),
        ("yarn", "k8s", "needs stream.master k8s://"),
        ("spark://m:7077", "yarn", "needs stream.master yarn"),
    ],
)
def test_master_and_target_must_agree(tmp_path: Path, master: str, target: Any, message: str) -> None:
    with pytest.raises(SubmitError, match=message):
        plan_submit(config(master, "hdfs:///c"), SubmitOptions(target=target, executor_python="/p"), tmp_path)


@pytest.mark.parametrize(
    ("checkpoint", "shared", "message"),
    [
        (None, False, "not set"),
        ("checkpoints/stream", True, "relative"),
        ("/var/tmp/ckpt", False, "local path"),
        ("file:///var/tmp/ckpt", False, "local path"),
    ],
)
def test_checkpoints_only_one_node_sees_are_refused(
    tmp_path: Path, checkpoint: str | None, shared: bool, message: str
) -> None:
    options = SubmitOptions(executor_python="/p", shared_checkpoint=shared)
    with pytest.raises(SubmitError, match=message):
        plan_submit(config("yarn", checkpoint), options, tmp_path)


@pytest.mark.parametrize(
    "checkpoint",
    [
        "hdfs://nn:8020/kpmon",
        "s3a://bucket/kpmon",
        "gs://b/k",
        "abfss://c@a.dfs.core.windows.net/k",
        "viewfs:///k",
    ],
)
def test_shared_filesystem_checkpoints_pass(tmp_path: Path, checkpoint: str) -> None:
    plan = plan_submit(config("yarn", checkpoint), SubmitOptions(executor_python="/p"), tmp_path)
    assert not [n for n in plan.notes if "checkpoint" in n]


def test_unknown_scheme_passes_with_a_note(tmp_path: Path) -> None:
    plan = plan_submit(config("yarn", "weirdfs://x/y"), SubmitOptions(executor_python="/p"), tmp_path)
    assert any("weirdfs" in note for note in plan.notes)


def test_k8s_plain_checkpoint_must_sit_on_the_templates_claim(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="PersistentVolumeClaim mount"):
        plan_submit(config("k8s://https://a:6443", "/tmp/ckpt"), SubmitOptions(), tmp_path)
    # --shared-checkpoint is for VMs; in pods only the template's claim counts.
    with pytest.raises(SubmitError, match=r"/var/lib/kpmon"):
        plan_submit(
            config("k8s://https://a:6443", "/data/ckpt"), SubmitOptions(shared_checkpoint=True), tmp_path
        )


def test_standalone_cluster_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="cluster mode"):
        plan_submit(
            config("spark://m:7077", "hdfs:///c"),
            SubmitOptions(deploy_mode="cluster", executor_python="/p"),
            tmp_path,
        )


def test_python_environment_is_required_off_kubernetes(tmp_path: Path, archive: str) -> None:
    with pytest.raises(SubmitError, match="pack-venv"):
        plan_submit(config("yarn", "hdfs:///c"), SubmitOptions(), tmp_path)
    with pytest.raises(SubmitError, match="does not exist"):
        plan_submit(
            config("yarn", "hdfs:///c"), SubmitOptions(archive=str(tmp_path / "nope.tar.gz")), tmp_path
        )
    with pytest.raises(SubmitError, match=r"\.tar\.gz"):
        plan_submit(config("yarn", "hdfs:///c"), SubmitOptions(archive=str(tmp_path)), tmp_path)
    with pytest.raises(SubmitError, match="not both"):
        plan_submit(
            config("yarn", "hdfs:///c"), SubmitOptions(archive=archive, executor_python="/p"), tmp_path
        )


def test_jar_directory_without_the_connector_is_refused(tmp_path: Path, archive: str) -> None:
    empty = tmp_path / "jars"
    empty.mkdir()
    with pytest.raises(SubmitError, match="fetch-connector"):
        plan_submit(
            config("yarn", "hdfs:///c"),
            SubmitOptions(connector="jars", jars_dir=empty, archive=archive),
            tmp_path,
        )
    # Jars of another Spark release are not the connector this job needs.
    with pytest.raises(SubmitError, match=r"spark-sql-kafka-0-10_2\.13-3\.5\.1\.jar"):
        plan_submit(
            config("yarn", "hdfs:///c"),
            SubmitOptions(connector="jars", jars_dir=connector_dir(), archive=archive, spark_version="3.5.1"),
            tmp_path,
        )


# ----- defaults files and the shipped config --------------------------------------------------------


def test_conf_files_parse_and_every_target_keeps_state_in_rocksdb() -> None:
    for target in ("standalone", "yarn", "k8s"):
        conf = target_defaults(target)
        assert conf["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB
        assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
        assert conf["spark.sql.streaming.stateStore.encodingFormat"] == "avro"
        assert conf["spark.pyspark.python"]
        assert conf["spark.submit.deployMode"] in ("client", "cluster")


def test_conf_files_agree_with_what_the_job_sets() -> None:
    session = pytest.importorskip("streaming.session")
    job_conf = session.spark_conf(KpmonConfig(), [])
    common = target_defaults("yarn")
    for key in (k for k in common if k.startswith("spark.sql.streaming.stateStore")):
        assert job_conf[key] == common[key], key


def test_read_conf_formats_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.conf"
    path.write_text("# c\n\nspark.a   1\nspark.b=2\nspark.c = -Dx=y z\n")
    assert read_conf(path) == {"spark.a": "1", "spark.b": "2", "spark.c": "-Dx=y z"}
    path.write_text("spark.lonely\n")
    with pytest.raises(SubmitError, match=r"x\.conf:1"):
        read_conf(path)


def test_shipped_config_is_the_validated_one_with_the_connector_marker(tmp_path: Path, archive: str) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump({"stream": {"master": "yarn", "checkpoint_dir": "hdfs:///c"}}))
    cfg = load_config(source, environ={"KPMON__STREAM__TRIGGER_SECONDS": "7", "KPMON__TAP__TOPIC": "t2"})
    plan = plan_submit(cfg, SubmitOptions(archive=archive), tmp_path / "staging")
    written = write_config(plan)
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    shipped = load_config(written, environ={})
    assert shipped.stream.trigger_seconds == 7 and shipped.tap.topic == "t2"
    # The job must know that spark-submit ships the connector (else it runs Maven on the driver).
    assert shipped.stream.spark_conf == {"spark.jars.packages": connector_coordinate(spark_version())}
    assert shipped.model_copy(update={"stream": cfg.stream}) == cfg
    jars = plan_submit(
        cfg, SubmitOptions(archive=archive, connector="jars", jars_dir=connector_dir()), tmp_path / "staging"
    )
    # Local jar paths must not reach a cluster driver: the marker is an empty package list.
    assert yaml.safe_load(jars.config_yaml)["stream"]["spark_conf"] == {"spark.jars.packages": ""}


# ----- the CLI --------------------------------------------------------------------------------------


def test_cli_dry_run_prints_the_command_and_writes_its_config(
    tmp_path: Path, archive: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KPMON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    source = tmp_path / "prod.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "stream": {"master": "yarn", "checkpoint_dir": "hdfs:///kpmon/c"},
                "deploy": {
                    "driver_memory": "4g",
                    "driver_cores": 2,
                    "spark_conf": {"spark.yarn.tags": "kpmon"},
                },
            }
        )
    )
    code = main(
        [
            "deploy",
            "submit",
            "--config",
            str(source),
            "--target",
            "yarn",
            "--archive",
            archive,
            "--dry-run",
            "--conf",
            "spark.yarn.queue=streaming",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("PYSPARK_PYTHON=./environment/bin/python \\\n")
    assert "--master yarn" in out and "--deploy-mode cluster" in out
    assert f"--archives '{archive}#environment'" in out
    assert "--conf spark.yarn.queue=streaming" in out
    # The config's deploy section, not the target's defaults (2g, 1 core).
    assert "--conf spark.driver.memory=4g" in out and "spark.driver.memory=2g" not in out
    assert "--conf spark.driver.cores=2" in out and "--conf spark.yarn.tags=kpmon" in out
    assert "--conf spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:" in out
    assert out.rstrip().endswith("--config kpmon.yaml")
    written = list((tmp_path / "home" / "deploy").glob("kpmon-submit-*.yaml"))
    assert len(written) == 1 and f"{written[0]}#kpmon.yaml" in out
    assert "note: spark-submit needs HADOOP_CONF_DIR or YARN_CONF_DIR" in err


def test_cli_reports_refusals_and_bad_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "local.yaml"
    source.write_text("stream:\n  master: local[2]\n")
    assert main(["deploy", "submit", "--config", str(source), "--dry-run"]) == 2
    assert "not a cluster master" in capsys.readouterr().err
    source.write_text("stream:\n  mastr: yarn\n")
    assert main(["deploy", "submit", "--config", str(source), "--dry-run"]) == 2
    assert "stream.mastr" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["deploy", "submit", "--conf", "no-equals-sign", "--dry-run"])


# ----- packing the venv -----------------------------------------------------------------------------


def test_pack_plan_builds_a_plain_install_then_packs(tmp_path: Path) -> None:
    options = PackOptions(
        output=tmp_path / "env.tar.gz", build_dir=tmp_path / "v", wheelhouse=tmp_path / "wh"
    )
    steps = plan_pack(options, ["venv-pack"])
    assert steps[0] == [sys.executable, "-m", "venv", "--clear", str(tmp_path / "v")]
    install = steps[1]
    assert install[:4] == [str(tmp_path / "v" / "bin" / "python"), "-m", "pip", "install"]
    assert "-e" not in install and "--editable" not in install  # venv-pack refuses editable installs
    assert install[-1] == str(pack_module.PROJECT_ROOT)
    assert ["--no-index", "--find-links", str(tmp_path / "wh")] == install[5:8]
    assert steps[2][:5] == [
        "venv-pack",
        "--prefix",
        str(tmp_path / "v"),
        "--output",
        str(tmp_path / "env.tar.gz"),
    ]
    assert steps[2][-2:] == ["--exclude", PYSPARK_JARS]
    kept = plan_pack(
        PackOptions(output=tmp_path / "e.tgz", venv=tmp_path / "x", keep_pyspark_jars=True), ["vp"]
    )
    assert len(kept) == 1 and "--exclude" not in kept[0]


def test_missing_venv_pack_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    if find_venv_pack() is not None:
        pytest.skip("venv-pack is installed beside this interpreter")
    with pytest.raises(PackError, match=r"pip install venv-pack"):
        pack_module.pack(PackOptions(output=tmp_path / "e.tar.gz", venv=tmp_path))
    assert main(["deploy", "pack-venv", "--venv", str(tmp_path), "--output", str(tmp_path / "e.tar.gz")]) == 1
    assert "pip install venv-pack" in capsys.readouterr().err


def test_cli_pack_venv_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KPMON_HOME", str(tmp_path))
    assert main(["deploy", "pack-venv", "--dry-run", "--python-prefix", "/usr"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].endswith(f"venv --clear {tmp_path}/build/pack-venv")
    assert f"--output {tmp_path}/dist/kpmon-env.tar.gz" in lines[2] and "--python-prefix /usr" in lines[2]


def test_pack_a_real_venv(tmp_path: Path) -> None:
    if find_venv_pack() is None:
        pytest.skip("venv-pack is not installed (.venv/bin/pip install venv-pack)")
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    output = pack_module.pack(PackOptions(output=tmp_path / "env.tar.gz", venv=venv))
    with tarfile.open(output) as tar:
        names = set(tar.getnames())
    assert {"bin/python", "bin/activate", "pyvenv.cfg"} <= names
    with pytest.raises(PackError, match="not a virtual environment"):
        pack_module.pack(PackOptions(output=tmp_path / "x.tar.gz", venv=tmp_path / "missing"))


def standalone_config(tmp_path: Path, **deploy: Any) -> KpmonConfig:
    return KpmonConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "stream": {"master": "spark://master.example:7077"},
            "deploy": {"target": "standalone", **deploy},
        }
    )


def test_a_standalone_cluster_driver_gets_the_submit_settings_with_its_python_everywhere(
    tmp_path: Path,
) -> None:
    from deploy.spark.submit import plan_cluster_submission

    config = standalone_config(
        tmp_path, connector="packages", driver_memory="3g", spark_conf={"spark.executor.memory": "6g"}
    )
    plan = plan_cluster_submission(config, "/opt/build-b/bin/python", tmp_path / "staging", "4.2.0")
    props = plan.properties
    assert props["spark.master"] == "spark://master.example:7077"
    assert props["spark.submit.deployMode"] == "cluster" and props["spark.driver.supervise"] == "false"
    for key in ("spark.pyspark.python", "spark.pyspark.driver.python", "spark.executorEnv.PYSPARK_PYTHON"):
        assert props[key] == "/opt/build-b/bin/python"
    assert (props["spark.driver.memory"], props["spark.driver.cores"]) == ("3g", "1")
    # deploy.spark_conf wins over standalone.conf; the state-store settings come from common.conf.
    assert props["spark.executor.memory"] == "6g" and props["spark.cores.max"] == "4"
    assert props["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB
    assert props["spark.jars.packages"] == connector_coordinate("4.2.0")
    shipped = yaml.safe_load(plan.config_yaml)
    assert shipped["stream"]["spark_conf"]["spark.jars.packages"] == connector_coordinate("4.2.0")
    assert shipped["deploy"]["target"] == "standalone"
    assert plan.config_file.parent == tmp_path / "staging"
    # The default checkpoint is under the state directory, which a standalone target requires shared.
    assert plan.notes and "shared mount" in plan.notes[0]


def test_a_standalone_cluster_driver_with_jars_needs_the_connector_there(tmp_path: Path) -> None:
    from deploy.spark.submit import plan_cluster_submission

    config = standalone_config(tmp_path, connector="jars", jars_dir=str(tmp_path / "empty"))
    with pytest.raises(SubmitError, match="spark-sql-kafka"):
        plan_cluster_submission(config, sys.executable, tmp_path, "4.2.0")
