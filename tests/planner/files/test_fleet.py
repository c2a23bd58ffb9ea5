"""Fleet files: the paper's data (folder and zip), fleet JSON, and malformed files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hulk.errors import InputError
from planner.core.fleet import complete
from planner.files.fleet import (fleet_to_json, load_fleet, load_fleet_with_report,
                             save_fleet_json)

from tests.helpers.paths import REPO


@pytest.mark.parametrize("which", ["folder", "zip"])
def test_paper_data(paper_fleet_dir: Path, which: str):
    path = paper_fleet_dir if which == "folder" else paper_fleet_dir / "Hulk_data.zip"
    fleet, issues = load_fleet_with_report(path)
    assert len(fleet.nodes) == 47
    assert [n.id for n in fleet.nodes] == [str(i) for i in range(47)]
    assert all(n.gpus == 8 for n in fleet.nodes)
    pairs = {frozenset((k.src, k.dst)) for k in fleet.links}
    assert len(pairs) == len(fleet.links) == 613
    assert all(k.src != k.dst for k in fleet.links)  # no self-loop stored
    by_line = {(Path(i.path.split("!")[-1]).name, i.line): i.message for i in issues}
    assert "self-loop" in by_line[("edge.txt", 116)] and "self-loop" in by_line[("edge.txt", 401)]
    assert "conflicting duplicate of line 342" in by_line[("edge.txt", 351)]
    assert "reversed duplicate of line 379" in by_line[("edge.txt", 400)]
    assert "Neimeng" in by_line[("node_feature.csv", 7)]
    assert any("one-directional" in i.message for i in issues)
    messages = [str(i) for i in issues]
    assert len(messages) == len(set(messages)) == 6  # each flaw once
    node = {n.id: n for n in fleet.nodes}
    assert node["5"].city == "Neimeng" and node["5"].city_key == "Hohhot"
    link = {frozenset((k.src, k.dst)): k.rtt_ms for k in fleet.links}
    assert link[frozenset(("11", "30"))] == (214 + 265) / 2
    assert link[frozenset(("13", "14"))] == (10 + 4) / 2
    assert link[frozenset(("20", "22"))] == 0.8
    assert node["3"].memory_gb == 384 and node["3"].compute_capability == 7.0


def test_json_round_trip(tmp_path: Path, paper_fleet_dir: Path):
    fleet = load_fleet(paper_fleet_dir)
    save_fleet_json(fleet, tmp_path / "f.json")
    again, issues = load_fleet_with_report(tmp_path / "f.json")
    assert issues == []
    assert again.nodes == fleet.nodes and again.links == fleet.links
    doc = json.loads((tmp_path / "f.json").read_text())
    assert set(doc["nodes"][0]) >= {"id", "city", "gpus", "gpu_name", "compute_capability",
                                    "memory_gb"}
    assert set(doc["links"][0]) == {"src", "dst", "rtt_ms", "bandwidth_gbps", "loss", "samples"}
    assert doc == fleet_to_json(again)


def test_saved_text_is_json_dumps_layout_in_utf8(tmp_path: Path, paper_fleet_dir: Path):
    """The written text is json.dumps(indent=1)'s, except that non-ASCII stays UTF-8."""
    import dataclasses

    fleet = load_fleet(paper_fleet_dir)
    first = dataclasses.replace(fleet.nodes[0], city="São Paulo")
    fleet = dataclasses.replace(fleet, nodes=(first, *fleet.nodes[1:]))
    save_fleet_json(fleet, tmp_path / "f.json")
    text = (tmp_path / "f.json").read_text(encoding="utf-8")
    assert text == json.dumps(fleet_to_json(fleet), indent=1, ensure_ascii=False) + "\n"
    assert load_fleet(tmp_path / "f.json").nodes[0].city == "São Paulo"


def test_design_md_example_reads(tmp_path: Path):
    p = tmp_path / "d.json"
    p.write_text("""{"nodes": [{"id": "beijing-1", "city": "Beijing", "gpus": 8,
            "gpu_name": "NVIDIA A100-SXM4-40GB", "compute_capability": 8.0, "memory_gb": 320},
           {"id": "tokyo-2", "city": "Tokyo", "gpus": 8, "gpu_name": null,
            "compute_capability": 9.0, "memory_gb": 640}],
 "links": [{"src": "beijing-1", "dst": "tokyo-2", "rtt_ms": 74.3, "bandwidth_gbps": null,
            "loss": 0.0, "samples": 1200},
           {"src": "tokyo-2", "dst": "tokyo-2", "rtt_ms": 0.1}]}
""")
    with pytest.raises(InputError, match=r"d\.json:7: links\[1\]\.dst: a link from node 'tokyo-2' "
                       "to itself"):
        load_fleet_with_report(p)
    p.write_text(p.read_text().replace('"dst": "tokyo-2", "rtt_ms": 0.1', '"dst": "beijing-1", "rtt_ms": 74.1'))
    fleet, issues = load_fleet_with_report(p)
    assert [n.id for n in fleet.nodes] == ["beijing-1", "tokyo-2"]
    assert len(fleet.links) == 2 and fleet.links[0].samples == 1200 and issues == []


@pytest.mark.process
@pytest.mark.parametrize("name", ["asia-24", "world-48"])
def test_shipped_examples_are_connected_and_current(tmp_path: Path, name: str):
    import subprocess
    import sys
    subprocess.run([sys.executable, str(REPO / "examples" / "make_fleets.py"), "--out",
                    str(tmp_path)], check=True, capture_output=True)
    shipped = REPO / "examples" / "fleets" / f"{name}.json"
    assert (tmp_path / f"{name}.json").read_text() == shipped.read_text()  # deterministic
    fleet, issues = load_fleet_with_report(shipped)
    assert issues == []
    net = complete(fleet)
    assert len(net.components()) == 1 and net.imputed.any()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _paper(tmp_path: Path, nodes: str, edges: str) -> Path:
    d = tmp_path / "paper"
    d.mkdir()
    (d / "node_feature.csv").write_text(nodes)
    (d / "edge.txt").write_text(edges)
    return d


GOOD_NODES = "node,City,Capability,Memory\n0,Paris,8,320\n1,Rome,7,256\n"

MALFORMED = {
    "bad weight": (GOOD_NODES, "0 1 10\n0 1 fast\n", "edge.txt:2: weight"),
    "unknown node": (GOOD_NODES, "0 1 10\n1 7 12\n", "edge.txt:2: dst"),
    "two fields": (GOOD_NODES, "0 1\n", "edge.txt:1: line"),
    "missing column": ("node,City,Capability\n0,Paris,8\n", "", "node_feature.csv:1: header"),
    "bad memory": ("node,City,Capability,Memory\n0,Paris,8,lots\n", "", "node_feature.csv:2: Memory"),
    "short row": ("node,City,Capability,Memory\n0,Paris\n", "", "node_feature.csv:2: Capability"),
    "bad node id": ("node,City,Capability,Memory\nzero,Paris,8,1\n", "", "node_feature.csv:2: node"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_paper_files(tmp_path: Path, case: str):
    nodes, edges, where = MALFORMED[case]
    with pytest.raises(InputError) as err:
        load_fleet(_paper(tmp_path, nodes, edges))
    message = str(err.value)
    assert "\n" not in message and where in message, message


JSON_CASES = {
    "not json": ("{nodes: [}", ":1: ", "invalid JSON"),
    "top is a list": ("[]", ":1: ", "expected a JSON object"),
    "nodes not a list": ('{"nodes": {}}', ":1: nodes: ", "array"),
    "id is a number": ('{"nodes": [\n {"id": 1, "memory_gb": 1}]}', ":2: nodes[0].id: ",
                       "non-empty string"),
    "gpus is a string": ('{"nodes": [\n {"id": "a", "gpus": "8", "memory_gb": 1}]}',
                         ":2: nodes[0].gpus: ", "whole number of GPUs"),
    "rtt missing": ('{"nodes": [{"id": "a", "memory_gb": 1}, {"id": "b", "memory_gb": 1}],\n'
                    ' "links": [\n  {"src": "a", "dst": "b"}]}', ":3: links[0].rtt_ms: ", "milliseconds of RTT"),
    "negative rtt": ('{"nodes": [{"id": "a", "memory_gb": 1}, {"id": "b", "memory_gb": 1}],\n'
                     ' "links": [{"src": "a", "dst": "b", "rtt_ms": -3}]}',
                     ":2: links[0].rtt_ms: ", "between 0 and 60000, got -3"),
    "unknown link node": ('{"nodes": [{"id": "a", "memory_gb": 1}],\n "links": [\n'
                          '  {"src": "a", "dst": "zz", "rtt_ms": 3}]}', ":3: links[0].dst: ",
                          "unknown node"),
    "duplicate node": ('{"nodes": [{"id": "a", "memory_gb": 1},\n {"id": "a", "memory_gb": 1}]}',
                       ":2: nodes[1].id: ", "twice"),
    "memory unknown": ('{"nodes": [{"id": "a", "gpu_name": "Mystery GPU"}]}',
                       ":1: nodes[0].memory_gb: ", "memory"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_malformed_json(tmp_path: Path, case: str):
    text, where, what = JSON_CASES[case]
    p = _write(tmp_path, "fleet.json", text)
    with pytest.raises(InputError) as err:
        load_fleet(p)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(p)), message
    assert where in message and what in message, message


def test_bad_zip_and_missing_path(tmp_path: Path):
    z = tmp_path / "x.zip"
    with zipfile.ZipFile(z, "w") as archive:
        archive.writestr("readme.txt", "nothing")
    with pytest.raises(InputError, match="x.zip: archive has no node_feature.csv"):
        load_fleet(z)
    with pytest.raises(InputError, match="no such file"):
        load_fleet(tmp_path / "nope.json")


FLEET_TWO = """{"name": "two",
 "nodes": [{"id": "a-1", "city": "Beijing", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB"},
           {"id": "b-1", "city": "Tokyo", "gpus": 8, "gpu_name": "NVIDIA A100-SXM4-40GB"}],
 "links": [{"src": "a-1", "dst": "b-1", "rtt_ms": 74.3}]}
"""


@pytest.mark.parametrize("doc, key, line", [
    (FLEET_TWO.replace('{"id": "b-1",', '{"id": "b-1", "id": "c-1",'), "id", 3),
    (FLEET_TWO.replace('"links": [', '"nodes": [], "links": ['), "nodes", 4),
    (FLEET_TWO.replace('"rtt_ms": 74.3}', '"rtt_ms": 74.3, "rtt_ms": 1.0}'), "rtt_ms", 4),
])
def test_a_key_written_twice_is_refused_naming_the_key_and_its_line(tmp_path: Path, doc, key,
                                                                      line):
    p = tmp_path / "dup.json"
    p.write_text(doc)
    with pytest.raises(InputError) as err:
        load_fleet(p)
    message = str(err.value)
    assert message.startswith(f"{p}:{line}:") and f'"{key}" is written twice' in message
    assert "\n" not in message


def test_two_links_for_one_pair_with_different_figures_are_refused(tmp_path: Path):
    p = tmp_path / "conflict.json"
    p.write_text(FLEET_TWO.replace(
        '"rtt_ms": 74.3}]', '"rtt_ms": 74.3},\n  {"src": "a-1", "dst": "b-1", "rtt_ms": 7.0}]'))
    with pytest.raises(InputError, match=r"conflict\.json:5: links\[1\]: conflicting duplicate "
                       r"of the link a-1 -> b-1 on line 4"):
        load_fleet(p)
    same = tmp_path / "same.json"
    same.write_text(FLEET_TWO.replace(
        '"rtt_ms": 74.3}]', '"rtt_ms": 74.3},\n  {"src": "a-1", "dst": "b-1", "rtt_ms": 74.3}]'))
    fleet, issues = load_fleet_with_report(same)
    assert len(fleet.links) == 1 and fleet.links[0].rtt_ms == 74.3
    assert len(issues) == 1 and "duplicate of the link a-1 -> b-1 on line 4" in issues[0].message
