"""The planner's settings from the HULK_* environment: one validated, frozen PlannerSettings.

`hulk-planner` loads them once, before it reads its flags; they are the flags' defaults
(precedence: flag > variable > default). A bad value raises ConfigError naming the variable and
what was expected, in one line; the command prints it and exits with code 2.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hulk import settings, validate
from hulk.wire.broker import check_name, parse_broker_url
from hulk.errors import ConfigError
from hulk.validate import Bound, Invalid

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class PlannerSettings:
    db: str | None = None              # the SQLite store; None: the command needs --db
    listen: str = "0.0.0.0:50051"      # HOST:PORT `serve` listens on
    fleet: str = "default"             # fleet name in the MQTT topics
    insecure: bool = False             # `serve` without TLS
    mqtt: str | None = None            # broker URL for `serve` recovery and `plan --push`
    raw_days: int = 7                  # days raw samples are kept
    window_days: int = 90              # rolling window of the fleet's links
    log_level: str = "INFO"
    signing_key: str | None = None     # Ed25519 key that signs placements (`plan --push`, `serve`)
    # Public keys signing_key replaced: serve re-signs what they signed (key rotation).
    previous_placement_key: tuple[str, ...] = ()
    probe_peers: int = 64              # most peers each agent probes (`serve`'s probe plan)
    probe_site_reps: int = 2           # probes per ordered site pair per epoch
    probe_epoch_s: float = 600.0       # seconds between rotations of each agent's peers


# field -> the HULK_* variable it is read from (every one is listed in hulk.settings.ENV_VARS).
VARIABLES: dict[str, str] = {
    "db": "HULK_DB",
    "listen": "HULK_LISTEN",
    "fleet": "HULK_FLEET",
    "insecure": "HULK_INSECURE",
    "mqtt": "HULK_MQTT",
    "raw_days": "HULK_RAW_DAYS",
    "window_days": "HULK_WINDOW_DAYS",
    "log_level": "HULK_LOG_LEVEL",
    "signing_key": "HULK_SIGNING_KEY",
    "previous_placement_key": "HULK_PREVIOUS_PLACEMENT_KEY",
    "probe_peers": "HULK_PROBE_PEERS",
    "probe_site_reps": "HULK_PROBE_SITE_REPS",
    "probe_epoch_s": "HULK_PROBE_EPOCH",
}


# The broker's own checks name the variable in their ConfigError.
def _fleet(text: str) -> str:
    return check_name(text, VARIABLES["fleet"])


def _mqtt(text: str) -> str:
    parse_broker_url(text, source=VARIABLES["mqtt"])
    return text


def _public_keys(text: str) -> tuple[str, ...]:
    """Split only: serve reads and checks the keys (files too) when it loads its signing key."""
    from hulk.wire.signing import key_texts
    return key_texts(text)


# Bounds of the planner's numeric settings (serve's flags check the same).
DAYS = Bound(1, 36_500, "days", integer=True)          # a century of samples is plenty
PROBE_PEERS = Bound(2, 10_000, "peers", integer=True)  # 2: one peer in the site, one outside
PROBE_SITE_REPS = Bound(1, 100, "probes", integer=True)
PROBE_EPOCH = Bound(10.0, 7 * 86400.0, "seconds")


PARSERS: dict[str, Callable[[str], object]] = {
    "db": str,
    "listen": lambda text: validate.host_port(text, "0.0.0.0:50051", port_zero=True),
    "fleet": _fleet,
    "insecure": validate.boolean,
    "mqtt": _mqtt,
    "raw_days": DAYS,
    "window_days": DAYS,
    "log_level": lambda text: validate.choice(text, LOG_LEVELS),
    "signing_key": str,
    "previous_placement_key": lambda text: _public_keys(text),
    "probe_peers": PROBE_PEERS,
    "probe_site_reps": PROBE_SITE_REPS,
    "probe_epoch_s": PROBE_EPOCH,
}


def load_settings(env_reader: Callable[[str], str | None] = settings.env) -> PlannerSettings:
    """PlannerSettings from the HULK_* variables (unset or empty: the default)."""
    values: dict[str, object] = {}
    for name, variable in VARIABLES.items():
        raw = env_reader(variable)
        if raw is None:
            continue
        try:
            values[name] = PARSERS[name](raw)
        except Invalid as bad:
            raise bad.error(ConfigError, field=variable) from None
    return PlannerSettings(**values)

