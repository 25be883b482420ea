"""``kpmon deploy submit|pack-venv|fetch-connector|native``: run the streaming job on a Spark cluster.

See docs/cluster-mode.md. The work is in deploy/spark/ (submit.py, pack.py); this module parses options.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from kpconfig.model import ConfigError, load_config
from kpconfig.paths import kpmon_home


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _submit(args: argparse.Namespace) -> int:
    from deploy.spark.submit import SubmitError, SubmitOptions, materialize, plan_submit, run

    try:
        config = load_config(getattr(args, "config", None))
    except ConfigError as exc:
        print(f"kpmon deploy submit: {exc}", file=sys.stderr)
        return 2
    options = SubmitOptions(
        target=args.target,
        deploy_mode=args.deploy_mode,
        connector=args.connector,
        jars_dir=Path(args.jars_dir) if args.jars_dir else None,
        extra_packages=tuple(args.extra_package or ()),
        archive=args.archive,
        executor_python=args.executor_python,
        shared_checkpoint=args.shared_checkpoint,
        conf=dict(args.conf or ()),
        name=args.name,
        spark_submit=args.spark_submit,
        spark_version=args.spark_version,
        **({"pod_template": Path(args.pod_template)} if args.pod_template else {}),
    )
    try:
        plan = plan_submit(config, options, kpmon_home() / "deploy")
    except SubmitError as exc:
        print(f"kpmon deploy submit: {exc}", file=sys.stderr)
        return 2
    for note in plan.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        materialize(plan)
        if plan.workdir is not None:
            print(f"cd {shlex.quote(str(plan.workdir))} && \\")
        print(_pretty(plan.env, plan.argv))
        return 0
    return run(plan)


def _pretty(env: dict[str, str], argv: list[str]) -> str:
    """One option per line, so a reviewer can read (and copy) the command."""
    lines = [f"{k}={shlex.quote(v)} \\" for k, v in env.items()]
    parts: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv):
            parts.append(f"{argv[i]} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            parts.append(shlex.quote(argv[i]))
            i += 1
    return "\n".join([*lines, " \\\n  ".join(parts)])


def _pack_venv(args: argparse.Namespace) -> int:
    from deploy.spark.pack import PackError, PackOptions, find_venv_pack, pack, plan_pack

    home = kpmon_home()
    options = PackOptions(
        output=Path(args.output) if args.output else home / "dist" / "kpmon-env.tar.gz",
        venv=Path(args.venv) if args.venv else None,
        build_dir=home / "build" / "pack-venv",
        python=args.python or sys.executable,
        python_prefix=args.python_prefix,
        wheelhouse=Path(args.wheelhouse) if args.wheelhouse else None,
        keep_pyspark_jars=args.keep_pyspark_jars,
    )
    venv_pack = find_venv_pack()
    if args.dry_run:
        for step in plan_pack(options, venv_pack or ["venv-pack"]):
            print(shlex.join(step))
        if venv_pack is None:
            print("note: venv-pack is not installed (.venv/bin/pip install venv-pack)", file=sys.stderr)
        return 0
    try:
        output = pack(options)
    except PackError as exc:
        print(f"kpmon deploy pack-venv: {exc}", file=sys.stderr)
        return 1
    print(output)
    print(f"submit with: kpmon deploy submit --archive {output} ...", file=sys.stderr)
    return 0


def _fetch_connector(args: argparse.Namespace) -> int:
    from kpconfig.mvn import FetchError
    from streaming.connector import fetch_connector

    try:
        print(fetch_connector(args.spark_version))
    except FetchError as exc:
        print(f"kpmon deploy fetch-connector: {exc}", file=sys.stderr)
        return 1
    return 0


def _native(args: argparse.Namespace) -> int:
    from deploy import tapcore
    from deploy.native import run

    done = run(check=args.check, clean=args.clean)
    if args.check or args.clean:
        return done
    # make setup builds the two side by side (its native and tapcore targets); here one after the other.
    return tapcore.run() or done


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "deploy",
        help="run the streaming job on Spark standalone, YARN or Kubernetes (docs/cluster-mode.md)",
        description="Submit the streaming job to a Spark cluster and prepare what it needs there.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    submit = actions.add_parser(
        "submit",
        help="build (and run) the spark-submit command for a cluster target",
        description=(
            "Build the spark-submit command for the streaming job: the Kafka connector from spark.jars.packages "
            "or a pre-resolved jar directory, the Python environment as a venv-pack archive, the checkpoint on "
            "a shared filesystem. Defaults come from deploy/spark/common.conf and <target>.conf."
        ),
        epilog=(
            "examples:\n"
            "  kpmon deploy submit --config prod.yaml --target yarn --archive kpmon-env.tar.gz --dry-run\n"
            "  kpmon deploy submit --config prod.yaml --target standalone --connector jars \\\n"
            "      --jars-dir /opt/kpmon/connector --archive kpmon-env.tar.gz\n"
            "  kpmon deploy submit --config prod.yaml --target k8s --conf spark.executor.instances=4\n"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument(
        "--config", default=argparse.SUPPRESS, help="YAML config (KPMON__* env vars override)"
    )
    submit.add_argument(
        "--target",
        choices=["standalone", "yarn", "k8s"],
        help="cluster manager (default: from stream.master)",
    )
    submit.add_argument("--deploy-mode", choices=["client", "cluster"], help="default: from <target>.conf")
    submit.add_argument(
        "--connector",
        choices=["packages", "jars", "provided"],
        default="packages",
        help="spark-sql-kafka-0-10: resolved from Maven (packages), a jar directory (jars, air-gapped), "
        "or already on the cluster's classpath (provided)",
    )
    submit.add_argument("--jars-dir", help="pre-resolved connector jars (default: the kpmon cache)")
    submit.add_argument(
        "--extra-package", action="append", help="another Maven coordinate (e.g. hadoop-aws for s3a)"
    )
    submit.add_argument("--archive", help="venv-pack archive (path or URI), unpacked as ./environment")
    submit.add_argument(
        "--executor-python", help="or: a Python with kpmon installed, same path on every node"
    )
    submit.add_argument(
        "--shared-checkpoint",
        action="store_true",
        help="stream.checkpoint_dir is a plain path on a mount shared by every node (NFS...)",
    )
    submit.add_argument(
        "--conf", action="append", type=_conf_pair, metavar="KEY=VALUE", help="Spark setting (wins)"
    )
    submit.add_argument("--name", default="kpmon-stream", help="application name")
    submit.add_argument("--spark-submit", help="spark-submit to run (default: $SPARK_HOME, PATH, pyspark's)")
    submit.add_argument("--spark-version", help="cluster Spark version (default: the installed pyspark's)")
    submit.add_argument(
        "--pod-template", help="k8s pod template (default: deploy/spark/k8s-pod-template.yaml)"
    )
    submit.add_argument(
        "--dry-run", action="store_true", help="print the command (and write its config) only"
    )
    submit.set_defaults(func=_submit)

    pack_venv = actions.add_parser(
        "pack-venv",
        help="pack kpmon's Python environment with venv-pack for --archive",
        description=(
            "Build a fresh venv with kpmon installed (not editable) and pack it with venv-pack. The archive "
            "links bin/python to the base interpreter: cluster nodes need the same Python at the same path, "
            "or give --python-prefix."
        ),
    )
    pack_venv.add_argument("--output", help="archive path (default: $KPMON_HOME/dist/kpmon-env.tar.gz)")
    pack_venv.add_argument("--venv", help="pack this existing venv instead of building one")
    pack_venv.add_argument("--python", help="interpreter for the new venv (default: this one)")
    pack_venv.add_argument("--python-prefix", help="Python's prefix on the cluster nodes (e.g. /usr)")
    pack_venv.add_argument("--wheelhouse", help="install from these wheels only (no index)")
    pack_venv.add_argument(
        "--keep-pyspark-jars", action="store_true", help="keep pyspark's jars (the cluster has its own)"
    )
    pack_venv.add_argument("--dry-run", action="store_true", help="print the commands only")
    pack_venv.set_defaults(func=_pack_venv)

    fetch = actions.add_parser(
        "fetch-connector",
        help="resolve spark-sql-kafka-0-10 and its dependencies into the cache (for --connector jars)",
    )
    fetch.add_argument("--spark-version", help="default: the installed pyspark's")
    fetch.set_defaults(func=_fetch_connector)

    native = actions.add_parser(
        "native",
        help="compile the per-frame cores with mypyc, and the tap's native core (make setup does it; docs/decisions.md)",
        description="Compile the checks engine, its rules and the stage steps into C extensions with "
        "mypyc, from the same source, into build/native/, and build and install the tap's native core "
        "(tap/native, with cargo and maturin; docs/tap.md). Each is used only while every source is the "
        "one it was built from.",
    )
    what = native.add_mutually_exclusive_group()
    what.add_argument(
        "--check",
        action="store_true",
        help="say whether the compiled build is used and which tap core runs, and why (exit 1 unless both are native)",
    )
    what.add_argument("--clean", action="store_true", help="remove build/native (the job runs plain Python)")
    native.set_defaults(func=_native)
