"""hulk-agent as a real process: one-line errors, clean stop on SIGTERM, sd_notify."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
from pathlib import Path

import pytest

from hulk.v1 import hulk_pb2

from tests.helpers.paths import REPO
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.processes import agent_command, stop_process
from tests.helpers.waits import wait_until, wait_until_async

pytestmark = pytest.mark.process   # every test starts hulk-agent or a fresh interpreter

AGENT = agent_command()


def run_agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    return subprocess.run([*AGENT, *args], cwd=REPO, capture_output=True, text=True, timeout=30,
                          env={**clean, **(env or {})})


@pytest.mark.parametrize("args, env, message", [
    (["--node-id", "n"], {}, "hulk-agent: planner: required: give --planner, set HULK_PLANNER"),
    (["--planner", "h:1", "--node-id", "n", "--interval", "0"], {},
     "hulk-agent: --interval: interval_s: expected seconds between 1 and 86400, got '0'"),
    (["--planner", "h:1"], {"HULK_NODE_ID": "bad id"}, "hulk-agent: HULK_NODE_ID: node_id: "),
    (["--frobnicate"], {}, "hulk-agent: unrecognized arguments: --frobnicate"),
])
def test_bad_input_is_one_line_and_exit_2(args, env, message):
    result = run_agent(*args, env=env)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_an_unusable_state_dir_keeps_the_agent_running_with_its_spool_in_memory(tmp_path):
    """Exiting would only have systemd restart it every 5 s, the node out of the fleet."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    log = tmp_path / "agent.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    with open(log, "w") as out:
        agent = subprocess.Popen([*AGENT, "--planner", "127.0.0.1:9", "--node-id", "n",
                                  "--insecure", "--address", "127.0.0.1", "--state-dir",
                                  str(blocker / "state")], cwd=REPO, stderr=out, env=clean)
    try:
        wait_until(lambda: "in memory" in log.read_text() or agent.poll() is not None, 30,
                   "the agent to say its spool is in memory", detail=log.read_text)
        assert agent.poll() is None, log.read_text()[-2000:]
    finally:
        code = stop_process(agent)
    text = log.read_text()
    assert code == 0, text[-2000:]
    [error] = [line for line in text.splitlines() if " ERROR " in line]
    assert str(blocker / "state" / "spool.sqlite") in error and "Not a directory" in error
    assert "Traceback" not in text


def test_version():
    result = run_agent("--version")
    assert result.returncode == 0 and result.stdout.strip() == "hulk-agent 0.1.0"


async def test_sigterm_stops_cleanly_with_exit_0(tmp_path: Path):
    planner = PlannerDouble(peers=[("lo2", "127.0.0.2", 0)],
                            settings=hulk_pb2.ProbeSettings(packets_per_round=2, timeout_s=0.5))
    server, port = await start_server(planner)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    process = await asyncio.create_subprocess_exec(
        *AGENT, "--planner", f"127.0.0.1:{port}", "--node-id", "node-x", "--address", "127.0.0.1",
        "--interval", "1", "--state-dir", str(tmp_path / "state"), "--insecure",
        cwd=REPO, stderr=asyncio.subprocess.PIPE,
        env={**clean, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000"})
    try:
        await wait_until_async(lambda: planner.seen.registers, timeout=15)
        await asyncio.sleep(2.0)   # a couple of rounds; the reporter lingers for a full batch
        loop = asyncio.get_running_loop()
        started = loop.time()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=8)
        stopped_in = loop.time() - started
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await server.stop(None)
    stderr = (await process.stderr.read()).decode()
    assert code == 0, stderr
    assert stopped_in < 5.0
    assert "Traceback" not in stderr and "stopping" in stderr
    messages = []
    while True:
        try:
            messages.append(notify.recv(4096).decode())
        except BlockingIOError:
            break
    notify.close()
    assert messages[0].startswith("READY=1")
    assert "WATCHDOG=1" in messages
    assert messages[-1].startswith("STOPPING=1")
    assert planner.seen.registers[0].node_id == "node-x"
    # What was spooled went out on the way down (flush), nothing stayed behind.
    rounds = planner.stored_rounds()
    assert sum(r.packets for r in rounds) >= 2
    assert all(r.peer_id == "lo2" and not r.lost for r in rounds)
    with sqlite3.connect(tmp_path / "state" / "spool.sqlite") as db:
        assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    assert (tmp_path / "state" / "spool.sqlite").exists()


def test_a_callback_on_a_closed_socket_is_no_traceback_and_other_errors_still_are(caplog):
    import asyncio
    import logging
    import socket

    caplog.set_level(logging.DEBUG, logger="agent")
    from agent.cli import quiet_closed_socket

    class Loop(asyncio.SelectorEventLoop):
        def __init__(self):
            super().__init__()
            self.reported = []

        def default_exception_handler(self, context):
            self.reported.append(context.get("exception"))

    loop = Loop()
    loop.set_exception_handler(quiet_closed_socket)
    sock = socket.socket()
    fd = sock.fileno()
    sock.close()                          # as the broker's close, before aiomqtt's registration
    boom = ValueError("boom")

    def fail():
        raise boom

    try:
        loop.call_soon(loop.add_writer, fd, lambda: None)
        loop.call_soon(fail)
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    assert loop.reported == [boom]        # the closed socket's error reached no traceback
    assert any("a closed socket's callback" in r.getMessage() and r.levelno == logging.DEBUG
               for r in caplog.records)
