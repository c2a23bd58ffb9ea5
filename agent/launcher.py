"""Launching a placement's training command under torchrun (as a subprocess: no torch here).

How a role runs: ``torchrun --nnodes N --node-rank R --nproc-per-node 1 --rdzv-backend static
--master-addr A --master-port P --max-restarts 0 --no-python <command>``. The static rendezvous
(the rank-0 node hosts a TCPStore on the job's port; every node knows its rank from the
placement) is what works with torch 2.13 on CPU/gloo without an etcd or an elastic c10d
round-trip, and it matches a placement exactly: the planner fixes ranks, nothing is negotiated.
``--no-python`` makes torchrun run the job's command (an argv list) as written; a leading
``python``/``python3`` is replaced by the configured interpreter (the one beside torchrun), so the
training program runs in the environment that has torch. torchrun is the agent config's
``torchrun`` (HULK_TORCHRUN), else the one beside the agent's python, else on PATH.

What a placement may run (docs/PLACEMENTS.md):
- only a command whose argv starts with one of the agent's ``allowed_commands`` (argv prefixes,
  compared word by word, before ``python`` is replaced; none by default) and whose job name is
  1-64 of [A-Za-z0-9._-]; a refused role is state FAILED with a one-line ``refused: ...`` detail;
- in ``jobs_dir/<job>/`` (state_dir/jobs/<job>/, made 0700) with its log ``job.log`` there, and
  its progress file ``progress-<rank>.jsonl`` (HULK_PROGRESS_FILE, fresh for each run), whose
  summary (agent/progress.py) the status carries while the job runs and after it ends;
- with an environment built from an allow-list: the role's HULK_* variables, PATH, HOME, LANG and
  the config's ``pass_env`` names (never a HULK_* of the agent: not its token, broker URL or keys);
- without the agent's capabilities: before exec the child clears its ambient and inheritable
  capabilities, empties its bounding set and sets no_new_privs, so even as root it runs with none.

The process gets HULK_* variables describing its role (hulk.settings lists them) besides the
RANK/WORLD_SIZE/MASTER_* that torchrun sets. A new placement stops the old process group first:
SIGTERM to the group, SIGKILL after ``grace_s``. Roles of later phases run after the earlier one
exits with 0 (torchrun's rendezvous waits for the job's other nodes).

States (exposed for the Heartbeat): idle, starting (spawned), running (alive after
``running_after_s``), exited (with its code), failed (could not be started).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from agent.progress import read_progress
from hulk.wire.placement import NodePlacement, Role, valid_job_name
from hulk.wire.progress import ENV_VAR as PROGRESS_ENV_VAR
from hulk.wire.records import LaunchState, LaunchStatus

log = logging.getLogger(__name__)

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
BASE_ENV_NAMES = ("PATH", "HOME", "LANG")
JOB_LOG = "job.log"


# --------------------------------------------------------------------------- process runner

class ProcessHandle(Protocol):
    pid: int

    async def wait(self) -> int: ...

    def signal_group(self, sig: int) -> None: ...


class ProcessRunner(Protocol):
    async def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
                    log_path: Path | None) -> ProcessHandle: ...


class _SubprocessHandle:
    def __init__(self, proc: asyncio.subprocess.Process):
        self._proc = proc
        self.pid = proc.pid

    async def wait(self) -> int:
        return await self._proc.wait()

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)  # the process leads its own session: its group is its pid
        except ProcessLookupError:
            pass


# Run by a fresh interpreter between the agent and the job (``python -I -S -c`` this, then the
# job's argv): no ambient, inheritable or bounding capabilities and no_new_privs (Linux
# prctl/capset), so the job runs without any capability even as root, then exec the job. Not a
# preexec_fn: Python code between fork and exec in the agent, whose gRPC and DNS threads may
# hold locks, can deadlock or abort the child (seen: gRPC's fork handler killed a relaunch with
# SIGABRT, "epoll_wait error: Bad file descriptor"); without one the child is vforked and execs.
DROP_CAPABILITIES_AND_EXEC = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(38, 1, 0, 0, 0)                      # PR_SET_NO_NEW_PRIVS
libc.prctl(47, 4, 0, 0, 0)                      # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
for cap in range(64):                           # PR_CAPBSET_DROP each (EINVAL past the last)
    libc.prctl(24, cap, 0, 0, 0)
header = (ctypes.c_uint32 * 2)(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, this process
data = (ctypes.c_uint32 * 6)()                  # {effective, permitted, inheritable} x 2
if libc.capget(header, data) == 0:
    data[0] = data[1] = data[2] = data[3] = data[4] = data[5] = 0
    libc.capset(header, data)
try:
    os.execvp(sys.argv[1], sys.argv[1:])
except OSError as exc:
    sys.stderr.write(f"hulk-agent: cannot start {sys.argv[1]}: {exc.strerror}\n")
    os._exit(127)
"""


class SubprocessRunner:
    """Real processes, each in a new session so the whole tree (torchrun + workers) is one group,
    without the agent's capabilities (``drop_caps``)."""

    def __init__(self, drop_caps: bool = True):
        self.drop_caps = drop_caps and sys.platform == "linux"

    async def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None,
                    log_path: Path | None) -> ProcessHandle:
        if not argv:
            raise ValueError("empty command")
        if self.drop_caps:
            # The wrapper would report a missing program only in the job's log: say it here.
            if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
                raise FileNotFoundError(errno.ENOENT, "no such program on the job's PATH", argv[0])
            argv = [sys.executable, "-I", "-S", "-c", DROP_CAPABILITIES_AND_EXEC, *argv]
        out = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(log_path, "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=dict(env), cwd=str(cwd) if cwd else None, stdin=asyncio.subprocess.DEVNULL,
                stdout=out or asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        finally:
            if out is not None:
                out.close()
        return _SubprocessHandle(proc)


# ---------------------------------------------------------------------------- command lines

def log_tail(path: Path | None, max_bytes: int = 3000, max_lines: int = 20) -> str:
    """The last lines of a job's log, at most ``max_bytes`` (the heartbeat carries them; the
    planner keeps 4 KiB of a launch detail)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]        # the first line is cut
    return "\n".join(lines[-max_lines:])


def role_env(role: Role) -> dict[str, str]:
    """The HULK_* variables a launched process reads (hulk/settings.py documents each)."""
    return {
        "HULK_PLAN_ID": role.plan_id, "HULK_JOB": role.job,
        "HULK_STAGE": str(role.stage), "HULK_NUM_STAGES": str(role.num_stages),
        "HULK_LAYER_LO": str(role.layer_lo), "HULK_LAYER_HI": str(role.layer_hi),
        "HULK_REPLICA": str(role.replica), "HULK_NUM_REPLICAS": str(role.num_replicas),
        "HULK_MICRO_BATCH": str(role.micro_batch),
        "HULK_RANK": str(role.rank), "HULK_WORLD_SIZE": str(role.world_size),
        "HULK_RDZV_ADDRESS": role.rendezvous_address, "HULK_RDZV_PORT": str(role.rendezvous_port),
        "HULK_MICRO_BATCHES": str(role.micro_batches), "HULK_RESTART_COUNT": str(role.restart_count),
        # Empty when the job names none: the job keeps no checkpoints. A relative path resolves
        # against the job's working directory, state_dir/jobs/<job>/.
        "HULK_CHECKPOINT_DIR": role.checkpoint_dir or "",
    }


def progress_file(job_dir: Path | None, role: Role) -> Path | None:
    """The rank's progress file in its job's directory (absolute, as HULK_PROGRESS_FILE), with
    any earlier run's removed: the summary's warm-up is the file's first line."""
    if job_dir is None:
        return None
    path = Path(os.path.abspath(job_dir / f"progress-{role.rank}.jsonl"))
    try:
        path.unlink(missing_ok=True)
    except OSError as err:       # e.g. the job made it a directory: no progress for this run
        log.warning("cannot reset the progress file %s: %s", path, err)
        return None
    return path


def default_torchrun() -> str:
    """torchrun beside this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).with_name("torchrun")
    return str(beside) if beside.exists() else (shutil.which("torchrun") or "torchrun")


class TorchrunCommand:
    """Role -> the torchrun command line (see the module docstring)."""

    def __init__(self, torchrun: str | None = None, python: str | None = None):
        self.torchrun = torchrun or default_torchrun()
        if python is None:
            beside = Path(self.torchrun).with_name("python")
            python = str(beside) if beside.exists() else sys.executable
        self.python = python

    def __call__(self, role: Role) -> list[str]:
        program = list(role.command or ())
        if not program:
            raise ValueError(f"job {role.job} has no command")
        if _PYTHON_RE.match(program[0]):
            program[0] = self.python
        return [self.torchrun, "--nnodes", str(role.world_size), "--node-rank", str(role.rank),
                "--nproc-per-node", "1", "--rdzv-backend", "static",
                "--master-addr", role.rendezvous_address, "--master-port", str(role.rendezvous_port),
                "--max-restarts", "0", "--no-python", *program]


# ---------------------------------------------------------------------------------- launcher

class Launcher:
    """Runs the current placement's roles; ``apply`` a new placement, read ``status``."""

    def __init__(self, *, runner: ProcessRunner | None = None,
                 command: Callable[[Role], list[str]] | None = None,
                 grace_s: float = 10.0, running_after_s: float = 0.5, jobs_dir: Path | None = None,
                 allowed_commands: Sequence[Sequence[str]] = (), pass_env: Sequence[str] = (),
                 base_env: Mapping[str, str] | None = None,
                 on_status: Callable[[LaunchStatus], None] | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 tail_every_s: float = 10.0):
        self.runner = runner or SubprocessRunner()
        self.command = command or TorchrunCommand()
        self.grace_s = grace_s
        self.running_after_s = running_after_s
        self.jobs_dir = Path(jobs_dir) if jobs_dir is not None else None
        self.allowed_commands = tuple(tuple(prefix) for prefix in allowed_commands if prefix)
        # The job's environment is an allow-list; the agent's own HULK_* (its token, its broker
        # URL with a password, its keys) are never passed through.
        names = [*BASE_ENV_NAMES, *(n for n in pass_env if not n.startswith("HULK_"))]
        source = os.environ if base_env is None else base_env
        self.base_env = {n: source[n] for n in names if n in source}
        self.on_status = on_status
        self._clock_ms = clock_ms
        self.tail_every_s = tail_every_s
        self.status = LaunchStatus(changed_at_ms=clock_ms())
        self._roles: tuple[Role, ...] | None = None
        self._task: asyncio.Task | None = None
        self._proc: ProcessHandle | None = None
        self._lock = asyncio.Lock()

    def _set(self, **fields) -> None:
        self.status = replace(self.status, changed_at_ms=self._clock_ms(), **fields)
        log.info("launch %s: %s%s%s", self.status.job or "-", self.status.state.name.lower(),
                 f" (code {self.status.exit_code})" if self.status.state == LaunchState.EXITED else "",
                 f" {self.status.detail.splitlines()[0]}" if self.status.detail else "")
        self._notify()

    def _update_detail(self, detail: str, progress_path: Path | None = None) -> None:
        """A new detail (the log's last lines) and step progress without a state change."""
        progress = read_progress(progress_path) or self.status.progress
        if detail != self.status.detail or progress != self.status.progress:
            self.status = replace(self.status, detail=detail, progress=progress)
            self._notify()

    def _notify(self) -> None:
        if self.on_status is not None:
            try:
                self.on_status(self.status)
            except Exception:
                log.exception("launch status consumer failed")

    async def apply(self, placement: NodePlacement | None) -> None:
        """Make the running process match ``placement`` (None: stop everything)."""
        async with self._lock:
            roles = placement.roles if placement is not None else ()
            if roles == self._roles:
                return  # same roles (e.g. a retained message redelivered): leave the process alone
            await self._stop_locked()
            self._roles = roles
            runnable = [r for r in roles if r.command]
            if not runnable:
                detail = "no placement" if not roles else "the placed job has no command"
                self._set(state=LaunchState.IDLE, plan_id=placement.plan_id if placement else "",
                          job=roles[0].job if roles else "", exit_code=0, detail=detail,
                          progress=None)
                return
            self._task = asyncio.create_task(self._run_roles(runnable), name="hulk-launch")

    async def stop(self) -> None:
        async with self._lock:
            await self._stop_locked()
            self._roles = None

    async def _stop_locked(self) -> None:
        proc, task = self._proc, self._task
        if task is not None:  # first, so a role that ends now does not start the next one
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if proc is not None:
            proc.signal_group(signal.SIGTERM)
            try:
                code = await asyncio.wait_for(proc.wait(), self.grace_s)
            except TimeoutError:
                log.warning("job process group %d ignored SIGTERM for %.0f s; killing it", proc.pid,
                            self.grace_s)
                proc.signal_group(signal.SIGKILL)
                code = await proc.wait()
            self._set(state=LaunchState.EXITED, exit_code=code, detail="stopped for a new placement")
        self._proc = self._task = None

    async def _run_roles(self, roles: list[Role]) -> None:
        for role in roles:
            code = await self._run_one(role)
            if code != 0:
                return

    def refusal(self, role: Role) -> str | None:
        """Why ``role`` may not run here (one line), or None."""
        if not valid_job_name(role.job):
            return f"job name {role.job[:80]!r} is not 1-64 of [A-Za-z0-9._-]"
        argv = tuple(role.command or ())
        if not any(argv[:len(prefix)] == prefix for prefix in self.allowed_commands):
            shown = shlex.join(argv)[:120]
            return (f"command {shown!r} is not in this agent's allowed_commands" if self.allowed_commands
                    else f"command {shown!r} refused: this agent's allowed_commands is empty")
        return None

    def job_dir(self, job: str) -> Path | None:
        """jobs_dir/<job>/, made 0700: the job's working directory and the home of its log."""
        if self.jobs_dir is None:
            return None
        path = self.jobs_dir / job
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)
        return path

    async def _run_one(self, role: Role) -> int | None:
        reason = self.refusal(role)
        if reason is not None:
            log.warning("refused to launch job %s of plan %s: %s", role.job[:80], role.plan_id, reason)
            self._set(state=LaunchState.FAILED, plan_id=role.plan_id, job=role.job[:64], exit_code=0,
                      detail=f"refused: {reason}", progress=None)
            return None
        self._set(state=LaunchState.STARTING, plan_id=role.plan_id, job=role.job, exit_code=0,
                  detail=f"stage {role.stage} replica {role.replica} rank {role.rank}/{role.world_size}",
                  progress=None)
        try:
            argv = self.command(role)
            env = {**self.base_env, **role_env(role)}
            cwd = self.job_dir(role.job)
            log_path = cwd / JOB_LOG if cwd is not None else None
            progress_path = progress_file(cwd, role)
            if progress_path is not None:
                env[PROGRESS_ENV_VAR] = str(progress_path)
            proc = await self.runner.start(argv, env, cwd, log_path)
        except (OSError, ValueError) as exc:
            self._set(state=LaunchState.FAILED, detail=f"cannot start: {exc}")
            return None
        self._proc = proc
        waiter = asyncio.ensure_future(proc.wait())
        done, _ = await asyncio.wait({waiter}, timeout=self.running_after_s)
        if not done:
            self._set(state=LaunchState.RUNNING, detail=f"pid {proc.pid}")
        try:
            # While it runs, the heartbeat carries the log's last lines (`hulk-planner jobs logs`).
            while not done:
                done, _ = await asyncio.wait({waiter}, timeout=self.tail_every_s)
                if not done:
                    self._update_detail(f"pid {proc.pid}\n{log_tail(log_path)}".rstrip(),
                                        progress_path)
            code = waiter.result()
        except asyncio.CancelledError:
            waiter.cancel()
            raise
        self._proc = None
        head = "exited 0" if code == 0 else f"exit code {code}"
        self._set(state=LaunchState.EXITED, exit_code=code,
                  detail=f"{head}\n{log_tail(log_path)}".rstrip(),
                  progress=read_progress(progress_path) or self.status.progress)
        return code
