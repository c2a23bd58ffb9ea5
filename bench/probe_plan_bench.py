"""Probing by plan at 10,000 servers in 200 sites, and `plan --db` on a store that size.

    .venv/bin/python -m bench.probe_plan_bench --shared ../shared [--quick] [--epochs N]

Writes bench/results/probe_plan.json:

- ``probe_plan``: time to compute one epoch's plan (quotas + lists), peers per agent (max,
  mean), probes each server receives (max, min), whether every ordered site pair is probed
  each epoch, the rotation period in epochs; serve's bookkeeping per registration answer and per
  heartbeat check (``planner.service.peer_plan``).
- ``plan_db``: a real SQLite store filled through the store's API (register every server,
  one Report batch per agent per epoch with 3 samples to each of its planned peers, then the
  rollup), then ``hulk-planner plan JOBS --db STORE --no-compare`` timed end to end as a
  subprocess (target < 90 s), and the split: the store read and fleet build
  (``fleet_from_store``, with site links) and the completion (``complete``) in this process.

RTTs: inside a site 0.2-0.6 ms; between sites the great-circle distance at 2/3 c there and
back, times 1.3 for routing, plus 2 ms, with 5 % noise per sample; 0.5 % of samples lost.
``--quick``: 2,000 servers in 40 sites.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_PLAN_DB_S = 90.0
CLI_TIMEOUT_S = 900.0
PACKETS = 3


def _log(line: str) -> None:
    print(line, flush=True)


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def fleet_layout(servers: int, sites: int, seed: int = 0):
    """{node id: site} and {site: (lat, lon)}: sites spread over the inhabited latitudes."""
    rng = random.Random(seed)
    where = {f"site-{s:03d}": (rng.uniform(-40, 60), rng.uniform(-180, 180))
             for s in range(sites)}
    names = sorted(where)
    nodes = {f"gpu-{i:05d}": names[i % sites] for i in range(servers)}
    return nodes, where


def probe_plan_figures(nodes: dict[str, str], peer_bound: int, reps: int) -> dict:
    from hulk.wire.records import Peer
    from planner.core.probe_plan import plan_shape, probe_plan
    from planner.service.peer_plan import PeerPlanner, ProbePlanSettings

    t0 = time.perf_counter()
    shape = plan_shape(nodes, peer_bound, reps)
    t1 = time.perf_counter()
    plan = probe_plan(nodes, 7, shape=shape)
    t2 = time.perf_counter()
    period = shape.rotation_period
    t3 = time.perf_counter()
    sizes = [len(p) for p in plan.values()]
    received: dict[str, int] = dict.fromkeys(nodes, 0)
    for peers in plan.values():
        for b in peers:
            received[b] += 1
    inter = [sum(nodes[b] != nodes[a] for b in peers) for a, peers in plan.items()]

    members = [(Peer(n, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 0), s)
               for i, (n, s) in enumerate(sorted(nodes.items()))]
    planner = PeerPlanner(members, ProbePlanSettings(peer_bound, reps, 600.0),
                          clock=lambda: 1_800_000_000_000)
    t4 = time.perf_counter()
    for n in nodes:
        planner.answer(n)
    t5 = time.perf_counter()
    changed = sum(planner.changed(n) for n in nodes)  # a heartbeat from every agent
    t6 = time.perf_counter()
    return {
        "servers": len(nodes), "sites": len(shape.sites), "peer_bound": peer_bound,
        "site_reps": reps,
        "shape_s": round(t1 - t0, 3), "plan_s": round(t2 - t1, 3),
        "rotation_period_compute_s": round(t3 - t2, 3),
        "peers_per_agent_max": max(sizes), "peers_per_agent_mean": round(sum(sizes) / len(sizes), 2),
        "inter_site_peers_per_agent_max": max(inter),
        "probed_by_max": max(received.values()), "probed_by_min": min(received.values()),
        "covers_all_site_pairs_each_epoch": shape.covers_all_site_pairs,
        "rotation_period_epochs": period,
        "serve_answer_all_agents_s": round(t5 - t4, 3),
        "serve_plans_computed": planner.replans,
        "serve_heartbeat_check_us": round((t6 - t5) / len(nodes) * 1e6, 1),
        "serve_changed_after_answer": changed,
    }


def site_rtt_ms(a: tuple[float, float], b: tuple[float, float]) -> float:
    from hulk.geo import great_circle_km

    return great_circle_km(a, b) / 200.0 * 2 * 1.3 + 2.0


def fill_store(path: Path, nodes: dict[str, str], where: dict[str, tuple[float, float]],
               peer_bound: int, reps: int, epochs: int, now_ms: int) -> dict:
    """Register every server and store ``epochs`` epochs of planned probes, through the
    store's own API; returns the figures of the fill."""
    from hulk.wire.records import Inventory, GpuInfo, NodeLocation, RegisterRequest
    from planner.core.probe_plan import plan_shape, probe_plan
    from planner.core.rollup import bucket_index
    from planner.service.store import Store

    rng = random.Random(1)
    gpu = GpuInfo("NVIDIA A100-SXM4-40GB", "", 8.0, 40 * 10**9)
    store = Store(path, clock=lambda: now_ms)
    t0 = time.perf_counter()
    refs = {}
    for i, (node_id, site) in enumerate(sorted(nodes.items())):
        ref, _ = store.register(RegisterRequest(
            node_id, hostname=node_id, location=NodeLocation(site, where[site]),
            agent_version="bench", inventory=Inventory(gpus=(gpu,) * 8),
            address=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"))
        refs[node_id] = ref
    t1 = time.perf_counter()
    base: dict[tuple[str, str], float] = {}
    shape = plan_shape(nodes, peer_bound, reps)
    samples = 0
    for epoch in range(epochs):
        plan = probe_plan(nodes, 1000 + epoch, shape=shape)
        sent = now_ms - (epochs - epoch) * 600_000
        for a, peers in plan.items():
            src = refs[a]
            rows = []
            for b in peers:
                key = (nodes[a], nodes[b])
                mean = base.get(key)
                if mean is None:
                    mean = base[key] = rng.uniform(0.2, 0.6) if key[0] == key[1] else \
                        site_rtt_ms(where[key[0]], where[key[1]])
                dst = refs[b].idx
                for k in range(PACKETS):
                    if rng.random() < 0.005:
                        rows.append((src.idx, dst, sent + k, 1, 56, 1, None, None))
                    else:
                        rtt = mean * rng.uniform(0.95, 1.05)
                        rows.append((src.idx, dst, sent + k, 1, 56, 0, rtt, bucket_index(rtt)))
            store.store_batch(src, f"{a}-{epoch}", rows)
            samples += len(rows)
    t2 = time.perf_counter()
    store.rollup_pending()
    t3 = time.perf_counter()
    store.close()
    return {"register_s": round(t1 - t0, 1), "store_samples_s": round(t2 - t1, 1),
            "rollup_s": round(t3 - t2, 1), "samples": samples, "epochs": epochs,
            "store_mb": round(sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
                              / 1e6, 1)}


def read_split(path: Path) -> dict:
    """The store read + fleet build, and the completion, timed in this process."""
    from planner.core.fleet import complete
    from planner.service.graph import fleet_from_store
    from planner.service.store import Store

    with Store(path) as store:
        t0 = time.perf_counter()
        # The sums links are made of (node pairs inside sites, site pairs), as plan --db reads.
        pairs = len(store.window_totals(90)) + len(store.site_window_totals(90))
        t1 = time.perf_counter()
        fleet = fleet_from_store(store, 90, name=path.stem)
        t2 = time.perf_counter()
    out = {"window_rollup_pairs": pairs, "window_totals_s": round(t1 - t0, 1),
           "fleet_from_store_s": round(t2 - t1, 1), "fleet_nodes": len(fleet.nodes),
           "fleet_node_links": len(fleet.links), "fleet_sites": len(fleet.sites),
           "fleet_site_links": len(fleet.site_links)}
    t3 = time.perf_counter()
    net = complete(fleet)
    t4 = time.perf_counter()
    components = net.components()
    out.update(complete_s=round(t4 - t3, 1), components=len(components),
               largest_component=max(map(len, components)))
    del net
    return out


def time_cli(path: Path, jobs: Path) -> dict:
    """`hulk-planner plan JOBS --db STORE --no-compare`, end to end, as an operator runs it."""
    exe = Path(sys.executable).parent / "hulk-planner"
    cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "planner.cli"]) + \
        ["plan", str(jobs), "--db", str(path), "--no-compare"]
    from bench.child_usage import run_measured

    # From a small launcher: a child forked from this process (which holds the store's
    # figures) would report this process's memory as its own peak.
    usage = run_measured(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout_s=CLI_TIMEOUT_S)
    rc = None if usage.timed_out else usage.exit_code
    out = ([f"timed out after {CLI_TIMEOUT_S:.0f} s"] if usage.timed_out
           else usage.output.strip().splitlines())
    seconds = usage.wall_s
    peak_mb = usage.peak_rss_bytes / 2 ** 20
    return {"command": " ".join(["hulk-planner"] + cmd[1:] if exe.exists() else cmd),
            "exit_code": rc, "seconds": round(seconds, 1), "peak_rss_mb": round(peak_mb),
            "meets_target": rc == 0 and seconds < TARGET_PLAN_DB_S, "output_tail": out[-6:]}


def run(out_dir: Path, shared: Path = REPO / ".." / "shared", quick: bool = False,
        epochs: int = 1) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    servers, sites = (2000, 40) if quick else (10_000, 200)
    nodes, where = fleet_layout(servers, sites)
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "load_before": _load()},
                    "target_plan_db_s": TARGET_PLAN_DB_S}
    _log(f"[probe_plan] plan of {servers} servers in {sites} sites")
    result["probe_plan"] = probe_plan_figures(nodes, 64, 2)
    _log(f"[probe_plan] {json.dumps(result['probe_plan'])}")
    jobs = Path(shared) / "bench" / "paper-6-jobs.yaml"
    with tempfile.TemporaryDirectory(prefix="hulk-probe-plan-") as tmp:
        path = Path(tmp) / "planner.db"
        now_ms = int(time.time() * 1000)
        _log(f"[probe_plan] filling {path}")
        fill = fill_store(path, nodes, where, 64, 2, epochs, now_ms)
        _log(f"[probe_plan] fill {json.dumps(fill)}")
        split = read_split(path)
        _log(f"[probe_plan] read {json.dumps(split)}")
        _log(f"[probe_plan] hulk-planner plan --db (load {_load()})")
        cli = time_cli(path, jobs)
        _log(f"[probe_plan] cli {json.dumps(cli)}")
    result["plan_db"] = {"servers": servers, "sites": sites, "jobs": str(jobs.name),
                         "fill": fill, "split": split, "cli": cli}
    result["machine"]["load_after"] = _load()
    (out_dir / "probe_plan.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summarize(result: dict) -> str:
    p, d = result["probe_plan"], result["plan_db"]
    cli, split = d["cli"], d["split"]
    return "\n".join([
        f"- probe plan, {p['servers']:,} servers in {p['sites']} sites, bound {p['peer_bound']}: "
        f"{p['shape_s'] + p['plan_s']:.2f} s an epoch; peers per agent max "
        f"{p['peers_per_agent_max']} (mean {p['peers_per_agent_mean']}); each server probed by "
        f"{p['probed_by_min']}-{p['probed_by_max']}; every site pair each epoch: "
        f"{p['covers_all_site_pairs_each_epoch']}; rotation period {p['rotation_period_epochs']} "
        "epochs",
        f"- `plan --db` on {d['servers']:,} servers: exit {cli['exit_code']} in {cli['seconds']} s "
        f"(target < {result['target_plan_db_s']:.0f} s: "
        f"{'met' if cli['meets_target'] else 'NOT met'}); fleet from store "
        f"{split['fleet_from_store_s']} s ({split['fleet_node_links']:,} node links, "
        f"{split['fleet_site_links']:,} site links), completion {split['complete_s']} s into "
        f"{split['components']} connected part(s)"
        + (" (the completion does not use site links here: the plan is confined to one part)"
           if split["components"] > 1 else ""),
    ]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO / ".." / "shared")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(argv)
    result = run(args.out, args.shared, args.quick, args.epochs)
    print(summarize(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
