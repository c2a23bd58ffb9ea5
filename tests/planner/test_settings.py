"""The planner's HULK_* settings: the loader's checks, and what `hulk-planner` does with a bad one."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from hulk.errors import ConfigError
from hulk.settings import ENV_VARS
from planner import cli
from planner.settings import VARIABLES, PlannerSettings, load_settings
from tests.helpers.paths import REPO


def load(**variables: str) -> PlannerSettings:
    return load_settings(variables.get)


def test_defaults_when_nothing_is_set():
    assert load() == PlannerSettings()
    assert load() == PlannerSettings(db=None, listen="0.0.0.0:50051", fleet="default",
                                     insecure=False, mqtt=None, raw_days=7, window_days=90,
                                     log_level="INFO")


def test_every_variable_is_read_and_parsed():
    settings = load(HULK_DB="/var/lib/hulk/planner.db", HULK_LISTEN="[::]:6000", HULK_FLEET="eu-1",
                    HULK_INSECURE="yes", HULK_MQTT="mqtts://planner:pw@broker:8883",
                    HULK_RAW_DAYS="3", HULK_WINDOW_DAYS="30", HULK_LOG_LEVEL="debug")
    assert settings == PlannerSettings(db="/var/lib/hulk/planner.db", listen="[::]:6000",
                                       fleet="eu-1", insecure=True,
                                       mqtt="mqtts://planner:pw@broker:8883", raw_days=3,
                                       window_days=30, log_level="DEBUG")
    assert load(HULK_INSECURE="0").insecure is False
    probe = load(HULK_PROBE_PEERS="32", HULK_PROBE_SITE_REPS="3", HULK_PROBE_EPOCH="300")
    assert (probe.probe_peers, probe.probe_site_reps, probe.probe_epoch_s) == (32, 3, 300.0)


def test_every_setting_has_a_listed_variable():
    assert set(VARIABLES) == {f.name for f in fields(PlannerSettings)}
    for variable in VARIABLES.values():
        assert "planner" in ENV_VARS[variable].used_by, variable


@pytest.mark.parametrize("variable, value, expected", [
    ("HULK_RAW_DAYS", "abc", "expected a whole number of days between 1 and 36,500, got 'abc'"),
    ("HULK_RAW_DAYS", "0", "between 1 and"),
    ("HULK_RAW_DAYS", "2.5", "whole number"),
    ("HULK_RAW_DAYS", "9" * 5000, "between 1 and 36,500, got '9999"),
    ("HULK_WINDOW_DAYS", "-3", "between 1 and"),
    ("HULK_LOG_LEVEL", "verbose", "expected one of DEBUG, INFO, WARNING, ERROR, got 'verbose'"),
    ("HULK_INSECURE", "maybe", "expected true/false"),
    ("HULK_LISTEN", "50051", "expected HOST:PORT"),
    ("HULK_LISTEN", "host:99999", "expected HOST:PORT"),
    ("HULK_FLEET", "a/b", "expected 1-128 letters"),
    ("HULK_MQTT", "tcp://broker:1883", "expected mqtt://"),
    ("HULK_PROBE_PEERS", "1", "expected a whole number of peers between 2 and 10,000, got '1'"),
    ("HULK_PROBE_PEERS", "64.5", "whole number"),
    ("HULK_PROBE_SITE_REPS", "0", "between 1 and 100"),
    ("HULK_PROBE_EPOCH", "nan", "expected seconds between 10 and 604800"),
    ("HULK_PROBE_EPOCH", "inf", "expected seconds between 10 and 604800"),
    ("HULK_PROBE_EPOCH", "ten", "expected seconds"),
])
def test_a_bad_value_is_one_line_naming_the_variable(variable, value, expected):
    with pytest.raises(ConfigError) as err:
        load(**{variable: value})
    message = str(err.value)
    assert message.startswith(f"{variable}: ") and expected in message
    assert "\n" not in message
    assert err.value.exit_code == 2


def test_a_broker_password_is_not_repeated_in_the_error():
    with pytest.raises(ConfigError) as err:
        load(HULK_MQTT="mqtt://planner:s3cret@broker/path")
    assert "s3cret" not in str(err.value)


def test_the_settings_are_the_flags_defaults_and_flags_win():
    parser = cli.build_parser(PlannerSettings(db="x.db", raw_days=3, window_days=30, fleet="eu",
                                              mqtt="mqtt://b", insecure=True, log_level="DEBUG"))
    serve = parser.parse_args(["serve"])
    assert (serve.db, serve.raw_days, serve.window_days, serve.fleet_name, serve.mqtt,
            serve.insecure, serve.log_level) == ("x.db", 3, 30, "eu", "mqtt://b", True, "DEBUG")
    assert parser.parse_args(["serve", "--raw-days", "5"]).raw_days == 5
    assert parser.parse_args(["fleet", "show"]).window_days == 30
    assert parser.parse_args(["plan", "jobs.yaml", "--fleet", "f"]).fleet_name == "eu"


def planner_with(variable: str, value: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    env.update({variable: value, "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("variable, value", [
    ("HULK_RAW_DAYS", "abc"),
    ("HULK_WINDOW_DAYS", "ninety"),
    ("HULK_LOG_LEVEL", "verbose"),
])
@pytest.mark.process
def test_hulk_planner_with_a_bad_variable_exits_2_with_one_line(variable, value, tmp_path):
    result = planner_with(variable, value, "fleet", "show", "--db", str(tmp_path / "x.db"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"hulk-planner: {variable}: expected ") and repr(value) in lines[0]
    assert result.stdout == ""
