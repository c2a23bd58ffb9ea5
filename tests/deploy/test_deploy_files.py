"""The shipped deploy/ files: units that systemd accepts, an agent config the agent accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
DEPLOY = REPO / "deploy"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze not installed (Debian package 'systemd'; `make install` installs it)")


def _directives(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    text = unit.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(unit: Path, tmp_path: Path, program: str) -> None:
    """`systemd-analyze verify` on a copy of ``unit`` whose ExecStart runs this checkout's program
    with the venv's Python (the installed /usr/local/bin path does not exist on a test machine).
    Everything else is verified exactly as shipped."""
    text = unit.read_text()
    shipped = f"/usr/local/bin/{program}"
    assert f"ExecStart={shipped} " in text
    module = {"hulk-agent": "agent", "hulk-planner": "planner.cli"}[program]
    copy = tmp_path / unit.name
    copy.write_text(text.replace(f"ExecStart={shipped} ", f"ExecStart={sys.executable} -m {module} "))
    done = subprocess.run([SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True,
                          timeout=60)
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if unit.name in line]
    assert done.returncode == 0, done.stderr
    assert complaints == [], complaints   # unknown keys and bad values are only warnings


@pytest.mark.process
@needs_systemd
def test_agent_unit_verifies(tmp_path):
    _verify(DEPLOY / "hulk-agent.service", tmp_path, "hulk-agent")


@pytest.mark.process
@needs_systemd
def test_planner_unit_verifies(tmp_path):
    _verify(DEPLOY / "hulk-planner.service", tmp_path, "hulk-planner")


@pytest.mark.process
@needs_systemd
def test_verify_catches_a_broken_unit(tmp_path):
    """The check above is not vacuous: a misspelt directive is reported."""
    src = tmp_path / "src"
    src.mkdir()
    broken = src / "hulk-agent.service"
    broken.write_text((DEPLOY / "hulk-agent.service").read_text()
                      .replace("WatchdogSec=", "WatchdogSecs="))
    with pytest.raises(AssertionError, match="Unknown key"):
        _verify(broken, tmp_path, "hulk-agent")


def test_agent_unit_has_the_required_service_settings():
    d = _directives(DEPLOY / "hulk-agent.service")
    assert d["Type"] == ["notify"]
    assert int(d["WatchdogSec"][0]) > 0
    assert d["Restart"] == ["on-failure"]
    assert d["KillMode"] == ["process"]      # stopping or upgrading the agent leaves training running
    assert d.get("DynamicUser") == ["yes"] or d.get("User")
    assert d["StateDirectory"] == ["hulk-agent"]
    assert d["AmbientCapabilities"] == ["CAP_NET_RAW"]
    assert d["CapabilityBoundingSet"] == ["CAP_NET_RAW"]
    # NVML needs /dev/nvidia*: devices are filtered, not hidden.
    assert "PrivateDevices" not in d or d["PrivateDevices"] == ["no"]
    assert any("nvidia" in v for v in d["DeviceAllow"])
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectKernelModules", "RestrictSUIDSGID"):
        assert hardening in d


def test_planner_unit_keeps_its_key_out_of_the_service_user_reach():
    d = _directives(DEPLOY / "hulk-planner.service")
    assert d["User"] == ["hulk-planner"]
    assert any(v.startswith("tls.key:") for v in d["LoadCredential"])
    exec_start = d["ExecStart"][0]
    assert "--tls-cert" in exec_start and "${CREDENTIALS_DIRECTORY}/tls.key" in exec_start
    assert "--insecure" not in exec_start


def test_example_agent_config_is_accepted_by_the_agent(tmp_path):
    from agent.config import load_config

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    text = (DEPLOY / "agent.yaml").read_text()
    assert "token" not in re.sub(r"#.*", "", text), "the token belongs in agent.env, not the YAML"
    config_file = tmp_path / "agent.yaml"
    config_file.write_text(text.replace("/etc/hulk/tls/ca.pem", str(ca)))
    assert "BROKER-PASSWORD" not in re.sub(r"#.*", "", text), "passwords belong in agent.env"
    # agent.env, as INSTALL.md writes it, gives the broker URL with its password.
    install = (DEPLOY / "INSTALL.md").read_text()
    url = re.search(r"echo 'HULK_MQTT=(mqtts://[^']+)'", install).group(1)   # the agent's, not the planner's
    url = url.replace("<broker password>", "secret").replace("/etc/hulk/tls/ca.pem", str(ca))
    config = load_config({"config": str(config_file)},
                         env_reader=lambda name: url if name == "HULK_MQTT" else None)
    assert config.node_id and not config.insecure and config.ca == ca
    assert config.state_dir == Path("/var/lib/hulk-agent")
    from hulk.wire.broker import parse_broker_url
    broker = parse_broker_url(config.mqtt)      # what the placement subscriber connects with
    assert broker.tls and broker.port == 8883 and broker.ca == str(ca)
    assert broker.username == config.node_id


def test_shipped_broker_config_denies_anonymous_and_requires_tls():
    text = (DEPLOY / "mosquitto" / "hulk.conf").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert "allow_anonymous false" in lines
    assert "per_listener_settings false" in lines
    assert any(line.startswith("password_file ") for line in lines)
    assert any(line.startswith("acl_file ") for line in lines)
    listeners = [line for line in lines if line.startswith("listener ")]
    # Every listener reachable from outside has a certificate; the plaintext one is loopback only.
    for listener in listeners:
        if not listener.endswith("127.0.0.1"):
            block = text.split(listener, 1)[1].split("\nlistener ", 1)[0]
            assert "certfile " in block and "keyfile " in block


@pytest.mark.process
@needs_systemd
@pytest.mark.parametrize("unit, ceiling", [("hulk-agent.service", 2.0), ("hulk-planner.service", 1.5)])
def test_units_score_low_exposure_in_systemd_analyze_security(unit, ceiling):
    """Hardening kept: system-call filter, /proc protections, private mounts, umask 0077.
    Before this hardening the scores were 3.7 (agent) and 1.9 (planner)."""
    done = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=yes", str(DEPLOY / unit)],
                          capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", done.stdout)
    assert found, done.stdout[-500:] + done.stderr
    assert float(found.group(1)) <= ceiling and found.group(2) in ("SAFE", "OK", "PERFECT")
    d = _directives(DEPLOY / unit)
    assert "@system-service" in d["SystemCallFilter"] and d["UMask"] == ["0077"]
    assert d["ProtectProc"] == ["invisible"] and d["SystemCallErrorNumber"] == ["EPERM"]


def test_agent_requirements_pin_every_agent_dependency_with_hashes():
    """deploy/agent-requirements.txt (`make agent-requirements`) covers pyproject's agent
    dependencies, each pinned to one version that satisfies pyproject's range, each with hashes."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {Requirement(r).name.lower(): Requirement(r) for r in project["dependencies"]}
    text = (DEPLOY / "agent-requirements.txt").read_text().replace("\\\n", " ")
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *hashes = line.split("--hash=")
        name, _, version = spec.strip().partition("==")
        assert version, f"not pinned: {line}"
        assert hashes and all(h.strip().startswith("sha256:") for h in hashes), name
        pins[name.lower()] = (version.strip(), hashes)
    for name, requirement in wanted.items():
        assert name in pins, f"{name} is not pinned in agent-requirements.txt"
        assert requirement.specifier.contains(pins[name][0]), (name, pins[name][0])
    direct = {Requirement(line).name.lower() for line in
              (DEPLOY / "agent-requirements.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert direct == set(wanted), "agent-requirements.in differs from pyproject's dependencies"
    assert "--require-hashes -r /path/to/hulk/deploy/agent-requirements.txt" in \
        (DEPLOY / "INSTALL.md").read_text()


def test_mosquitto_limits_drop_in_and_nftables_rules_are_shipped_as_installed():
    limits = (DEPLOY / "mosquitto" / "limits.conf").read_text()
    assert "[Service]\nLimitNOFILE=65536" in limits
    rules = (DEPLOY / "nftables" / "hulk-broker.nft").read_text()
    assert "tcp dport 8883" in rules and "ct count over 256" in rules
    install = (DEPLOY / "INSTALL.md").read_text()
    assert "deploy/nftables/hulk-broker.nft" in install and "deploy/mosquitto/limits.conf" in install
    conf = (DEPLOY / "mosquitto" / "hulk.conf").read_text()
    # a listener setting: one per listener, never above the first (that opens 0.0.0.0:1883)
    assert conf.count("use_username_as_clientid true") == conf.count("\nlistener ")
    assert conf.index("use_username_as_clientid") > conf.index("\nlistener ")
