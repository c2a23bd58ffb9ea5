"""A --keep lab's decisions without processes: which services died and what to do (lab.services),
restart requests from lab.ctl carried out with the first start's arguments, lab.ctl's status."""

from __future__ import annotations

import json
import os

import pytest

from lab import ctl
from lab.netns import LabError
from lab.services import SERVICES_FILE, Services, decide


class FakeProc:
    """What Services reads of a Popen: pid, poll(), returncode."""

    def __init__(self, pid: int, code: int | None = None):
        self.pid, self.returncode = pid, code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class FakeLab:
    """Starts nothing: records what would be started in which namespace."""

    def __init__(self):
        self.started: list[tuple[str, list[str], dict]] = []

    def popen(self, host, argv, **kwargs):
        self.started.append((host, list(argv), kwargs["env"]))
        return FakeProc(1000 + len(self.started))

    def ns(self, host):
        raise KeyError(host)


def test_without_keep_any_death_tears_the_lab_down():
    d = decide({"mosquitto": None, "planner": None, "agent-a": -9}, set(), keep=False)
    assert d.teardown and d.dead == ("agent-a",)
    assert not decide({"planner": None, "agent-a": None}, set(), keep=False).teardown


def test_with_keep_each_death_is_reported_once_and_the_lab_goes_on():
    exits = {"mosquitto": None, "planner": None, "agent-a": -9, "agent-b": None}
    first = decide(exits, set(), keep=True)
    assert (first.teardown, first.dead, first.report) == (False, ("agent-a",), ("agent-a",))
    later = decide({**exits, "planner": 1}, {"agent-a"}, keep=True)
    assert (later.teardown, later.dead, later.report) == (False, ("agent-a", "planner"),
                                                          ("planner",))


def make_services(tmp_path) -> tuple[Services, FakeLab]:
    lab = FakeLab()
    services = Services(lab, tmp_path, "python", {"BASE": "1"})
    services.start("planner", "hub", ["serve"], {"HULK_MQTT": "secret"})
    services.start("agent-a", "a", ["agent", "--node-id", "a"], {"HULK_TOKEN": "t"})
    return services, lab


def test_check_names_the_dead_agent_and_how_to_start_it_again(tmp_path):
    services, _ = make_services(tmp_path)
    (tmp_path / "agent-a.log").write_text("agent log tail\n")
    services.procs[1][1].returncode = -9
    lines = services.check(keep=True)
    assert len(lines) == 1 and "agent-a exited with code -9" in lines[0]
    assert f"python -m lab.ctl restart agent-a --work {tmp_path}" in lines[0]
    assert services.check(keep=True) == []          # once
    with pytest.raises(LabError, match="agent-a exited with code -9:\nagent log tail"):
        services.check()


def test_a_restart_request_starts_the_service_again_as_first_started(tmp_path):
    services, lab = make_services(tmp_path)
    services.procs[1][1].returncode = -9           # dead: a restart signals nothing
    services.check(keep=True)
    control = tmp_path / "control"
    control.mkdir()
    (control / "1.request").write_text(json.dumps({"restart": "a"}))     # a host name will do
    (control / "2.request").write_text(json.dumps({"restart": "nobody"}))
    services.serve_requests()
    assert lab.started[-1][:2] == ("a", ["agent", "--node-id", "a"])
    assert lab.started[-1][2] == {"BASE": "1", "HULK_TOKEN": "t"}
    answer = json.loads((control / "1.done").read_text())
    assert answer["ok"] and answer["message"].startswith("started agent-a again (pid ")
    refused = json.loads((control / "2.done").read_text())
    assert not refused["ok"] and "no service 'nobody'" in refused["message"]
    assert not list(control.glob("*.request"))
    assert [name for name, _ in services.procs] == ["planner", "agent-a"]
    assert services.check(keep=True) == []          # the new one runs
    services.procs[1][1].returncode = 1
    assert len(services.check(keep=True)) == 1      # and its death is news again
    written = json.loads((tmp_path / SERVICES_FILE).read_text())
    assert [r["pid"] for r in written["services"]] == [p.pid for _, p in services.procs]
    assert "secret" not in (tmp_path / SERVICES_FILE).read_text()   # no environment on disk
    assert "--- started again by lab.ctl" in (tmp_path / "agent-a.log").read_text()


def test_ctl_status_and_a_restart_of_a_lab_that_is_gone(tmp_path):
    services, _ = make_services(tmp_path)
    doc = json.loads((tmp_path / SERVICES_FILE).read_text())
    assert doc["lab_pid"] == os.getpid()
    doc["services"][0]["pid"] = os.getpid()        # "planner": this process, alive
    doc["services"][1]["pid"] = 2**22 + 7           # "agent-a": beyond pid_max, dead
    (tmp_path / SERVICES_FILE).write_text(json.dumps(doc))
    lines = ctl.status(tmp_path).splitlines()
    assert "running" in lines[0]
    assert lines[1].startswith("planner") and lines[1].rstrip().split("log")[0].endswith("running  ")
    assert lines[2].startswith("agent-a") and " dead " in lines[2]
    doc["lab_pid"] = 2**22 + 7
    (tmp_path / SERVICES_FILE).write_text(json.dumps(doc))
    with pytest.raises(ctl.CtlError, match="not running"):
        ctl.restart(tmp_path, "agent-a")
    with pytest.raises(ctl.CtlError, match="no lab's services file"):
        ctl.status(tmp_path / "elsewhere")


def test_the_jobs_a_keep_lab_offers_are_commands_its_agents_allow(tmp_path):
    from lab.run import EXAMPLE, TRAIN_JOBS, resolve_example_paths
    from planner.files.jobs import load_jobs

    jobs = load_jobs(resolve_example_paths(TRAIN_JOBS, tmp_path / TRAIN_JOBS.name))
    assert len(jobs) == 2
    for job in jobs:
        assert job.command[:2] == ("python", str(EXAMPLE)), job
