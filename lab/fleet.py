"""A lab fleet for end-to-end tests and benchmarks: the hub's broker and `hulk-planner serve
--mqtt`, one agent per host namespace, and the job commands (`hulk-planner jobs ...`).

Lab hosts have no GPUs. :data:`AGENT_WITH_DECLARED_GPUS` is the real agent (CLI arguments, gRPC
client, ICMP prober, MQTT subscriber, launcher) with 8 x A100-40GB declared through the agent's
``--declared-gpus`` setting (so the planner's store can place jobs) and one constructor argument
set, its heartbeat interval (the agent has no setting for it: faster than its fixed 10 s, so a 5 s
node timeout has no false alarms).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TypeVar

from lab import fleet_throughput
from lab.netns import HUB_ADDRESS, LabError
from lab.run import (MQTT_PORT, PLANNER_PORT, Services, cities_plausible, export_fleet,
                     learned_rtts, read_placements, wait_port)
from lab.wan import HUB, REPO, WanLab

T = TypeVar("T")
FLEET = "lab"
MQTT_URL = f"mqtt://{HUB_ADDRESS}:{MQTT_PORT}"
PYTHON = sys.executable
EXAMPLE = REPO / "examples" / "train_gpt.py"

LAB_GPUS = "8xNVIDIA A100-SXM4-40GB:40"   # the agents' --declared-gpus

# argv: HEARTBEAT_S, then the `hulk-agent` flags (a --declared-gpus among them wins).
AGENT_WITH_DECLARED_GPUS = textwrap.dedent(f"""
    import asyncio, signal, sys
    from agent.cli import build_parser, config_from_args, setup_logging
    from agent.placement import PlacementComponent
    from agent.runtime import AgentRuntime

    heartbeat_s = float(sys.argv[1])
    config = config_from_args(build_parser().parse_args(
        ["--declared-gpus", {LAB_GPUS!r}, *sys.argv[2:]]))
    setup_logging(config.log_level)

    async def main():
        runtime = AgentRuntime.from_config(
            config, components=[PlacementComponent.from_config(config)],
            heartbeat_interval_s=heartbeat_s)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, runtime.request_stop)
        return await runtime.run()

    sys.exit(asyncio.run(main()))
""")


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, *, poll_s: float = 0.5,
             detail: Callable[[], str] | None = None) -> T:
    """``predicate``'s first truthy value; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f": {detail()}" if detail else ""))
        time.sleep(poll_s)


class LabFleet:
    """A lab with the hub's broker and planner and one agent per host, all real processes."""

    def __init__(self, lab: WanLab, work: Path):
        self.lab, self.work = lab, work
        self.services = Services(lab, work, PYTHON)
        self.db = work / "planner.db"
        self.state_root = work / "agents"
        self.agents: dict[str, subprocess.Popen] = {}
        self.serve_args: tuple[str, ...] = ()
        self.planner: subprocess.Popen | None = None
        self.planner_starts = 0

    def start_hub(self, *serve_args: str) -> None:
        conf = self.work / "mosquitto.conf"
        conf.write_text(f"listener {MQTT_PORT} {HUB_ADDRESS}\nallow_anonymous true\npersistence false\n")
        self.services.start("mosquitto", HUB, ["mosquitto", "-c", str(conf)])
        wait_port(self.lab, HUB, HUB_ADDRESS, MQTT_PORT)
        self.serve_args = serve_args
        self.start_planner()

    def start_planner(self) -> None:
        """`hulk-planner serve --mqtt` in the hub on the fleet's db (log: planner.log, then
        planner-2.log, ... for later starts)."""
        self.planner_starts += 1
        name = "planner" if self.planner_starts == 1 else f"planner-{self.planner_starts}"
        self.planner = self.services.start(name, HUB, [
            PYTHON, "-m", "planner.cli", "serve", "--db", str(self.db),
            "--listen", f"{HUB_ADDRESS}:{PLANNER_PORT}", "--insecure", "--fleet-name", FLEET,
            "--mqtt", MQTT_URL, "--rollup-seconds", "1", *self.serve_args])
        wait_port(self.lab, HUB, HUB_ADDRESS, PLANNER_PORT, timeout_s=60)

    def stop_planner(self) -> int:
        """SIGTERM serve and wait for it to exit; its exit code."""
        proc, self.planner = self.planner, None
        assert proc is not None, "serve is not running"
        self._forget(proc)
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=30)

    def start_agents(self, program: list[str], *, throughput_port: int = 0,
                     throughput_off: Collection[str] = ()) -> None:
        """``program``: the agent's command before its flags (the CLI, or the CLI plus seams).
        With ``throughput_port`` every agent declares its site and all but ``throughput_off``
        take throughput tests on that port."""
        send_cities = cities_plausible(self.lab.matrix)
        for host in self.lab.matrix.hosts:
            argv = [*program, "--planner", f"{HUB_ADDRESS}:{PLANNER_PORT}", "--node-id", host.name,
                    "--address", self.lab.address(host.name), "--interval", "1",
                    "--state-dir", str(self.state_root / host.name), "--insecure",
                    "--mqtt", MQTT_URL, "--log-level", "INFO"]
            if send_cities and host.city:
                argv += ["--city", host.city]
            if throughput_port:
                argv += fleet_throughput.agent_flags(
                    host, 0 if host.name in throughput_off else throughput_port)
            self.agents[host.name] = self.services.start(f"agent-{host.name}", host.name, argv)

    def kill_agent(self, host: str) -> None:
        """SIGKILL the agent of ``host`` (no goodbye to anyone) and stop watching it."""
        proc = self.agents.pop(host)
        os.killpg(proc.pid, signal.SIGKILL)
        self._forget(proc)
        proc.wait(timeout=10)

    def _forget(self, proc: subprocess.Popen) -> None:
        self.services.procs = [(name, p) for name, p in self.services.procs if p is not proc]

    def logs(self) -> str:
        """The tail of every log, for failure messages."""
        parts = []
        for path in sorted(self.work.glob("*.log")) + sorted(self.state_root.glob("*/jobs/*/job.log")):
            parts.append(f"--- {path.relative_to(self.work)}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.5) -> T:
        """``predicate``'s first truthy value, failing at once when a lab service has died."""
        def checked():
            self.services.check()
            return predicate()

        return wait_for(checked, timeout_s, what, poll_s=poll_s, detail=lambda: "\n" + self.logs())

    def wait_for_rtts(self, timeout_s: float = 60, min_samples: int = 3) -> dict:
        """The store's fleet once every pair of hosts has a measured RTT."""
        names = self.lab.matrix.names
        want = {frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1:]}

        def measured():
            fleet = export_fleet(PYTHON, self.db, self.work / "fleet.json")
            return fleet if fleet and want <= set(learned_rtts(fleet, min_samples)) else None

        return self.wait(measured, timeout_s, "every pair's RTT in the planner's store", poll_s=1)

    def wait_for_gpus(self, count: int = 8, timeout_s: float = 20) -> None:
        self.wait(lambda: all((self.store_nodes().get(n) or {}).get("gpu_count") == count
                              for n in self.lab.hosts), timeout_s, "every node's GPUs in the store")

    def plan_push(self, jobs: Path, *source: str):
        """`hulk-planner plan --push` inside the hub (the broker is only reachable from the lab)."""
        out = self.work / "plan.json"
        proc = self.lab.run(HUB, [PYTHON, "-m", "planner.cli", "plan", str(jobs), *source,
                                  "--no-compare", "--out", str(out), "--push", "--mqtt", MQTT_URL,
                                  "--fleet-name", FLEET],
                            timeout=180, cwd=REPO, env=self.services.env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + self.logs()
        assert "pushed to" in proc.stdout, proc.stdout
        return json.loads(out.read_text()), proc.stdout

    def jobs_cli(self, *args: str) -> subprocess.CompletedProcess:
        """`hulk-planner jobs ARGS --db <the fleet's db>` (the store is a file: no namespace)."""
        proc = subprocess.run([PYTHON, "-m", "planner.cli", "jobs", *args, "--db", str(self.db)],
                              capture_output=True, text=True, cwd=REPO, env=self.services.env,
                              timeout=60)
        if proc.returncode != 0:
            raise LabError(f"jobs {' '.join(args)}: exit {proc.returncode}: {proc.stderr[-1000:]}")
        return proc

    def submit(self, jobs: Path) -> str:
        return self.jobs_cli("submit", str(jobs)).stdout

    def jobs(self) -> dict[str, dict]:
        """`jobs list --json`: name -> row (state, nodes, restarts, plan_id, ...)."""
        return {row["name"]: row for row in json.loads(self.jobs_cli("list", "--json").stdout)["jobs"]}

    def placements(self) -> dict[str, dict | None]:
        return read_placements(self.state_root, self.lab.matrix.names)

    def store_nodes(self) -> dict[str, dict]:
        from planner.service.store import Store

        with Store(self.db) as store:
            return {r["id"]: r for r in store.nodes()}

    def job_log(self, host: str, job: str) -> str:
        path = self.state_root / host / "jobs" / job / "job.log"
        return path.read_text(errors="replace") if path.exists() else ""


def torchrun_pids(lab: WanLab, program: str) -> dict[str, dict[int, list[str]]]:
    """Host -> {pid: argv} of the torchruns running ``program`` in that host's namespace (other
    labs on the machine run their own)."""
    hosts = {os.stat(f"/run/netns/{lab.ns(h).netns}").st_ino: h for h in lab.hosts}
    found: dict[str, dict[int, list[str]]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(a.endswith("torchrun") for a in argv[:2]) and program in argv:
                host = hosts.get(os.stat(proc / "ns" / "net").st_ino)
                if host:
                    found.setdefault(host, {})[int(proc.name)] = argv
        except OSError:  # gone meanwhile
            continue
    return found


def torchrun_processes(lab: WanLab, program: str) -> dict[str, list[str]]:
    """Host -> argv of the torchrun running ``program`` in that host's namespace."""
    return {host: next(iter(pids.values())) for host, pids in torchrun_pids(lab, program).items()}


def worker_pids(lab: WanLab, host: str, program: str) -> list[int]:
    """The ``program`` worker processes under ``host``'s torchrun (not torchrun, not the agent)."""
    out = []
    for torchrun in torchrun_pids(lab, program).get(host, {}):
        for pid in descendants(torchrun):
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            argv = raw.decode(errors="replace").split("\0")
            if program in argv and not any(a.endswith("torchrun") for a in argv[:2]):
                out.append(pid)
    return out


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, ... (from /proc's parent pids)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it: torchrun starts its workers in sessions of
    their own, so its process group alone would leave them training."""
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def roles_for(placement: dict | None, job: str) -> list[dict]:
    return [r for r in (placement or {}).get("roles", []) if r["job"] == job]


def stages_of(plan: dict, job: str) -> list[dict]:
    (entry,) = [j for j in plan["jobs"] if j["name"] == job]
    return entry["stages"]
