"""Start `hulk-planner serve` as its own process for a benchmark (so its RSS and CPU are its own)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_planner(db: Path, log: Path, serve_args: list[str], start_timeout_s: float = 30.0,
                  host: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """`hulk-planner serve --db DB --listen HOST:PORT SERVE_ARGS`, waited for until it listens;
    returns the process and 127.0.0.1:PORT."""
    port = free_port()
    script = Path(sys.executable).parent / "hulk-planner"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "planner.cli"]
    with log.open("w") as out:
        proc = subprocess.Popen([*cmd, "--log-level", "WARNING", "serve", "--db", str(db),
                                 "--listen", f"{host}:{port}", *serve_args], cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + start_timeout_s
    while "listening on" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"planner did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return proc, f"127.0.0.1:{port}"


def stop_planner(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """SIGTERM (serve's clean shutdown), then SIGKILL if it has not ended after ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
