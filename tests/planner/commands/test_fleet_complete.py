"""`hulk-planner fleet complete` end to end, `fleet show` marking completed links, and
`plan --links`: the fleet a completion writes plans as the original completed with the
prediction."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

from planner import cli
from planner.commands.plan import load_network
from planner.core.fleet import complete
from planner.files.fleet import load_fleet
from planner.linkpred.complete import MIN_MEASURED_THROUGHPUTS, predict_fleet_links
from planner.linkpred.models import MODELS
from tests.helpers.paths import REPO

SITES = 10
EXAMPLE = REPO / "examples" / "fleets" / "asia-24.json"


def _fleet_file(tmp_path, throughputs: int = MIN_MEASURED_THROUGHPUTS + 2):
    """One server a site; a ring of measured RTTs plus a few chords, ``throughputs`` of them
    with a measured throughput."""
    nodes = [{"id": f"n{k}", "site": f"aws:site-{k}", "gpus": 8, "gpu_name": "A100",
              "memory_gb": 640} for k in range(SITES)]
    pairs = [(k, (k + 1) % SITES) for k in range(SITES)] + [(0, 5), (2, 7), (3, 8)]
    links = [{"src": f"n{a}", "dst": f"n{b}", "rtt_ms": 10.0 + 3 * a + b,
              "bandwidth_gbps": (1.0 + 0.5 * k) if k < throughputs else None}
             for k, (a, b) in enumerate(pairs)]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"name": "ring", "nodes": nodes, "links": links}))
    return path


def _hulk_planner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.process
def test_fleet_complete_end_to_end(tmp_path):
    src, out = _fleet_file(tmp_path), tmp_path / "completed.json"
    done = _hulk_planner("fleet", "complete", str(src), "--out", str(out), "--model", "distance")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"wrote {out}: {SITES} sites, 45 site pairs; model distance;")
    assert lines[1] == "  RTT: 13 measured, 32 predicted, 0 formula"
    assert lines[2] == "  throughput: 10 measured, 35 predicted, 0 formula"
    written = json.loads(out.read_text())
    links = written["site_links"]
    assert len({frozenset((k["src"], k["dst"])) for k in links}) == len(links) == 45
    predicted = [k for k in links if k.get("source") == "predicted"]
    assert len(predicted) == 35
    assert all(k["rtt_hi_ms"] >= k["rtt_ms"] and k["bandwidth_lo_gbps"] <= k["bandwidth_gbps"]
               for k in predicted)
    assert len(written["links"]) == 13                     # node links kept as measured

    # Reading it back plans as planning the original with the prediction on.
    fleet = load_fleet(src)
    with_model = complete(fleet, prediction=predict_fleet_links(fleet, MODELS["distance"]))
    again = load_network(argparse.Namespace(fleet=str(out), db=None, links="predicted"))[1]
    np.testing.assert_array_equal(again.rtt_ms, with_model.rtt_ms)
    np.testing.assert_array_equal(again.bw, with_model.bw)


def test_fleet_complete_without_throughputs_says_it_used_the_formula(tmp_path, capsys):
    out = tmp_path / "completed.json"
    assert cli.main(["fleet", "complete", str(EXAMPLE), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model formula" in text and "throughput: 0 measured, 0 predicted, 15 formula" in text
    assert f"fewer than {MIN_MEASURED_THROUGHPUTS} site pairs measured a throughput" in text
    assert len(load_fleet(out).site_links) == 15


@pytest.mark.process
def test_fleet_complete_bad_input_exits_2_with_one_line(tmp_path):
    src = _fleet_file(tmp_path)
    bad_model = _hulk_planner("fleet", "complete", str(src), "--out", str(tmp_path / "o.json"),
                              "--model", "oracle")
    assert bad_model.returncode == 2
    assert bad_model.stderr.count("\n") == 1 and "--model" in bad_model.stderr
    assert "provider median" in bad_model.stderr
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"nodes": [{"id": "n0", "site": "a", "gpus": 1,
                                             "gpu_name": "A100", "memory_gb": 80}],
                                  "site_links": [{"src": "a", "dst": "a", "rtt_ms": 1.0,
                                                  "source": "guessed"}]}))
    bad_file = _hulk_planner("fleet", "complete", str(broken), "--out", str(tmp_path / "o.json"))
    assert bad_file.returncode == 2
    assert bad_file.stderr.count("\n") == 1
    assert "site_links[0].source" in bad_file.stderr and str(broken) in bad_file.stderr
    assert not (tmp_path / "o.json").exists()


def test_fleet_show_marks_predicted_and_formula_links(tmp_path, capsys):
    src, out = _fleet_file(tmp_path), tmp_path / "completed.json"
    assert cli.main(["fleet", "complete", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["fleet", "show", "--fleet", str(out)]) == 0
    text = capsys.readouterr().out
    assert "peers ~ / *" in text
    assert "completed site links (fleet complete): 35 predicted (~" in text
    assert "formula (*: relay over measured RTTs and the window formula)" in text
    assert cli.main(["fleet", "show", "--fleet", str(src)]) == 0
    assert "peers ~ / *" not in capsys.readouterr().out      # nothing completed: no column


def test_plan_links_formula_ignores_the_prediction_and_predicted_uses_it(tmp_path):
    src = _fleet_file(tmp_path)
    formula = load_network(argparse.Namespace(fleet=str(src), db=None, links="formula"))[1]
    predicted = load_network(argparse.Namespace(fleet=str(src), db=None, links="predicted"))[1]
    today = complete(load_fleet(src))
    np.testing.assert_array_equal(formula.rtt_ms, today.rtt_ms)
    assert not np.array_equal(predicted.bw, today.bw)
    # The shipped example fleet measured no throughput: both choices give today's network.
    example = load_network(argparse.Namespace(fleet=str(EXAMPLE), db=None, links="predicted"))[1]
    np.testing.assert_array_equal(example.rtt_ms, complete(load_fleet(EXAMPLE)).rtt_ms)
    np.testing.assert_array_equal(example.bw, complete(load_fleet(EXAMPLE)).bw)


def test_plan_accepts_the_links_flag():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    from planner.commands import plan
    from planner.settings import PlannerSettings
    plan.register(sub, PlannerSettings())
    args = parser.parse_args(["plan", "jobs.yaml", "--fleet", "f.json", "--links", "formula"])
    assert args.links == "formula"
    assert parser.parse_args(["plan", "jobs.yaml", "--fleet", "f.json"]).links == "predicted"
