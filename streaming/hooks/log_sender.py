"""The log hook: one structured JSON line per alert on the ``kpmon.alerts`` logger."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from streaming.hooks.core import Result
from streaming.hooks.formatters import AlertDict
from streaming.hooks.sender import SendResult

_LEVELS = {"critical": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


def log_line(alert: AlertDict) -> str:
    """One JSON object per line, so log shippers can index alerts without parsing prose."""
    return json.dumps({"event": "kpmon.alert", **alert}, ensure_ascii=False, separators=(",", ":"))


class LogSender:
    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("kpmon.alerts")

    def send(self, alerts: Sequence[AlertDict]) -> SendResult:
        for alert in alerts:
            # A resolve is good news: it is logged at INFO whatever the alert's severity was.
            level = logging.INFO if alert["status"] == "resolved" else _LEVELS[alert["severity"]]
            self.logger.log(level, "%s", log_line(alert))
        return SendResult.all(Result.OK, len(alerts))

    def close(self) -> None:
        pass
