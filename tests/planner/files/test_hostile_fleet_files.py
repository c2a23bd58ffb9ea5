"""Hostile fleet files: node ids every other path refuses, free text with escapes, absurd sizes,
encrypted archives. Each is a one-line InputError naming file, line and field; the node-id rule
is the one registration, the MQTT topics and enrolment apply (``hulk.validate.is_name``)."""

from __future__ import annotations

import io
import json
import random
import zipfile
from pathlib import Path

import pytest

from hulk.errors import ConfigError, InputError, PlanningError
from hulk.validate import is_name
from hulk.wire.broker import check_name
from planner.core.fleet import (FLEET_TEXT_CHARS, MAX_FLEET_NODES, Fleet, Node, complete,
                                link_problem, node_problem)
from planner.core.generate import generate_fleet, generate_regional_fleet
from planner.files.fleet import load_fleet, save_fleet_json
from planner.files.paper import MAX_FLEET_FILE_BYTES
from planner.security.credentials import check_node_id as credentials_node_id
from planner.service.admission import check_node_id as admission_node_id

NODE = {"id": "a", "city": "Paris", "gpus": 8, "gpu_name": "A100-SXM4-80GB", "memory_gb": 640}
HOSTILE_IDS = ["a/b", "#", "+", "a b", "a\x00b", "\x1b[2J", "\x1b]0;title\x07", "<img src=x>",
               "x" * 100_000, "-a", "a\n", "é"]


def write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message and "\x1b" not in message and "\x00" not in message
    assert len(message) < 400
    return message


@pytest.mark.parametrize("node_id", HOSTILE_IDS, ids=lambda s: repr(s[:12]))
def test_a_node_id_any_other_path_refuses_is_refused_with_file_line_and_field(tmp_path, node_id):
    path = write(tmp_path, {"nodes": [NODE, dict(NODE, id=node_id)]})
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    message = one_line(caught.value)
    assert caught.value.path == str(path) and caught.value.field == "nodes[1].id"
    assert caught.value.line is not None and "node id" in message


def test_one_node_id_rule_everywhere():
    rng = random.Random(28)
    alphabet = "aZ09._-/#+ \x00\x1b\n<>é"
    drawn = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(400)]
    for text in HOSTILE_IDS + drawn + ["", "a", "node-1.x_y", "x" * 128, "x" * 129]:
        accepted = [_accepts(check, text) for check in
                    (lambda v: check_name(v, "node id"), admission_node_id, credentials_node_id)]
        assert accepted == [is_name(text)] * 3, text
    assert is_name("x" * 128) and not is_name("x" * 129) and sum(map(is_name, drawn)) > 20


def _accepts(check, text: str) -> bool:
    try:
        check(text)
    except (InputError, ConfigError):
        return False
    return True


@pytest.mark.parametrize("field", ["city", "site", "gpu_name"])
@pytest.mark.parametrize("text", ["\x1b[2J", "a\tb", "Par\x00is", "\u202eevil", "x" * 129])
def test_free_text_is_printable_and_bounded(tmp_path, field, text):
    path = write(tmp_path, {"nodes": [dict(NODE, **{field: text})]})
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    assert caught.value.field == f"nodes[0].{field}" and caught.value.line is not None
    assert f"at most {FLEET_TEXT_CHARS} printable characters" in one_line(caught.value)


@pytest.mark.parametrize("doc, field", [
    ({"name": "\x1b[31mred", "nodes": [NODE]}, "name"),
    ({"name": "n" * 129, "nodes": [NODE]}, "name"),
    ({"sites": [{"id": "\x1b[2J"}], "nodes": [NODE]}, "sites[0].id"),
])
def test_fleet_and_site_names_are_printable_and_bounded(tmp_path, doc, field):
    with pytest.raises(InputError) as caught:
        load_fleet(write(tmp_path, doc))
    assert caught.value.field == field and "printable characters" in one_line(caught.value)


def test_unicode_text_within_the_bound_is_kept(tmp_path):
    path = write(tmp_path, {"name": "Zürich fleet", "nodes": [dict(NODE, city="北京", site="z" * 128)]})
    fleet = load_fleet(path)
    assert fleet.name == "Zürich fleet" and fleet.nodes[0].city == "北京"


def paper(tmp_path: Path, nodes: str, edges: str = "") -> Path:
    folder = tmp_path / "paper"
    folder.mkdir(exist_ok=True)
    (folder / "node_feature.csv").write_text("node,City,Capability,Memory\n" + nodes)
    (folder / "edge.txt").write_text(edges)
    return folder


def test_the_papers_integer_ids_pass_the_rule(tmp_path):
    fleet = load_fleet(paper(tmp_path, "0,Paris,8.0,640\n17,Paris,8.0,640\n", "0 17 1.5\n"))
    assert [n.id for n in fleet.nodes] == ["0", "17"] and all(is_name(n.id) for n in fleet.nodes)


@pytest.mark.parametrize("nodes, edges, expected", [
    ("-5,Paris,8.0,640\n", "", ":2: node: expected a node id"),
    ("9" * 200 + ",Paris,8.0,640\n", "", ":2: node: expected a node id"),
    ("1,Par\x1bis,8.0,640\n", "", ":2: City: expected at most 128 printable characters"),
    ("1,Paris,8.0,1e308\n", "", ":2: Memory: expected GB of GPU memory between 0 and 100000"),
    ("1,Paris,8.0,1e300\n", "", ":2: Memory: expected GB of GPU memory between 0 and 100000"),
])
def test_hostile_paper_rows_name_their_column(tmp_path, nodes, edges, expected):
    with pytest.raises(InputError) as caught:
        load_fleet(paper(tmp_path, nodes, edges))
    assert expected in one_line(caught.value)


def test_an_encrypted_paper_zip_is_one_line(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("node_feature.csv", "node,City,Capability,Memory\n1,Paris,8.0,640\n")
        archive.writestr("edge.txt", "")
    data = bytearray(buffer.getvalue())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):   # local, central
        start = 0
        while (start := data.find(signature, start)) >= 0:
            data[start + flags_at] |= 0x1                 # "encrypted" bit, as `zip -P` sets it
            start += 4
    path = tmp_path / "locked.zip"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    assert "is encrypted; expected an archive without a password" in one_line(caught.value)
    assert caught.value.path == str(path)


@pytest.mark.slow
def test_a_fleet_beyond_the_node_bound_is_refused_before_completion(tmp_path):
    nodes = [{"id": f"n{i}", "memory_gb": 80} for i in range(100_000)]
    path = tmp_path / "huge.json"
    path.write_text(json.dumps({"nodes": nodes}))
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    assert caught.value.field == "nodes" and f"at most {MAX_FLEET_NODES:,} nodes, got 100,000" \
        in one_line(caught.value)
    rows = "".join(f"{i},Paris,8.0,640\n" for i in range(MAX_FLEET_NODES + 1))
    with pytest.raises(InputError, match=f"expected at most {MAX_FLEET_NODES:,} nodes"):
        load_fleet(paper(tmp_path, rows))
    # A fleet from elsewhere (a store) meets the same bound where it would be completed.
    fleet = Fleet(tuple(Node(id=f"n{i}") for i in range(MAX_FLEET_NODES + 1)))
    with pytest.raises(PlanningError, match="completes at most 20,000"):
        complete(fleet)


@pytest.mark.slow
def test_the_fleets_the_planner_is_built_for_fit_the_file_bound(tmp_path):
    """A 10,000-server fleet as `fleet export` writes it (site links) is read whole, and a full
    mesh of 1,000 servers (70 MB: the largest node-link file in use) fits the file bound with
    room to spare (measured on 100 servers: the size grows with the links)."""
    regional = tmp_path / "regional.json"
    save_fleet_json(generate_regional_fleet(10_000, 200, seed=1), regional)
    assert len(load_fleet(regional).nodes) == 10_000
    assert regional.stat().st_size < MAX_FLEET_FILE_BYTES / 20
    mesh = tmp_path / "mesh.json"
    save_fleet_json(generate_fleet(100, seed=1, missing_fraction=0.0), mesh)
    assert len(load_fleet(mesh).links) == 4950
    per_link = mesh.stat().st_size / 4950
    assert 100 < per_link < 200 and per_link * 499_500 < MAX_FLEET_FILE_BYTES / 3


def test_store_rows_are_held_to_the_same_rules():
    assert node_problem(Node(id="a", memory_gb=640)) is None
    assert node_problem(Node(id="a/b")).startswith("id: expected a node id")
    assert node_problem(Node(id="a", memory_gb=1e300)).startswith("memory_gb: expected")
    assert node_problem(Node(id="a", gpus=2 ** 53)).startswith("gpus: expected")
    from planner.core.fleet import Link
    assert link_problem(Link("a", "b", rtt_ms=1e300)).startswith("rtt_ms: expected")
    assert link_problem(Link("a", "b", rtt_ms=3.0, bandwidth_gbps=None)) is None
