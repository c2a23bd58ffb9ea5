"""The hostile round's signal class: SIGTERM, SIGKILL (and SIGINT) while something writes.

- `plan --out` stopped at spread moments: the output is the earlier file, byte for byte, or the
  new one whole, never a part, and no temporary file is left;
- `jobs submit` (a file of 200 jobs) and `fleet import` stopped at spread moments: the store
  opens, passes `PRAGMA integrity_check`, keeps what it held, and holds the file's jobs (nodes)
  all or none; all of them when the command said it was done (exit 0);
- `hulk-planner serve` stopped while two enrolled agents report (Report calls over TLS) and an
  operator's `jobs submit` / `fleet import` loop writes into its store: serve starts again on the
  store, and every batch serve acknowledged (Report answered OK), every job `jobs submit`
  acknowledged and every node of an acknowledged `fleet import` (exit 0) is stored.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench.hostile_common import (CLI, FLEET, JOBS, LIMIT_S, ROOT, Outcome, Serve,
                                  register_request, run_cli)

WORLD = ROOT / "examples" / "fleets" / "world-48.json"
LAB_NODES = {n["id"] for n in json.loads(FLEET.read_text())["nodes"]}
SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)
JOBS_PER_FILE = 200             # a file of many jobs: its one transaction takes a while


def plan_round(tmp: Path, rounds: int) -> Iterator[Outcome]:
    """`plan --out` stopped by a signal at spread moments."""
    out = tmp / "plan.json"
    code, text, _ = run_cli(["plan", str(JOBS), "--fleet", str(FLEET), "--no-compare",
                             "--out", str(out)])
    if code != 0:
        yield Outcome("plan --out: first plan", False, code, 0.0, text[-200:])
        return
    earlier = out.read_bytes()
    start = time.monotonic()
    subprocess.run([*CLI, "plan", str(JOBS), "--fleet", str(FLEET), "--no-compare", "--out",
                    str(tmp / "timing.json")], capture_output=True, cwd=ROOT)
    full_s = time.monotonic() - start
    for i in range(rounds):
        for sig in SIGNALS:
            delay = full_s * (0.5 + 0.5 * i / max(1, rounds - 1))
            proc = subprocess.Popen([*CLI, "plan", str(JOBS), "--fleet", str(FLEET),
                                     "--no-compare", "--out", str(out)], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(delay)
            proc.send_signal(sig)
            name = f"plan --out: {sig.name} at {delay:.2f} s"
            try:
                _, err = proc.communicate(timeout=LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                yield Outcome(name, False, None, delay, "hang after the signal")
                continue
            data = out.read_bytes()
            whole = data == earlier
            if not whole:
                try:
                    json.loads(data)
                    whole = True
                except ValueError:
                    whole = False
            leftovers = [p.name for p in tmp.glob("plan.json*") if p.name != "plan.json"]
            why = [] if whole else ["output half written"]
            if "Traceback" in (err or ""):
                why.append("traceback")
            if leftovers:
                why.append(f"left {leftovers}")
                for p in tmp.glob("plan.json.*"):
                    p.unlink()
            yield Outcome(name, not why, proc.returncode, delay,
                          "output whole" if not why else "; ".join(why),
                          expected="the earlier file or the new one, whole",
                          where="" if not why else "planner/files/plan.py (the atomic write)")


def store_state(db: Path) -> tuple[str, set[str], set[str], set[str]]:
    """(integrity_check, job names, node ids, acknowledged batch ids) of a store at rest."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        jobs = {r[0] for r in conn.execute("SELECT name FROM jobs")}
        nodes = {r[0] for r in conn.execute("SELECT id FROM nodes")}
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        batches = ({r[0] for r in conn.execute("SELECT batch_id FROM batches")}
                   if "batches" in names else set())
        return integrity, jobs, nodes, batches
    finally:
        conn.close()


def jobs_file(path: Path, names: list[str]) -> Path:
    path.write_text("jobs:\n" + "".join(
        f'  - name: {n}\n    model: gpt2-xl\n    command: "python train.py"\n' for n in names))
    return path


def cli_round(tmp: Path, rounds: int) -> Iterator[Outcome]:
    """`jobs submit` and `fleet import` stopped at spread moments."""
    base = tmp / "base.sqlite"        # a fleet and a job; each round writes into a copy of it
    run_cli(["fleet", "import", str(FLEET), "--db", str(base)])
    run_cli(["jobs", "submit", str(jobs_file(tmp / "kept.yaml", ["kept"])), "--db", str(base)])
    db = base
    lab_nodes = store_state(base)[2]
    world_nodes = {n["id"] for n in json.loads(WORLD.read_text())["nodes"]}
    timing = {}
    for what in ("jobs submit", "fleet import"):     # how long each takes on a copy of the store
        spare = tmp / f"timing-{what[:4]}.sqlite"
        spare.write_bytes(db.read_bytes())
        target = (str(jobs_file(tmp / "t.yaml", [f"t{k}" for k in range(JOBS_PER_FILE)]))
                  if what == "jobs submit" else str(WORLD))
        start = time.monotonic()
        run_cli([*what.split(), target, "--db", str(spare)])
        timing[what] = time.monotonic() - start
    n = 0
    for i in range(rounds):
        for what in ("jobs submit", "fleet import"):
            for sig in (signal.SIGKILL, signal.SIGTERM):
                n += 1
                db = tmp / f"round-{n}.sqlite"
                db.write_bytes(base.read_bytes())
                delay = timing[what] * (0.4 + 0.7 * i / max(1, rounds - 1))
                names = [f"r{n}-{k}" for k in range(JOBS_PER_FILE)]
                target = (str(jobs_file(tmp / f"r{n}.yaml", names)) if what == "jobs submit"
                          else str(WORLD))
                before = store_state(db)
                proc = subprocess.Popen([*CLI, *what.split(), target, "--db", str(db)], cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
                time.sleep(delay)
                proc.send_signal(sig)
                try:
                    _, err = proc.communicate(timeout=LIMIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    err = "hang"
                yield judge_cli(f"{what}: {sig.name} at {delay:.2f} s", db, proc.returncode, err,
                                before, what, set(names) if what == "jobs submit"
                                else world_nodes - lab_nodes, delay)


def judge_cli(name, db, code, err, before, what, new: set[str], delay) -> Outcome:
    why = []
    try:
        integrity, jobs, nodes, _ = store_state(db)
    except sqlite3.Error as exc:
        return Outcome(name, False, code, delay, f"the store does not open: {exc}",
                       where="planner/service/database.py")
    have = jobs if what == "jobs submit" else nodes
    kept = before[1] if what == "jobs submit" else before[2]
    if integrity != "ok":
        why.append(f"integrity_check: {integrity}")
    if not kept <= have:
        why.append(f"lost {sorted(kept - have)[:5]}")
    got = new & have
    if got and got != new:
        why.append(f"a part stored: {len(got)} of {len(new)}")
    if code == 0 and got != new:
        why.append("acknowledged (exit 0) but not stored")
    if err == "hang":
        why.append("hang after the signal")
    elif "Traceback" in err:
        why.append("traceback")
    state = "all stored" if got == new else "none stored"
    return Outcome(name, not why, code, delay,
                   f"exit {code}, {state}, integrity {integrity}" if not why else "; ".join(why),
                   expected="all or none; all when acknowledged; the store whole",
                   where="" if not why else "planner/service/store.py, job_records.py")


class Agents:
    """Two enrolled agents reporting as fast as serve answers, and an operator's `jobs submit`
    loop; each remembers what was acknowledged."""

    def __init__(self, serve: Serve, tmp: Path):
        import grpc

        from hulk.v1 import hulk_pb2, hulk_pb2_grpc

        self.acked: dict[str, int] = {}
        self.jobs: set[str] = set()
        self.imports = 0
        self.stop = threading.Event()
        self.threads = []
        for node, peer in (("n1", "n2"), ("n2", "n1")):
            channel = serve.channel()
            stub = hulk_pb2_grpc.PlannerStub(channel)
            stub.Register(register_request(node), metadata=serve.bearer(node), timeout=10)

            def report(node=node, peer=peer, stub=stub, channel=channel):
                k = 0
                while not self.stop.is_set():
                    k += 1
                    batch = f"{node}-{os.getpid()}-{time.monotonic_ns()}-{k}"
                    now = int(time.time() * 1000)
                    request = hulk_pb2.ReportRequest(node_id=node, batch_id=batch, samples=[
                        hulk_pb2.Sample(peer_id=peer, sent_at_ms=now - j, payload_bytes=56,
                                        kind=hulk_pb2.PROBE_KIND_ICMP, rtt_ms=1.0,
                                        timeout_ms=2000.0) for j in range(20)])
                    try:
                        answer = stub.Report(request, metadata=serve.bearer(node), timeout=5)
                        self.acked[batch] = answer.accepted
                    except grpc.RpcError:
                        time.sleep(0.05)
                channel.close()

            self.threads.append(threading.Thread(target=report, daemon=True))

        def submit():
            k = 0
            while not self.stop.is_set():
                k += 1
                if k % 3 == 2:      # and now and then a `fleet import` into the served store
                    args = ["fleet", "import", str(FLEET), "--db", str(serve.db)]
                    self.imports += run_cli(args, 20)[0] == 0
                    continue
                name = f"op-{k}"
                path = jobs_file(tmp / "op.yaml", [name])
                if run_cli(["jobs", "submit", str(path), "--db", str(serve.db)], 20)[0] == 0:
                    self.jobs.add(name)

        self.threads.append(threading.Thread(target=submit, daemon=True))
        for t in self.threads:
            t.start()

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def serve_round(tmp: Path, kills: tuple = (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL,
                                           signal.SIGTERM, signal.SIGKILL)) -> Iterator[Outcome]:
    for i, sig in enumerate(kills):
        started = time.monotonic()
        serve = Serve(tmp / f"serve-{i}").start()
        agents = Agents(serve, tmp / f"serve-{i}")
        time.sleep(1.0 + 0.4 * i)
        acked_before = len(agents.acked)
        serve.proc.send_signal(sig)
        try:
            code = serve.proc.wait(30)
        except subprocess.TimeoutExpired:
            code = None
            serve.proc.kill()
        serve.proc = None
        agents.end()
        why = []
        if code is None:
            why.append(f"serve did not end within 30 s of {sig.name}")
        log = serve.log.read_text(errors="replace")
        if "Traceback" in log:
            why.append("traceback in serve's log: " + next(
                (ln for ln in log.splitlines() if "Error" in ln), "")[:160])
        try:
            serve.start()          # the store opens again
            serve.stop()
        except RuntimeError as err:
            why.append(f"serve does not start again: {str(err)[-200:]}")
        try:
            integrity, jobs, nodes, batches = store_state(serve.db)
        except sqlite3.Error as err:
            integrity, jobs, nodes, batches = f"does not open: {err}", set(), set(), set()
        if agents.imports and not LAB_NODES <= nodes:
            why.append("an acknowledged `fleet import` not stored")
        lost = set(agents.acked) - batches
        lost_jobs = agents.jobs - jobs
        if integrity != "ok":
            why.append(f"integrity_check: {integrity}")
        if lost:
            why.append(f"{len(lost)} acknowledged batches not stored")
        if lost_jobs:
            why.append(f"{len(lost_jobs)} acknowledged jobs not stored")
        detail = (f"serve {sig.name} after {acked_before} acknowledged batches (exit {code}); "
                  f"{len(agents.acked)} batches, {len(agents.jobs)} `jobs submit` and "
                  f"{agents.imports} `fleet import` acknowledged, all stored; restarted")
        yield Outcome(f"serve {sig.name} while 2 agents report and jobs submit writes (round "
                      f"{i + 1})", not why, code, time.monotonic() - started,
                      detail if not why else "; ".join(why),
                      expected="restarts; every acknowledged batch and job stored",
                      where="" if not why else "planner/service/runtime.py, ingest.py")


def signal_round(tmp: Path, rounds: int = 3, progress=None) -> Iterator[Outcome]:
    tmp.mkdir(parents=True, exist_ok=True)
    yield from plan_round(tmp, rounds)
    yield from cli_round(tmp, rounds + 2)
    yield from serve_round(tmp)
