"""An agent whose credentials the planner refuses ends with one line and exit code 2 rather
than retrying for ever while looking healthy. A real `hulk-planner serve` over TLS, real agents."""

from __future__ import annotations

import json
import subprocess

import pytest

from planner.security.tls import init_pki
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.processes import agent_command, planner_command, stop_process, worktree_env
from tests.helpers.waits import wait_until

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    where = tmp_path_factory.mktemp("planner")
    pki = init_pki(where / "tls", ["127.0.0.1"])
    db = where / "planner.sqlite"
    enrolled = subprocess.run([*planner_command(), "enroll", "n1", "--db", str(db), "--json"],
                              cwd=REPO, env=worktree_env(), capture_output=True, text=True,
                              timeout=60)
    assert enrolled.returncode == 0, enrolled.stderr
    port = free_port()
    log = where / "planner.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*planner_command(), "serve", "--db", str(db), "--listen",
                                 f"127.0.0.1:{port}", "--tls-cert", str(pki["server_cert"]),
                                 "--tls-key", str(pki["server_key"])],
                                cwd=REPO, env=worktree_env(), stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: "listening on" in log.read_text(), 30, "serve to listen",
               detail=log.read_text)
    yield {"target": f"127.0.0.1:{port}", "ca": pki["ca"], "db": db,
           "token": json.loads(enrolled.stdout)["token"]}
    stop_process(proc)


def run_agent(planner, tmp_path, node_id: str, token: str) -> subprocess.CompletedProcess:
    env = {**worktree_env(), "HULK_TOKEN": token}
    return subprocess.run([*agent_command(), "--planner", planner["target"], "--node-id", node_id,
                           "--ca", str(planner["ca"]), "--state-dir", str(tmp_path / node_id),
                           "--address", "127.0.0.1"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("node_id, token", [
    ("n2", None),                                   # n1's token, another node id
    ("n1", "hulk1.0123456789abcdef." + "A" * 43),   # a token this planner never issued
])
def test_refused_credentials_end_the_agent_with_exit_2_and_one_line(planner, tmp_path, node_id,
                                                                     token):
    done = run_agent(planner, tmp_path, node_id, token or planner["token"])
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("hulk-agent: ") and "refuses this node's credentials" in last
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_token_revoked_while_the_agent_runs_ends_it_at_its_next_heartbeat(planner, tmp_path):
    def planner_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*planner_command(), *args, "--db", str(planner["db"])], cwd=REPO,
                              env=worktree_env(), capture_output=True, text=True, timeout=60)

    enrolled = planner_cli("enroll", "n3", "--json")
    assert enrolled.returncode == 0, enrolled.stderr
    env = {**worktree_env(), "HULK_TOKEN": json.loads(enrolled.stdout)["token"]}
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen([*agent_command(), "--planner", planner["target"], "--node-id",
                                  "n3", "--ca", str(planner["ca"]), "--state-dir",
                                  str(tmp_path / "n3"), "--address", "127.0.0.1"],
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "registered with" in log.read_text(), 30, "the agent to register",
                   detail=log.read_text)
        assert agent.poll() is None
        revoked = planner_cli("revoke", "n3")
        assert revoked.returncode == 0, revoked.stderr
        # The next heartbeat (every 10 s) is refused; the agent registers again, is refused, ends.
        code = agent.wait(timeout=40)
    finally:
        stop_process(agent)
    text = log.read_text()
    assert code == 2, text[-2000:]
    assert "refuses this node's credentials" in text.strip().splitlines()[-1]
    assert "Traceback" not in text


def test_the_unit_does_not_restart_a_configuration_error():
    unit = (REPO / "deploy" / "hulk-agent.service").read_text()
    assert "Restart=on-failure" in unit and "RestartPreventExitStatus=2" in unit
