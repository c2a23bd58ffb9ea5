"""A command's own wall time, CPU time and peak RSS, measured from a small launcher process.

Linux carries a process's peak RSS across fork and exec: a child forked from a benchmark that
holds a gigabyte reports at least that gigabyte as its own ``ru_maxrss`` (seen here: a
290 MB `plan` reported 0.93 GB). So the command is started by a launcher (a bare Python of a
few MB), which forks it afresh and reports its ``wait4`` usage as one JSON line on a pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# The launcher: argv[1] is the deadline in seconds, argv[2:] the command; its stdout is the
# report, the command's output goes to stderr (inherited from the caller's choice).
_LAUNCHER = r"""
import json, os, signal, sys, time
deadline, cmd = float(sys.argv[1]), sys.argv[2:]
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(2, 1)
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
timed_out = False
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    if time.perf_counter() - t0 > deadline:
        os.kill(pid, signal.SIGKILL)
        done, status, usage = os.wait4(pid, 0)
        timed_out = True
        break
    time.sleep(0.02)
print(json.dumps({"wall_s": time.perf_counter() - t0, "exit_code": os.waitstatus_to_exitcode(status),
                  "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_kb": usage.ru_maxrss,
                  "timed_out": timed_out}))
"""


@dataclass(frozen=True)
class ChildUsage:
    wall_s: float
    exit_code: int
    cpu_s: float           # user + system of the command and its reaped children
    peak_rss_bytes: int    # the command's own peak (ru_maxrss is in kB on Linux)
    timed_out: bool
    output: str            # stdout and stderr, interleaved


def run_measured(cmd: list[str], *, env: dict[str, str] | None = None, cwd=None,
                 timeout_s: float = 1200.0) -> ChildUsage:
    """Run ``cmd`` to its end (killed after ``timeout_s``) and measure it."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.run([sys.executable, "-c", _LAUNCHER, str(timeout_s), *cmd],
                              stdout=subprocess.PIPE, stderr=log, env=env, cwd=cwd)
        log.seek(0)
        output = log.read().decode(errors="replace")
    report = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return ChildUsage(wall_s=report["wall_s"], exit_code=report["exit_code"],
                      cpu_s=report["cpu_s"], peak_rss_bytes=report["peak_rss_kb"] * 1024,
                      timed_out=report["timed_out"], output=output)


if __name__ == "__main__":   # python -m bench.child_usage CMD...: measure one command
    usage = run_measured(sys.argv[1:], env=dict(os.environ))
    print(json.dumps({k: v for k, v in usage.__dict__.items() if k != "output"}))
