"""The alerts section of the config: hook validation and the kind defaults the hooks run with."""

from __future__ import annotations

from pathlib import Path

import pytest

from kpconfig.model import ConfigError, HookConfig, load_config
from streaming.hooks.factory import alertmanager_url
from streaming.hooks.policy import policy_for


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "kpmon.yaml"
    path.write_text(text)
    return load_config(path, environ={})


def test_default_is_one_log_hook() -> None:
    hooks = load_config(environ={}).alerts.hooks
    assert [(h.kind, h.hook_name, h.min_severity) for h in hooks] == [("log", "log", "warning")]


def test_example_from_the_docs_loads(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "alerting.md"
    text = docs.read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = _load(tmp_path, example)
    kinds = [hook.kind for hook in config.alerts.hooks]  # type: ignore[attr-defined]
    assert sorted(set(kinds)) == ["alertmanager", "kafka", "log", "pagerduty", "slack", "webhook"]


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("{kind: webhook}", "needs url"),
        ("{kind: slack}", "needs url"),
        ("{kind: alertmanager}", "needs url"),
        ("{kind: pagerduty}", "needs routing_key"),
        ("{kind: webhook, url: 'ftp://x'}", "http"),
        ("{kind: webhook, url: 'http://x', max_batch: 5}", "max_batch must be 1"),
        ("{kind: alertmanager, url: 'http://x', labels: {'bad-name': v}}", "invalid label names"),
        ("{kind: log, name: 'has space'}", "name must be"),
        ("{kind: log, max_per_second: 0}", "max_per_second"),
        ("{kind: log, backoff_initial_seconds: 5, backoff_max_seconds: 1}", "backoff_max_seconds"),
        ("{kind: sms}", "kind"),
        ("{kind: log, retries: 3}", "retries"),
    ],
)
def test_bad_hooks_are_named(tmp_path: Path, hook: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, f"alerts:\n  hooks:\n    - {hook}\n")


def test_hook_names_must_be_unique(tmp_path: Path) -> None:
    text = (
        "alerts:\n  hooks:\n    - {kind: webhook, url: 'http://a'}\n    - {kind: webhook, url: 'http://b'}\n"
    )
    with pytest.raises(ConfigError, match="repeated: webhook"):
        _load(tmp_path, text)
    named = text.replace("url: 'http://b'", "url: 'http://b', name: second")
    assert [h.hook_name for h in _load(tmp_path, named).alerts.hooks] == ["webhook", "second"]  # type: ignore[attr-defined]


def test_kind_defaults() -> None:
    slack = policy_for(HookConfig(kind="slack", url="http://s"))
    assert (slack.max_per_second, slack.max_batch, slack.resend) == (1.0, 10, None)
    manager = policy_for(HookConfig(kind="alertmanager", url="http://am"))
    assert manager.resend == 60.0 and manager.supersede_on_resolve
    assert not policy_for(HookConfig(kind="log")).spooled
    tuned = policy_for(
        HookConfig(kind="slack", url="http://s", max_per_second=0.5, max_batch=3, min_severity="critical")
    )
    assert (tuned.max_per_second, tuned.max_batch, tuned.min_rank) == (0.5, 3, 2)


def test_alertmanager_url_takes_base_or_endpoint() -> None:
    assert alertmanager_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alertmanager_url("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alertmanager_url("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"


def test_the_alert_context_comes_from_the_config() -> None:
    default = load_config(environ={})
    assert default.cluster_name == default.kafka.bootstrap_servers  # a fleet should name it (docs/config.md)
    assert default.alert_context().runbook_url("tap.gap") == "docs/runbook.md#tapgap"
    named = load_config(
        environ={
            "KPMON__CLUSTER": "prod-eu-1",
            "KPMON__ALERTS__RUNBOOK_BASE_URL": "https://wiki.example.com/kpmon/runbook.md",
        }
    )
    context = named.alert_context()
    assert context.cluster == "prod-eu-1"
    assert context.runbook_url("txn.hanging") == "https://wiki.example.com/kpmon/runbook.md#txnhanging"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"KPMON__CLUSTER": ""}, "cluster"),
        ({"KPMON__ALERTS__RUNBOOK_BASE_URL": "https://x/runbook.md#top"}, "runbook_base_url"),
        ({"KPMON__ALERTS__RUNBOOK_BASE_URL": "https://x/run book.md"}, "runbook_base_url"),
    ],
)
def test_bad_alert_context_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(environ=environ)
