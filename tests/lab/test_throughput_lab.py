"""Throughput tests end to end in the WAN lab, as an operator meets them: mosquitto and
`hulk-planner serve` (the lab's throughput settings) in the hub, the real `hulk-agent` CLI with
``--throughput-port`` on three hosts and without it on a fourth, one directed link shaped by the
switch. Serve plans the tests and hands the slots out by heartbeat, the agents run them, the
receivers report the results, and `hulk-planner fleet show --db` prints them.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from lab import fleet_throughput
from lab import matrix as lab_matrix
from lab.fleet import PYTHON

pytestmark = [pytest.mark.root, pytest.mark.process]

TESTED = ["beijing-1", "neimeng-1", "nanjing-1"]
OFF = "tokyo-1"
SHAPED = ("beijing-1", "neimeng-1")
RATE_MBIT = 100.0
# Longer than the whole run, so each directed site pair is tested exactly once in it.
PERIOD_S = 600.0
# Three servers hold one test per 15 s slot, slot after slot: the six tests take about 120 s
# from serve's first plan.
RESULTS_TIMEOUT_S = 300.0


def test_every_site_pair_is_measured_once_and_shown_and_an_agent_without_tests_keeps_working(
        lab_fleet):
    matrix = lab_matrix.from_cities(["Beijing", "Neimeng", "Nanjing", "Tokyo"]).scaled(0.5)
    fleet = lab_fleet(matrix, rate_mbps={SHAPED: RATE_MBIT})
    fleet.start_hub(*fleet_throughput.serve_flags(period_s=PERIOD_S))
    fleet.start_agents([PYTHON, "-m", "agent"], throughput_port=fleet_throughput.PORT,
                       throughput_off={OFF})
    site = {h.name: fleet_throughput.site_of(h) for h in matrix.hosts}
    want = fleet_throughput.wanted_pairs(h for h in matrix.hosts if h.name != OFF)
    assert len(want) == 6

    def every_pair_measured():
        measured = fleet_throughput.measured(fleet.db)
        return measured if all(measured.get(p) and measured[p].tests for p in want) else None

    got = fleet.wait(every_pair_measured, RESULTS_TIMEOUT_S,
                     "an ok throughput result for every directed site pair", poll_s=2)
    learned = fleet.wait_for_rtts(timeout_s=60)

    # Exactly once: one scheduled test per directed pair, one stored result per test, all ok.
    with sqlite3.connect(fleet.db) as conn:
        scheduled = conn.execute(
            "SELECT a.id, b.id FROM throughput_scheduled s JOIN nodes a ON a.idx = s.src "
            "JOIN nodes b ON b.idx = s.dst").fetchall()
        results = conn.execute(
            "SELECT a.id, b.id, t.ok, t.gbps, t.streams FROM throughput_tests t "
            "JOIN nodes a ON a.idx = t.src JOIN nodes b ON b.idx = t.dst").fetchall()
    assert sorted((site[a], site[b]) for a, b in scheduled) == sorted(want), scheduled
    assert sorted((site[a], site[b]) for a, b, *_ in results) == sorted(want), results
    assert all(ok and gbps > 0 and streams >= 1 for *_, ok, gbps, streams in results), results
    assert set(got) == want and all(p.tests == 1 and p.failed == 0 for p in got.values()), got

    # The shaped direction carries its rate; its reverse is not held to it.
    shaped = got[(site[SHAPED[0]], site[SHAPED[1]])].gbps * 1000
    assert abs(shaped / RATE_MBIT - 1) <= 0.15, f"{shaped:.1f} Mbit/s at {RATE_MBIT:g} Mbit/s"
    assert got[(site[SHAPED[1]], site[SHAPED[0]])].gbps * 1000 > 2 * RATE_MBIT, got

    # `fleet show` prints a row per directed site pair with the stored median.
    shown = fleet_throughput.fleet_show(PYTHON, fleet.db)
    for (src, dst), p in got.items():
        # from, to, RTT ms, Gbit/s, tests (1), failed (0)
        cell = r"\s+│\s+"
        row = re.search(rf"{src}{cell}{dst}{cell}[0-9.]+{cell}([0-9.]+){cell}1{cell}0\s+│", shown)
        assert row and row.group(1) == f"{p.gbps:.2f}", f"{src} -> {dst}:\n{shown}"

    # The agent without a throughput port: registered (port 0), probing the others, alive, and
    # in no test.
    assert {k["dst"] for k in learned["links"] if k["src"] == OFF and not k.get("imputed")} \
        >= set(TESTED), learned["links"]
    nodes = fleet.store_nodes()
    assert nodes[OFF]["throughput_port"] == 0
    assert all(nodes[n]["throughput_port"] == fleet_throughput.PORT for n in TESTED)
    assert OFF not in {n for pair in scheduled for n in pair}
    assert fleet.agents[OFF].poll() is None
