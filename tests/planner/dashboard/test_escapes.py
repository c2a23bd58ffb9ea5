"""Text from agents and jobs (a launch detail with the job log's last lines, host and GPU names)
reaches the dashboard's documents and page with its control characters shown as '?', as
`hulk-planner jobs` prints it: a window title or a cleared screen is never part of the page."""

from __future__ import annotations

import http.client
import json

from planner.core.fleet import Fleet, Node
from planner.core.placements import job_spec
from planner.dashboard.server import DashboardServer
from planner.dashboard.snapshot import DashboardState
from planner.dashboard.view import fleet_json
from planner.service.store import Store
from tests.helpers.plans import job

TITLE, CLEAR = "\x1b]0;owned\x07", "\x1b[2J"
LOG = f"rank 0 exited, exit code 1: {TITLE}loss 2.31\n{CLEAR}Traceback (most recent call last)"


def control_free(text: str) -> bool:
    """No control character but the tab and the newline between a log's lines."""
    return not any(ord(c) < 32 and c not in "\t\n" or 0x7f <= ord(c) < 0xa0 for c in text)


def test_a_launch_detail_reaches_the_served_jobs_document_without_control_characters(tmp_path):
    with Store(tmp_path / "planner.sqlite") as store:
        store.import_fleet(Fleet((Node("bj-1", city="Beijing", gpus=8, memory_gb=320.0),), ()))
        record = store.submit_job("train", job_spec(job("train", "bert-large", ("python", "train.py"))))
        store.update_job(record.id, state="failed", detail=LOG)   # what the lifecycle writes
        state = DashboardState(fleet="test", node_timeout_s=30, window_days=90)
        state.refresh(store)
    server = DashboardServer("127.0.0.1:0", state)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/api/jobs")
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
    finally:
        server.close()
        state.close()
    assert response.status == 200
    detail = json.loads(body)["jobs"][0]["detail"]
    assert control_free(detail), repr(detail)
    assert detail == LOG.replace("\x1b", "?").replace("\x07", "?")
    assert "\\u001b" not in body and "\\u0007" not in body


def test_host_gpu_and_launch_texts_an_agent_sent_are_shown_without_control_characters():
    row = {"id": "bj-1", "city": f"Beijing{CLEAR}", "source": "agent", "last_seen_ms": 1000,
           "gpu_count": 8, "gpu_name": f"A100{TITLE}", "memory_gb": 320.0,
           "hostname": f"host{TITLE}", "gpu_unavailable_reason": f"NVML: {CLEAR}gone",
           "site": f"dc-1{CLEAR}", "launch_state": "running", "launch_job": f"train{TITLE}"}
    doc = fleet_json([row], [], fleet="f", now_ms=2000, node_timeout_s=30)
    text = json.dumps(doc)
    assert "\\u001b" not in text and "\\u0007" not in text
    node = doc["nodes"][0]
    assert node["hostname"] == "host?]0;owned?" and node["launch"]["job"] == "train?]0;owned?"
    assert node["gpu_unavailable"] == "NVML: ?[2Jgone" and node["site"] == "dc-1?[2J"
