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
- without the agent's capabilities: the wrapper that starts it (agent/jobproc.py) clears its
  ambient and inheritable capabilities, empties its bounding set and sets no_new_privs first,
  so even as root it runs with none.

The process gets HULK_* variables describing its role (hulk.settings lists them) besides the
RANK/WORLD_SIZE/MASTER_* that torchrun sets. A new placement stops the old process group first:
SIGTERM to the group, SIGKILL after ``grace_s``. Roles of later phases run after the earlier one
exits with 0 (torchrun's rendezvous waits for the job's other nodes).

Job processes outlive the agent (agent/jobproc.py: their own session, a systemd scope where
``job_scope`` allows, ``run.json`` and ``exit.json`` in the job's directory). ``detach`` leaves
them running when the agent stops. The first ``apply`` after a start adopts each recorded process
that is still alive and whose role the placement names (RUNNING, "adopted pid N"; polled every
``adopt_poll_s``), reports a named role that ended while no agent watched as EXITED with its
recorded code (it is not run again), and stops every live process the placement does not name, so
a job re-placed elsewhere never runs twice.

States (exposed for the Heartbeat): idle, starting (spawned), running (alive after
``running_after_s``), exited (with its code; exit cause FENCED when its wrapper stopped it
because the node's lease lapsed: serve restarts such a job without spending its budget), failed
(could not be started). An exited rank's detail (``exit_detail``) has the lines around the log's
first error, its last lines and the log's path, within the 4 KiB the planner keeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from agent.joblog import root_cause
from agent.jobproc import (EXIT_FILE, KILLED_CODE, LEASE_FILE, ProcessHandle, ProcessRunner,
                           RunRecord, SubprocessRunner, read_exit_code, read_fenced, read_records,
                           role_json, unit_name)
from agent.progress import read_progress
from hulk.wire.placement import NodePlacement, Role, command_allowed, valid_job_name
from hulk.wire.progress import ENV_VAR as PROGRESS_ENV_VAR
from hulk.wire.records import ExitCause, LaunchState, LaunchStatus

if TYPE_CHECKING:
    from agent.lease import NodeLease

log = logging.getLogger(__name__)

_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
BASE_ENV_NAMES = ("PATH", "HOME", "LANG")
JOB_LOG = "job.log"


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
    if size > max_bytes:         # the read may start inside a character: skip its rest
        data = data.lstrip(bytes(range(0x80, 0xC0)))
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and len(lines) > 1:
        lines = lines[1:]        # the first line is cut (kept when it is the only one)
    return "\n".join(lines[-max_lines:])


DETAIL_MAX_BYTES = 3500      # the planner keeps 4 KiB of a launch detail
LINE_MAX_BYTES = 300         # one log line in a detail
ERROR_BEFORE, ERROR_LINES = 3, 8
ERROR_RE = re.compile(rb"error|exception|traceback|fatal|killed", re.IGNORECASE)


def clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8 (an ellipsis marks a cut)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max(0, max_bytes - 3)].decode("utf-8", "ignore") + "\u2026"


def first_error(path: Path) -> tuple[int, int, int, list[str]] | None:
    """(first, last, total lines, lines): up to ERROR_LINES lines around the log's first line that
    names an error; None when no line does or the log cannot be read. Reads the log once, a line
    (at most 64 KiB of one) at a time."""
    before: deque[bytes] = deque(maxlen=ERROR_BEFORE)
    section: list[bytes] = []
    first = total = 0
    try:
        with open(path, "rb") as f:
            for total, line in enumerate(iter(lambda: f.readline(65536), b""), 1):
                if section:
                    if len(section) < ERROR_LINES:
                        section.append(line)
                elif ERROR_RE.search(line):
                    first, section = total - len(before), [*before, line]
                else:
                    before.append(line)
    except OSError:
        return None
    if not section:
        return None
    lines = [clip(b.decode("utf-8", "replace").rstrip("\r\n"), LINE_MAX_BYTES) for b in section]
    return first, first + len(lines) - 1, total, lines


def exit_detail(code: int, log_path: Path | None) -> str:
    """A launch detail for an ended process: ``exited 0`` or ``exit code N``; for a failure the
    lines around the first error and the heading ``last lines:``; the log's last lines; and
    ``full log: PATH``. At most DETAIL_MAX_BYTES."""
    head = ["exited 0" if code == 0 else f"exit code {code}"]
    if log_path is None:
        return head[0]
    if code != 0:
        found = first_error(log_path)
        if found is not None:
            first, last, total, lines = found
            head += [f"first error (lines {first}-{last} of {total}):", *lines]
            cause = root_cause(log_path)
            if cause is not None and not first <= cause[0] <= last:
                # A traceback's cause is its last line, often past the window's frames.
                head.append(clip(f"cause (line {cause[0]}): {cause[1]}", LINE_MAX_BYTES))
        head.append("last lines:")
    foot = clip(f"full log: {os.path.abspath(log_path)}", 600)
    room = DETAIL_MAX_BYTES - len("\n".join([*head, foot]).encode()) - 1
    tail: list[str] = []
    for line in reversed(log_tail(log_path).splitlines()):
        line = clip(line, LINE_MAX_BYTES)
        room -= len(line.encode()) + 1
        if room < 0:
            break
        tail.insert(0, line)
    return clip("\n".join([*head, *tail, foot]), DETAIL_MAX_BYTES)


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
        **sync_env(role),
    }


def sync_env(role: Role) -> dict[str, str]:
    """How the job synchronises (docs/PLACEMENTS.md): every step, or DiLoCo islands with an outer
    sync every HULK_INNER_STEPS steps."""
    return {
        "HULK_SYNC": role.sync, "HULK_INNER_STEPS": str(role.inner_steps),
        "HULK_OUTER_COMPRESSION": role.outer_compression,
        "HULK_STREAMING_FRAGMENTS": str(role.streaming_fragments),
        "HULK_ISLAND": str(role.island), "HULK_NUM_ISLANDS": str(role.num_islands),
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
                 tail_every_s: float = 10.0, adopt_poll_s: float = 1.0, job_scope: str = "auto",
                 lease: NodeLease | None = None):
        self.runner = runner or SubprocessRunner(scope=job_scope)
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
        self.adopt_poll_s = adopt_poll_s
        self.lease = lease        # None: no fencing (the node lease, agent/lease.py)
        self._first = True        # the first apply takes over what an earlier agent left running
        self.status = LaunchStatus(changed_at_ms=clock_ms())
        self._roles: tuple[Role, ...] | None = None
        self._task: asyncio.Task | None = None
        self._proc: ProcessHandle | None = None
        self._lock = asyncio.Lock()

    def _set(self, **fields) -> None:
        fields.setdefault("exit_cause", ExitCause.UNSPECIFIED)   # only a fenced end says FENCED
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
            runnable = [r for r in roles if r.command]
            resume = None
            if self._first:
                self._first = False
                resume = await self._take_over(runnable)
            if roles == self._roles:
                return  # same roles (e.g. a retained message redelivered): leave the process alone
            await self._stop_locked()
            self._roles = roles
            if not runnable:
                detail = "no placement" if not roles else "the placed job has no command"
                self._set(state=LaunchState.IDLE, plan_id=placement.plan_id if placement else "",
                          job=roles[0].job if roles else "", exit_code=0, detail=detail,
                          progress=None)
                return
            if resume is not None and resume[1] is not None:   # RUNNING as soon as apply returns
                adopted, proc = runnable[resume[0]], resume[1]
                self._proc = proc     # a new placement before the task starts still stops it
                log.info("adopted job %s (pid %d) left running by an earlier agent", adopted.job,
                         proc.pid)
                self._set(state=LaunchState.RUNNING, plan_id=adopted.plan_id, job=adopted.job,
                          exit_code=0, detail=f"adopted pid {proc.pid}", progress=None)
            self._task = asyncio.create_task(self._run_roles(runnable, resume), name="hulk-launch")

    async def stop(self) -> None:
        async with self._lock:
            await self._stop_locked()
            self._roles = None

    async def detach(self) -> None:
        """Stop watching and leave the processes running (the agent stops or restarts; the next
        agent adopts them, or stops them if its placement no longer names them)."""
        async with self._lock:
            await self._cancel_task()
            self._proc = None
            self._roles = None

    async def _cancel_task(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _stop_locked(self) -> None:
        proc = self._proc
        await self._cancel_task()  # first, so a role that ends now does not start the next one
        if proc is not None:
            code = await self._terminate(proc)
            self._set(state=LaunchState.EXITED, exit_code=code, detail="stopped for a new placement")
        self._proc = None

    async def _terminate(self, proc: ProcessHandle) -> int:
        """SIGTERM to the process group, SIGKILL after ``grace_s``; the exit code."""
        proc.signal_group(signal.SIGTERM)
        try:
            return await asyncio.wait_for(proc.wait(), self.grace_s)
        except TimeoutError:
            log.warning("job process group %d ignored SIGTERM for %.0f s; killing it", proc.pid,
                        self.grace_s)
            proc.signal_group(signal.SIGKILL)
            return await proc.wait()

    async def _take_over(self, roles: list[Role]) -> tuple[int, ProcessHandle | None, RunRecord] | None:
        """What an earlier agent left: stop each live process whose role ``roles`` do not name;
        the named record latest in phase order (its index, a handle when still alive)."""
        adopt = getattr(self.runner, "adopt", None)
        wanted = [role_json(r) for r in roles]
        resume = None
        for record in read_records(self.jobs_dir):
            handle = adopt(record, self.adopt_poll_s) if adopt is not None else None
            if record.role in wanted:
                index = wanted.index(record.role)
                if resume is None or index > resume[0]:
                    resume = (index, handle, record)
            elif handle is not None:
                log.warning("stopping job %s (pid %d): this node's placement no longer names it",
                            record.role.get("job", "?"), record.pid)
                await self._terminate(handle)
        return resume

    async def _run_roles(self, roles: list[Role],
                         resume: tuple[int, ProcessHandle | None, RunRecord] | None = None) -> None:
        start = 0
        if resume is not None:
            index, handle, record = resume
            if await self._follow(roles[index], handle, record) != 0:
                return
            start = index + 1
        for role in roles[start:]:
            code = await self._run_one(role)
            if code != 0:
                return

    async def _follow(self, role: Role, proc: ProcessHandle | None, record: RunRecord) -> int:
        """A recorded run of ``role``: watched to its end when still alive, else its recorded end."""
        if proc is not None:   # apply reported it RUNNING
            return await self._watch(proc, record.log_path, record.progress_path, "adopted pid")
        self.status = replace(self.status, plan_id=role.plan_id, job=role.job, progress=None)
        code = read_exit_code(record.exit_path)
        code = KILLED_CODE if code is None else code
        log.info("job %s (pid %d) ended while no agent watched it: exit code %d", role.job,
                 record.pid, code)
        await self._ended(code, record.log_path, record.progress_path)
        return code

    def refusal(self, role: Role) -> str | None:
        """Why ``role`` may not run here (one line), or None."""
        if not valid_job_name(role.job):
            return f"job name {role.job[:80]!r} is not 1-64 of [A-Za-z0-9._-]"
        argv = tuple(role.command or ())
        if not command_allowed(argv, self.allowed_commands):
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
            await self._hold_lease(cwd)
            proc = await self.runner.start(argv, env, cwd, log_path, unit=unit_name(role))
        except (OSError, ValueError) as exc:
            self._set(state=LaunchState.FAILED, detail=f"cannot start: {exc}")
            return None
        self._proc = proc
        if cwd is not None and getattr(proc, "start_ticks", None) is not None:
            try:   # what the next agent needs to adopt or stop this process
                RunRecord(job_dir=cwd, pid=proc.pid, start_ticks=proc.start_ticks,
                          role=role_json(role), log=os.path.abspath(log_path) if log_path else "",
                          progress=str(progress_path or "")).save()
            except OSError as exc:
                log.warning("cannot record job %s's process in %s: %s", role.job, cwd, exc)
        return await self._watch(proc, log_path, progress_path, "pid", self.running_after_s)

    async def _watch(self, proc: ProcessHandle, log_path: Path | None, progress_path: Path | None,
                     label: str, running_after_s: float = 0.0) -> int:
        """Wait for ``proc`` to end, reporting RUNNING after ``running_after_s`` and the log's
        tail every ``tail_every_s`` meanwhile; then EXITED with its code."""
        self._proc = proc
        waiter = asyncio.ensure_future(proc.wait())
        done = set()
        if running_after_s > 0:
            done, _ = await asyncio.wait({waiter}, timeout=running_after_s)
            if not done:
                self._set(state=LaunchState.RUNNING, detail=f"{label} {proc.pid}")
        try:
            # While it runs, the heartbeat carries the log's last lines (`hulk-planner jobs logs`).
            while not done:
                done, _ = await asyncio.wait({waiter}, timeout=self.tail_every_s)
                if not done:
                    self._update_detail(f"{label} {proc.pid}\n{log_tail(log_path)}".rstrip(),
                                        progress_path)
            code = waiter.result()
        except asyncio.CancelledError:
            waiter.cancel()
            raise
        self._proc = None
        await self._ended(code, log_path, progress_path)
        return code

    async def _hold_lease(self, cwd: Path | None) -> None:
        """A job starts only while this node holds its lease, with the lease in its folder."""
        if cwd is None:
            return
        if self.lease is None:
            (cwd / LEASE_FILE).unlink(missing_ok=True)    # an earlier agent's: not this run's
            return
        if not self.lease.valid():
            self._set(detail="waiting for the planner to acknowledge a heartbeat (node lease)")
            await self.lease.wait_valid()
        self.lease.track(cwd)

    async def _ended(self, code: int, log_path: Path | None, progress_path: Path | None) -> None:
        detail = await asyncio.to_thread(exit_detail, code, log_path)   # reads the whole log
        cause = ExitCause.UNSPECIFIED
        if log_path is not None:   # the job's folder holds its log, exit.json and lease.json
            if self.lease is not None:
                self.lease.untrack(log_path.parent)
            fenced = read_fenced(log_path.parent / EXIT_FILE)
            if fenced:
                log.warning("job %s was fenced: %s", self.status.job, fenced)
                detail = f"fenced: {fenced}\n{detail}"
                cause = ExitCause.FENCED     # not the job's failure: serve spends no restart on it
        self._set(state=LaunchState.EXITED, exit_code=code, detail=detail, exit_cause=cause,
                  progress=read_progress(progress_path) or self.status.progress)
