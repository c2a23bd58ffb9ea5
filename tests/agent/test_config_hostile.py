"""agent.yaml against hostile files: each setting is written once, and every text setting is
bounded as the planner takes it in Register (docs/BOUNDS.md, "agent.yaml").

Reproductions of the hostile round's findings (docs/BENCHMARKS.md): `node_id` written twice, and a
100 KiB `city`, were both accepted, so `hulk-agent --config FILE` ran (as the second id; with a
registration the planner refuses for ever) instead of refusing the file with exit code 2.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from agent import config as agent_config
from agent.config import load_config
from agent.inventory import declared_inventory
from hulk.errors import ConfigError
from hulk.wire.records import NodeLocation, RegisterRequest
from tests.helpers.paths import REPO
from tests.helpers.processes import agent_command

BASE = {"planner": "planner.test:50051", "node_id": "node-1"}
# The longest text of each text setting (docs/BOUNDS.md): Register's bound for what the agent
# sends the planner, PATH_MAX for paths, a host name and a port for HOST:PORT.
TEXT_BOUNDS = {"planner": 261, "node_id": 128, "address": 253, "city": 100, "site": 100,
               "state_dir": 4096, "token": 66, "ca": 4096, "client_cert": 4096,
               "client_key": 4096, "mqtt": 16_384, "torchrun": 4096, "metrics": 261,
               "declared_gpus": 256}
# Settings that are no single text: numbers (a Bound), choices, a boolean, lists.
NOT_TEXT = {"insecure", "log_level", "job_scope", "placement_key", "allowed_commands",
            "pass_env"}


def env_of(values: dict[str, str]):
    return lambda name: values.get(name)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "agent.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def load_file(path: Path):
    return load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))


def refusal(path: Path) -> str:
    """The one-line ConfigError loading ``path`` gives."""
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith(f"{path}:"), message
    return message


# ------------------------------------------------------------------------- each setting once

@pytest.mark.parametrize("text, key, line, first", [
    ("planner: p:1\nnode_id: tokyo-1\ncity: Tokyo\nnode_id: tokyo-2\n", "node_id", 4, 2),
    ("planner: p:1\nnode_id: n\ncity: Tokyo\n\ncity: Osaka\n", "city", 5, 3),
    ("planner: p:1\nnode_id: n\nallowed_commands:\n  - [python, a.py]\nallowed_commands: []\n",
     "allowed_commands", 5, 3),
])
def test_a_key_written_twice_is_refused_naming_the_file_the_key_and_its_lines(
        tmp_path, text, key, line, first):
    path = write(tmp_path, text)
    message = refusal(path)
    assert message.startswith(f"{path}:{line}: "), message
    assert f"duplicate key '{key}' (first on line {first}" in message, message


@pytest.mark.parametrize("text, field, line", [
    ("planner: p:1\nnode_id: n\ninterval: 30\ninterval_s: 40\n", "interval_s", 4),
    ("planner: p:1\nnode-id: a\nnode_id: b\n", "node_id", 3),
])
def test_a_setting_given_under_two_of_its_names_is_refused(tmp_path, text, field, line):
    path = write(tmp_path, text)
    message = refusal(path)
    assert message.startswith(f"{path}:{line}: {field}: given twice"), message


# ------------------------------------------------------------------------------ text bounds

def test_every_text_setting_has_its_bound():
    from hulk.validate import Bound

    assert {name: limit for name, (limit, _) in agent_config.TEXT_LIMITS.items()} == TEXT_BOUNDS
    rest = {name for name, parse in agent_config.PARSERS.items() if not isinstance(parse, Bound)}
    assert rest - set(TEXT_BOUNDS) == NOT_TEXT, "a text setting without a TEXT_LIMITS row"


@pytest.mark.parametrize("name", sorted(TEXT_BOUNDS))
def test_every_text_setting_past_its_bound_is_refused_naming_the_field_and_the_bound(tmp_path,
                                                                                      name):
    limit = TEXT_BOUNDS[name]
    path = write(tmp_path, yaml.safe_dump({**BASE, name: "x" * (limit + 1)}, width=10**9))
    message = refusal(path)
    assert f": {name}: expected " in message, message
    assert f"of at most {limit:,} characters, got {limit + 1:,}" in message, message


def test_the_hostile_rounds_100_kib_city_is_refused_from_file_variable_and_flag(tmp_path):
    city = "x" * (100 << 10)
    path = write(tmp_path, yaml.safe_dump({**BASE, "city": city}, sort_keys=False, width=10**9))
    assert refusal(path).startswith(f"{path}:3: city: expected a city name of at most 100 "
                                    "characters, got 102,400")
    with pytest.raises(ConfigError, match=r"^HULK_CITY: city: expected a city name of at most"):
        load_config(BASE, env_reader=env_of({"HULK_CITY": city}))
    with pytest.raises(ConfigError, match=r"^--city: city: expected a city name of at most"):
        load_config({**BASE, "city": city}, env_reader=env_of({}))


def test_text_settings_at_their_bound_are_kept(tmp_path):
    values = {"city": "c" * 100, "site": "s" * 100, "token": "t" * 66, "torchrun": "r" * 4096,
              "node_id": "n" * 128}
    config = load_file(write(tmp_path, yaml.safe_dump({**BASE, **values}, width=10**9)))
    assert {name: getattr(config, name) for name in values} == values


@pytest.mark.parametrize("name, value", [
    ("city", "Tok\x1byo"), ("torchrun", "/opt/torch\nrun"), ("token", "hulk1.x\x00y"),
    ("planner", "host\x07:50051"),
])
def test_a_control_character_in_a_text_setting_is_refused(name, value):
    variable = agent_config.SOURCES[name][0]
    with pytest.raises(ConfigError, match=fr"^{variable}: {name}: expected .* without control"):
        load_config(BASE, env_reader=env_of({variable: value}))


def test_a_token_with_a_space_is_refused_before_grpc_metadata_sees_it():
    with pytest.raises(ConfigError, match=r"^HULK_TOKEN: token: expected a token of visible ASCII"):
        load_config(BASE, env_reader=env_of({"HULK_TOKEN": "hulk1 secret"}))


def test_the_register_bounds_are_the_planners():
    """The agent may not import the planner: its copies of admission's numbers are held here."""
    from agent.inventory import MAX_DECLARED_GPUS, MAX_NAME_CHARS
    from planner.security.credentials import TOKEN_PREFIX, TOKEN_RE
    from planner.service import admission as adm

    limits = agent_config.TEXT_LIMITS
    assert agent_config.CITY_MAX_CHARS == limits["city"][0] == adm.TEXT_LIMITS["city"]
    assert limits["site"][0] == adm.TEXT_LIMITS["site"]
    assert limits["address"][0] == agent_config.ADDRESS_MAX_CHARS
    assert agent_config.MAX_ALLOWED_COMMANDS == adm.MAX_ALLOWED_COMMANDS
    assert agent_config.MAX_PREFIX_CHARS == adm.MAX_PREFIX_CHARS
    assert (MAX_DECLARED_GPUS, MAX_NAME_CHARS) == (adm.MAX_GPUS, adm.TEXT_LIMITS["gpu.name"])
    longest_host = ".".join(["a" * 63] * 3 + ["a" * 61])
    assert len(adm.check_address(longest_host)) == agent_config.ADDRESS_MAX_CHARS
    with pytest.raises(Exception):
        adm.check_address(longest_host + "a")
    token = f"{TOKEN_PREFIX}.{'0' * 16}.{'A' * 43}"
    assert TOKEN_RE.fullmatch(token) and len(token) == agent_config.TOKEN_MAX_CHARS


def test_a_registration_from_settings_at_their_bounds_is_admitted_and_fits_register(tmp_path):
    from planner.service.admission import check_registration
    from planner.service.ingest import ServerLimits

    wide = "\U0001d54f"     # 4 bytes in UTF-8: the most a character costs on the wire
    commands = [["python", "/opt/jobs/" + "a" * 220] for _ in range(64)]
    settings = {**BASE, "node_id": "n" * 128, "city": wide * 100, "site": wide * 100,
                "address": "2001:db8::1", "declared_gpus": f"64x{wide * 128}:80",
                "allowed_commands": commands}
    config = load_file(write(tmp_path, yaml.safe_dump(settings, width=10**9)))
    request = RegisterRequest(node_id=config.node_id, hostname="h" * 255,
                              location=NodeLocation(config.city, (35.7, 139.7), config.site),
                              agent_version="v" * 64,
                              inventory=declared_inventory(config.declared_gpus),
                              address=config.address, probe_port=65535, throughput_port=65535,
                              allowed_commands=config.allowed_commands)
    assert check_registration(request) is request
    assert request.to_proto().ByteSize() <= ServerLimits().max_register_bytes


def test_commands_each_admitted_but_past_registers_size_are_refused(tmp_path):
    """64 prefixes of 4,000 characters pass admission's per-prefix check, but no Register of
    256 KiB is read: the agent refuses them rather than registering in vain for ever."""
    from planner.service.admission import check_allowed_commands

    commands = [["python", "a" * 4000] for _ in range(64)]
    check_allowed_commands(tuple(tuple(c) for c in commands))
    path = write(tmp_path, yaml.safe_dump({**BASE, "allowed_commands": commands}, width=10**9))
    message = refusal(path)
    assert ": allowed_commands: expected commands of at most 16,384 bytes" in message, message


@pytest.mark.parametrize("commands, expected", [
    ([["python", f"/opt/j{i}.py"] for i in range(65)], "at most 64 commands"),
    ([["python"] + ["x"] * 256], "1 to 256 non-empty printable words"),
    ([["python", "a" * 4096]], "4,096 characters in all"),
    ([["python", ""]], "non-empty printable words"),
    ([["python", "train\x1b[2J.py"]], "non-empty printable words"),
    (["python 'unclosed"], "split as a shell would"),
])
def test_allowed_commands_past_what_register_takes_are_refused(tmp_path, commands, expected):
    path = write(tmp_path, yaml.safe_dump({**BASE, "allowed_commands": commands}, width=10**9))
    message = refusal(path)
    assert ": allowed_commands: expected " in message and expected in message, message


def test_list_settings_are_bounded(tmp_path):
    path = write(tmp_path, yaml.safe_dump({**BASE, "pass_env": [f"V{i}" for i in range(257)]}))
    assert "pass_env: expected at most 256 variable names" in refusal(path)
    path = write(tmp_path, yaml.safe_dump({**BASE, "pass_env": ["V" * 129]}))
    assert "pass_env: expected variable names of at most 128 characters" in refusal(path)
    keys = [f"ed25519:{'A' * 43}=" for _ in range(9)]
    path = write(tmp_path, yaml.safe_dump({**BASE, "placement_key": keys}))
    assert "placement_key: expected at most 8 public keys" in refusal(path)


# ------------------------------------------------------------------------ the file as a whole

def test_a_file_past_one_mib_is_refused_unread(tmp_path):
    path = write(tmp_path, "planner: p:1\nnode_id: n\n" + "# padding\n" * 110_000)
    assert "cannot read the config file: expected an agent config file of at most 1,048,576" \
        in refusal(path)


@pytest.mark.parametrize("text, expected", [
    (b"planner: p:1\nnode_id: n\ncity: \xff\xfe\n",
     "expected UTF-8 text (YAML), got the byte 0xff"),
    ("planner: " + "[" * 20_000 + "\n", "not an agent config file: YAML nested too deeply"),
    ("planner: p:1\nnode_id: n\ncity: " + "9" * 5000 + "\n", ": expected YAML: Exceeds the limit"),
])
def test_a_file_no_yaml_reader_takes_is_one_line_not_a_traceback(tmp_path, text, expected):
    path = write(tmp_path, text)
    assert expected in refusal(path)


def test_a_path_the_system_cannot_look_up_is_refused_not_raised(tmp_path):
    path = write(tmp_path, f"planner: p:1\nnode_id: n\nca: /{'a' * 300}/ca.pem\n")
    assert ":3: ca: expected a readable CA certificate file" in refusal(path)


# ------------------------------------------------------------------------------ the real CLI

@pytest.mark.process
@pytest.mark.parametrize("text, expected", [
    ("planner: 127.0.0.1:9\nnode_id: tokyo-1\ninsecure: true\nnode_id: tokyo-2\n",
     ":4: expected YAML: duplicate key 'node_id' (first on line 2"),
    ("planner: 127.0.0.1:9\nnode_id: n\ninsecure: true\ncity: " + "x" * (100 << 10) + "\n",
     ":4: city: expected a city name of at most 100 characters, got 102,400"),
])
def test_hulk_agent_refuses_the_file_at_once_with_exit_2_and_one_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    try:
        result = subprocess.run([*agent_command(), "--config", str(path), "--state-dir",
                                 str(tmp_path / "state")], cwd=REPO, capture_output=True,
                                text=True, timeout=20, env=clean)
    except subprocess.TimeoutExpired:
        pytest.fail("hulk-agent took the file and ran instead of refusing it")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"hulk-agent: {path}{expected}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_broker_url_refused_never_shows_its_password():
    from agent.config import load_config
    from hulk.errors import ConfigError

    for url in ("mqtp://hulk:s3cret@broker:1883", "mqtt:/hulk:s3cret@broker",
                "mqtt://hulk:se/cr et@", "mqtts://hulk:s3cret@broker?ca=/nope&cert=/x"):
        try:
            load_config({"planner": "p:1", "node_id": "n1", "mqtt": url},
                        env_reader=lambda name: None)
        except ConfigError as err:
            assert "s3cret" not in str(err) and "se/cr" not in str(err), str(err)
