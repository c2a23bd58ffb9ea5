"""AgentConfig: precedence file < HULK_* < flags, and one-line errors naming the source."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, load_config
from hulk.errors import ConfigError


def env_of(values: dict[str, str]):
    return lambda name: values.get(name)


BASE = {"planner": "planner.test:50051", "node_id": "node-1"}


def test_defaults_and_required_fields_only():
    config = load_config(BASE, env_reader=env_of({}))
    assert config == AgentConfig(planner="planner.test:50051", node_id="node-1")
    assert config.payload_bytes == 56 and config.interval_s == 60.0
    assert config.explicit == {"planner", "node_id"}


def test_file_then_env_then_flags(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_text("planner: file.test:1\nnode_id: from-file\ninterval: 30\ncity: Tokyo\n"
                    "spool_max: 5000\ninsecure: true\n")
    env = {"HULK_CONFIG": str(path), "HULK_INTERVAL": "20", "HULK_NODE_ID": "from-env"}
    config = load_config({"interval_s": "10"}, env_reader=env_of(env))
    assert config.planner == "file.test:1"          # only the file sets it
    assert config.node_id == "from-env"             # env beats file
    assert config.interval_s == 10.0                # flag beats env and file
    assert (config.city, config.spool_max, config.insecure) == ("Tokyo", 5000, True)
    assert {"interval_s", "city", "spool_max", "node_id"} <= config.explicit
    assert "timeout_s" not in config.explicit


def test_config_flag_beats_hulk_config(tmp_path: Path):
    (tmp_path / "a.yaml").write_text("node_id: a\n")
    (tmp_path / "b.yaml").write_text("node_id: b\n")
    config = load_config({"config": str(tmp_path / "b.yaml"), "planner": "p:1"},
                         env_reader=env_of({"HULK_CONFIG": str(tmp_path / "a.yaml")}))
    assert config.node_id == "b"


@pytest.mark.parametrize("flags, env, expected", [
    ({"interval_s": "soon"}, {}, "--interval: interval_s: expected seconds between 1 and 86400"),
    ({}, {"HULK_SPOOL_MAX": "-3"}, "HULK_SPOOL_MAX: spool_max: expected a whole number"),
    ({"address": "not-an-ip"}, {}, "--address: address: expected an IP address"),
    ({}, {"HULK_INSECURE": "maybe"}, "HULK_INSECURE: insecure: expected true/false"),
    ({"log_level": "loud"}, {}, "--log-level: log_level: expected one of DEBUG, INFO"),
    ({"planner": "nohostport"}, {}, "--planner: planner: expected HOST:PORT"),
    ({}, {"HULK_MQTT": "http://x"}, "HULK_MQTT: mqtt: expected a broker URL"),
    ({"ca": "/nonexistent/ca.pem"}, {}, "--ca: ca: expected a readable CA certificate file"),
    ({"site": "s" * 101}, {}, "--site: site: expected a site name of at most 100 characters"),
    ({}, {"HULK_SITE": "dc\u200b2"}, "HULK_SITE: site: expected a site name of printable"),
])
def test_bad_values_name_source_field_and_expectation(flags, env, expected):
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **flags}, env_reader=env_of(env))
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_missing_required_setting_says_how_to_give_it():
    with pytest.raises(ConfigError, match=r"node_id: required: give --node-id, set HULK_NODE_ID"):
        load_config({"planner": "p:1"}, env_reader=env_of({}))


def test_file_errors_name_file_and_line(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_text("planner: p:1\nnode_id: n\n\ntimeout: forever\n")
    with pytest.raises(ConfigError) as caught:
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))
    assert str(caught.value).startswith(f"{path}:4: timeout_s: expected seconds")

    path.write_text("planner: p:1\nnode_id: n\ncolour: blue\n")
    with pytest.raises(ConfigError, match=r":3: colour: unknown setting; expected one of"):
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))

    path.write_text("planner: [unclosed\n")
    with pytest.raises(ConfigError, match=r"agent.yaml:\d+: expected YAML"):
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))

    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))

    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(tmp_path / "missing.yaml")}))


def test_real_environment_is_read_through_hulk_settings(monkeypatch):
    monkeypatch.setenv("HULK_PLANNER", "env.test:7")
    monkeypatch.setenv("HULK_NODE_ID", "env-node")
    monkeypatch.setenv("HULK_PROBE_PORT", "7000")
    monkeypatch.delenv("HULK_CONFIG", raising=False)
    config = load_config({})
    assert (config.planner, config.node_id, config.probe_port) == ("env.test:7", "env-node", 7000)


def test_config_is_frozen():
    config = load_config(BASE, env_reader=env_of({}))
    with pytest.raises(AttributeError):
        config.node_id = "other"  # type: ignore[misc]


def test_site_comes_from_file_env_or_flag_and_defaults_to_empty(tmp_path: Path):
    """The node's site: "" leaves the node in its city's site."""
    assert load_config(BASE, env_reader=env_of({})).site == ""
    path = tmp_path / "agent.yaml"
    path.write_text("planner: p:1\nnode_id: n\ncity: Frankfurt\nsite: fra-dc2\n")
    env = {"HULK_CONFIG": str(path)}
    assert load_config({}, env_reader=env_of(env)).site == "fra-dc2"
    env["HULK_SITE"] = " aws:eu-central-1 "
    assert load_config({}, env_reader=env_of(env)).site == "aws:eu-central-1"
    config = load_config({"site": "fra-dc3"}, env_reader=env_of(env))
    assert (config.city, config.site) == ("Frankfurt", "fra-dc3")
    path.write_text("planner: p:1\nnode_id: n\nsite:\n  - a list\n")
    with pytest.raises(ConfigError, match=r"agent.yaml:3: site: expected a single value"):
        load_config({}, env_reader=env_of({"HULK_CONFIG": str(path)}))


def test_the_site_flag_of_the_command_line():
    from agent.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--planner", "p:1", "--node-id", "n", "--city", "Paris",
                                      "--site", "par-dc2"])
    assert config_from_args(args).site == "par-dc2"
