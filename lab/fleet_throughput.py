"""Throughput tests in the lab, as an operator meets them: every lab agent offers a throughput
port (``--throughput-port``, with its site), ``hulk-planner serve`` plans the tests with the lab's
settings below and hands the slots out by heartbeat, the receivers report the results, and the lab
waits for the store to hold one for every directed site pair and prints ``hulk-planner fleet
show``.

A lab host's site is its city (a custom matrix without cities: the host's name), so two servers of
one city also test each other (the scheduler's intra-site pairs).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from lab.matrix import Host
from lab.wan import REPO

PORT = 5201
# serve's settings in the lab. A pair never tested is due at once whatever the period, so the
# period only sets how soon a pair is tested again: 5 min keeps a kept lab's figures fresh
# without the tests' bytes crowding the switch. Lab bytes are memory copies: the budget only
# must not stop a long lab run (a 12-host lab's tests can move the default 200 GB in an hour).
PERIOD_S = 300.0
BUDGET_GB = 100_000.0


def site_of(host: Host) -> str:
    return host.city or host.name


def agent_flags(host: Host, port: int) -> list[str]:
    """The agent's flags: its site, and the throughput port unless ``port`` is 0 (no tests)."""
    return ["--site", site_of(host)] + (["--throughput-port", str(port)] if port else [])


def serve_flags(period_s: float = PERIOD_S, budget_gb: float = BUDGET_GB) -> list[str]:
    return ["--throughput-period", f"{period_s:g}", "--throughput-budget-gb", f"{budget_gb:g}"]


def wanted_pairs(hosts: Iterable[Host]) -> set[tuple[str, str]]:
    """The directed site pairs the scheduler tests among ``hosts`` (those with a port)."""
    from planner.core.throughput_schedule import ScheduleOptions, site_pairs

    by_site: dict[str, list[Host]] = {}
    for host in hosts:
        by_site.setdefault(site_of(host), []).append(host)
    return set(site_pairs(by_site, ScheduleOptions().intra_site))


def measured(db: Path) -> dict:
    """(sender's site, receiver's site) -> the store's SitePairThroughput (ok and failed tests)."""
    from planner.service.store import Store

    if not db.exists():
        return {}
    with Store(db) as store:
        return {(p.src_site, p.dst_site): p for p in store.throughput.site_pairs()}


def wait_for_throughput(db: Path, want: set[tuple[str, str]], timeout_s: float,
                        check: Callable[[], None] = lambda: None, poll_s: float = 2.0) -> dict:
    """The store's site pairs once each of ``want`` has an ok test, or what there is after
    ``timeout_s``; ``check`` raises when a lab service has died."""
    deadline = time.monotonic() + timeout_s
    while True:
        check()
        got = measured(db)
        if all(got.get(pair) and got[pair].tests for pair in want) or time.monotonic() > deadline:
            return got
        time.sleep(poll_s)


def fleet_show(python: str, db: Path) -> str:
    """What ``hulk-planner fleet show --db DB`` prints (the store is a file: no namespace)."""
    proc = subprocess.run([python, "-m", "planner.cli", "fleet", "show", "--db", str(db)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    return proc.stdout + (proc.stderr if proc.returncode else "")
