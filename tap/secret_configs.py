"""Which config values are secrets: Kafka's PASSWORD-type configs, by name (pure).

The names come from ``tap/password_configs.json``, generated from the ``ConfigDef``s in Kafka's own jars
(``deploy/password_configs_gen.py``). A config set through the wire usually carries a prefix in front of
that name, and the value is just as secret:

- per listener and mechanism on a broker: ``listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config``;
- Connect's client overrides: ``producer.override.ssl.keystore.password``, ``consumer.sasl.jaas.config``;
- MirrorMaker 2's per-cluster settings: ``source.cluster.ssl.truststore.password``.

So a name is a password when it is one of those names or ends with ``.`` and one of them. Plug-ins
(custom login callbacks, config providers, connectors) define their own PASSWORD keys that the jars do
not know; a name whose dot-separated words include one of ``SECRET_WORDS`` counts too. Wrongly
redacting a harmless value only hides it from the mirror; missing a secret leaks it.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

JSON_PATH = Path(__file__).with_name("password_configs.json")

#: Words that mark a plug-in's config as a secret when the jars do not know its name.
SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "jaas", "credentials", "credential"})
_WORDS = re.compile(r"[._\-]")


@cache
def password_configs() -> frozenset[str]:
    """Every PASSWORD-type config name of every pinned Kafka release."""
    data = json.loads(JSON_PATH.read_text())
    return frozenset(name for names in data["releases"].values() for name in names)


def is_password_config(name: str | None) -> bool:
    """True when the value of config ``name`` must not leave the tap (case-insensitive)."""
    if not name:
        return False
    lowered = name.lower()
    known = password_configs()
    if lowered in known or any(lowered.endswith("." + known_name) for known_name in known):
        return True
    return not SECRET_WORDS.isdisjoint(_WORDS.split(lowered))
