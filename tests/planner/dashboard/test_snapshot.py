"""DashboardState on a real SQLite store: links read when due, documents rebuilt every time."""

from __future__ import annotations

from planner.core.fleet import Fleet, Link, Node
from planner.dashboard.compare import ComparisonWorker
from planner.dashboard.snapshot import LINKS_READ_SHARE, DashboardState
from planner.service.store import Store


def test_links_are_read_when_due_and_nodes_on_every_refresh(tmp_path):
    ticks = iter(float(t) for t in range(0, 10_000, 1))     # each clock reading: one more second
    state = DashboardState(fleet="f", node_timeout_s=30, window_days=90, links_interval_s=5,
                           worker=ComparisonWorker(lambda jobs, fleet: None),
                           monotonic=lambda: next(ticks))
    with Store(tmp_path / "planner.sqlite") as store:
        store.import_fleet(Fleet((Node("bj-1", city="Beijing", gpus=8, memory_gb=320.0),
                                  Node("tk-1", city="Tokyo", gpus=8, memory_gb=320.0)),
                                 (Link("bj-1", "tk-1", rtt_ms=40.0),)))
        first = state.read(store)
        assert first.fleet is not None
        state.build(first)
        # A node in a new city and a link to it: the node shows at once, its link once links are due.
        store.import_fleet(Fleet((Node("ld-1", city="London", gpus=4, memory_gb=160.0),),
                                 (Link("bj-1", "ld-1", rtt_ms=200.0),)))
        second = state.read(store)
        assert second.fleet is None
        state.build(second)
        doc = state.document("fleet")
        assert [n["id"] for n in doc["nodes"]] == ["bj-1", "tk-1", "ld-1"]
        assert [(l["a"], l["b"]) for l in doc["links"]] == [("Beijing", "Tokyo")]
        reads = 1
        while (read := state.read(store)).fleet is None:
            reads += 1
        # The first links read began at tick 0 and "took" 1 s, so links are due again at tick
        # 0 + LINKS_READ_SHARE x 1 s = 20, not at 5 (links_interval_s): reads at ticks 2..19 skip them.
        assert LINKS_READ_SHARE == 20 and reads == 18
        state.build(read)
        links = {(l["a"], l["b"]): l["rtt_ms"] for l in state.document("fleet")["links"]}
        assert links == {("Beijing", "Tokyo"): 40.0, ("Beijing", "London"): 200.0}
    assert state.document("plan")["status"] == "none" and state.document("jobs")["jobs"] == []
