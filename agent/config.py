"""The agent's settings: one validated, frozen AgentConfig.

Sources, lowest to highest precedence: defaults < YAML config file < HULK_* variables < flags.
Every bad value raises ConfigError naming its source (file and line, variable or flag), the field
and what was expected, in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.jobproc import SCOPES as JOB_SCOPES
from hulk import settings, validate
from hulk.errors import ConfigError
from hulk.validate import Bound, Invalid
from agent.inventory import parse_declared_gpus
from hulk.wire.broker import parse_broker_url
from hulk.wire.records import SITE_MAX_CHARS, GpuInfo, ProbeSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_STATE_DIR = Path("/var/lib/hulk-agent")
# Probe settings the operator leaves unset default to what the planner pushes (one set of
# defaults, hulk.wire); the planner's answer replaces them at registration.
PROBE_DEFAULTS = ProbeSettings()


@dataclass(frozen=True)
class AgentConfig:
    planner: str                      # HOST:PORT of hulk-planner serve
    node_id: str
    address: str = ""                 # "" = the outgoing interface's address towards the planner
    city: str = ""
    site: str = ""                    # data centre, cloud region or city; "" = the city
    interval_s: float = PROBE_DEFAULTS.interval_s     # one probe round per peer per interval
    state_dir: Path = DEFAULT_STATE_DIR
    insecure: bool = False
    token: str = ""
    ca: Path | None = None
    client_cert: Path | None = None   # this node's certificate for a planner requiring mTLS
    client_key: Path | None = None    # and its private key (PEM)
    mqtt: str = ""
    spool_max: int = 1_000_000
    packets_per_round: int = PROBE_DEFAULTS.packets_per_round
    timeout_s: float = PROBE_DEFAULTS.timeout_s
    payload_bytes: int = PROBE_DEFAULTS.payload_bytes
    max_concurrency: int = PROBE_DEFAULTS.max_concurrency
    # Most probe packets per second, whatever the planner asks: a long peer list stretches the
    # interval instead (agent.peers.paced_interval_s).
    max_probe_rate: float = 10.0
    log_level: str = "INFO"
    probe_port: int = 0               # TCP port peers connect-probe us on (0: no listener)
    throughput_port: int = 0          # TCP port peers send throughput tests to (0: takes none)
    # Placements (agent/placement.py, agent/launcher.py; docs/PLACEMENTS.md):
    # The planner's public keys (ed25519:... or PEM files): a placement signed by any one is good
    # (two while the planner's key is rotated).
    placement_key: tuple[str, ...] = ()
    allowed_commands: tuple[tuple[str, ...], ...] = ()   # argv prefixes a placement may run
    pass_env: tuple[str, ...] = ()    # variables jobs get besides HULK_*, PATH, HOME, LANG
    torchrun: str = ""                # "" = torchrun beside the agent's python, else on PATH
    job_scope: str = "auto"           # where jobs run apart from the agent (agent/jobproc.py)
    metrics: str = ""                 # HOST:PORT of the Prometheus /metrics endpoint ("" = off)
    # GPUs this node claims instead of NVML's (labs and tests; "" = off): agent/inventory.py.
    declared_gpus: tuple[GpuInfo, ...] = ()
    # Fields set by a file, variable or flag (not defaults): these win over the planner's
    # ProbeSettings; defaults give way to them.
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def spool_path(self) -> Path:
        return self.state_dir / "spool.sqlite"


# field -> (HULK_* variable, flag) ; None where a source does not offer the field.
SOURCES: dict[str, tuple[str | None, str | None]] = {
    "planner": ("HULK_PLANNER", "--planner"),
    "node_id": ("HULK_NODE_ID", "--node-id"),
    "address": ("HULK_ADDRESS", "--address"),
    "city": ("HULK_CITY", "--city"),
    "site": ("HULK_SITE", "--site"),
    "interval_s": ("HULK_INTERVAL", "--interval"),
    "state_dir": ("HULK_STATE_DIR", "--state-dir"),
    "insecure": ("HULK_INSECURE", "--insecure"),
    "token": ("HULK_TOKEN", None),            # never a flag: it would show in `ps`
    "ca": ("HULK_CA", "--ca"),
    "client_cert": ("HULK_CLIENT_CERT", "--client-cert"),
    "client_key": ("HULK_CLIENT_KEY", "--client-key"),
    "mqtt": ("HULK_MQTT", "--mqtt"),
    "spool_max": ("HULK_SPOOL_MAX", "--spool-max"),
    "packets_per_round": ("HULK_PACKETS_PER_ROUND", "--packets-per-round"),
    "timeout_s": ("HULK_PROBE_TIMEOUT", "--timeout"),
    "payload_bytes": ("HULK_PAYLOAD_BYTES", None),
    "max_concurrency": ("HULK_MAX_CONCURRENCY", "--max-concurrency"),
    "max_probe_rate": ("HULK_MAX_PROBE_RATE", None),
    "log_level": ("HULK_LOG_LEVEL", "--log-level"),
    "probe_port": ("HULK_PROBE_PORT", "--probe-port"),
    "throughput_port": ("HULK_THROUGHPUT_PORT", "--throughput-port"),
    "placement_key": ("HULK_PLACEMENT_KEY", None),
    "allowed_commands": ("HULK_ALLOWED_COMMANDS", None),
    "pass_env": ("HULK_PASS_ENV", None),
    "torchrun": ("HULK_TORCHRUN", None),
    "job_scope": ("HULK_JOB_SCOPE", None),
    "metrics": ("HULK_METRICS", "--metrics"),
    "declared_gpus": ("HULK_DECLARED_GPUS", "--declared-gpus"),
}

# Keys a config file may use besides the field names.
FILE_ALIASES = {"interval": "interval_s", "timeout": "timeout_s", "node-id": "node_id",
                "state-dir": "state_dir", "log-level": "log_level", "spool-max": "spool_max",
                "client-cert": "client_cert", "client-key": "client_key",
                "declared-gpus": "declared_gpus"}


def _path(value: Any) -> Path:
    text = validate.single(value)
    if not text:
        raise Invalid("expected a path, got an empty value")
    return Path(text).expanduser()


def _pem_file(what: str, pem: bool = True) -> Callable[[Any], Path | None]:
    def parse(value: Any) -> Path | None:
        text = validate.single(value)
        if not text:
            return None
        path = Path(text).expanduser()
        if not path.is_file():
            kind = " (PEM)" if pem else ""
            raise Invalid(f"expected a readable {what} file{kind}, {text!r} does not exist")
        return path
    return parse


def _mqtt(value: Any) -> str:
    text = validate.single(value)
    if text and not re.match(r"^mqtts?://[^/\s]+", text):
        raise Invalid(f"expected a broker URL mqtt://[user:pass@]HOST:PORT, got {text!r}")
    if "cert=" in text or "key=" in text:  # a client certificate for the broker: check now
        try:
            broker = parse_broker_url(text, source="")
        except ConfigError as err:
            raise Invalid(str(err)) from None
        for what, path in (("cert", broker.cert), ("key", broker.key)):
            if path and not Path(path).is_file():
                raise Invalid(f"expected a readable file for {what}=, {path!r} does not exist")
    return text


def _metrics_address(text: str) -> None:
    from hulk.metrics import parse_metrics_address
    parse_metrics_address(text, field=None)


def _placement_keys(value: Any) -> tuple[str, ...]:
    """Public keys: one, a YAML list, or one text with commas between them (a variable)."""
    from hulk.errors import InputError
    from hulk.wire.signing import Verifier, key_texts
    try:
        texts = key_texts(value)
        if texts:
            Verifier.from_text(texts, field=None)
    except InputError as exc:
        raise Invalid(str(exc)) from None
    return texts


def _allowed_commands(value: Any) -> tuple[tuple[str, ...], ...]:
    """A list of argv prefixes (each a list, or a string split as a shell would); a variable
    separates them with ';'."""
    import shlex
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list) and not isinstance(value, str):
        raise Invalid("expected a list of commands (argv prefixes such as [python, train.py])")
    out = []
    for item in items:
        argv = shlex.split(item) if isinstance(item, str) else item
        if not isinstance(argv, list) or not all(isinstance(a, (str, int, float)) for a in argv):
            raise Invalid(f"expected a command as a string or a list of strings, got {item!r}")
        if argv:
            out.append(tuple(str(a) for a in argv))
    return tuple(out)


PARSERS: dict[str, Callable[[Any], Any]] = {
    "planner": lambda v: validate.host_port(v, "planner.example.org:50051"),
    "node_id": validate.name,
    "address": validate.ip_address,
    "city": validate.single,
    "site": lambda v: validate.printable(v, SITE_MAX_CHARS, "a site name"),
    "interval_s": Bound(1.0, 86400.0, "seconds"),
    "state_dir": _path,
    "insecure": validate.boolean,
    "token": validate.single,
    "ca": _pem_file("CA certificate", pem=False),
    "client_cert": _pem_file("client certificate"),
    "client_key": _pem_file("client private key"),
    "mqtt": _mqtt,
    "spool_max": Bound(100, 1_000_000_000, "samples", integer=True),
    "packets_per_round": Bound(1, 100, "packets", integer=True),
    "timeout_s": Bound(0.01, 60.0, "seconds"),
    "payload_bytes": Bound(0, 1472, "bytes", integer=True),
    "max_concurrency": Bound(1, 4096, "rounds", integer=True),
    "max_probe_rate": Bound(0.01, 10_000.0, "packets per second"),
    "log_level": lambda v: validate.choice(v, LOG_LEVELS),
    "probe_port": Bound(0, 65535, "port", integer=True),
    "throughput_port": Bound(0, 65535, "port", integer=True),
    "placement_key": _placement_keys,
    "allowed_commands": _allowed_commands,
    "pass_env": validate.identifiers,
    "torchrun": validate.single,
    "job_scope": lambda v: validate.choice(v, JOB_SCOPES, str.lower),
    "metrics": validate.from_error(_metrics_address),
    "declared_gpus": parse_declared_gpus,
}
REQUIRED = ("planner", "node_id")


def _read_file(path: Path) -> dict[str, tuple[Any, int | None]]:
    """The file's settings as field -> (raw value, line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read the config file: {err.strerror or err}",
                          path=str(path)) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ConfigError(f"expected YAML: {problem}", path=str(path),
                          line=mark.line + 1 if mark else None) from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise ConfigError("expected a mapping of setting: value", path=str(path), line=1)
    lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
    out: dict[str, tuple[Any, int | None]] = {}
    for key, value in data.items():
        name = FILE_ALIASES.get(str(key), str(key))
        if name not in PARSERS or name == "explicit":
            known = ", ".join(sorted(PARSERS))
            raise ConfigError(f"unknown setting; expected one of {known}", path=str(path),
                              line=lines.get(str(key)), field=str(key))
        out[name] = (value, lines.get(str(key)))
    return out


def load_config(flags: Mapping[str, Any] | None = None, *,
                env_reader: Callable[[str], str | None] = settings.env) -> AgentConfig:
    """Merge defaults < config file < HULK_* variables < flags into a validated AgentConfig.

    ``flags`` maps field names to values given on the command line (None or absent: not given);
    its key "config" names the config file (else HULK_CONFIG; no file when neither is set).
    """
    flags = dict(flags or {})
    values: dict[str, Any] = {}
    explicit: set[str] = set()

    def take(name: str, raw: Any, where: str, line: int | None = None) -> None:
        try:
            values[name] = PARSERS[name](raw)
        except Invalid as bad:
            raise bad.error(ConfigError, path=where, line=line, field=name) from None
        explicit.add(name)

    config_path = flags.pop("config", None) or env_reader("HULK_CONFIG")
    if config_path:
        for name, (raw, line) in _read_file(Path(config_path)).items():
            take(name, raw, str(config_path), line)
    for name, (variable, _) in SOURCES.items():
        raw = env_reader(variable) if variable else None
        if raw is not None:
            take(name, raw, variable)
    for name, raw in flags.items():
        if name not in PARSERS:
            raise KeyError(f"{name} is not an agent setting")
        if raw is not None:
            take(name, raw, SOURCES[name][1] or name)
    for name in REQUIRED:
        if not values.get(name):
            variable, flag = SOURCES[name]
            raise ConfigError(f"required: give {flag}, set {variable} or put {name!r} in the "
                              "config file", field=name)
    _check_client_certificate(values)
    return AgentConfig(**values, explicit=frozenset(explicit))


def _check_client_certificate(values: Mapping[str, Any]) -> None:
    """A client certificate comes with its key, and only over TLS."""
    cert, key = values.get("client_cert"), values.get("client_key")
    if bool(cert) != bool(key):
        missing = "client_key" if cert else "client_cert"
        variable, flag = SOURCES[missing]
        raise ConfigError(f"a client certificate needs its key and the key its certificate: give "
                          f"{flag}, set {variable} or put {missing!r} in the config file",
                          field=missing)
    if cert and values.get("insecure"):
        raise ConfigError("a client certificate needs TLS, but insecure (plaintext gRPC) is on",
                          field="client_cert")

