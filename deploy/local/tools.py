"""Kafka's command-line tools, run from the same cached jars as the brokers (there are no shell scripts).

Tool names are the upstream script names; the main classes differ per release (several moved from the
Scala core into ``kafka-tools`` for 4.0), so the table is keyed by major version.
"""

from __future__ import annotations

import subprocess

from deploy.local import process
from deploy.local.distribution import fetch_distribution, libs_dir, logging_jvm_args, major, tools_version
from deploy.local.process import StackError

_COMMON = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-storage": "kafka.tools.StorageTool",
}
#: Checked against the jars: ConsoleProducer is still Scala (kafka_2.13) in 3.9 and Java in 4.x.
MAIN_CLASSES: dict[int, dict[str, str]] = {
    3: _COMMON | {"kafka-console-producer": "kafka.tools.ConsoleProducer"},
    4: _COMMON | {"kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer"},
}


#: Tools that must match the broker release exactly (they write its storage format).
_BROKER_TOOLS = {"kafka-storage"}


def _runtime(version: str, tool: str) -> str:
    """The release whose jars run ``tool`` for a ``version`` broker."""
    return version if tool in _BROKER_TOOLS else tools_version(version)


def main_class(version: str, tool: str) -> str:
    """The main class of ``tool`` in the jars that run it for a ``version`` broker."""
    table = MAIN_CLASSES.get(major(_runtime(version, tool)))
    if table is None:
        raise StackError(f"no tool table for Kafka {version}")
    try:
        return table[tool]
    except KeyError:
        raise StackError(f"unknown tool {tool!r}; known: {', '.join(sorted(table))}") from None


def tool_command(version: str, tool: str, args: list[str]) -> list[str]:
    runtime = _runtime(version, tool)
    return [
        process.find_java(),
        *process.TOOL_JVM_OPTS,
        *logging_jvm_args(runtime, "WARN"),
        "-cp",
        str(libs_dir(runtime) / "*"),
        main_class(version, tool),
        *args,
    ]


def run_tool(
    version: str,
    tool: str,
    args: list[str],
    timeout: float = 60,
    *,
    input: str | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``tool`` (e.g. ``kafka-topics``) of Kafka ``version`` with ``args``; output is captured as text.

    Tool logging goes to stderr at WARN, so stdout is just the tool's output. ``check=True`` raises
    ``CalledProcessError`` on a non-zero exit; a timeout raises ``TimeoutExpired``.
    """
    command = tool_command(version, tool, args)  # fails on a missing JDK before any download
    fetch_distribution(version)
    return subprocess.run(
        command,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )
