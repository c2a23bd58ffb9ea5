"""A job's process, apart from the agent: started, recorded, and found again by a restarted agent.

- Every role's process leads its own session (its group id is its pid). That leader is a small
  wrapper, a fresh ``python -I -S -c`` (WRAPPER): it drops the agent's capabilities, forks the
  job's command, waits for it, writes ``exit.json`` (``{"code": N}``, negative N: the signal that
  ended it) atomically in the job's directory and exits with the job's code. It ignores SIGTERM
  and SIGINT (one that came before the job existed is passed on to it), so a stop signal to the
  group reaches the job and the wrapper still records its code; SIGKILL takes the wrapper too and
  leaves no ``exit.json`` (read as -9).
- Fencing: where the job's folder holds ``lease.json`` (the node lease, agent/lease.py) when it
  starts, the wrapper is the job's child subreaper and reads the lease every ``poll_s``; once
  its deadline (CLOCK_BOOTTIME) has passed it sends SIGTERM to every process below it and their
  groups, SIGKILL ``grace_s`` later, reaps them all and records ``{"code": N, "fenced": why}``.
  It never un-fences, and a lease already lapsed at the start runs nothing.
- With ``job_scope`` systemd (or auto, where systemd runs and the agent is root: an unprivileged
  agent may not create system units), the wrapper starts in a transient scope (``systemd-run
  --scope``), outside the agent's cgroup, so the job outlives any stop of the agent's unit.
- After a start the launcher writes ``run.json`` in the job's directory (RunRecord): the pid, its
  start time (field 22 of /proc/<pid>/stat, so a reused pid is never taken for the job), the role
  and the log and progress paths. The process is alive while /proc/<pid>/stat has that start
  time and is not a zombie. A restarted agent adopts or stops what the records name.
- Only the standard library: no psutil, no torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hulk.atomic import write_atomic
from hulk.wire.placement import NodePlacement, Role

log = logging.getLogger(__name__)

EXIT_FILE = "exit.json"
LEASE_FILE = "lease.json"  # the node lease's deadline for this job (agent/lease.py)
RUN_FILE = "run.json"
SCOPES = ("auto", "systemd", "session")
KILLED_CODE = -9          # a job whose wrapper left no exit.json was killed (SIGKILL, a reboot)

# argv: EXIT_PATH ("" for none), LEASE_PATH ("" for none), DROP_CAPS ("1"/"0"), then the job's
# argv. Run by a fresh interpreter rather than a preexec_fn: Python code between fork and exec in
# the agent, whose gRPC and DNS threads may hold locks, can deadlock or abort the child; this
# process has no threads, so its own fork is safe. Capabilities are dropped here, before the
# fork, so the job inherits none and no_new_privs keeps it so (Linux prctl/capset), even under a
# root agent. With a lease (agent/lease.py) the wrapper is the job's subreaper (an orphaned
# worker stays its descendant) and fences the job once the lease's deadline has passed.
WRAPPER = r"""
import signal
stops = {signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, stops)   # a stop that comes before the fork is the job's
import ctypes, json, os, sys, time
exit_path, lease_path, drop, argv = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
libc = ctypes.CDLL(None, use_errno=True)
clock = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
terms = [0.0, 0.5, 3.0]                             # deadline, poll, grace; unreadable: lapsed
def lease():
    try:
        with open(lease_path) as f:
            d = json.load(f)
        deadline, poll, grace = float(d["deadline"]), float(d["poll_s"]), float(d["grace_s"])
        if deadline == deadline and poll == poll and grace == grace:   # not NaN
            terms[:] = [deadline, min(max(poll, 0.01), 5.0), min(max(grace, 0.0), 60.0)]
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        pass                                        # the last good deadline still holds
    return terms
def record(code, fenced=""):
    if exit_path:
        tmp = f"{exit_path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"code": code, **({"fenced": fenced} if fenced else {})}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, exit_path)
    os._exit(code if code >= 0 else 128 - code)
if lease_path:
    libc.prctl(36, 1, 0, 0, 0)                      # PR_SET_CHILD_SUBREAPER
    if lease()[0] <= time.clock_gettime(clock):
        record(-15, "the node's lease had lapsed before the job started")
if drop:
    libc.prctl(38, 1, 0, 0, 0)                      # PR_SET_NO_NEW_PRIVS
    libc.prctl(47, 4, 0, 0, 0)                      # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):                           # PR_CAPBSET_DROP each (EINVAL past the last)
        libc.prctl(24, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()                  # {effective, permitted, inheritable} x 2
    if libc.capget(header, data) == 0:
        data[0] = data[1] = data[2] = data[3] = data[4] = data[5] = 0
        libc.capset(header, data)
pid = os.fork()
if pid == 0:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"hulk-agent: cannot start {argv[0]}: {exc.strerror}\n")
        os._exit(127)
early = signal.sigpending() & stops
for signum in stops:
    signal.signal(signum, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
for signum in early:
    os.kill(pid, signum)
if not lease_path:
    record(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
me = os.getpid()
def descendants():                                  # [(pid, group)] of every process below us
    kids = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                kids.setdefault(int(fields[1]), []).append((int(entry), int(fields[2])))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [me]
    while todo:
        for child, group in kids.get(todo.pop(), ()):
            out.append((child, group))
            todo.append(child)
    return out
def stop_all(sig):                                  # torchrun's workers lead groups of their own
    procs = descendants()
    for target in sorted({g for _, g in procs if g != me}):
        try:
            os.killpg(target, sig)
        except OSError:
            pass
    for target, _ in procs:
        try:
            os.kill(target, sig)
        except OSError:
            pass
code, fenced, kill_at, killed = None, "", 0.0, False
while True:
    try:
        got, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:                       # nothing left below us
        break
    if got == pid:
        code = os.waitstatus_to_exitcode(status)
        if not fenced:
            break
    if got:
        continue                                    # reap every orphan the job leaves us
    now = time.clock_gettime(clock)
    deadline, poll, grace = lease()
    if not fenced and now >= deadline:
        fenced = f"the node's lease lapsed {now - deadline:.1f} s ago: SIGTERM to the job"
        kill_at = now + grace
        stop_all(signal.SIGTERM)
    elif fenced and not killed and now >= kill_at:
        killed = True
        fenced += f", SIGKILL {grace:g} s later"
        stop_all(signal.SIGKILL)
    time.sleep(min(poll, 0.05) if fenced else poll)
record(code if code is not None else -9, fenced)
"""


# ------------------------------------------------------------------------------ /proc, records

def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc/<pid>/stat; None: no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_stat(f.read())
    except OSError:
        return None


def parse_stat(data: bytes) -> tuple[str, int] | None:
    """Fields 3 (state) and 22 (start time) of a /proc/<pid>/stat line. The command name (field
    2) may hold spaces and parentheses, so fields are counted after the last ')'."""
    if b")" not in data:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])   # fields 3 and 22
    except (IndexError, ValueError):
        return None


def descendant_groups(pid: int, proc_dir: str = "/proc") -> set[int]:
    """The process groups of ``pid``'s descendants other than its own: torchrun starts each
    worker in a session of its own, so a signal to the wrapper's group alone would leave a
    worker running once torchrun is killed. Read before signalling (a killed parent's children
    are re-parented and can no longer be traced)."""
    children: dict[int, list[tuple[int, int]]] = {}
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc_dir}/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
            ppid, pgrp = int(fields[1]), int(fields[2])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(entry), pgrp))
    groups, todo, seen = set(), [pid], {pid}
    while todo:
        for child, pgrp in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
                groups.add(pgrp)
    groups.discard(pid)
    return groups


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat is not None else None


def is_alive(pid: int, ticks: int) -> bool:
    """``pid`` is still the process that started at ``ticks`` and has not exited (a zombie whose
    parent has not reaped it yet has)."""
    stat = proc_stat(pid)
    return stat is not None and stat[1] == ticks and stat[0] not in ("Z", "X", "x")


def role_json(role: Role) -> dict[str, Any]:
    """The role as a placement message carries it (hulk.wire.placement's rendering)."""
    return NodePlacement(fleet="", node="", plan_id="", roles=(role,)).to_json()["roles"][0]


def read_fenced(path: Path | None) -> str:
    """Why the wrapper fenced the job (``exit.json``'s ``fenced``); empty when it did not."""
    if path is None:
        return ""
    try:
        fenced = json.loads(path.read_text()).get("fenced", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return fenced[:300] if isinstance(fenced, str) else ""


def read_exit_code(path: Path | None) -> int | None:
    """The code the wrapper recorded in ``exit.json``; None when there is none (or it is unreadable)."""
    if path is None:
        return None
    try:
        code = json.loads(path.read_text())["code"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: a job process this agent started, for the agent that comes after it."""

    job_dir: Path
    pid: int
    start_ticks: int
    role: dict[str, Any]
    log: str = ""
    progress: str = ""

    @property
    def exit_path(self) -> Path:
        return self.job_dir / EXIT_FILE

    @property
    def log_path(self) -> Path | None:
        return Path(self.log) if self.log else None

    @property
    def progress_path(self) -> Path | None:
        return Path(self.progress) if self.progress else None

    def save(self) -> None:
        write_atomic(self.job_dir / RUN_FILE, json.dumps({
            "pid": self.pid, "start_ticks": self.start_ticks, "role": self.role,
            "log": self.log, "progress": self.progress}))

    @classmethod
    def load(cls, job_dir: Path) -> "RunRecord | None":
        """The record in ``job_dir``; None when there is none or it cannot be read (logged)."""
        path = job_dir / RUN_FILE
        try:
            data = json.loads(path.read_text())
            record = cls(job_dir=job_dir, pid=int(data["pid"]), start_ticks=int(data["start_ticks"]),
                         role=dict(data["role"]), log=str(data.get("log") or ""),
                         progress=str(data.get("progress") or ""))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the unreadable job record %s: %s", path, exc)
            return None
        return record if record.pid > 0 else None


def read_records(jobs_dir: Path | None) -> list[RunRecord]:
    """Every job record under ``jobs_dir`` (state_dir/jobs/<job>/run.json), by job name."""
    if jobs_dir is None or not jobs_dir.is_dir():
        return []
    records = (RunRecord.load(d) for d in sorted(jobs_dir.iterdir()) if d.is_dir())
    return [r for r in records if r is not None]


# ------------------------------------------------------------------------------- the process

class ProcessHandle(Protocol):
    pid: int
    start_ticks: int | None       # None: not a real process (test stand-ins); never recorded

    async def wait(self) -> int: ...

    def signal_group(self, sig: int) -> None: ...


class ProcessRunner(Protocol):
    async def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
                    log_path: Path | None, *, unit: str | None = None) -> ProcessHandle: ...

    def adopt(self, record: RunRecord, poll_s: float) -> ProcessHandle | None:
        """A handle on the recorded process if it is still alive, else None."""
        ...


class JobProcess:
    """A job's wrapper: one this agent started (``popen``), or one an earlier agent started, found
    by pid and start time. Its end is seen by polling (woken early by a pidfd where there is one);
    its code is the one in ``exit.json``, else the wrapper's own (started) or -9 (adopted)."""

    def __init__(self, pid: int, ticks: int | None, exit_path: Path | None, *,
                 popen: subprocess.Popen | None = None, poll_s: float = 1.0):
        self.pid = pid
        self.start_ticks = ticks
        self.exit_path = exit_path
        self.poll_s = poll_s
        self._popen = popen

    def _ended(self) -> int | None:
        if self._popen is not None:
            code = self._popen.poll()
            if code is None:
                return None
        elif self.start_ticks is not None and is_alive(self.pid, self.start_ticks):
            return None
        else:
            code = KILLED_CODE
        recorded = read_exit_code(self.exit_path)
        return recorded if recorded is not None else code

    async def wait(self) -> int:
        pidfd = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(self.pid)       # readable once the process has exited
        loop = asyncio.get_running_loop()
        try:
            while (code := self._ended()) is None:
                if pidfd is None:
                    await asyncio.sleep(self.poll_s)
                    continue
                woken = loop.create_future()
                loop.add_reader(pidfd, lambda: woken.done() or woken.set_result(None))
                try:
                    await asyncio.wait({woken}, timeout=self.poll_s)
                finally:
                    loop.remove_reader(pidfd)
            return code
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def signal_group(self, sig: int) -> None:
        if self._popen is None and (self.start_ticks is None or not is_alive(self.pid, self.start_ticks)):
            return    # an adopted process that has ended: its pid may be someone else's by now
        # The wrapper leads its own session (its group is its pid); the workers torchrun put
        # in sessions of their own get the signal too.
        for group in (self.pid, *sorted(descendant_groups(self.pid))):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass


def resolve_scope(mode: str, *, systemd_dir: str = "/run/systemd/system") -> str:
    """``auto`` -> ``systemd`` where systemd runs, ``systemd-run`` is on PATH and the agent is
    root (only root may create system units without polkit), else ``session``."""
    if mode != "auto":
        return mode
    usable = os.path.isdir(systemd_dir) and shutil.which("systemd-run") and os.geteuid() == 0
    return "systemd" if usable else "session"


class SubprocessRunner:
    """Real processes: the wrapper in a new session (the whole tree, torchrun and its workers, is
    one group), optionally in a systemd scope, without the agent's capabilities (``drop_caps``)."""

    def __init__(self, drop_caps: bool = True, *, scope: str = "session", poll_s: float = 0.2):
        self.drop_caps = drop_caps and sys.platform == "linux"
        self.scope = resolve_scope(scope)
        self.poll_s = poll_s

    async def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
                    log_path: Path | None, *, unit: str | None = None) -> JobProcess:
        if not argv:
            raise ValueError("empty command")
        # The wrapper would report a missing program only in the job's log: say it here.
        if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
            raise FileNotFoundError(errno.ENOENT, "no such program on the job's PATH", argv[0])
        exit_path = Path(os.path.abspath(cwd / EXIT_FILE)) if cwd is not None else None
        if exit_path is not None:
            exit_path.unlink(missing_ok=True)     # an earlier run's code is not this run's
        # The launcher writes the job's lease before the start when the agent keeps one.
        lease_path = Path(os.path.abspath(cwd / LEASE_FILE)) if cwd is not None else None
        lease = str(lease_path) if lease_path is not None and lease_path.is_file() else ""
        wrapped = [sys.executable, "-I", "-S", "-c", WRAPPER, str(exit_path or ""), lease,
                   "1" if self.drop_caps else "0", *argv]
        if self.scope == "systemd" and unit:
            systemd_run = shutil.which("systemd-run")
            if systemd_run is None:
                raise FileNotFoundError(errno.ENOENT, "job_scope is systemd but there is no "
                                        "systemd-run on PATH", "systemd-run")
            wrapped = [systemd_run, "--scope", "--collect", "--quiet", f"--unit={unit}", "--",
                       *wrapped]
        out = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")
        try:
            # No preexec_fn: the child only execs (see WRAPPER).
            popen = subprocess.Popen(
                wrapped, env=dict(env), cwd=str(cwd) if cwd else None, stdin=subprocess.DEVNULL,
                stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if out is not None:
                out.close()
        return JobProcess(popen.pid, start_ticks(popen.pid), exit_path, popen=popen,
                          poll_s=self.poll_s)

    def adopt(self, record: RunRecord, poll_s: float) -> JobProcess | None:
        if not is_alive(record.pid, record.start_ticks):
            return None
        return JobProcess(record.pid, record.start_ticks, record.exit_path, poll_s=poll_s)


def unit_name(role: Role) -> str:
    """The transient scope of one run of a role (characters of job names are valid in units)."""
    return f"hulk-job-{role.job}-{role.rank}-{role.restart_count}"
