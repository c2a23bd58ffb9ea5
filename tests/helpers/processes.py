"""Starting and stopping the processes the slow tests run: `hulk-planner serve`, the CLIs.

Every test that starts a process carries the ``process`` marker (tests/conftest.py checks it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.waits import wait_until


def _console_script(name: str, module: str) -> list[str]:
    """The venv's console script when `make install` made it, else the same entry point via -m."""
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", module]


def planner_command() -> list[str]:
    return _console_script("hulk-planner", "planner.cli")


def agent_command() -> list[str]:
    return _console_script("hulk-agent", "agent")


def worktree_env() -> dict[str, str]:
    """This environment with PYTHONPATH at this checkout, so a child runs this checkout's code."""
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_cli(*args: object, timeout: float = 60, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`hulk-planner ARGS` run to completion; stdout and stderr captured as text."""
    return subprocess.run([*planner_command(), *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=worktree_env())


def stop_process(proc: subprocess.Popen, timeout: float = 10) -> int | None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` s; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@dataclass
class PlannerProcess:
    """A running `hulk-planner serve --insecure`; its stdout and stderr go to ``log``."""

    proc: subprocess.Popen
    address: str
    db: Path
    log: Path

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM and its exit code; a planner still running after ``timeout`` s fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("planner did not stop on SIGTERM") from None
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text()


def start_planner(db: Path, host: str = "127.0.0.1", port: int | None = None,
                  extra: tuple[str, ...] = (), log_dir: Path | None = None,
                  timeout: float = 20) -> PlannerProcess:
    """`hulk-planner serve --db DB --listen HOST:PORT --insecure EXTRA`, once it listens."""
    port = port or free_port(host)
    log = (log_dir or db.parent) / f"planner-{port}-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*planner_command(), "serve", "--db", str(db), "--listen", f"{host}:{port}",
             "--insecure", *extra], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env=worktree_env())

    def listening() -> bool:
        if "listening on" in log.read_text():
            return True
        if proc.poll() is not None:
            raise AssertionError(f"planner exited with {proc.returncode}:\n{log.read_text()}")
        return False

    try:
        wait_until(listening, timeout, "the planner to listen", detail=log.read_text)
    except AssertionError:
        stop_process(proc, timeout=5)
        raise
    return PlannerProcess(proc, f"{host}:{port}", db, log)
