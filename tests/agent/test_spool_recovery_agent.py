"""hulk-agent as a real process with a spool file SQLite cannot use: it moves the file aside,
starts a fresh spool, says so in one ERROR line and goes on probing and reporting (it used to
exit 1, and systemd restarted it every 5 s for ever)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from hulk.v1 import hulk_pb2
from tests.helpers.paths import REPO
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.processes import agent_command
from tests.helpers.waits import wait_until_async

pytestmark = pytest.mark.process

GARBAGE = b"this is not an SQLite database\n" * 64


async def test_the_agent_moves_a_garbage_spool_aside_and_keeps_reporting(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "spool.sqlite").write_bytes(GARBAGE)
    planner = PlannerDouble(peers=[("lo2", "127.0.0.2", 0)],
                            settings=hulk_pb2.ProbeSettings(packets_per_round=2, timeout_s=0.5,
                                                            report_interval_s=0.2))
    server, port = await start_server(planner)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HULK_")}
    process = await asyncio.create_subprocess_exec(
        *agent_command(), "--planner", f"127.0.0.1:{port}", "--node-id", "node-g",
        "--address", "127.0.0.1", "--interval", "1", "--state-dir", str(state), "--insecure",
        cwd=REPO, stderr=asyncio.subprocess.PIPE, env={**clean, "PYTHONPATH": str(REPO)})
    try:
        # Reports reach the planner while the agent runs on: it neither exits nor stalls.
        await wait_until_async(lambda: planner.stored_rounds() or process.returncode is not None,
                               timeout=30, what="a report from the agent")
        assert process.returncode is None, (await process.stderr.read()).decode()[-2000:]
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await server.stop(None)
    stderr = (await process.stderr.read()).decode()
    assert code == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    aside = [p for p in state.iterdir() if p.name.startswith("spool.sqlite.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == GARBAGE    # kept for a post-mortem
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors
    assert str(state / "spool.sqlite") in errors[0] and aside[0].name in errors[0]
    assert "lost" in errors[0]
    with sqlite3.connect(state / "spool.sqlite") as db:      # a fresh, working spool
        assert db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
