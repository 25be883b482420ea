"""HTTP POST of a rendered JSON body with the standard library: webhook, Slack, PagerDuty, Alertmanager.

A dependency-free client is enough here: one small JSON POST at a time, per hook thread. Redirects are
not followed (urllib would turn a redirected POST into a body-less GET and call it delivered).
"""

from __future__ import annotations

import email.utils
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from streaming.hooks.core import Result
from streaming.hooks.formatters import AlertDict
from streaming.hooks.sender import SendResult

#: Worth retrying: timeout, too early, rate limited, and any server-side error.
_TRANSIENT_STATUS = {408, 425, 429}
#: Enough of a response body to explain a rejection in the log.
_MAX_ERROR_BODY = 300


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def redact(url: str) -> str:
    """scheme://host[:port] only: Slack and other webhook URLs carry their secret in the path."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def classify(status: int) -> Result:
    if 200 <= status < 300:
        return Result.OK
    if status in _TRANSIENT_STATUS or status >= 500:
        return Result.TRANSIENT
    return Result.PERMANENT


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: either a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, moment.timestamp() - (time.time() if now is None else now))


class HttpSender:
    def __init__(
        self,
        url: str,
        render: Callable[[Sequence[AlertDict]], bytes],
        *,
        timeout: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.render = render
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "User-Agent": "kpmon-alerts/1", **(headers or {})}
        # build_opener keeps the environment's proxy settings (http_proxy, no_proxy), as operators expect.
        self.opener = urllib.request.build_opener(_NoRedirect())
        self.where = redact(url)

    def send(self, alerts: Sequence[AlertDict]) -> SendResult:
        body = self.render(alerts)
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        count = len(alerts)
        try:
            # The timeout bounds the connect and every socket read.
            with self.opener.open(request, timeout=self.timeout) as response:
                response.read(64 * 1024)
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            status = exc.code
            detail = _error_body(exc)
            retry_after = parse_retry_after(exc.headers.get("Retry-After")) if exc.headers else None
            exc.close()
            return SendResult.all(
                classify(status), count, f"{self.where} answered {status}{detail}", retry_after
            )
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            return SendResult.all(Result.TRANSIENT, count, f"{self.where}: {type(exc).__name__}: {reason}")
        result = classify(status)
        error = "" if result is Result.OK else f"{self.where} answered {status}"
        return SendResult.all(result, count, error)

    def close(self) -> None:
        pass


def _error_body(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(_MAX_ERROR_BODY).decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException):
        return ""
    return f": {' '.join(text.split())}" if text else ""
