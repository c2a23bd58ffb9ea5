"""What a lab operator reaches, without processes: lab.run's --dashboard/--metrics flags and the
lines it prints (lab.endpoints), the operator's broker account (lab.secure), a restart that keeps
the flags a service was started with and the ones lab.ctl adds (lab.services.with_args), and
the order the lab stops its services in."""

from __future__ import annotations

import json
import stat
import subprocess

import pytest

from lab import ctl
from lab import endpoints
from lab import run as lab_run
from lab import secure
from lab import services as lab_services
from lab.netns import LabError
from lab.services import Services, stop_stages, with_args

SERVE = ["python", "-m", "planner.cli", "serve", "--db", "p.db", "--listen", "10.77.0.1:50051",
         "--tls-cert", "s.pem", "--tls-key", "s.key", "--throughput-period", "300"]


def test_lab_run_takes_dashboard_and_metrics_flags_with_the_install_guides_addresses():
    parse = lab_run.build_parser().parse_args
    args = parse(["--secure", "--dashboard", "--metrics"])
    assert (args.dashboard, args.metrics) == ("10.77.0.1:8443", "127.0.0.1:9108")
    args = parse(["--dashboard", "127.0.0.1:9000", "--metrics", "10.77.0.1:9108"])
    assert (args.dashboard, args.metrics) == ("127.0.0.1:9000", "10.77.0.1:9108")
    assert (parse([]).dashboard, parse([]).metrics) == (None, None)


def test_serve_gets_the_dashboard_with_a_private_token_and_metrics(tmp_path):
    token = endpoints.make_token(tmp_path)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text().strip()) == 64
    assert endpoints.make_token(tmp_path).read_text() == token.read_text()     # kept
    assert endpoints.serve_flags(endpoints.DASHBOARD, endpoints.METRICS, token) == [
        "--dashboard", "10.77.0.1:8443", "--dashboard-token", str(token),
        "--metrics", "127.0.0.1:9108"]
    assert endpoints.serve_flags(None, None, None) == []
    assert endpoints.host_port("10.77.0.1:8443") == ("10.77.0.1", 8443)


def test_the_printed_lines_reach_each_endpoint_from_the_hub(tmp_path):
    hub = secure.SecureHub(tls=tmp_path / "tls", broker_dir=tmp_path / "b",
                           broker_conf=tmp_path / "m.conf", planner_mqtt="", fleet="lab",
                           operator_password="pw-1")
    token = tmp_path / "dashboard.token"
    lines = endpoints.access_lines("NS", "ignored", dashboard=endpoints.DASHBOARD,
                                   metrics=endpoints.METRICS, token=token, hub=hub,
                                   mqtt_port=1883)
    text = "\n".join(lines)
    assert "lab: dashboard https://10.77.0.1:8443/" in text
    assert (f"ip netns exec NS curl -s --cacert {hub.ca} -H \"Authorization: Bearer $(cat "
            f"{token})\" https://10.77.0.1:8443/api/fleet") in text
    assert "ip netns exec NS curl -s http://127.0.0.1:9108/metrics | grep '^hulk_nodes'" in text
    assert "broker account hulk-operator, password pw-1: reads hulk/v1/lab/#" in text
    assert (f"ip netns exec NS mosquitto_sub -h 10.77.0.1 -p 8883 --cafile {hub.ca} "
            "-u hulk-operator -P pw-1 -t 'hulk/v1/lab/#'") in text
    plain = "\n".join(endpoints.access_lines("NS", "default", dashboard=None, metrics=None,
                                             token=None, mqtt_port=1883))
    assert "dashboard" not in plain and "metrics" not in plain
    assert "mosquitto_sub -h 10.77.0.1 -p 1883 -t 'hulk/v1/default/#'" in plain


def test_the_operator_account_reads_the_fleets_topics_only(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(secure.subprocess, "run", lambda argv, **kw: calls.append(argv) or
                        subprocess.CompletedProcess(argv, 0, "", ""))
    (tmp_path / "acl").write_text("# enroll's\n\nuser n1\ntopic read hulk/v1/+/nodes/n1/placement\n")
    secure.add_operator(tmp_path, "default", "pw")
    secure.add_operator(tmp_path, "default", "pw")             # once in the acl
    assert calls[0] == ["mosquitto_passwd", "-b", str(tmp_path / "passwd"), "hulk-operator", "pw"]
    acl = (tmp_path / "acl").read_text()
    assert acl.count("user hulk-operator") == 1
    block = acl.split("user hulk-operator\n")[1]
    assert block.strip().splitlines() == ["topic read hulk/v1/default/#"]
    assert "user n1\ntopic read hulk/v1/+/nodes/n1/placement" in acl     # enroll's untouched
    with pytest.raises(Exception):
        secure.operator_acl("no/slash")


def test_a_restart_keeps_the_flags_serve_was_started_with_and_those_added_later():
    assert with_args(SERVE) == SERVE
    added = with_args(SERVE, ["--dashboard", "10.77.0.1:8443", "--dashboard-token", "t",
                              "--metrics", "127.0.0.1:9108"])
    assert added == SERVE + ["--dashboard", "10.77.0.1:8443", "--dashboard-token", "t",
                             "--metrics", "127.0.0.1:9108"]
    moved = with_args(added, ["--metrics=127.0.0.1:9109", "--throughput-on-busy"])
    assert moved.count("--metrics") == 0 and moved[-2:] == ["--metrics=127.0.0.1:9109",
                                                           "--throughput-on-busy"]
    assert "--dashboard" in moved and "--throughput-period" in moved
    dropped = with_args(moved, drop=["--dashboard", "--dashboard-token", "--throughput-on-busy"])
    assert dropped == SERVE + ["--metrics=127.0.0.1:9109"]
    assert with_args(["x", "--node-timeout", "-1"], drop=["--node-timeout"]) == ["x"]
    with pytest.raises(LabError, match="expected flags"):
        with_args(SERVE, ["10.77.0.1:8443"])


class _Proc:
    def __init__(self, pid):
        self.pid, self.returncode = pid, None

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode


class _Lab:
    def __init__(self):
        self.started = []

    def popen(self, host, argv, **kwargs):
        self.started.append((host, list(argv)))
        return _Proc(5000 + len(self.started))

    def ns(self, host):
        raise KeyError(host)


def test_lab_ctl_restart_planner_with_flags_and_later_restarts_keep_them(tmp_path):
    lab = _Lab()
    services = Services(lab, tmp_path, "python", {})
    services.start("planner", "hub", SERVE)
    services.procs[0][1].returncode = 0                  # ended: a restart signals nothing
    control = tmp_path / "control"
    control.mkdir()
    wanted = ctl.restart_request("planner", ["--dashboard", "10.77.0.1:8443",
                                             "--dashboard-token", "t"], ["metrics"])
    assert wanted["drop"] == ["--metrics"]
    (control / "1.request").write_text(json.dumps(wanted))
    services.serve_requests()
    answer = json.loads((control / "1.done").read_text())
    assert answer["ok"] and "--dashboard 10.77.0.1:8443 --dashboard-token t" in answer["message"]
    assert lab.started[-1] == ("hub", SERVE + ["--dashboard", "10.77.0.1:8443",
                                               "--dashboard-token", "t"])
    services.procs[0][1].returncode = 0
    services.restart("planner")                          # plain `lab.ctl restart planner`
    assert lab.started[-1][1][-4:] == ["--dashboard", "10.77.0.1:8443", "--dashboard-token", "t"]
    row = json.loads((tmp_path / lab_services.SERVICES_FILE).read_text())["services"][0]
    assert row["argv"] == lab.started[-1][1]
    assert "--dashboard 10.77.0.1:8443" in ctl.status(tmp_path, verbose=True)
    with pytest.raises(ctl.CtlError, match="expected flags"):
        ctl.restart_request("planner", ["8443"])


def test_lab_ctl_takes_the_flags_after_a_double_dash(tmp_path, monkeypatch):
    asked = {}
    monkeypatch.setattr(ctl, "restart", lambda work, name, **kw: asked.update(kw, name=name) or "ok")
    assert ctl.main(["restart", "planner", "--work", str(tmp_path), "--drop", "metrics", "--",
                     "--dashboard", "10.77.0.1:8443"]) == 0
    assert asked == {"name": "planner", "add": ["--dashboard", "10.77.0.1:8443"],
                     "drop": ["metrics"]}


def test_the_lab_stops_its_agents_before_serve_and_the_broker_last(tmp_path, monkeypatch):
    assert stop_stages(["mosquitto", "planner", "agent-a", "agent-b"]) == [
        ["agent-a", "agent-b"], ["planner"], ["mosquitto"]]
    # A restarted planner is started last, and still stops before the broker, after the agents.
    assert stop_stages(["mosquitto", "agent-a", "planner"]) == [["agent-a"], ["planner"],
                                                               ["mosquitto"]]
    lab = _Lab()
    services = Services(lab, tmp_path, "python", {})
    for name in ("mosquitto", "planner", "agent-a", "agent-b"):
        services.start(name, "hub", [name])
    pids = {proc.pid: name for name, proc in services.procs}
    events = []

    def killpg(pid, sig):
        events.append(("signal", pids[pid]))
        by_pid[pid].returncode = -sig

    by_pid = {proc.pid: proc for _, proc in services.procs}
    for proc in by_pid.values():
        proc.wait = lambda timeout=None, p=proc: events.append(("exited", pids[p.pid])) or p.returncode
    monkeypatch.setattr(lab_services.os, "killpg", killpg)
    services.stop()
    order = [e for e in events if e[0] == "signal"]
    assert order == [("signal", "agent-a"), ("signal", "agent-b"), ("signal", "planner"),
                     ("signal", "mosquitto")]
    # the broker is signalled only once every agent has exited
    assert events.index(("signal", "mosquitto")) > events.index(("exited", "agent-b"))
    assert events.index(("signal", "planner")) > events.index(("exited", "agent-a"))
