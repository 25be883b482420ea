"""``kpmon stream``: run the streaming monitor, or ask a running one how it is, or stop it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from kpconfig.model import ConfigError, KpmonConfig, load_config


def _config(args: argparse.Namespace) -> KpmonConfig:
    config = load_config(getattr(args, "config", None))
    stream: dict[str, Any] = {}
    for name in ("master", "checkpoint_dir", "starting_offsets", "trigger_seconds"):
        value = getattr(args, name, None)
        if value is not None:
            stream[name] = value
    updates: dict[str, Any] = {}
    if stream:
        updates["stream"] = config.stream.model_copy(update=stream)
    if getattr(args, "topic", None):
        updates["tap"] = config.tap.model_copy(update={"topic": args.topic})
    if getattr(args, "state_dir", None):
        updates["state_dir"] = args.state_dir
    return config.model_copy(update=updates) if updates else config


def _quiet_spark_output(log_path: str) -> int:
    """Send the JVM's and Python workers' console noise to a log file; returns a terminal fd for us."""
    terminal = os.dup(1)
    target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    return terminal


def run(args: argparse.Namespace) -> int:
    import logging

    from streaming.job import run_until_stopped, start
    from streaming.paths import StreamPaths

    config = _config(args)
    paths = StreamPaths.of(config)
    paths.make()
    terminal_fd = _quiet_spark_output(str(paths.spark_log)) if not args.spark_output else 1
    terminal = os.fdopen(terminal_fd, "w", buffering=1, closefd=False)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(message)s",
        stream=terminal,
    )
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def say(line: str) -> None:
        print(line, file=terminal, flush=True)

    say(
        f"kpmon stream: reading tap topic {config.tap.topic!r} on {config.tap_cluster.bootstrap_servers}, "
        f"master {config.stream.master}, state {paths.root}"
    )
    if not args.spark_output:
        say(f"kpmon stream: Spark's own output goes to {paths.spark_log}")
    say("kpmon stream: starting Spark (the first batch includes start-up, typically 10-60 s)...")
    job = start(config, terminal=say)
    say(f"kpmon stream: running (query {job.query.id}); Ctrl-C or `kpmon stream stop` stops it gracefully")
    code = run_until_stopped(job)
    say(f"kpmon stream: stopped ({'ok' if code == 0 else 'failed, see ' + str(paths.spark_log)})")
    return code


def status(args: argparse.Namespace) -> int:
    from streaming.paths import StreamPaths
    from streaming.status import judge, read_progress

    config = _config(args)
    paths = StreamPaths.of(config)
    health = judge(read_progress(paths.progress), time.time(), config.stream)
    if args.json:
        print(json.dumps(health.to_dict()))
    else:
        print(f"{health.status}: {health.reason}")
        for key, value in health.to_dict().items():
            if key not in ("status", "reason") and value is not None:
                print(f"  {key}: {value}")
    return {"healthy": 0, "lagging": 1, "stalled": 2, "stopped": 3, "failed": 4}.get(health.status, 4)


def stop(args: argparse.Namespace) -> int:
    from deploy.local.process import is_alive
    from streaming.paths import StreamPaths

    config = _config(args)
    paths = StreamPaths.of(config)
    try:
        pid = int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        print(f"kpmon stream stop: no running job recorded in {paths.pid_file}", file=sys.stderr)
        return 1
    paths.stop_marker.touch()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):  # an exited job its parent has not reaped yet is stopped too
            print(f"kpmon stream stop: job {pid} stopped")
            return 0
        time.sleep(0.5)
    print(f"kpmon stream stop: job {pid} still running after {args.timeout:.0f} s", file=sys.stderr)
    return 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file")
    p.add_argument("--state-dir", help="state directory (default: the config's state_dir)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "stream",
        help="run the Spark Structured Streaming monitor over the tap topic",
        description=(
            "Decode the tap topic, run every protocol check, validate each micro-batch with Great "
            "Expectations and send alerts through the configured hooks. Runs until Ctrl-C, SIGTERM or "
            "`kpmon stream stop`; a restart resumes from the checkpoint."
        ),
    )
    _common(parser)
    parser.add_argument("--master", help="Spark master (default from config: local[*])")
    parser.add_argument("--topic", help="tap topic to read (default from config)")
    parser.add_argument(
        "--checkpoint-dir", help="checkpoint location (default <state_dir>/stream/checkpoint)"
    )
    parser.add_argument("--starting-offsets", choices=["earliest", "latest"], help="for a new checkpoint")
    parser.add_argument("--trigger-seconds", type=float, help="micro-batch trigger interval")
    parser.add_argument(
        "--spark-output", action="store_true", help="leave Spark's console output on the terminal"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log one JSON line per batch")
    parser.set_defaults(func=_guard(run))
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    st = actions.add_parser("status", help="healthy, lagging, stalled or stopped (exit code 0/1/2/3)")
    _common(st)
    st.add_argument("--json", action="store_true", help="print the verdict as JSON")
    st.set_defaults(func=_guard(status))
    sp = actions.add_parser("stop", help="stop a running job gracefully (after its running batch)")
    _common(sp)
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for it to exit")
    sp.set_defaults(func=_guard(stop))


def _guard(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ConfigError as exc:
            print(f"kpmon stream: {exc}", file=sys.stderr)
            return 2

    return wrapped
