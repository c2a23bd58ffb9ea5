"""The agent's settings: one validated, frozen AgentConfig.

Sources, lowest to highest precedence: defaults < YAML config file < HULK_* variables < flags.
Every bad value raises ConfigError naming its source (file and line, variable or flag), the field
and what was expected, in one line. The file is a regular file of at most 1 MiB, each setting
written once (a key twice, or a field under two of its names, is refused rather than the last
one winning), and every text setting has a length bound: the planner's bound for what the agent
sends it in Register (a longer city would have every registration refused, for ever), PATH_MAX
for a path (docs/BOUNDS.md lists them all).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.jobproc import SCOPES as JOB_SCOPES
from hulk import settings, validate
from hulk.errors import ConfigError, InputError
from hulk.userfile import line_of, load_yaml, read_user_file
from hulk.v1 import hulk_pb2
from hulk.validate import Bound, Invalid
from agent.inventory import parse_declared_gpus
from hulk.wire.broker import hide_password, parse_broker_url
from hulk.wire.placement import MAX_COMMAND_WORDS, MAX_PATH
from hulk.wire.records import SITE_MAX_CHARS, GpuInfo, ProbeSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_STATE_DIR = Path("/var/lib/hulk-agent")
# Probe settings the operator leaves unset default to what the planner pushes (one set of
# defaults, hulk.wire); the planner's answer replaces them at registration.
PROBE_DEFAULTS = ProbeSettings()

MAX_CONFIG_FILE_BYTES = 1 << 20   # every setting at its bound fits many times over
# What Register carries, bounded as the planner's admission checks it (planner/service/
# admission.py, which the agent may not import; tests/agent/test_config_hostile.py holds the
# numbers equal): a value past one would have every registration refused.
CITY_MAX_CHARS = 100
ADDRESS_MAX_CHARS = 253           # a DNS name's longest; admission's bound on address
MAX_ALLOWED_COMMANDS = 64         # argv prefixes in one registration
MAX_PREFIX_CHARS = 4096           # all the words of one prefix
# Their share of Register's 64 KiB (ServerLimits.max_register_bytes), encoded: the rest of a
# registration at its bounds (64 declared GPUs of 128-character names, city, site) stays under
# 40 KiB, so every registration this config makes fits; 64 prefixes of 256 bytes fill it.
ALLOWED_COMMANDS_MAX_BYTES = 16 << 10
# The only token the planner accepts is hulk1.<16 hex digits>.<43 base64url characters>.
TOKEN_MAX_CHARS = 66
# Settings the agent keeps to itself, bounded by what they are.
HOST_PORT_MAX_CHARS = 261         # [a 253-character host name]:65535
URL_MAX_CHARS = 16_384            # a broker URL: a host, a password and three paths (?ca=...)
DECLARED_GPUS_MAX_CHARS = 256     # COUNTxNAME:GB with a 128-character GPU name
MAX_PLACEMENT_KEYS = 8            # two while the planner's key is rotated
MAX_PASS_ENV = 256                # variable names passed to jobs
ENV_NAME_MAX_CHARS = 128

# Text settings: field -> (most characters, what the value is). Every value of them, from the
# file, a variable or a flag, is stripped text of at most that many characters without control
# characters (hulk.validate.bounded_text) before its own check.
TEXT_LIMITS: dict[str, tuple[int, str]] = {
    "planner": (HOST_PORT_MAX_CHARS, "HOST:PORT"),
    "node_id": (128, "a node id"),              # and validate.NAME_RE's characters
    "address": (ADDRESS_MAX_CHARS, "an IP address"),
    "city": (CITY_MAX_CHARS, "a city name"),
    "site": (SITE_MAX_CHARS, "a site name"),
    "state_dir": (MAX_PATH, "a path"),
    "token": (TOKEN_MAX_CHARS, "a token"),
    "ca": (MAX_PATH, "a path"),
    "client_cert": (MAX_PATH, "a path"),
    "client_key": (MAX_PATH, "a path"),
    "mqtt": (URL_MAX_CHARS, "a broker URL"),
    "torchrun": (MAX_PATH, "a path or a command name"),
    "metrics": (HOST_PORT_MAX_CHARS, "HOST:PORT"),
    "declared_gpus": (DECLARED_GPUS_MAX_CHARS, "a declared GPU inventory"),
}


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


def _bounded(name: str, parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse``, after the length and character check of ``TEXT_LIMITS[name]`` (a value left
    empty in YAML, None, goes to ``parse`` as it is)."""
    max_chars, what = TEXT_LIMITS[name]

    def parser(value: Any) -> Any:
        if value is not None:
            validate.bounded_text(value, max_chars, what)
        return parse(value)
    return parser


def _token(value: Any) -> str:
    text = validate.single(value)
    if not re.fullmatch(r"[\x21-\x7e]*", text):
        raise Invalid("expected a token of visible ASCII characters (hulk1.<id>.<secret>, as "
                      "enroll printed it)")
    return text


def _path(value: Any) -> Path:
    text = validate.single(value)
    if not text:
        raise Invalid("expected a path, got an empty value")
    return Path(text).expanduser()


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False too for one the system cannot look up (a name
    component past NAME_MAX, which Path.is_file raises for)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _pem_file(what: str, pem: bool = True) -> Callable[[Any], Path | None]:
    def parse(value: Any) -> Path | None:
        text = validate.single(value)
        if not text:
            return None
        path = Path(text).expanduser()
        if not _is_file(path):
            kind = " (PEM)" if pem else ""
            raise Invalid(f"expected a readable {what} file{kind}, "
                          f"{validate.shown(text, 80)} does not exist")
        return path
    return parse


def _mqtt(value: Any) -> str:
    text = validate.single(value)
    if text and not re.match(r"^mqtts?://[^/\s]+", text):
        raise Invalid("expected a broker URL mqtt://[user:pass@]HOST:PORT, got "
                      f"{hide_password(text)!r}")
    if "cert=" in text or "key=" in text:  # a client certificate for the broker: check now
        try:
            broker = parse_broker_url(text, source="")
        except ConfigError as err:
            raise Invalid(str(err)) from None
        for what, path in (("cert", broker.cert), ("key", broker.key)):
            if path and not _is_file(Path(path)):
                raise Invalid(f"expected a readable file for {what}=, {validate.shown(path, 80)} "
                              "does not exist")
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
        if len(texts) > MAX_PLACEMENT_KEYS:
            raise Invalid(f"expected at most {MAX_PLACEMENT_KEYS} public keys, got {len(texts)}")
        for text in texts:
            validate.bounded_text(text, MAX_PATH, "a public key (ed25519:<base64> or a PEM file)")
        if texts:
            Verifier.from_text(texts, field=None)
    except InputError as exc:
        raise Invalid(str(exc)) from None
    return texts


def _allowed_commands(value: Any) -> tuple[tuple[str, ...], ...]:
    """A list of argv prefixes (each a list, or a string split as a shell would); a variable
    separates them with ';'. Bounded as the planner's admission takes them in Register: at most
    MAX_ALLOWED_COMMANDS prefixes of 1 to MAX_COMMAND_WORDS printable words, MAX_PREFIX_CHARS
    characters in all."""
    import shlex
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list) and not isinstance(value, str):
        raise Invalid("expected a list of commands (argv prefixes such as [python, train.py])")
    out = []
    for item in items:
        try:
            argv = shlex.split(item) if isinstance(item, str) else item
        except ValueError as exc:   # an unclosed quote
            raise Invalid(f"expected a command split as a shell would, got {validate.shown(item)}"
                          f" ({exc})") from None
        if not isinstance(argv, list) or not all(isinstance(a, (str, int, float)) for a in argv):
            raise Invalid(f"expected a command as a string or a list of strings, got "
                          f"{validate.shown(item)}")
        if not argv:
            continue
        words = tuple(str(a) for a in argv)
        if (len(words) > MAX_COMMAND_WORDS or sum(map(len, words)) > MAX_PREFIX_CHARS
                or not all(word and word.isprintable() for word in words)):
            raise Invalid(f"expected a command of 1 to {MAX_COMMAND_WORDS} non-empty printable "
                          f"words, {MAX_PREFIX_CHARS:,} characters in all, got "
                          f"{validate.shown(list(words))}")
        out.append(words)
    if len(out) > MAX_ALLOWED_COMMANDS:
        raise Invalid(f"expected at most {MAX_ALLOWED_COMMANDS} commands (argv prefixes), got "
                      f"{len(out)}")
    size = hulk_pb2.RegisterRequest(
        allowed_commands=[hulk_pb2.CommandPrefix(argv=list(p)) for p in out]).ByteSize()
    if size > ALLOWED_COMMANDS_MAX_BYTES:
        raise Invalid(f"expected commands of at most {ALLOWED_COMMANDS_MAX_BYTES:,} bytes in all "
                      f"as Register sends them, got {size:,}")
    return tuple(out)


def _pass_env(value: Any) -> tuple[str, ...]:
    names = validate.identifiers(value)
    if len(names) > MAX_PASS_ENV:
        raise Invalid(f"expected at most {MAX_PASS_ENV} variable names, got {len(names)}")
    long = next((n for n in names if len(n) > ENV_NAME_MAX_CHARS), None)
    if long is not None:
        raise Invalid(f"expected variable names of at most {ENV_NAME_MAX_CHARS} characters, "
                      f"got one of {len(long):,}")
    return names


PARSERS: dict[str, Callable[[Any], Any]] = {
    "planner": _bounded("planner", lambda v: validate.host_port(v, "planner.example.org:50051")),
    "node_id": _bounded("node_id", validate.name),
    "address": _bounded("address", validate.ip_address),
    "city": _bounded("city", validate.single),
    "site": _bounded("site", lambda v: validate.printable(v, SITE_MAX_CHARS, "a site name")),
    "interval_s": Bound(1.0, 86400.0, "seconds"),
    "state_dir": _bounded("state_dir", _path),
    "insecure": validate.boolean,
    "token": _bounded("token", _token),
    "ca": _bounded("ca", _pem_file("CA certificate", pem=False)),
    "client_cert": _bounded("client_cert", _pem_file("client certificate")),
    "client_key": _bounded("client_key", _pem_file("client private key")),
    "mqtt": _bounded("mqtt", _mqtt),
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
    "pass_env": _pass_env,
    "torchrun": _bounded("torchrun", validate.single),
    "job_scope": lambda v: validate.choice(v, JOB_SCOPES, str.lower),
    "metrics": _bounded("metrics", validate.from_error(_metrics_address)),
    "declared_gpus": _bounded("declared_gpus", parse_declared_gpus),
}
REQUIRED = ("planner", "node_id")


def _read_file(path: Path) -> dict[str, tuple[Any, int | None]]:
    """The file's settings as field -> (raw value, line)."""
    where = str(path)
    try:
        raw = read_user_file(path, "an agent config file", MAX_CONFIG_FILE_BYTES)
    except InputError as err:
        raise ConfigError(f"cannot read the config file: {str(err).removeprefix(where + ': ')}",
                          path=where) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"expected UTF-8 text (YAML), got the byte 0x{raw[err.start]:02x} at "
                          f"offset {err.start:,}", path=where) from None
    data = load_yaml(text, where, "an agent config file", kind=ConfigError, lead="expected YAML")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of setting: value", path=where, line=1)
    out: dict[str, tuple[Any, int | None]] = {}
    keys: dict[str, str] = {}       # field -> the key that set it (a field or an alias)
    for key, value in data.items():
        line = line_of(data, key)
        name = FILE_ALIASES.get(str(key), str(key))
        if name not in PARSERS or name == "explicit":
            known = ", ".join(sorted(PARSERS))
            label = str(key)
            if len(label) > 64 or not label.isprintable():
                label = validate.shown(label, 64)
            raise ConfigError(f"unknown setting; expected one of {known}", path=where,
                              line=line, field=label)
        if name in out:             # interval_s and its alias interval (YAML saw two keys)
            raise ConfigError(f"given twice, as {keys[name]!r} on line {out[name][1]} and as "
                              f"{str(key)!r} (expected each setting once)", path=where,
                              line=line, field=name)
        out[name], keys[name] = (value, line), str(key)
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

