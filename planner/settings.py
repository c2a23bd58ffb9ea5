"""The planner's settings from the HULK_* environment: one validated, frozen PlannerSettings.

`hulk-planner` loads them once, before it reads its flags; they are the flags' defaults
(precedence: flag > variable > default). A bad value raises ConfigError naming the variable and
what was expected, in one line; the command prints it and exits with code 2.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hulk import settings
from hulk.wire.broker import check_name, parse_broker_url
from hulk.errors import ConfigError

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
    "probe_peers": "HULK_PROBE_PEERS",
    "probe_site_reps": "HULK_PROBE_SITE_REPS",
    "probe_epoch_s": "HULK_PROBE_EPOCH",
}


class _Bad(ValueError):
    """A parser's complaint: what was expected."""


def _listen(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise _Bad(f"expected HOST:PORT (e.g. 0.0.0.0:50051), got {text!r}")
    return text


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise _Bad(f"expected 1 or 0 (true/false, yes/no, on/off), got {text!r}")


# The broker's own checks name the variable in their ConfigError.
def _fleet(text: str) -> str:
    return check_name(text, VARIABLES["fleet"])


def _mqtt(text: str) -> str:
    parse_broker_url(text, source=VARIABLES["mqtt"])
    return text


def _days(text: str) -> int:
    if not re.fullmatch(r"\s*[0-9]+\s*", text) or int(text) < 1:
        raise _Bad(f"expected a whole number of days, at least 1, got {text!r}")
    return int(text)


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[0-9]+\s*", text) or not low <= int(text) <= high:
            raise _Bad(f"expected a whole number from {low} to {high}, got {text!r}")
        return int(text)
    return parse


def _seconds(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:  # also NaN
            raise _Bad(f"expected seconds from {low:g} to {high:g}, got {text!r}")
        return value
    return parse


# Bounds of the probe plan's settings (serve's flags check the same).
PROBE_PEERS_RANGE = (2, 10_000)        # 2: room for one peer in the site and one outside
PROBE_SITE_REPS_RANGE = (1, 100)
PROBE_EPOCH_RANGE = (10.0, 7 * 86400.0)


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise _Bad(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


PARSERS: dict[str, Callable[[str], object]] = {
    "db": str,
    "listen": _listen,
    "fleet": _fleet,
    "insecure": _boolean,
    "mqtt": _mqtt,
    "raw_days": _days,
    "window_days": _days,
    "log_level": _log_level,
    "signing_key": str,
    "probe_peers": _count(*PROBE_PEERS_RANGE),
    "probe_site_reps": _count(*PROBE_SITE_REPS_RANGE),
    "probe_epoch_s": _seconds(*PROBE_EPOCH_RANGE),
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
        except _Bad as bad:
            raise ConfigError(str(bad), field=variable) from None
    return PlannerSettings(**values)

