"""`hulk-planner plan` as a user runs it: a subprocess, exit codes, one-line messages, files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from planner.files.plan import read_plan

from tests.helpers.paths import REPO
from tests.helpers.processes import run_cli

pytestmark = pytest.mark.process   # every test runs `hulk-planner plan` as a subprocess


def hulk_planner(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hulk-planner: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def fleet_json(tmp_path: Path, nodes: list[dict], links: list[dict]) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"nodes": nodes, "links": links}))
    return path


def node(i: str, city: str, memory_gb: float = 320.0) -> dict:
    return {"id": i, "city": city, "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB",
            "compute_capability": 8.0, "memory_gb": memory_gb}


SMALL_JOBS = "jobs:\n  - {name: bert, model: bert-large, steps: 10}\n"


def test_plan_writes_a_valid_plan_and_plot(tmp_path, paper_fleet_dir, shared_dir):
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    result = hulk_planner("plan", shared_dir / "bench" / "paper-4-jobs.yaml", "--fleet",
                          paper_fleet_dir, "--method", "system-b", "--no-compare",
                          "--out", out, "--plot", png)
    assert result.returncode == 0, result.stderr
    assert "opt-175b" in result.stdout and "compute bound" in result.stdout
    doc = read_plan(out, node_ids=[str(i) for i in range(47)])
    assert doc.method == "system-b" and len(doc.jobs) == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_method_compares_with_every_baseline(tmp_path, repo_dir):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOBS + "  - {name: gpt2, model: gpt2-xl, steps: 10}\n")
    fleet = repo_dir / "examples" / "fleets" / "asia-24.json"
    if not fleet.exists():
        pytest.skip("examples/fleets/asia-24.json not present")
    result = hulk_planner("plan", jobs, "--fleet", fleet, "--out", tmp_path / "p.json")
    assert result.returncode == 0, result.stderr
    for label in ("comparison", "System A", "System B", "System C", "DT-FM-style peer",
                  "compute bound", "best of Systems A/B/C"):
        assert label in result.stdout
    assert json.loads((tmp_path / "p.json").read_text())["format"] == "hulk-plan/1"


def test_not_yaml(tmp_path, paper_fleet_dir):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs: [\n  {name: a\n")
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", paper_fleet_dir),
                          str(jobs), "not valid YAML")


def test_impossible_job(tmp_path, paper_fleet_dir):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: giant, model: opt-175b, params: 5.0e12}\n")
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", paper_fleet_dir),
                          "giant", "whole fleet has")


def test_empty_fleet(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOBS)
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", fleet_json(tmp_path, [], [])),
                          "fleet.json", "node")


def test_split_fleet(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOBS)
    fleet = fleet_json(tmp_path, [node("a", "Tokyo"), node("b", "Paris"), node("c", "Lima")], [])
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", fleet),
                          "no two nodes can communicate")


def test_job_larger_than_any_connected_part(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: big, model: gpt3-13b}\n")   # 208 GB of training state
    nodes = [node("a", "Tokyo", 100), node("b", "Tokyo", 100), node("c", "Paris", 100)]
    links = [{"src": "a", "dst": "b", "rtt_ms": 1.0}]
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", fleet_json(tmp_path, nodes, links)),
                          "big", "largest connected part")


def test_missing_files_and_bad_flags(tmp_path, paper_fleet_dir):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOBS)
    assert_one_line_error(hulk_planner("plan", tmp_path / "none.yaml", "--fleet", paper_fleet_dir),
                          "none.yaml", "no such file")
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", tmp_path / "nowhere"),
                          "nowhere", "--fleet")
    assert_one_line_error(hulk_planner("plan", jobs, "--fleet", paper_fleet_dir, "--method",
                                       "system-c", "--out", tmp_path / "c.json"),
                          "System C", "--out")
    assert_one_line_error(hulk_planner("plan", jobs, "--db", tmp_path / "missing.db"), "--db")


def test_plan_from_the_live_store(tmp_path):
    from planner.core.generate import generate_fleet
    from planner.service.store import Store

    db = tmp_path / "hulk.db"
    with Store(db) as store:
        store.import_fleet(generate_fleet(12, seed=4))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(SMALL_JOBS)
    result = hulk_planner("plan", jobs, "--db", db, "--method", "system-b", "--no-compare",
                          "--out", tmp_path / "p.json")
    assert result.returncode == 0, result.stderr
    doc = read_plan(tmp_path / "p.json")
    assert doc.fleet_nodes == 12 and doc.jobs[0].name == "bert"
