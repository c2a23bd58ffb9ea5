"""`fleet show --db` and `fleet export --db` on a store whose agents declared sites: two
data centres in one city are two sites in the table and in the exported file; a node without a
site is in its city's, and the file names no site for it (as before). Real SQLite store."""

from __future__ import annotations

import json
import time

from hulk.wire.records import NodeLocation, RegisterRequest
from planner import cli
from planner.core.rollup import bucket_index
from planner.files.fleet import load_fleet
from planner.service.store import Store

NODES = {"par-a0": ("Paris", "par-dc1"), "par-b0": ("Paris", "par-dc2"), "rome-0": ("Rome", "")}


def make_store(path) -> None:
    now = int(time.time() * 1000)
    with Store(path) as store:
        refs = {n: store.register(RegisterRequest(n, location=NodeLocation(city, site=site)))[0]
                for n, (city, site) in NODES.items()}
        pairs = [("par-a0", "par-b0", 0.4), ("par-b0", "rome-0", 11.0), ("par-a0", "rome-0", 11.5)]
        for k, (a, b, rtt) in enumerate(pairs):
            rows = [(refs[a].idx, refs[b].idx, now - 1000 + i, 1, 56, 0, rtt, bucket_index(rtt))
                    for i in range(3)]
            store.store_batch(refs[a], f"batch-{k}", rows)


def table_rows(out: str) -> list[list[str]]:
    """The cells of each row of a rich table, header first."""
    return [[c.strip() for c in line.replace("┃", "│").split("│")[1:-1]]
            for line in out.splitlines() if line[:1] in ("│", "┃")]


def test_fleet_show_lists_each_nodes_site_when_one_is_declared(tmp_path, capsys):
    make_store(tmp_path / "p.db")
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "p.db")]) == 0
    header, *rows = table_rows(capsys.readouterr().out)
    assert header[:3] == ["node", "city", "site"]
    assert {r[0]: tuple(r[1:3]) for r in rows} == {
        "par-a0": ("Paris", "par-dc1"), "par-b0": ("Paris", "par-dc2"), "rome-0": ("Rome", "Rome")}


def test_fleet_show_has_no_site_column_when_every_site_is_a_city(tmp_path, capsys):
    with Store(tmp_path / "p.db") as store:
        store.register(RegisterRequest("n1", location=NodeLocation("Paris")))
    assert cli.main(["fleet", "show", "--db", str(tmp_path / "p.db")]) == 0
    header, *_ = table_rows(capsys.readouterr().out)
    assert header[:3] == ["node", "city", "GPUs"]


def test_fleet_export_names_declared_sites_and_rolls_links_up_by_them(tmp_path, capsys):
    make_store(tmp_path / "p.db")
    out = tmp_path / "fleet.json"
    assert cli.main(["fleet", "export", "--db", str(tmp_path / "p.db"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {n["id"]: n.get("site") for n in doc["nodes"]} == \
        {"par-a0": "par-dc1", "par-b0": "par-dc2", "rome-0": None}
    assert {n.id: n.site_key for n in load_fleet(out).nodes} == \
        {"par-a0": "par-dc1", "par-b0": "par-dc2", "rome-0": "Rome"}
    assert cli.main(["fleet", "export", "--db", str(tmp_path / "p.db"), "--out", str(out),
                     "--site-links", "yes"]) == 0
    doc = json.loads(out.read_text())
    assert {s["id"] for s in doc["sites"]} == {"par-dc1", "par-dc2", "Rome"}
    assert {(k["src"], k["dst"]) for k in doc["site_links"]} == \
        {("par-dc1", "par-dc2"), ("par-dc2", "Rome"), ("par-dc1", "Rome")}
