"""`hulk-planner plan` and `fleet export` on regional fleets written with site links."""

from __future__ import annotations

import json

import pytest

from planner.core.generate import generate_fleet, generate_regional_fleet
from planner.files.fleet import load_fleet, save_fleet_json
from planner.files.plan import read_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import run_cli

pytestmark = pytest.mark.process


@pytest.mark.slow
def test_a_2000_server_regional_fleet_is_planned_end_to_end(tmp_path):
    fleet_path, out = tmp_path / "regional.json", tmp_path / "plan.json"
    save_fleet_json(generate_regional_fleet(2000, 40, seed=11), fleet_path)
    result = run_cli("plan", REPO / "examples" / "jobs.yaml", "--fleet", fleet_path,
                     "--no-compare", "--out", out, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "fleet of 2000 servers: planned on" in result.stdout and "compute bound" in result.stdout
    assert "best of views of 1,500, 1,732, 2,000 servers" in " ".join(result.stdout.split())
    plan = json.loads(out.read_text())
    assert plan["fleet"]["nodes"] == 2000 and not plan["unplaced"]
    ids = {n.id for n in load_fleet(fleet_path).nodes}
    placed = {i for job in plan["jobs"] for st in job["stages"] for i in st["nodes"]}
    assert placed and placed <= ids
    assert read_plan(out) is not None


def test_export_writes_site_links_for_a_store(tmp_path):
    mesh, db, out = tmp_path / "mesh.json", tmp_path / "planner.sqlite", tmp_path / "out.json"
    save_fleet_json(generate_fleet(24, seed=5, n_cities=3, missing_fraction=0.0), mesh)
    assert run_cli("fleet", "import", mesh, "--db", db).returncode == 0
    result = run_cli("fleet", "export", "--db", db, "--out", out, "--site-links", "yes")
    assert result.returncode == 0, result.stderr
    assert "3 sites, 6 site links" in result.stdout
    exported = load_fleet(out)
    assert not exported.links and len(exported.site_links) == 6 and len(exported.nodes) == 24
    plain = run_cli("fleet", "export", "--db", db, "--out", out)   # auto: small fleets as before
    assert plain.returncode == 0 and "site links" not in plain.stdout
    assert len(load_fleet(out).links) == 24 * 23 // 2


def test_import_says_site_links_are_not_stored(tmp_path):
    regional, db = tmp_path / "regional.json", tmp_path / "planner.sqlite"
    save_fleet_json(generate_regional_fleet(20, 3, seed=1), regional)
    result = run_cli("fleet", "import", regional, "--db", db)
    assert result.returncode == 0, result.stderr
    assert "warning: 6 site links not imported" in result.stdout
