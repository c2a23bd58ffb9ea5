"""Fixtures for the planner's server side: a real `hulk-planner serve` process on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.helpers.paths import REPO


def planner_command() -> list[str]:
    """`hulk-planner` from the venv when installed, else the same entry point via -m."""
    script = Path(sys.executable).parent / "hulk-planner"
    return [str(script)] if script.exists() else [sys.executable, "-m", "planner.cli"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*planner_command(), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


@dataclass
class PlannerProcess:
    proc: subprocess.Popen
    address: str
    db: Path
    log: Path

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def stop(self, timeout: float = 15) -> int:
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
    port = port or free_port(host)
    log = (log_dir or db.parent) / f"planner-{port}-{time.monotonic_ns()}.log"
    out = log.open("w")
    proc = subprocess.Popen(
        [*planner_command(), "serve", "--db", str(db), "--listen", f"{host}:{port}", "--insecure",
         *extra], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    out.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "listening on" in log.read_text():
            return PlannerProcess(proc, f"{host}:{port}", db, log)
        if proc.poll() is not None:
            raise AssertionError(f"planner exited with {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"planner did not start within {timeout} s:\n{log.read_text()}")


@pytest.fixture
def planner(tmp_path: Path):
    p = start_planner(tmp_path / "planner.db")
    yield p
    p.stop()
