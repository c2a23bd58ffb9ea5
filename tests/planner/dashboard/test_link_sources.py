"""The dashboard marks where each site pair's figures come from: measured by probes and
throughput tests, predicted by serve's link model (with its conservative bounds), or the
formula; through the real HTTP server over a real store."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess

import pytest

from planner.core.fleet import Fleet, Link, Node
from planner.dashboard.compare import ComparisonWorker
from planner.dashboard.link_sources import marked_links
from planner.dashboard.server import DashboardServer
from planner.dashboard.snapshot import DashboardState
from planner.dashboard.view import LinkSummary
from planner.linkpred.graph import Source
from planner.service.store import Store
from tests.helpers.link_predictions import link_prediction

SITES = ("Beijing", "London", "Tokyo")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PREDICTION = link_prediction(SITES, {
    ("Beijing", "Tokyo"): (42.0, 42.0, 3.0, 2.0, Source.MEASURED, Source.PREDICTED),
    ("London", "Tokyo"): (200.0, 260.0, 0.9, 0.5, Source.PREDICTED),
    ("Beijing", "London"): (240.0, 240.0, 0.33, 0.33, Source.FORMULA)}, model="provider median")
NODES = (Node("bj-1", city="Beijing", gpus=8, memory_gb=320.0),
         Node("tk-1", city="Tokyo", gpus=4, memory_gb=160.0),
         Node("ld-1", city="London", gpus=4, memory_gb=160.0))


def api_fleet(server: DashboardServer) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/api/fleet")
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        conn.close()


def test_the_fleet_document_marks_measured_predicted_and_formula_links(tmp_path):
    holder = {"prediction": None}
    state = DashboardState(fleet="test", node_timeout_s=30, window_days=90,
                           worker=ComparisonWorker(lambda jobs, fleet: None),
                           links=lambda: holder["prediction"])
    server = DashboardServer("127.0.0.1:0", state)
    with Store(tmp_path / "planner.sqlite") as store:
        store.import_fleet(Fleet(NODES, (Link("bj-1", "tk-1", rtt_ms=42.0, samples=5),)))
        state.refresh(store)
        server.start()
        try:
            before = api_fleet(server)
            holder["prediction"] = PREDICTION
            state.refresh(store)
            after = api_fleet(server)
        finally:
            server.close()
            state.close()
    # Before the link model is fitted: the measured link alone, marked measured.
    [only] = before["links"]
    assert (only["a"], only["b"], only["source"], only["bandwidth_source"]) == \
        ("Beijing", "Tokyo", "measured", None)
    links = {(l["a"], l["b"]): l for l in after["links"]}
    assert list(links) == [("Beijing", "Tokyo"), ("London", "Tokyo"), ("Beijing", "London")]
    measured = links[("Beijing", "Tokyo")]
    assert (measured["source"], measured["rtt_ms"], measured["pairs"]) == ("measured", 42.0, 1)
    assert (measured["bandwidth_source"], measured["bandwidth_gbps"],
            measured["bandwidth_lo_gbps"]) == ("predicted", 3.0, 2.0)
    predicted = links[("London", "Tokyo")]
    assert {k: predicted[k] for k in ("source", "rtt_ms", "rtt_hi_ms", "bandwidth_source",
                                      "bandwidth_gbps", "bandwidth_lo_gbps", "model", "pairs")} \
        == {"source": "predicted", "rtt_ms": 200.0, "rtt_hi_ms": 260.0,
            "bandwidth_source": "predicted", "bandwidth_gbps": 0.9, "bandwidth_lo_gbps": 0.5,
            "model": "provider median", "pairs": 0}
    formula = links[("Beijing", "London")]
    assert (formula["source"], formula["bandwidth_source"], formula["rtt_hi_ms"],
            formula["bandwidth_lo_gbps"]) == ("formula", "formula", None, None)


def test_a_measured_throughput_stays_measured_whatever_the_prediction_says():
    summary = LinkSummary(({"a": "Beijing", "b": "Tokyo", "rtt_ms": 42.0, "colour": "#000000",
                            "min_ms": 42.0, "max_ms": 42.0, "loss": 0.0, "pairs": 1,
                            "samples": 5, "bandwidth_gbps": 7.0},), {}, 1)
    prediction = link_prediction(("Beijing", "Tokyo"), {
        ("Beijing", "Tokyo"): (42.0, 42.0, 3.0, 2.0, Source.MEASURED, Source.PREDICTED)})
    [link] = marked_links(summary, prediction).between
    assert (link["bandwidth_source"], link["bandwidth_gbps"]) == ("measured", 7.0)
    assert marked_links(summary, None).between[0]["source"] == "measured"


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make install` installs "
                                              "Debian's chromium package)")
def test_the_page_draws_predicted_and_formula_links_dashed_with_their_bounds(tmp_path):
    state = DashboardState(fleet="test", node_timeout_s=30, window_days=90,
                           worker=ComparisonWorker(lambda jobs, fleet: None),
                           links=lambda: PREDICTION)
    with Store(tmp_path / "planner.sqlite") as store:
        store.import_fleet(Fleet(NODES, (Link("bj-1", "tk-1", rtt_ms=42.0, samples=5),)))
        state.refresh(store)
    server = DashboardServer("127.0.0.1:0", state)
    server.start()
    try:
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
             "--dump-dom", f"http://127.0.0.1:{server.port}/"],
            capture_output=True, text=True, timeout=90)
    finally:
        server.close()
        state.close()
    html = dom.stdout
    assert dom.returncode == 0 and 'data-loaded="1"' in html, dom.stderr[-2000:]
    assert 'data-source="predicted" stroke-dasharray="6 4"' in html
    assert 'data-source="formula" stroke-dasharray="2 4"' in html
    assert "London – Tokyo [predicted]: 200 ms RTT predicted by provider median (planned as " \
        "≤ 260 ms), 0.9 Gbit/s predicted (planned as ≥ 0.5)" in html
    assert "Beijing – Tokyo [measured]: 42 ms RTT" in html
    assert html.count('class="link-source"') == 3
