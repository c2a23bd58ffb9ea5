"""The hostile round's file readers: every file a user hands over, through the real programs.

- `plan`: the calibration file, fleet JSON and jobs.yaml (the first round's 76 probes' kinds);
- `jobs submit --db`: jobs.yaml; `fleet import --db`: fleet JSON and the paper's zip/folder;
- `hulk-agent --config`: agent.yaml;
- `hulk-planner serve`: its --dashboard-token, --tls-cert/--tls-key and --signing-key files.

A probe is held when the program ends within its limit with exit 2 and one clear last line naming
the file (or, for a value within its bounds, a success); it failed otherwise: a traceback, another
code, a hang, an "internal error", or (agent.yaml) the bad file accepted.
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from bench.hostile_common import FLEET, JOBS, ROOT, Outcome, refused_cleanly, run_cli


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
    yield "fleet duplicate id", text.replace('"id": "beijing-1",',
                                             '"id": "beijing-1", "id": "x",', 1)
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


def submit_probes() -> Iterator[tuple[str, str]]:
    """jobs.yaml as `jobs submit` reads it (every job needs a command there)."""
    job = "jobs:\n  - name: a\n    model: gpt2-xl\n    command: \"python train.py\"\n"
    yield from jobs_probes()
    yield "submit a 300-word command", job.replace('"python train.py"', '"' + "w " * 300 + '"')
    yield "submit a name with a newline", job.replace("name: a", 'name: "a\\nb"')
    yield "submit a name of 10,000 characters", job.replace("name: a", "name: " + "n" * 10_000)
    yield "submit two jobs of one name", job + job[6:]
    yield "submit deep nesting", "jobs: " + "[" * 50_000 + "]" * 50_000 + "\n"
    yield "submit a 20 MB file", job + "# " + "x" * (20 << 20) + "\n"
    yield "submit global_batch of -1", job + "    global_batch: -1\n"
    yield "submit a list at the top", "- a\n- b\n"


def paper_zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()


def import_probes() -> Iterator[tuple[str, str, bytes]]:
    """(name, file name, bytes) for `fleet import`."""
    for name, text in fleet_probes():
        yield f"import {name}", "fleet.json", text.encode("utf-8", "surrogateescape")
    nodes = b"node,City,Capability,Memory\n0,Beijing,8.0,320\n1,Shanghai,8.0,320\n"
    edges = b"0 1 30.0\n"
    yield "import zip that is no zip", "fleet.zip", b"PK\x03\x04" + os.urandom(2000)
    yield "import zip without edge.txt", "fleet.zip", paper_zip({"node_feature.csv": nodes})
    yield "import zip with a binary node_feature.csv", "fleet.zip", paper_zip(
        {"node_feature.csv": os.urandom(3000), "edge.txt": edges})
    yield "import zip with member names ../../", "fleet.zip", paper_zip(
        {"../../node_feature.csv": nodes, "../../edge.txt": b"0 1 -5\n"})
    yield "import zip bomb (a 200 MB member)", "fleet.zip", paper_zip(
        {"node_feature.csv": nodes + b"0" * (200 << 20), "edge.txt": edges})
    yield "import zip with RTT NaN", "fleet.zip", paper_zip(
        {"node_feature.csv": nodes, "edge.txt": b"0 1 nan\n"})
    yield "import zip with an edge to an unknown node", "fleet.zip", paper_zip(
        {"node_feature.csv": nodes, "edge.txt": b"0 7 3.0\n"})


def agent_probes() -> Iterator[tuple[str, str]]:
    base = "planner: 127.0.0.1:9\nnode_id: n1\ninsecure: true\nstate_dir: {state}\n"
    yield "agent.yaml a duplicate key (node_id twice)", base + "node_id: n2\n"
    yield "agent.yaml an unknown key", base + "bogus: 1\n"
    yield "agent.yaml interval 1e308", base + "interval: 1e308\n"
    yield "agent.yaml interval NaN", base + "interval: .nan\n"
    yield "agent.yaml a list for node_id", base.replace("node_id: n1", "node_id: [a, b]")
    yield "agent.yaml a port of 99999", base + "throughput_port: 99999\n"
    yield "agent.yaml a missing CA", base.replace("insecure: true", "ca: /nonexistent/ca.pem")
    yield "agent.yaml a python tag", base + "token: !!python/object/apply:os.system ['true']\n"
    yield "agent.yaml binary", "\x00\xff\xfe" * 50
    yield "agent.yaml a list at the top", "- a\n- b\n"
    yield "agent.yaml billion laughs", base + 'a: &a ["x","x","x","x","x","x","x","x"]\n' + \
        "".join(f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
                for p, c in zip("abcdefg", "bcdefgh"))
    yield "agent.yaml allowed_commands a mapping", base + "allowed_commands: {rm: -rf}\n"
    yield "agent.yaml a 100 KiB city (over Register's 64 KiB)", base + "city: " + "x" * (
        100 << 10) + "\n"
    yield "agent.yaml a 10 MB site", base + "site: " + "x" * (10 << 20) + "\n"


def run_agent(path: Path, limit_s: float = 8.0) -> tuple[int | None, str, float]:
    start = time.monotonic()
    cmd = [str(Path(sys.executable).parent / "hulk-agent"), "--config", str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, "ran (accepted the file) until the limit", time.monotonic() - start
    return done.returncode, done.stderr + done.stdout, time.monotonic() - start


def file_round(tmp: Path, progress=None) -> Iterator[Outcome]:
    tmp.mkdir(parents=True, exist_ok=True)
    where_plan = "planner/files/"
    for name, text in calibration_probes():
        path = tmp / "calibration.json"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(JOBS), "--fleet", str(FLEET), "--no-compare",
                                   "--cost-model", "calibrated", "--calibration", str(path)])
        # A tiny or zero overhead, or an exponent of 0, is a value a fit can give: a plan or a
        # refusal both hold; a hang, a traceback or another code does not.
        held, detail = refused_cleanly(code, out, path.name, may_accept=True)
        yield Outcome(f"plan: {name}", held, code, secs, detail, "exit 2 naming the file",
                      "" if held else where_plan)
    for name, text in fleet_probes():
        path = tmp / "fleet.json"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(JOBS), "--fleet", str(path), "--no-compare"])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(f"plan: {name}", held, code, secs, detail, "exit 2 naming the file",
                      "" if held else where_plan + "fleet.py")
    for name, text in jobs_probes():
        path = tmp / "jobs.yaml"
        path.write_text(text)
        code, out, secs = run_cli(["plan", str(path), "--fleet", str(FLEET), "--no-compare"])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(f"plan: {name}", held, code, secs, detail, "exit 2 naming the file",
                      "" if held else where_plan + "jobs.py")
    for name, text in submit_probes():
        path, db = tmp / "submit.yaml", tmp / f"submit-{time.monotonic_ns()}.sqlite"
        path.write_text(text)
        code, out, secs = run_cli(["jobs", "submit", str(path), "--db", str(db)])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(f"jobs submit: {name}", held, code, secs, detail, "exit 2 naming the file",
                      "" if held else "planner/commands/jobs.py, planner/files/jobs.py")
    for name, filename, data in import_probes():
        path, db = tmp / filename, tmp / f"import-{time.monotonic_ns()}.sqlite"
        path.write_bytes(data)
        code, out, secs = run_cli(["fleet", "import", str(path), "--db", str(db)])
        held, detail = refused_cleanly(code, out, path.name)
        yield Outcome(f"fleet import: {name}", held, code, secs, detail,
                      "exit 2 naming the file", "" if held else "planner/files/fleet.py, paper.py")
    for name, text in agent_probes():
        path = tmp / "agent.yaml"
        path.write_text(text.replace("{state}", str(tmp / "agent-state")))
        code, out, secs = run_agent(path)
        held, detail = refused_cleanly(code, out, path.name)
        where = ("agent/config.py (_read_file: yaml.safe_load keeps the last of a duplicate key)"
                 if "duplicate" in name else "agent/config.py (PARSERS)")
        yield Outcome(name, held, code, secs, detail, "exit 2 naming the file",
                      "" if held else where)
    yield from serve_file_round(tmp)


def serve_file_round(tmp: Path) -> Iterator[Outcome]:
    """serve's own files: it must not start; one line naming the file, exit 2."""
    from bench.planner_process import free_port
    from planner.security.tls import init_pki

    pki = init_pki(tmp / "pki", ["127.0.0.1"])
    tls = ["--tls-cert", str(pki["server_cert"]), "--tls-key", str(pki["server_key"])]
    token = tmp / "token"
    cases = []
    for label, text, mode in (("world-readable", "t" * 32, 0o644), ("empty", "", 0o600),
                              ("too short", "short", 0o600), ("binary", "\x00\xff" * 20, 0o600)):
        cases.append((f"serve --dashboard-token {label}", token, text, mode,
                      ["--dashboard", "127.0.0.1:0", "--dashboard-token", str(token), *tls]))
    bad_pem = tmp / "cert.pem"
    cases.append(("serve --tls-cert garbage", bad_pem, "-----BEGIN CERTIFICATE-----\nxx\n", 0o600,
                  ["--tls-cert", str(bad_pem), "--tls-key", str(pki["server_key"])]))
    other = init_pki(tmp / "pki2", ["127.0.0.1"])
    cases.append(("serve --tls-key of another certificate", other["server_key"], None, None,
                  ["--tls-cert", str(pki["server_cert"]), "--tls-key", str(other["server_key"])]))
    key = tmp / "signing.key"
    cases.append(("serve --signing-key garbage", key, "not a key\n", 0o600,
                  ["--signing-key", str(key), "--mqtt", "mqtt://127.0.0.1:9", *tls]))
    for name, path, text, mode, args in cases:
        if text is not None:
            path.write_text(text, encoding="latin-1")
            path.chmod(mode)
        db = tmp / f"serve-{time.monotonic_ns()}.sqlite"
        code, out, secs = run_cli(["serve", "--db", str(db), "--listen",
                                   f"127.0.0.1:{free_port()}", *args], limit_s=20)
        held, detail = refused_cleanly(code, out, path.name)
        if code is None:
            detail = "serve started with the file (ran until the limit)"
        elif not held and "--listen" in out:
            detail += " (the certificate or key is blamed on --listen)"
        where = ("planner/security/tls.py (server_credentials checks only '-----BEGIN'), "
                 "planner/service/servicer.py (create_server: add_secure_port's error as --listen)"
                 if "--tls" in name else "planner/commands/serve.py")
        yield Outcome(name, held, code, secs, detail, "exit 2 naming the file",
                      "" if held else where)
