"""The lab's processes (broker, planner, agents): started in their namespaces, watched, restarted
on an operator's request, stopped in reverse order.

A lab that runs once (``lab.run`` without ``--keep``) ends when any of them dies: it could not
finish. A ``--keep`` lab exists for fault experiments, so a death is reported once (which
service, its exit code, its log) and the rest keep running; ``python -m lab.ctl restart NAME
--work DIR`` brings it back. Dead services are never restarted on their own: an experiment that
kills an agent wants its node silent until the operator says otherwise.

The work dir holds ``services.json`` (each service's host, namespace, argv, pid and log; no
environment, which carries the secure lab's secrets) and ``control/``, where ``lab.ctl`` drops
requests that the running lab carries out (it holds the secrets in memory). A restart may add
flags (``lab.ctl restart planner -- --dashboard ...``) or drop them (``--drop NAME``): the service
keeps its command line so changed for every later restart (:func:`with_args`).

The lab stops in stages (:func:`stop_stages`): the agents together, then serve, then the broker,
each stage once the one before has exited. An agent stopping while the broker closes its
connection can have paho close the socket before aiomqtt's deferred ``add_writer`` for the
DISCONNECT runs, and asyncio logs ``OSError: [Errno 9] Bad file descriptor`` in the agent's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from lab.netns import LabError
from lab.wan import REPO, WanLab

SERVICES_FILE = "services.json"
CONTROL_DIR = "control"


@dataclass(frozen=True)
class Decision:
    """What to do about the services that exited: tear the lab down, or report ``report`` (the
    newly dead, by name) and go on."""

    teardown: bool
    dead: tuple[str, ...]
    report: tuple[str, ...]


def decide(exits: Mapping[str, int | None], reported: Collection[str], *, keep: bool) -> Decision:
    """``exits``: each service's exit code, None while it runs. Without ``keep`` any death ends
    the lab; with it each death is reported once and the lab goes on."""
    dead = tuple(sorted(name for name, code in exits.items() if code is not None))
    if dead and not keep:
        return Decision(teardown=True, dead=dead, report=dead)
    return Decision(teardown=False, dead=dead,
                    report=tuple(name for name in dead if name not in reported))


def restart_hint(name: str, work: Path) -> str:
    return f"python -m lab.ctl restart {name} --work {work}"


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not token[1:2].isdigit()


def _without(argv: Sequence[str], flags: Collection[str]) -> list[str]:
    """``argv`` less every ``FLAG``, ``FLAG VALUE...`` and ``FLAG=VALUE`` of ``flags`` (a flag's
    values: the words after it up to the next flag)."""
    out: list[str] = []
    skipping = False
    for token in argv:
        if _is_flag(token):
            skipping = token.split("=", 1)[0] in flags
        if not skipping:
            out.append(token)
    return out


def with_args(argv: Sequence[str], add: Sequence[str] = (), drop: Collection[str] = ()) -> list[str]:
    """``argv`` with the flags of ``drop`` removed and ``add`` appended, a flag of ``add`` that
    ``argv`` already has replacing it (``--metrics A`` then ``--metrics B`` leaves one, B)."""
    if add and not _is_flag(add[0]):
        raise LabError(f"expected flags to add (--NAME [VALUE]), got {add[0]!r}")
    replaced = {token.split("=", 1)[0] for token in add if _is_flag(token)}
    return _without(argv, set(drop) | replaced) + list(add)


def stop_stages(names: Sequence[str]) -> list[list[str]]:
    """The order the lab stops its services in (``names`` in the order started): every agent
    at once, then the others last started first, the broker last of all: the agents stop while
    serve and the broker still answer them (their last reports, a clean MQTT DISCONNECT)."""
    agents = [n for n in names if n.startswith("agent-")]
    brokers = [n for n in names if n.startswith("mosquitto")]
    others = [n for n in reversed(names) if n not in agents and n not in brokers]
    return [stage for stage in (agents, *[[n] for n in others], *[[n] for n in reversed(brokers)])
            if stage]


@dataclass
class Spec:
    """How a service was started, to start it again."""

    host: str
    argv: list[str]
    env: dict[str, str]


class Services:
    """The processes the lab started, by name, and how to start each again."""

    def __init__(self, lab: WanLab, work: Path, python: str, env: dict[str, str]):
        self.lab, self.work, self.python, self.env = lab, work, python, env
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.specs: dict[str, Spec] = {}
        self.reported: set[str] = set()

    def start(self, name: str, host: str, argv: Sequence[str],
              env: dict[str, str] | None = None, *, append: bool = False) -> subprocess.Popen:
        """``argv`` in ``host``'s namespace, with the lab's environment plus ``env``."""
        out = open(self.log(name), "ab" if append else "wb")
        proc = self.lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT,
                              env={**self.env, **(env or {})}, cwd=str(REPO),
                              start_new_session=True)
        out.close()   # the child holds its own copy
        self.specs[name] = Spec(host, list(argv), dict(env or {}))
        self.procs = [(n, p) for n, p in self.procs if n != name] + [(name, proc)]
        self.reported.discard(name)
        self.write_file()
        return proc

    def log(self, name: str) -> Path:
        return self.work / f"{name}.log"

    def check(self, keep: bool = False) -> list[str]:
        """Raise LabError when a service died, unless ``keep``: then one line per newly dead
        service (and the lab goes on)."""
        decision = decide({name: proc.poll() for name, proc in self.procs}, self.reported,
                          keep=keep)
        codes = {name: proc.returncode for name, proc in self.procs}
        if decision.teardown:
            name = decision.dead[0]
            tail = self.log(name).read_text(errors="replace")[-1500:]
            raise LabError(f"{name} exited with code {codes[name]}:\n{tail}")
        self.reported.update(decision.report)
        return [f"lab: {name} exited with code {codes[name]} (log {self.log(name)}); the rest "
                f"keep running; to start it again: {restart_hint(name, self.work)}"
                for name in decision.report]

    def resolve(self, name: str) -> str:
        """The service called ``name``, or the agent of host ``name``."""
        for candidate in (name, f"agent-{name}"):
            if candidate in self.specs:
                return candidate
        raise LabError(f"no service {name!r}; the lab's services: {', '.join(self.specs)}")

    def restart(self, name: str, add: Sequence[str] = (),
                drop: Collection[str] = ()) -> subprocess.Popen:
        """Stop ``name`` (a service, or a host for its agent) if it still runs, then start it
        again with the command line it last ran with, ``add`` and ``drop`` applied
        (:func:`with_args`; kept for later restarts)."""
        name = self.resolve(name)
        spec = self.specs[name]
        argv = with_args(spec.argv, add, drop)
        for other, proc in self.procs:
            if other == name:
                _stop([proc])
        changed = " ".join([*add, *(f"--drop {flag}" for flag in drop)])
        with open(self.log(name), "ab") as out:
            out.write(f"--- started again by lab.ctl at {time.strftime('%H:%M:%S')}"
                      f"{' with ' + changed if changed else ''}\n".encode())
        return self.start(name, spec.host, argv, spec.env, append=True)

    def serve_requests(self) -> None:
        """Carry out the requests ``lab.ctl`` left in the control folder."""
        folder = self.work / CONTROL_DIR
        for request in sorted(folder.glob("*.request")) if folder.is_dir() else []:
            try:
                asked = json.loads(request.read_text())
                name = self.resolve(asked["restart"])
                add, drop = list(asked.get("add", [])), list(asked.get("drop", []))
                if not all(isinstance(word, str) for word in add + drop):
                    raise LabError("expected words to add and flags to drop")
                proc = self.restart(name, add, drop)
                answer = {"ok": True, "message": f"started {name} again (pid {proc.pid}): "
                                                 f"{' '.join(self.specs[name].argv)}"}
            except (LabError, OSError, ValueError, KeyError, TypeError) as err:
                answer = {"ok": False, "message": str(err)}
            request.with_suffix(".done").write_text(json.dumps(answer))
            request.unlink(missing_ok=True)
            print(f"lab: {answer['message']}", flush=True)

    def write_file(self) -> None:
        """services.json: what ``lab.ctl status`` shows."""
        rows = []
        for name, proc in self.procs:
            spec = self.specs[name]
            rows.append({"name": name, "host": spec.host, "netns": self._netns(spec.host),
                         "argv": spec.argv, "pid": proc.pid, "log": str(self.log(name))})
        path = self.work / SERVICES_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"lab_pid": os.getpid(), "services": rows}, indent=1))
        tmp.replace(path)

    def _netns(self, host: str) -> str:
        try:
            return self.lab.ns(host).netns
        except (KeyError, LabError, AttributeError):
            return ""

    def stop(self) -> None:
        """Every service, stage after stage (:func:`stop_stages`)."""
        procs = dict(self.procs)
        for stage in stop_stages([name for name, _ in self.procs]):
            _stop([procs[name] for name in stage])
        self.procs.clear()


def _stop(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM each process group, SIGKILL what is left after ``grace_s``."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
