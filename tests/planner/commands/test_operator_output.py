"""What an operator reads: the fleet's name, memory figures, the no-GPU error, the
plot's colour bar on a fleet without GPUs."""

from __future__ import annotations

import json

from hulk.wire.records import GpuInfo, Inventory, RegisterRequest
from planner import cli
from planner.plots.fleet import throughput_limits
from planner.service.store import Store
from tests.helpers.paths import REPO


def test_fleet_show_names_the_fleet_as_serve_does_not_after_the_file(tmp_path, capsys, monkeypatch):
    db = tmp_path / "planner.sqlite"
    with Store(db) as store:
        store.register(RegisterRequest("n1", address="127.0.0.1", inventory=Inventory(
            gpus=(GpuInfo("NVIDIA A100-SXM4-80GB", memory_bytes=85_899_345_920),))))
    assert cli.main(["fleet", "show", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "fleet default: 1 node" in out and "1 nodes" not in out and "fleet planner" not in out
    assert "85.9" in out and "85.8993" not in out
    monkeypatch.setenv("HULK_FLEET", "lab")
    assert cli.main(["fleet", "show", "--db", str(db)]) == 0
    assert "fleet lab: 1 node" in capsys.readouterr().out


def test_plan_on_a_fleet_without_gpus_says_so(tmp_path, capsys):
    fleet = {"name": "bare", "nodes": [{"id": f"n{i}", "city": "Tokyo", "gpus": 0, "memory_gb": 0}
                                       for i in range(3)], "links": []}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    code = cli.main(["plan", str(REPO / "examples" / "jobs.yaml"), "--fleet", str(path),
                     "--no-compare"])
    err = capsys.readouterr().err
    assert code == 2 and "no node of the fleet has a GPU" in err and "0 GB" not in err


def test_the_colour_bar_of_a_fleet_without_gpus_runs_from_0_to_1():
    assert throughput_limits([0.0, 0.0]) == (0.0, 1.0)
    assert throughput_limits([0.0, 312.0]) == (0.0, 312.0)
