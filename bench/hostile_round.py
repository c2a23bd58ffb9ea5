"""A hostile round against the programs as a user runs them: every file reader, the store, signals
during writes (`python -m bench.hostile_round`). Each probe is tried through the real CLI
(`hulk-planner` in a subprocess) and is *held* when the program ends within its limit with exit 2
and one clear line naming the file (or, for a signal, leaves the output whole or absent); it
*failed* otherwise: a traceback, another code, a hang, a file left half written.

The network classes (gRPC before authentication, the throughput port, the HTTP servers) are
measured by their own benches (`bench/auth_flood_bench.py`, `bench/http_slow_bench.py`) and
tests; this round counts the classes that are reached through files and signals.

Figures go to bench/results/hostile_round.json with the date and the command.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "planner.cli"]
FLEET = ROOT / "examples" / "fleets" / "lab-5.json"
LIMIT_S = 60.0


@dataclass
class Outcome:
    probe: str
    held: bool
    code: int | None
    seconds: float
    detail: str


def run_cli(args: list[str], limit_s: float = LIMIT_S) -> tuple[int | None, str, float]:
    """(exit code, stderr+stdout's last lines, seconds); code None when it ran past the limit."""
    start = time.monotonic()
    try:
        done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=limit_s,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, "ran past the limit", time.monotonic() - start
    return done.returncode, (done.stderr + done.stdout), time.monotonic() - start


def refused_cleanly(code: int | None, out: str, names: str, *,
                    may_accept: bool = False) -> tuple[bool, str]:
    """Exit 2, no traceback, and an error line that names ``names`` (a file's name); with
    ``may_accept`` a plan made within the limit holds too (the value is within its bounds)."""
    if code is None:
        return False, "hang"
    if "Traceback" in out:
        return False, "traceback"
    if may_accept and code == 0:
        return True, "accepted: within its bounds"
    if code != 2:
        return False, f"exit {code}"
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if not lines or names not in lines[-1]:
        return False, f"last line does not name {names}: {lines[-1:]!r}"
    return True, lines[-1][:200]


# ------------------------------------------------------------------------------- the documents

def calibration_doc() -> dict:
    prior = lambda v: {"value": v, "low": v, "high": v, "runs": 0, "fitted": False}  # noqa: E731
    return {"format": "hulk-calibration/5",
            "compute": {"A100": {"value": 1.0, "low": 1.0, "high": 1.0, "runs": 5, "fitted": True}},
            "bandwidth": {}, "bandwidth_exponent": prior(0.0), "hop_overhead_s": prior(0.0),
            "micro_batch_overhead_s": prior(0.0), "step_overhead_s": prior(0.0),
            "communication": prior(1.0), "outer_sync": prior(1.0), "outliers": []}


CALIBRATION_FIELDS = ("compute.A100", "communication", "hop_overhead_s", "micro_batch_overhead_s",
                      "step_overhead_s", "outer_sync", "bandwidth_exponent")
EXTREMES = (1e308, 1.7976931348623157e308, 5e-324, 1e200, -1.0, 0.0)


def set_factor(doc: dict, name: str, value: float) -> dict:
    out = copy.deepcopy(doc)
    target = out["compute"]["A100"] if name == "compute.A100" else out[name]
    target.update(value=value, low=value, high=value, fitted=True, runs=5)
    return out


def calibration_probes() -> Iterator[tuple[str, str]]:
    for name in CALIBRATION_FIELDS:
        for value in EXTREMES:
            yield f"calibration {name}={value!r}", json.dumps(set_factor(calibration_doc(), name,
                                                                       value))
    yield "calibration string value", json.dumps(calibration_doc()).replace(
        '"value": 1.0', '"value": "1.0"', 1)
    yield "calibration NaN", json.dumps(set_factor(calibration_doc(), "communication", 1.0)
                                        ).replace('"value": 1.0', '"value": NaN', 1)
    yield "calibration truncated", json.dumps(calibration_doc())[:57]
    yield "calibration binary", "\x00\xff\x1b[2J" * 20


def fleet_probes() -> Iterator[tuple[str, str]]:
    base = json.loads(FLEET.read_text())
    text = FLEET.read_text()
    yield "fleet duplicate id", text.replace('"id": "beijing-1",', '"id": "beijing-1", "id": "x",', 1)
    yield "fleet duplicate nodes", text.replace('"nodes": [', '"nodes": [], "nodes": [', 1)
    self_link = copy.deepcopy(base)
    self_link["links"].append({"src": "beijing-1", "dst": "beijing-1", "rtt_ms": 1.0})
    yield "fleet self link", json.dumps(self_link)
    conflict = copy.deepcopy(base)
    first = dict(conflict["links"][0])
    first["rtt_ms"] = float(first["rtt_ms"]) * 50
    conflict["links"].append(first)
    yield "fleet conflicting links", json.dumps(conflict)
    yield "fleet truncated", text[: len(text) // 2]
    yield "fleet binary", "\x00\x01\x02" * 100
    huge = copy.deepcopy(base)
    huge["nodes"][0]["gpus"] = 10 ** 400
    yield "fleet huge integer", json.dumps(huge)
    nan = copy.deepcopy(base)
    yield "fleet NaN rtt", json.dumps(nan).replace('"rtt_ms": 2.09', '"rtt_ms": NaN', 1)
    deep = '{"name": "x", "nodes": ' + "[" * 100_000 + "]" * 100_000 + "}"
    yield "fleet deep nesting", deep


def jobs_probes() -> Iterator[tuple[str, str]]:
    yield "jobs duplicate key", "jobs:\n  - name: a\n    name: b\n    model: gpt2-xl\n"
    yield "jobs billion laughs", ('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
                                  + "".join(f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
                                            for p, c in zip("abcdefg", "bcdefgh"))
                                  + "jobs: *h\n")
    yield "jobs huge steps", "jobs:\n  - name: a\n    model: gpt2-xl\n    steps: 1e308\n"
    yield "jobs python tag", "jobs: !!python/object/apply:os.system ['true']\n"
    yield "jobs binary", "\x00\xff" * 64


# ------------------------------------------------------------------------------- the probes

def file_round(tmp: Path) -> Iterator[Outcome]:
    jobs = ROOT / "examples" / "jobs.yaml"
    for name, text in calibration_probes():
        path = tmp / "calibration.json"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(jobs), "--fleet", str(FLEET), "--no-compare",
                                   "--cost-model", "calibrated", "--calibration", str(path)])
        # A tiny or zero overhead, or an exponent of 0, is a value a fit can give: a plan or a
        # refusal both hold; a hang, a traceback or another code does not.
        held, detail = refused_cleanly(code, out, path.name, may_accept=True)
        yield Outcome(name, held, code, secs, detail)
    for name, text in fleet_probes():
        path = tmp / "fleet.json"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(jobs), "--fleet", str(path), "--no-compare"])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(name, held, code, secs, detail)
    for name, text in jobs_probes():
        path = tmp / "jobs.yaml"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(path), "--fleet", str(FLEET), "--no-compare"])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(name, held, code, secs, detail)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


def store_round(tmp: Path) -> Iterator[Outcome]:
    """`fleet show --db` and `jobs list --db` on stores that are not what they claim; the file
    must be refused in one line and left byte for byte as it was."""
    good = tmp / "good.sqlite"
    sqlite3.connect(good).close()
    cases: dict[str, Callable[[Path], None]] = {
        "store not sqlite": lambda p: p.write_bytes(b"this is not a database\n" * 100),
        "store truncated header": lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 50),
        "store foreign schema": lambda p: _foreign(p),
        "store a directory": lambda p: p.mkdir(),
        "store empty file": lambda p: p.write_bytes(b""),
    }
    for name, make in cases.items():
        for command in (["fleet", "show"], ["jobs", "list"]):
            path = tmp / f"{name.replace(' ', '-')}-{command[0]}.sqlite"
            make(path)
            before = digest(path)
            code, out, secs = run_cli([*command, "--db", str(path)])
            held, detail = refused_cleanly(code, out, path.name)
            if held and digest(path) != before:
                held, detail = False, "the store was changed"
            yield Outcome(f"{name} ({' '.join(command)})", held, code, secs, detail)


def _foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE nodes (x TEXT)")
    db.execute("INSERT INTO nodes VALUES ('hostile')")
    db.commit()
    db.close()


def signal_round(tmp: Path, rounds: int) -> Iterator[Outcome]:
    """`plan --out` stopped by SIGTERM or SIGKILL at spread moments: the output is the earlier
    file, byte for byte, or the new one whole; never a part of one."""
    jobs = ROOT / "examples" / "jobs.yaml"
    out = tmp / "plan.json"
    code, text, _ = run_cli(["plan", str(jobs), "--fleet", str(FLEET), "--no-compare",
                             "--out", str(out)])
    if code != 0:
        yield Outcome("signals: first plan", False, code, 0.0, text[-200:])
        return
    earlier = out.read_bytes()
    start = time.monotonic()
    subprocess.run([*CLI, "plan", str(jobs), "--fleet", str(FLEET), "--no-compare", "--out",
                    str(tmp / "timing.json")], capture_output=True, cwd=ROOT)
    full_s = time.monotonic() - start
    for i in range(rounds):
        for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGINT):
            delay = full_s * (0.5 + 0.5 * i / max(1, rounds - 1))
            proc = subprocess.Popen([*CLI, "plan", str(jobs), "--fleet", str(FLEET),
                                     "--no-compare", "--out", str(out)], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(delay)
            proc.send_signal(sig)
            try:
                _, err = proc.communicate(timeout=LIMIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                yield Outcome(f"{sig.name} at {delay:.2f} s", False, None, delay, "hang after signal")
                continue
            data = out.read_bytes()
            whole = data == earlier
            if not whole:
                try:
                    json.loads(data)
                    whole = True
                except ValueError:
                    whole = False
            held = whole and "Traceback" not in (err or "")
            detail = "output whole" if whole else "output half written"
            if "Traceback" in (err or ""):
                detail = "traceback"
            yield Outcome(f"{sig.name} at {delay:.2f} s", held, proc.returncode, delay, detail)
            leftovers = [p.name for p in tmp.glob("plan.json*") if p.name != "plan.json"]
            if leftovers:
                yield Outcome(f"{sig.name} at {delay:.2f} s: temporary files", False,
                              proc.returncode, delay, f"left {leftovers}")
                for p in tmp.glob("plan.json.*"):
                    p.unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal-rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "hostile_round.json"))
    args = parser.parse_args(argv)
    try:
        from rich.progress import track
    except ImportError:   # pragma: no cover - rich is a dependency
        track = lambda it, **_: it  # noqa: E731
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for label, probes in (("files", file_round(tmp)), ("store", store_round(tmp)),
                              ("signals", signal_round(tmp, args.signal_rounds))):
            for outcome in track(probes, description=f"hostile round: {label}"):
                outcome.probe = f"{label}: {outcome.probe}"
                outcomes.append(outcome)
                if not outcome.held:
                    print(f"FAILED {outcome.probe}: {outcome.detail}", flush=True)
    held = sum(o.held for o in outcomes)
    summary = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "command": "python -m bench.hostile_round " + " ".join(argv or sys.argv[1:]),
               "tried": len(outcomes), "held": held, "failed": len(outcomes) - held,
               "probes": [asdict(o) for o in outcomes]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"hostile round: {len(outcomes)} tried, {held} held, {len(outcomes) - held} failed "
          f"(written to {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
