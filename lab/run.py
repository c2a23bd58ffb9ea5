"""``make lab``: a whole Hulk fleet on one machine, over a WAN with the paper's latencies.

    python -m lab.run [--secure] [--hosts N] [--scale S] [--matrix FILE] [--jobs FILE] [--interval S]
                      [--throughput-port P] [--throughput-wait S] [--rate-mbit R] [--keep]
                      [--no-plan] [--node-timeout S] [--gpus N] [--gpu-name NAME] [--gpu-gb GB]
                      [--dashboard [HOST:PORT]] [--metrics [HOST:PORT]]

1. builds one namespace per host (default: the paper's Table 1 cities) and the ``hub`` namespace,
   joined by the delaying switch (:mod:`lab.wan`);
2. starts mosquitto and ``hulk-planner serve`` in the hub (10.77.0.1, zero delay to everyone) and
   one ``hulk-agent`` per host namespace, each with its own state directory and ``--gpus`` x
   ``--gpu-name`` declared (``--declared-gpus``: lab hosts have no GPUs of their own); a fresh
   placement-signing key signs the placements, every agent pins its public key and may run only
   the example trainer (``python <repo>/examples/train_gpt.py``; :func:`placement_security_env`);
3. waits until the planner has learned an RTT for every pair and prints it beside the configured
   one; then (unless ``--throughput-port 0``) until the throughput tests serve plans between the
   agents have measured every directed site pair, or ``--throughput-wait`` passes, and prints
   ``hulk-planner fleet show`` (:mod:`lab.fleet_throughput`);
4. (unless ``--no-plan``) plans the jobs file on the store's fleet and pushes the placements (``hulk-planner plan JOBS --db DB --push --mqtt
   URL`` when the planner supports it), then shows each agent's ``placement.json`` as it arrives;
5. tears everything down on exit or Ctrl-C. ``--keep`` stays up until Ctrl-C for ``jobs submit``
   and fault experiments: a service that dies is reported and the rest keep running, and
   ``python -m lab.ctl restart NAME --work DIR`` starts it again (:mod:`lab.services`).

``--secure`` sets the hub up as deploy/INSTALL.md sets up a planner host (:mod:`lab.secure`): a
private CA from ``enroll --init-ca``, the shipped mosquitto configuration (TLS, passwords, ACL),
serve over TLS, enrolled agents with their tokens and ``mqtts://`` accounts. Without it the lab
is plaintext with an anonymous broker. ``--dashboard`` and ``--metrics`` start serve's dashboard
and ``/metrics``; the lab prints how to reach them and the broker (:mod:`lab.endpoints`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from hulk import geo
from hulk.errors import HulkError
from hulk.plural import count
from lab import endpoints as lab_endpoints
from lab import fleet_throughput
from lab import matrix as lab_matrix
from lab import secure as lab_secure
from lab import services as lab_services
from lab.netns import HUB_ADDRESS, LabError
from lab.wan import HUB, REPO, WanLab

log = logging.getLogger("lab")

MQTT_PORT = 1883
PLANNER_PORT = 50051
DEFAULT_JOBS = Path(__file__).with_name("jobs.yaml")
TRAIN_JOBS = Path(__file__).with_name("train-jobs.yaml")   # what a --keep lab's user submits
EXAMPLE = REPO / "examples" / "train_gpt.py"


def placement_security_env(work: Path) -> dict[str, str]:
    """HULK_* variables for the lab's planner and agents: a signing key made in ``work`` (the
    planner signs with it, the agents pin its public key), an allow-list that permits the example
    training command, and the variables the trainer needs passed through."""
    from hulk.wire.signing import Signer, generate_key_files

    key = work / "placement-signing.key"
    signer = (Signer.from_file(key) if key.exists()
              else generate_key_files(key, work / "placement-signing.pub"))
    return {"HULK_SIGNING_KEY": str(key), "HULK_PLACEMENT_KEY": signer.public_text(),
            "HULK_ALLOWED_COMMANDS": f"python {EXAMPLE}",
            "HULK_PASS_ENV": "PYTHONPATH,OMP_NUM_THREADS"}


def resolve_example_paths(jobs: Path, out: Path) -> Path:
    """``jobs`` with ``examples/...`` in commands made absolute (jobs run in their own folder)."""
    text = jobs.read_text()
    if "examples/" not in text:
        return jobs
    out.write_text(text.replace(" examples/", f" {REPO / 'examples'}/"))
    return out


class Services(lab_services.Services):
    """The lab's processes (:mod:`lab.services`) with the lab's environment: the repository on
    PYTHONPATH, no inherited token, the placement-signing key and allow-list."""

    def __init__(self, lab: WanLab, work: Path, python: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env.pop("HULK_TOKEN", None)
        env.update(placement_security_env(work))
        super().__init__(lab, work, python, env)


def supports(python: str, argv: list[str], flag: str) -> bool:
    """Whether a teammate's command line already has ``flag`` (the lab uses what exists)."""
    proc = subprocess.run([python, *argv, "--help"], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    return proc.returncode == 0 and flag in proc.stdout


def wait_port(lab: WanLab, host: str, address: str, port: int, timeout_s: float = 30) -> None:
    probe = f"import socket; socket.create_connection(({address!r}, {port}), timeout=1).close()"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if lab.run(host, [sys.executable, "-c", probe], timeout=10).returncode == 0:
            return
        time.sleep(0.3)
    raise LabError(f"nothing listens on {address}:{port} after {timeout_s:.0f} s")


def export_fleet(python: str, db: Path, out: Path) -> dict | None:
    proc = subprocess.run([python, "-m", "planner.cli", "fleet", "export", "--db", str(db),
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    if proc.returncode != 0 or not out.exists():
        return None
    return json.loads(out.read_text())


def learned_rtts(fleet: dict, min_samples: int = 1) -> dict[frozenset, float]:
    """Measured (not imputed) RTT per unordered pair with at least ``min_samples`` samples (both
    directions together); the directions' RTTs averaged, weighted by their samples."""
    pairs: dict[frozenset, list[tuple[float, int]]] = {}
    for link in fleet.get("links", []):
        if link.get("imputed") or link["src"] == link["dst"]:
            continue
        n = int(link.get("samples") or 1)
        pairs.setdefault(frozenset((link["src"], link["dst"])), []).append((float(link["rtt_ms"]), n))
    out = {}
    for key, values in pairs.items():
        total = sum(n for _, n in values)
        if total >= min_samples:
            out[key] = sum(r * n for r, n in values) / total
    return out


def report_rtts(matrix: lab_matrix.LatencyMatrix, learned: dict[frozenset, float]) -> list[dict]:
    rows = []
    for i, a in enumerate(matrix.names):
        for j in range(i + 1, matrix.n):
            b = matrix.names[j]
            got = learned.get(frozenset((a, b)))
            rows.append({"a": a, "b": b, "configured_ms": matrix.rtt(i, j), "learned_ms": got})
    return rows


def print_rtts(rows: list[dict]) -> None:
    errors = [abs(r["learned_ms"] - r["configured_ms"]) for r in rows if r["learned_ms"] is not None]
    print(f"{'pair':34s} {'configured':>10s} {'learned':>9s}")
    for r in rows:
        got = "-" if r["learned_ms"] is None else f"{r['learned_ms']:.2f}"
        print(f"{r['a'] + ' - ' + r['b']:34s} {r['configured_ms']:10.2f} {got:>9s}")
    if errors:
        print(f"{len(errors)} of {count(len(rows), 'pair')} learned; |error| mean "
              f"{sum(errors) / len(errors):.2f} ms, max {max(errors):.2f} ms")


def cities_plausible(matrix: lab_matrix.LatencyMatrix) -> bool:
    """Whether every configured RTT is at or above the speed-of-light bound of its cities (a
    scaled-down matrix is not, and the planner rightly rejects such samples)."""
    for i, a in enumerate(matrix.hosts):
        for j, b in enumerate(matrix.hosts):
            if i < j and a.city and b.city:
                if matrix.rtt(i, j) < geo.min_rtt_ms(geo.coordinates(a.city), geo.coordinates(b.city)):
                    return False
    return True


def lab_fleet_with_gpus(fleet: dict, matrix: lab_matrix.LatencyMatrix, gpus: int, gpu_name: str,
                        memory_gb: float) -> dict:
    """The learned fleet with every lab host given GPUs, for planning on a fleet file."""
    cities = {h.name: h.city for h in matrix.hosts}
    nodes = [dict(node, city=node.get("city") or cities[node["id"]], gpus=gpus, gpu_name=gpu_name,
                  memory_gb=memory_gb)
             for node in fleet.get("nodes", []) if node["id"] in cities]
    return dict(fleet, nodes=nodes)


def read_placements(state_root: Path, names: list[str]) -> dict[str, dict | None]:
    out: dict[str, dict | None] = {}
    for name in names:
        path = state_root / name / "placement.json"
        try:
            out[name] = json.loads(path.read_text()) if path.exists() else None
        except (OSError, ValueError):
            out[name] = None
    return out


def describe(placement: dict) -> str:
    """One line for a node's placement, whatever extra fields it carries."""
    roles = placement.get("roles") or [placement]
    parts = []
    for role in roles:
        if not isinstance(role, dict):
            continue
        job = role.get("job", "?")
        bits = [f"job {job}"]
        for key in ("stage", "layers", "replica", "rank", "world_size", "phase"):
            value = role.get(key)
            if key == "layers" and isinstance(value, list) and len(value) == 2:
                value = f"[{value[0]}, {value[1]})"   # half-open, as the plan prints it
            if key in role:
                bits.append(f"{key} {value}")
        parts.append(", ".join(bits))
    return "; ".join(parts) or json.dumps(placement)[:120]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, help="number of hosts (default: all of the matrix; "
                   "more than 12 Table 1 cities adds a second server per city)")
    p.add_argument("--scale", type=float, default=0.25,
                   help="multiply every RTT (default 0.25: fits a 2-core machine)")
    p.add_argument("--matrix", help="custom latency matrix (.yaml or .csv; see lab/matrix.py)")
    p.add_argument("--jobs", default=str(DEFAULT_JOBS), help="jobs file to plan (default lab/jobs.yaml)")
    p.add_argument("--interval", type=float, default=5.0, help="agents' probe interval, seconds")
    p.add_argument("--measure-timeout", type=float, default=120.0,
                   help="seconds to wait for every pair's RTT")
    p.add_argument("--min-samples", type=int, default=10,
                   help="RTT samples per pair (both directions) before a pair counts as learned")
    p.add_argument("--placement-timeout", type=float, default=60.0,
                   help="seconds to wait for the placements to reach the agents")
    p.add_argument("--gpus", type=int, default=8, help="GPUs each lab host is declared to have "
                   "(the agents' --declared-gpus)")
    p.add_argument("--gpu-name", default="NVIDIA A100-SXM4-40GB")
    p.add_argument("--gpu-gb", type=float, default=40.0, help="memory of each declared GPU, GB")
    p.add_argument("--node-timeout", type=float,
                   help="serve's --node-timeout: a node silent this long is down (default: serve's)")
    p.add_argument("--no-plan", action="store_true",
                   help="plan and push nothing: every host is free for `jobs submit` "
                        "(with --keep)")
    p.add_argument("--throughput-port", type=int, default=fleet_throughput.PORT,
                   help=f"agents' throughput test port (default {fleet_throughput.PORT}; "
                        "0: no tests)")
    p.add_argument("--throughput-period", type=float, default=fleet_throughput.PERIOD_S,
                   help="serve tests each directed site pair again after this many seconds")
    p.add_argument("--throughput-wait", type=float, default=180.0,
                   help="seconds to wait for every site pair's throughput before planning")
    p.add_argument("--rate-mbit", type=float,
                   help="every link between two hosts carries at most this many Mbit/s "
                        "(default: no limit)")
    p.add_argument("--keep", action="store_true",
                   help="stay up until Ctrl-C; a service that dies is reported and the rest keep "
                        "running (python -m lab.ctl restart NAME --work DIR starts it again)")
    p.add_argument("--secure", action="store_true",
                   help="as deploy/INSTALL.md: private CA, TLS gRPC, the shipped mosquitto "
                        "configuration (TLS, passwords, ACL), enrolled agents")
    p.add_argument("--dashboard", nargs="?", const=lab_endpoints.DASHBOARD, metavar="HOST:PORT",
                   help="serve's dashboard with a token in WORK/dashboard.token (default "
                        f"{lab_endpoints.DASHBOARD}, the hub's address); prints how to reach it")
    p.add_argument("--metrics", nargs="?", const=lab_endpoints.METRICS, metavar="HOST:PORT",
                   help=f"serve's /metrics (default {lab_endpoints.METRICS}, the hub's loopback)")
    p.add_argument("--work-dir", help="logs, store and state directories (default: a temp dir)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="lab: %(message)s")
    try:
        return run(args)
    except (HulkError, LabError) as err:
        print(f"lab: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)      # run()'s finally said "torn down"
        return 130


def build_matrix(args: argparse.Namespace) -> lab_matrix.LatencyMatrix:
    if args.matrix:
        m = lab_matrix.load(args.matrix)
        if args.hosts:
            if args.hosts > m.n:
                raise LabError(f"--hosts {args.hosts} but {args.matrix} has {count(m.n, 'host')}")
            m = m.subset(list(range(args.hosts)))
    else:
        m = lab_matrix.table1(args.hosts)
    return m.scaled(args.scale)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    matrix = build_matrix(args)
    jobs = Path(args.jobs)
    if not jobs.is_file():
        raise LabError(f"{jobs}: no such jobs file")
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="hulk-lab-run-"))
    work.mkdir(parents=True, exist_ok=True)
    jobs = resolve_example_paths(jobs, work / "jobs.yaml")
    python = sys.executable
    if shutil.which("mosquitto") is None:
        raise LabError("mosquitto is not installed (make install installs it)")
    if not 0 <= args.throughput_port <= 65535:
        raise LabError(f"--throughput-port: expected 0 to 65535, got {args.throughput_port}")

    # SIGTERM ends the lab like Ctrl-C does: through the finally blocks below.
    signal.signal(signal.SIGTERM, _interrupt)
    rates = ({(a, b): args.rate_mbit for a in matrix.names for b in matrix.names if a != b}
             if args.rate_mbit else None)
    lab = WanLab(matrix, hub=True, work_dir=work / "lab", rate_mbps=rates)
    services = Services(lab, work, python)
    hub: lab_secure.SecureHub | None = None
    try:
        lab.start()
        print(f"lab: {count(matrix.n, 'host')} + hub, RTTs x{args.scale:g}; logs in {work}")
        for name, m in zip(matrix.names, lab.namespaces.members):
            print(f"  {name:16s} {m.address:12s} {m.netns}")
        db = work / "planner.db"
        state_root = work / "agents"
        if args.secure:
            hub = lab_secure.prepare(work, db, matrix.names, python, services.env)
            services.env.update(hub.planner_env(), HULK_PLACEMENT_KEY=hub.placement_key)
            services.start("mosquitto", HUB, ["mosquitto", "-c", str(hub.broker_conf)])
            wait_port(lab, HUB, HUB_ADDRESS, lab_secure.TLS_PORT)
            mqtt_url = ""   # HULK_MQTT in the environment: no password on a command line
            shown_url = f"mqtts://NODE:***@{HUB_ADDRESS}:{lab_secure.TLS_PORT}?ca={hub.ca}"
            serve = [python, "-m", "planner.cli", "serve", "--db", str(db),
                     "--listen", f"{HUB_ADDRESS}:{PLANNER_PORT}", *hub.serve_flags()]
        else:
            mqtt_url = shown_url = f"mqtt://{HUB_ADDRESS}:{MQTT_PORT}"
            conf = work / "mosquitto.conf"
            conf.write_text(f"listener {MQTT_PORT} {HUB_ADDRESS}\nallow_anonymous true\n"
                            "persistence false\n")
            services.start("mosquitto", HUB, ["mosquitto", "-c", str(conf)])
            wait_port(lab, HUB, HUB_ADDRESS, MQTT_PORT)
            serve = [python, "-m", "planner.cli", "serve", "--db", str(db),
                     "--listen", f"{HUB_ADDRESS}:{PLANNER_PORT}", "--insecure"]
            if supports(python, ["-m", "planner.cli", "serve"], "--mqtt"):
                serve += ["--mqtt", mqtt_url]
        if args.throughput_port:
            serve += fleet_throughput.serve_flags(args.throughput_period)
        if args.node_timeout:
            serve += ["--node-timeout", f"{args.node_timeout:g}"]
        token = lab_endpoints.make_token(work) if args.dashboard else None
        serve += lab_endpoints.serve_flags(args.dashboard, args.metrics, token)
        services.start("planner", HUB, serve)
        wait_port(lab, HUB, HUB_ADDRESS, PLANNER_PORT, timeout_s=60)
        for address in filter(None, (args.dashboard, args.metrics)):
            wait_port(lab, HUB, *lab_endpoints.host_port(address), timeout_s=30)
        access = lab_endpoints.access_lines(
            lab.ns(HUB).netns, services.env.get("HULK_FLEET") or "default", hub=hub, token=token,
            dashboard=args.dashboard, metrics=args.metrics, mqtt_port=MQTT_PORT)

        agent_mqtt = supports(python, ["-m", "agent"], "--mqtt")
        send_cities = cities_plausible(matrix)
        if not send_cities:
            print(f"lab: at x{args.scale:g} some RTTs are below the speed-of-light bound of their "
                  "cities, which the planner rejects as errors; agents run without --city")
        for host in matrix.hosts:
            argv = [python, "-m", "agent", "--planner", f"{HUB_ADDRESS}:{PLANNER_PORT}",
                    "--node-id", host.name, "--address", lab.address(host.name),
                    "--interval", f"{args.interval:g}", "--state-dir", str(state_root / host.name),
                    "--log-level", "WARNING", "--declared-gpus", declared_gpus(args)]
            if host.city and send_cities:
                argv += ["--city", host.city]
            if args.throughput_port:
                argv += fleet_throughput.agent_flags(host, args.throughput_port)
            if hub is not None:
                argv += ["--ca", str(hub.ca)]
            else:
                argv += ["--insecure"] + (["--mqtt", mqtt_url] if agent_mqtt else [])
            services.start(f"agent-{host.name}", host.name, argv,
                           env=hub.agent_env(host.name) if hub is not None else None)
        print(f"lab: broker {shown_url}, planner {HUB_ADDRESS}:{PLANNER_PORT}, "
              f"{count(matrix.n, 'agent')}; waiting for every pair's RTT ...")
        print("\n".join(access), flush=True)

        fleet = wait_for_measurements(services, python, db, work, matrix, args.measure_timeout,
                                      args.min_samples)
        if args.throughput_port:
            show_throughput(services, python, db, matrix, args.throughput_wait)
            # Again: links between tested sites now carry the measured Gbit/s.
            fleet = export_fleet(python, db, work / "fleet.json") or fleet
        if not args.no_plan:
            plan_and_show(args, lab, python, db, work, jobs, matrix, fleet, mqtt_url, state_root,
                          services)
        if args.keep:
            keep_running(services, python, db, work, access)
        return 0
    finally:
        services.stop()
        lab_secure.remove(hub)
        lab.stop()
        print("lab: torn down")


def declared_gpus(args: argparse.Namespace) -> str:
    """The agents' ``--declared-gpus``: lab hosts have no GPUs of their own."""
    if not 1 <= args.gpus <= 64 or not args.gpu_gb > 0:
        raise LabError(f"--gpus {args.gpus} --gpu-gb {args.gpu_gb:g}: expected 1 to 64 GPUs of "
                       "more than 0 GB")
    return f"{args.gpus}x{args.gpu_name}:{args.gpu_gb:g}"


def keep_running(services: Services, python: str, db: Path, work: Path,
                 access: list[str] = ()) -> None:
    """Until Ctrl-C: report services that die (the rest keep running) and carry out lab.ctl's
    restart requests."""
    submit = resolve_example_paths(TRAIN_JOBS, work / TRAIN_JOBS.name)
    print("\n".join(access))
    print(f"lab: up; Ctrl-C tears it down. Jobs: {python} -m planner.cli jobs submit {submit} "
          f"--db {db}; services: python -m lab.ctl status --work {work}", flush=True)
    while True:
        for line in services.check(keep=True):
            print(line, flush=True)
        services.serve_requests()
        time.sleep(1)


def wait_for_measurements(services: Services, python: str, db: Path, work: Path,
                          matrix: lab_matrix.LatencyMatrix, timeout_s: float,
                          min_samples: int) -> dict:
    deadline = time.monotonic() + timeout_s
    want = matrix.n * (matrix.n - 1) // 2
    fleet: dict = {}
    rows: list[dict] = []
    while time.monotonic() < deadline:
        services.check()
        fleet = export_fleet(python, db, work / "fleet.json") or {}
        rows = report_rtts(matrix, learned_rtts(fleet, min_samples))
        have = sum(1 for r in rows if r["learned_ms"] is not None)
        if have == want:
            break
        time.sleep(2)
    print_rtts(rows)
    (work / "rtts.json").write_text(json.dumps(rows, indent=1))
    return fleet


def show_throughput(services: Services, python: str, db: Path,
                    matrix: lab_matrix.LatencyMatrix, wait_s: float) -> None:
    want = fleet_throughput.wanted_pairs(matrix.hosts)
    print(f"lab: waiting up to {wait_s:g} s for the throughput of "
          f"{count(len(want), 'directed site pair')} ...")
    got = fleet_throughput.wait_for_throughput(db, want, wait_s, services.check)
    done = sum(1 for pair in want if got.get(pair) and got[pair].tests)
    print(fleet_throughput.fleet_show(python, db).rstrip())
    if done < len(want):
        print(f"lab: {done} of {count(len(want), 'site pair')} measured so far; serve goes on "
              "testing")


def plan_and_show(args, lab, python, db, work, jobs, matrix, fleet, mqtt_url, state_root, services) -> None:
    plan_cmd = [python, "-m", "planner.cli", "plan", str(jobs), "--out", str(work / "plan.json")]
    push = supports(python, ["-m", "planner.cli", "plan"], "--push")
    if push:  # secure: no URL here, the planner account's HULK_MQTT is in the environment
        plan_cmd += ["--push"] + (["--mqtt", mqtt_url] if mqtt_url else [])
    env = dict(services.env, PYTHONPATH=str(REPO))
    # On the store's fleet, as in production (the agents declare their GPUs), in the hub like an
    # operator's shell on the planner host: the broker is only reachable from inside the lab.
    proc = lab.run(HUB, plan_cmd + ["--db", str(db)], timeout=300, cwd=REPO, env=env)
    print(proc.stdout.rstrip())
    if proc.returncode != 0:
        raise LabError(f"planning failed: {proc.stderr.strip()}")
    if not push:
        print("lab: `hulk-planner plan --push` is not available yet; the plan is in "
              f"{work / 'plan.json'} and no placement is sent")
        return
    deadline = time.monotonic() + args.placement_timeout
    shown: set[str] = set()
    expected = _planned_nodes(work / "plan.json")
    while time.monotonic() < deadline:
        services.check()
        for name, placement in read_placements(state_root, matrix.names).items():
            if placement is not None and name not in shown:
                shown.add(name)
                print(f"  placement -> {name:16s} {describe(placement)}")
        if expected and expected <= shown:
            break
        time.sleep(0.5)
    missing = sorted(expected - shown)
    if missing:
        print(f"lab: no placement reached {', '.join(missing)} within {args.placement_timeout:g} s")


def _planned_nodes(plan_path: Path) -> set[str]:
    try:
        plan = json.loads(plan_path.read_text())
    except (OSError, ValueError):
        return set()
    return {n for job in plan.get("jobs", []) for st in job.get("stages", []) for n in st.get("nodes", [])}


if __name__ == "__main__":
    raise SystemExit(main())
