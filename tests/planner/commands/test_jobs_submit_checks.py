"""`jobs submit` refuses a job that cannot run with one line and exit 2 (nothing is queued);
`--plan-only` checks jobs without a command and queues nothing; a queued job's reason shows in
`jobs list`; layer ranges print half-open in the plan and in the lab's placement lines alike."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from hulk.wire.records import GpuInfo, Inventory, RegisterRequest
from planner.cli import main
from planner.commands.plan import MethodResult, print_plan
from planner.core.evaluate import evaluate
from planner.core.placements import build_node_placements
from planner.service.store import Store
from lab.run import describe
from tests.helpers.plans import manual_plan, two_city_net

GOOD = "  - {name: good, model: gpt2-xl, command: 'python train.py'}\n"


def run(capsys, *argv):
    code = main([*map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def queued(db) -> list[str]:
    with Store(db) as store:
        return [r.name for r in store.job_records()]


@pytest.mark.parametrize("entry, field, words", [
    ("{name: bad, model: gpt2-xl}", "command", "missing"),
    ("{name: bad, model: gpt2-xl, command: [%s]}" % ", ".join(["x"] * 257), "command",
     "at most 256 words"),
    ("{name: bad, model: gpt2-xl, params: 1e-300, command: x}", "params", "parameter count"),
    ("{name: bad, model: gpt2-xl, params: 1.0e15, command: x}", "params", "parameter count"),
])
def test_each_refusal_is_one_line_exit_2_and_queues_nothing(tmp_path, capsys, entry, field,
                                                            words):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + GOOD + f"  - {entry}\n")
    db = tmp_path / "planner.sqlite"
    code, out, err = run(capsys, "jobs", "submit", jobs, "--db", db)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{field}: " in err and "'bad'" in err and words in err and "jobs.yaml" in err
    assert not db.exists() or queued(db) == []


def test_a_job_beyond_the_fleets_memory_is_refused_once_the_store_knows_nodes(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: huge, model: gpt2-xl, params: 5e11, command: x}\n")
    db = tmp_path / "planner.sqlite"
    with Store(db) as store:
        gpus = tuple(GpuInfo(i, "A100", memory_bytes=80 * 10**9) for i in range(8))
        for node in ("n0", "n1"):
            store.register(RegisterRequest(node, hostname=node, address="127.0.0.1",
                                           inventory=Inventory(gpus=gpus)))
    code, _, err = run(capsys, "jobs", "submit", jobs, "--db", db)
    assert code == 2 and "params: " in err and "1,280 GB of GPU memory" in err
    assert queued(db) == []
    empty = tmp_path / "empty.sqlite"                    # no nodes: memory is not checked
    assert run(capsys, "jobs", "submit", jobs, "--db", empty)[0] == 0 and queued(empty) == ["huge"]


def test_plan_only_checks_jobs_without_a_command_and_queues_nothing(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + GOOD + "  - {name: plan-me, model: bert-large}\n")
    db = tmp_path / "planner.sqlite"
    code, out, _ = run(capsys, "jobs", "submit", jobs, "--plan-only", "--db", db)
    assert code == 0 and "checked 2 jobs" in out and "queues nothing" in out
    assert not db.exists()
    jobs.write_text("jobs:\n  - {name: bad, model: gpt2-xl, params: 1e-300}\n")
    code, _, err = run(capsys, "jobs", "submit", jobs, "--plan-only", "--db", db)
    assert code == 2 and "params: " in err


def test_the_shipped_example_needs_plan_only(capsys):
    code, _, err = run(capsys, "jobs", "submit", "examples/jobs.yaml", "--db", "/nonexistent/x")
    assert code == 2 and "command: " in err and "--plan-only" in err
    code, out, _ = run(capsys, "jobs", "submit", "examples/jobs.yaml", "--plan-only",
                       "--db", "/nonexistent/x")
    assert code == 0 and "checked 5 jobs" in out


def test_jobs_list_says_why_a_queued_job_waits(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n" + GOOD)
    db = tmp_path / "planner.sqlite"
    assert run(capsys, "jobs", "submit", jobs, "--db", db)[0] == 0
    with Store(db) as store:
        store.update_job(store.job_by_name("good").id,
                         detail="waiting: no free nodes (2 nodes run other)")
    code, out, _ = run(capsys, "jobs", "list", "--db", db)
    assert code == 0 and "waiting: no free nodes" in out
    code, out, _ = run(capsys, "jobs", "show", "good", "--db", db)
    assert "job good: queued (waiting: no free nodes (2 nodes run other))" in out
    code, out, _ = run(capsys, "jobs", "logs", "good", "--db", db)
    assert code == 0 and "no rank has reported for this job (waiting: no free nodes" in out


def test_layer_ranges_print_alike_in_the_plan_and_placement_lines():
    net = two_city_net()
    plan = manual_plan(net)
    buffer = io.StringIO()
    print_plan(Console(file=buffer, width=200), MethodResult("manual", plan, evaluate(plan, net),
                                                             0.1), net)
    in_plan = re.findall(r"\[\d+, \d+\)", buffer.getvalue())
    placements = build_node_placements(plan, net, fleet="f", plan_id="p")
    in_lines = {m for p in placements.values()
                for m in re.findall(r"layers (\[\d+, \d+[)\]])", describe(p.to_json()))}
    assert sorted(set(in_plan)) == sorted(in_lines) == ["[0, 20)", "[0, 24)", "[20, 48)"]


def test_a_command_no_reporting_agent_allows_is_refused(tmp_path, capsys):
    db = tmp_path / "planner.sqlite"
    with Store(db) as store:
        store.register(RegisterRequest("n0", address="127.0.0.1",
                                       allowed_commands=(("python", "train.py"),)))
        store.register(RegisterRequest("n1", address="127.0.0.2"))   # an older agent: unknown
        assert store.allowed_commands() == {"n0": (("python", "train.py"),)}
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: evil, model: gpt2-xl, command: 'python evil.py'}\n")
    code, _, err = run(capsys, "jobs", "submit", jobs, "--db", db)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "command: " in err and "'python evil.py'" in err and "allowed_commands" in err
    assert queued(db) == []
    jobs.write_text("jobs:\n  - {name: ok, model: gpt2-xl, command: 'python train.py --steps 5'}\n")
    assert run(capsys, "jobs", "submit", jobs, "--db", db)[0] == 0 and queued(db) == ["ok"]
    other = tmp_path / "older.sqlite"       # no agent reported its allowed_commands: not checked
    with Store(other) as store:
        store.register(RegisterRequest("n1", address="127.0.0.2"))
    jobs.write_text("jobs:\n  - {name: evil, model: gpt2-xl, command: 'python evil.py'}\n")
    assert run(capsys, "jobs", "submit", jobs, "--db", other)[0] == 0
