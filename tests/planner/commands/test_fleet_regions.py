"""`fleet show` and `fleet plot` on a fleet whose cities are cloud regions: the table
names each region's place, the plot puts the nodes at their regions' coordinates."""

from __future__ import annotations

import json

from hulk import geo
from planner import cli
from planner.files.fleet import load_fleet
from planner.plots.fleet import layout

CITIES = ["aws:us-east-1", "us-east-1", "gcp:europe-west4", "azure:westeurope", "Frankfurt",
          "nowhere-known"]


def _fleet_file(tmp_path):
    nodes = [{"id": f"n{i}", "city": c, "gpus": 1, "gpu_name": "A100", "memory_gb": 80}
             for i, c in enumerate(CITIES)]
    links = [{"src": f"n{i}", "dst": f"n{i + 1}", "rtt_ms": 90.0} for i in range(len(nodes) - 1)]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"name": "clouds", "nodes": nodes, "links": links}))
    return path


def test_fleet_show_gives_each_region_its_place(tmp_path, capsys):
    assert cli.main(["fleet", "show", "--fleet", str(_fleet_file(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.count("aws:us-east-1 (N. Virginia, Ashburn)") == 2       # bare code resolved too
    assert "gcp:europe-west4 (Eemshaven, Netherlands)" in out
    assert "azure:westeurope (Netherlands, Amsterdam)" in out
    assert "Frankfurt " in out and "Frankfurt (" not in out           # cities read as before
    assert "nowhere-known" in out


def test_the_plot_layout_puts_region_nodes_at_their_coordinates(tmp_path):
    fleet = load_fleet(_fleet_file(tmp_path))
    pos = layout(fleet)
    lat, lon = geo.coordinates("gcp:europe-west4")
    assert pos["n2"] == (lon, lat)
    # Only the unknown name goes to the row below the map.
    below = min(geo.coordinates(c)[0] for c in CITIES[:-1]) - 5
    assert [n for n, (_, y) in pos.items() if y < below] == ["n5"]
