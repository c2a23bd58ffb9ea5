"""`fleet complete` says which site pairs it could not complete instead of counting them as
written formula links."""

from __future__ import annotations

import json

from planner import cli
from planner.files.fleet import load_fleet


def test_site_pairs_no_measurement_joins_are_reported_not_written(tmp_path, capsys):
    nodes = [{"id": f"{site}-{k}", "site": site, "gpus": 8, "gpu_name": "A100", "memory_gb": 640}
             for site in ("east", "west", "south") for k in range(2)]
    links = [{"src": f"{site}-0", "dst": f"{site}-1", "rtt_ms": 1.0}
             for site in ("east", "west", "south")]
    links.append({"src": "east-0", "dst": "west-0", "rtt_ms": 80.0})     # south stays apart
    src, out = tmp_path / "fleet.json", tmp_path / "completed.json"
    src.write_text(json.dumps({"name": "apart", "nodes": nodes, "links": links}))
    assert cli.main(["fleet", "complete", str(src), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 sites, 3 site pairs" in text
    assert "  2 site pairs unreachable (no measured path joins their sites)" in text
    written = {frozenset((k.src, k.dst)) for k in load_fleet(out).site_links}
    assert written == {frozenset(("east", "west"))}


def test_a_connected_fleet_reports_no_unreachable_pair(tmp_path, capsys):
    nodes = [{"id": f"n{k}", "site": f"s{k}", "gpus": 8, "gpu_name": "A100", "memory_gb": 640}
             for k in range(3)]
    links = [{"src": "n0", "dst": "n1", "rtt_ms": 10.0}, {"src": "n1", "dst": "n2", "rtt_ms": 20.0}]
    src, out = tmp_path / "fleet.json", tmp_path / "completed.json"
    src.write_text(json.dumps({"name": "chain", "nodes": nodes, "links": links}))
    assert cli.main(["fleet", "complete", str(src), "--out", str(out)]) == 0
    assert "unreachable" not in capsys.readouterr().out
    assert len(load_fleet(out).site_links) == 3
