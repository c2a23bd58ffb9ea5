"""`hulk-planner jobs`: submit, list, show, cancel, logs against a store (in process)."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.core.lifecycle import PLACED, SUCCEEDED
from planner.service.store import Store

JOBS = ("jobs:\n"
        "  - {name: a, model: gpt2-xl, command: 'python train.py'}\n"
        "  - {name: b, model: bert-large, command: 'python train.py'}\n")


@pytest.fixture
def setup(tmp_path):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    return tmp_path / "planner.sqlite", jobs


def run(capsys, *argv):
    code = main([*map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_submit_list_show_cancel(setup, capsys):
    db, jobs = setup
    code, out, _ = run(capsys, "jobs", "submit", jobs, "--db", db)
    assert code == 0 and "queued 2 jobs: a, b" in out
    code, out, _ = run(capsys, "jobs", "list", "--db", db)
    assert code == 0
    for column in ("name", "state", "nodes", "cities", "started", "elapsed", "estimate", "restarts"):
        assert column in out
    assert out.count("queued") == 2
    code, out, _ = run(capsys, "jobs", "cancel", "b", "--db", db)
    assert code == 0 and "cancelled b" in out
    code, out, _ = run(capsys, "jobs", "list", "--db", db, "--json")
    states = {j["name"]: j["state"] for j in json.loads(out)["jobs"]}
    assert states == {"a": "queued", "b": "cancelled"}
    code, out, _ = run(capsys, "jobs", "show", "b", "--db", db)
    assert code == 0 and "job b: cancelled" in out and "submitted" in out and "bert-large" in out


def test_errors_are_one_line_with_exit_2(setup, capsys):
    db, jobs = setup
    assert run(capsys, "jobs", "submit", jobs, "--db", db)[0] == 0
    code, _, err = run(capsys, "jobs", "submit", jobs, "--db", db)
    assert code == 2 and "already queued" in err and len(err.strip().splitlines()) == 1
    for argv in (("show", "zz"), ("cancel", "zz"), ("logs", "zz")):
        code, _, err = run(capsys, "jobs", *argv, "--db", db)
        assert code == 2 and "no job named 'zz'" in err
    code, _, err = run(capsys, "jobs", "list", "--db", db.parent / "missing.sqlite")
    assert code == 2 and "no such store" in err
    bad = db.parent / "bad.yaml"
    bad.write_text("jobs:\n  - {name: '../x', model: gpt2-xl}\n")
    code, _, err = run(capsys, "jobs", "submit", bad, "--db", db)
    assert code == 2 and "bad.yaml" in err
    assert run(capsys, "jobs", "cancel", "a", "--db", db)[0] == 0
    code, _, err = run(capsys, "jobs", "cancel", "a", "--db", db)
    assert code == 2 and "already cancelled" in err


def test_logs_show_what_the_agents_reported(setup, capsys):
    db, jobs = setup
    assert run(capsys, "jobs", "submit", jobs, "--db", db)[0] == 0
    with Store(db) as store:
        record = store.job_by_name("a")
        store.update_job(record.id, state=PLACED, plan_id="p1", nodes=["n1", "n2"])
        store.update_job(record.id, state=SUCCEEDED)
        store.conn.execute("INSERT INTO nodes (id, source, city, launch_state, launch_job, "
                           "launch_plan_id, launch_exit_code, launch_detail) VALUES "
                           "('n1', 'agent', 'Paris', 'failed', 'a', 'p1', 1, 'line 1\nTraceback: boom')")
    code, out, _ = run(capsys, "jobs", "logs", "a", "--db", db)
    assert code == 0 and "kept after the job ends" in out
    assert "== n1 (rank 0): failed (could not start)" in out and "Traceback: boom" in out
    assert "== n2 (rank 1): no report" in out
    code, out, _ = run(capsys, "jobs", "logs", "a", "--db", db, "--node", "n2")
    assert code == 0 and "n1" not in out.split("\n", 1)[1]
    code, _, err = run(capsys, "jobs", "logs", "a", "--db", db, "--node", "n9")
    assert code == 2 and "no rank on 'n9'" in err
    code, out, _ = run(capsys, "jobs", "list", "--db", db)
    assert "Paris" in out and "succeeded" in out
