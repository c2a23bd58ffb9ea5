"""The job lifecycle's pure decisions: states from ranks' launch reports, restarts and their
budget, retiring, placing (one bad job fails alone; a waiting job says why)."""

from __future__ import annotations

import dataclasses

import pytest

from hulk.errors import InputError, PlanningError
from planner.core.fleet import Fleet, Link, Node, complete
from planner.core.jobs import Job
from planner.core.lifecycle import (CANCELLED, FAILED, FENCED, FENCED_RESTART, GIVE_UP, PLACED,
                                    QUEUED, RESTART, RUNNING, SUCCEEDED, JobRecord, RankState,
                                    backoff_ms, give_up_wait, next_state, place_queued, rank_cause,
                                    restart_turn, restart_wait, to_retire, waiting_reason)
from planner.core.plan import Plan
from planner.core.placements import job_from_spec, job_spec
from planner.methods import planner_for

SPEC = job_spec(Job(name="a", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10))


def record(state=PLACED, nodes=("n1", "n2"), plan_id="p1", spec=SPEC, **kw) -> JobRecord:
    return JobRecord(id=1, name="a", state=state, spec=spec, submitted_ms=0, changed_ms=0,
                     plan_id=plan_id, nodes=tuple(nodes), **kw)


def rank(state, job="a", plan_id="p1", code=0, detail=""):
    return RankState(state=state, job=job, plan_id=plan_id, exit_code=code, detail=detail)


def test_all_ranks_running_moves_a_placed_job_to_running():
    assert next_state(record(), {"n1": rank("running"), "n2": rank("running")})[0] == RUNNING


def test_one_rank_still_starting_keeps_it_placed():
    assert next_state(record(), {"n1": rank("running"), "n2": rank("starting")})[0] == PLACED


def test_reports_of_another_plan_or_job_do_not_count():
    ranks = {"n1": rank("running", plan_id="old"), "n2": rank("running", job="b")}
    assert next_state(record(), ranks)[0] == PLACED
    assert next_state(record(), {"n1": rank("exited", plan_id="old", code=1)})[0] == PLACED


def test_every_rank_exited_zero_is_success_even_before_running_was_seen():
    state, _ = next_state(record(), {"n1": rank("exited"), "n2": rank("exited")})
    assert state == SUCCEEDED


def test_a_rank_that_cannot_start_fails_the_job_for_good():
    assert next_state(record(), {"n1": rank("failed", detail="refused: x")}) == (FAILED, "n1: refused: x")
    many = record(RUNNING, failures=0)
    assert next_state(many, {"n1": rank("running"),
                             "n2": rank("failed", detail="cannot start: x")})[0] == FAILED


def test_a_nonzero_exit_restarts_the_job_within_its_budget_then_gives_up():
    ranks = {"n1": rank("exited", code=137, detail="exit code 137\nstep 40\nKilled"),
             "n2": rank("running")}
    assert next_state(record(RUNNING), ranks) == (RESTART, "n1: exit code 137 (signal 9): Killed")
    assert next_state(record(RUNNING, failures=2), ranks)[0] == RESTART
    state, detail = next_state(record(RUNNING, failures=3), ranks)     # default budget: 3
    assert (state, detail) == (GIVE_UP,
                               "gave up after 3 restarts: n1: exit code 137 (signal 9): Killed")
    no_budget = record(RUNNING, spec={**SPEC, "max_restarts": 0})
    assert next_state(no_budget, ranks) == (GIVE_UP, "gave up after 0 restarts: n1: exit code 137 "
                                                     "(signal 9): Killed")
    bigger = record(RUNNING, spec={**SPEC, "max_restarts": 10}, failures=9)
    assert next_state(bigger, ranks)[0] == RESTART


def test_a_peers_exit_while_a_node_of_the_job_is_silent_is_left_to_recovery():
    # A node that died keeps its last report ("running"); its peers exit non-zero when their
    # connections to it break. That is a node loss (recovery re-plans the job after the node
    # timeout), not a failure of the job's own processes: no restart is spent, nothing fails.
    ranks = {"n1": rank("running"), "n2": rank("exited", code=1)}
    assert next_state(record(RUNNING), ranks, down={"n1"}) == (RUNNING, "")
    assert next_state(record(RUNNING, failures=3), ranks, down={"n1"})[0] == RUNNING
    assert next_state(record(RUNNING), ranks, down={"other"})[0] == RESTART


def test_the_cause_names_the_node_the_code_and_the_first_error_line():
    detail = ("exit code 1\nfirst error (lines 9-12 of 44):\n  step 3\n  ValueError: --dim (65) "
              "must be a multiple of --heads (4)\nlast lines:\n  Traceback (most recent call)\n"
              "full log: /var/lib/hulk/jobs/a/job.log")
    assert rank_cause("n2", rank("exited", code=1, detail=detail)) == (
        "n2: exit code 1: ValueError: --dim (65) must be a multiple of --heads (4)")
    assert rank_cause("n2", rank("exited", code=-9)) == "n2: killed by signal 9"
    assert rank_cause("n2", rank("exited", code=2, detail="exit code 2\nall fine")) == "n2: exit code 2"


def test_a_restart_waits_for_its_back_off_and_to_hear_from_every_node_since_the_failure():
    assert [backoff_ms(f) for f in range(7)] == [5000, 10000, 20000, 40000, 80000, 120000, 120000]
    assert backoff_ms(10_000) == 120_000
    rec = record(RUNNING, failures=1)
    heard = {"n1": 20_000, "n2": 20_000}
    wait = restart_wait(rec, "n1: exit code 1", failed_at_ms=10_000, now_ms=19_999, last_seen_ms=heard)
    assert wait == "restart 2/3 after a 10 s back-off: n1: exit code 1"
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=20_000, last_seen_ms=heard) is None
    quiet = {"n1": 20_000, "n2": 9_000}              # n2 not heard from since the failure
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=30_000,
                        last_seen_ms=quiet) == "restart 2/3 waits to hear from n2: c"
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=30_000,
                        last_seen_ms={"n1": 20_000}) == "restart 2/3 waits to hear from n2: c"


def test_final_and_queued_jobs_never_move():
    done = {"n1": rank("running"), "n2": rank("running")}
    for state in (QUEUED, SUCCEEDED, FAILED, CANCELLED):
        assert next_state(record(state), done)[0] == state


def test_finished_unretired_jobs_are_retired_and_keep_their_name_until_then():
    jobs = [record(SUCCEEDED), record(CANCELLED, retired_ms=5), record(RUNNING), record(FAILED)]
    assert [r.state for r in to_retire(jobs)] == [SUCCEEDED, FAILED]
    assert record(SUCCEEDED).active and not record(SUCCEEDED, retired_ms=1).active
    assert record(QUEUED, nodes=()).active and not record(CANCELLED, nodes=()).active


def network(n):
    nodes = [Node(id=f"n{i}", city="Beijing", gpus=8, gpu_name="NVIDIA A100-SXM4-40GB",
                  compute_capability=8.0, memory_gb=320) for i in range(n)]
    links = [Link(src=a.id, dst=b.id, rtt_ms=2.0) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    return complete(Fleet(nodes=tuple(nodes), links=tuple(links)))


def test_queued_jobs_go_on_free_nodes_only_and_wait_when_none_are_free():
    net = network(3)
    job = Job(name="a", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10)
    first = place_queued(Plan("search", []), net, [job], ["n2"], search=planner_for("search"))
    assert list(first.placed) == ["a"] and "n2" not in first.placed["a"]
    assert first.estimates["a"] > 0 and first.waiting == []
    used = set(first.placed["a"])
    other = Job(name="b", params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10)
    second = place_queued(first.plan, net, [other], ["n2"], search=planner_for("search"))
    assert not used & set(second.placed.get("b", []))
    assert {p.job.name for p in second.plan.placements} >= {"a"}
    if len(used) == 2:   # every live node busy: b waits in the queue
        assert second.waiting == ["b"] and second.placed == {}


def crashing_on(name: str):
    """The search planner, except that planning any set of jobs holding ``name`` raises (as the
    search did on a job of params 1e-300)."""
    real = planner_for("search")

    def plan(jobs, net, *, seed=0, **kw):
        if any(j.name == name for j in jobs):
            raise ZeroDivisionError("float division by zero")
        return real(jobs, net, seed=seed, **kw)
    return plan


def small(name, **kw):
    return Job(name=name, params=1e8, layers=4, hidden=256, seq_len=128, global_batch=8, steps=10,
               command=("python", "t.py"), **kw)


def test_a_job_the_planner_cannot_carry_fails_alone_and_the_others_are_placed():
    net = network(3)
    out = place_queued(Plan("search", []), net, [small("good"), small("crash")], [],
                       search=crashing_on("crash"))
    assert list(out.placed) == ["good"]
    assert out.failed == {"crash": "cannot be planned: ZeroDivisionError: float division by zero"}
    assert out.waiting == [] and "crash" not in {p.job.name for p in out.plan.placements}


def test_jobs_out_of_bounds_or_beyond_the_whole_fleet_fail_with_their_field():
    net = network(2)
    poison = dataclasses.replace(small("poison"), params=1e-300)
    huge = Job(name="huge", params=5e12, layers=96, hidden=12288, seq_len=2048, global_batch=8,
               command=("python", "t.py"))
    out = place_queued(Plan("search", []), net, [poison, small("good"), huge], [],
                       search=planner_for("search"))
    assert list(out.placed) == ["good"]
    assert out.failed["poison"].startswith("cannot be planned: params: expected a parameter count")
    assert out.failed["huge"].startswith("cannot be planned: params: ") and \
        "more than the whole fleet's 640 GB of GPU memory" in out.failed["huge"]


def test_a_waiting_job_says_why():
    net = network(3)
    kept = place_queued(Plan("search", []), net, [small("a")], [], search=planner_for("search")).plan
    busy = {net.ids[i] for p in kept.placements for i in p.nodes}
    out = place_queued(kept, net, [small("b")], [n for n in net.ids if n not in busy],
                       search=planner_for("search"), node_timeout_s=30)
    assert out.waiting == ["b"] and out.placed == {}
    silent = 3 - len(busy)
    assert out.why["b"] == (f"waiting: no free nodes ({len(busy)} node(s) run a; {silent} "
                            f"node(s) silent)")
    nobody = place_queued(Plan("search", []), net, [small("b")], net.ids,
                          search=planner_for("search"), node_timeout_s=30)
    assert nobody.why == {"b": "waiting: no node heard from in the last 30 s"}
    assert waiting_reason([], {}, set()) == "waiting: no nodes in the fleet yet"
    assert waiting_reason(["n1", "n2"], {"n1": "a"}, set(), note="needs 2 nodes") == (
        "waiting: 1 free node(s) are not enough (1 node(s) run a): needs 2 nodes")


def test_a_fleet_without_gpu_memory_gives_a_reason_not_an_error():
    nodes = [Node(id=f"z{i}", city="Beijing", gpus=0, gpu_name=None, memory_gb=0) for i in range(3)]
    links = [Link(src=a.id, dst=b.id, rtt_ms=2.0) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    net = complete(Fleet(nodes=tuple(nodes), links=tuple(links)))
    out = place_queued(Plan("search", []), net, [small("a")], [], search=planner_for("search"))
    assert out.placed == {} and out.failed == {}
    assert out.why == {"a": "waiting: none of the 3 node(s) has GPU memory (no agent declares GPUs)"}
    with pytest.raises(PlanningError, match="none of the 3 node"):   # the search says so too
        planner_for("search")([small("a")], net)


def test_the_restart_budget_travels_in_the_spec():
    assert "max_restarts" not in job_spec(small("a"))           # the default: specs unchanged
    spec = job_spec(small("a", max_restarts=7))
    assert spec["max_restarts"] == 7 and job_from_spec("a", spec).max_restarts == 7
    assert record(spec=spec).max_restarts == 7 and record().max_restarts == 3
    with pytest.raises(InputError):
        job_from_spec("a", {**spec, "max_restarts": 101})
    assert record(spec={**spec, "max_restarts": "x"}).max_restarts == 3


def test_the_cause_prefers_a_signal_then_an_exception_with_its_message():
    torchrun = ("exit code 1\nfirst error (lines 24-31 of 54):\n  Traceback (most recent call last):\n"
                '  File "/x/errors/__init__.py", line 367, in wrapper\n    raise ChildFailedError(\n'
                "  torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \nlast lines:\n"
                "    error_file: <N/A>\n    traceback : Signal 9 (SIGKILL) received by PID 6792\n"
                "full log: /var/lib/hulk/jobs/a/job.log")
    assert rank_cause("n1", rank("exited", code=1, detail=torchrun)) == (
        "n1: exit code 1: Signal 9 (SIGKILL) received by PID 6792")
    python = ("exit code 1\nfirst error (lines 9-12 of 44):\n  Traceback (most recent call last):\n"
              '  File "train_gpt.py", line 80, in <module>\n  some error text\n'
              "  ValueError: --dim (65) must be a multiple of --heads (4)\nlast lines:\n"
              "  torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert rank_cause("n1", rank("exited", code=1, detail=python)) == (
        "n1: exit code 1: ValueError: --dim (65) must be a multiple of --heads (4)")
    only_header = "exit code 3\nfirst error (lines 1-2 of 2):\n  Traceback (most recent call last):\n"
    assert rank_cause("n1", rank("exited", code=3, detail=only_header)) == "n1: exit code 3"


# ---------------------------------------------------------------------------------- fencing

FENCE_DETAIL = ("fenced: the node's lease lapsed 0.2 s ago: SIGTERM to the job, SIGKILL 2.9 s later"
                "\nexit code 143\nlast lines:\n  step 40\nfull log: /var/lib/hulk/jobs/a/job.log")
FENCE_CAUSE = ("n1: fenced: the node's lease lapsed 0.2 s ago: SIGTERM to the job, "
               "SIGKILL 2.9 s later")


def fenced(code=143, plan_id="p1"):
    """A rank its wrapper stopped when the node's lease lapsed, as the agent reports it."""
    return RankState("exited", "a", plan_id, code, FENCE_DETAIL, exit_cause=FENCED)


def test_a_fenced_rank_restarts_the_job_without_spending_its_budget():
    # Its peer's rank exits non-zero when its connection to the fenced rank breaks: the fence's
    # doing, not a failure of the job.
    ranks = {"n1": fenced(), "n2": rank("exited", code=1, detail="exit code 1\nRuntimeError: "
                                                                  "Connection reset by peer")}
    assert next_state(record(RUNNING), ranks) == (FENCED_RESTART, FENCE_CAUSE)
    # The budget spent, or none at all: a fence still restarts the job.
    assert next_state(record(RUNNING, failures=3), ranks) == (FENCED_RESTART, FENCE_CAUSE)
    no_budget = record(RUNNING, spec={**SPEC, "max_restarts": 0})
    assert next_state(no_budget, ranks) == (FENCED_RESTART, FENCE_CAUSE)
    assert next_state(record(PLACED, failures=3, fences=7), {"n1": fenced()})[0] == FENCED_RESTART
    # A trainer that exits 0 on SIGTERM did not finish the job.
    assert next_state(record(RUNNING), {"n1": fenced(code=0), "n2": rank("exited")})[0] == (
        FENCED_RESTART)
    # While a node of the job is silent the job is recovery's, as for a crash.
    assert next_state(record(RUNNING), ranks, down={"n2"}) == (RUNNING, "")
    # Only the job's current plan counts.
    assert next_state(record(RUNNING), {"n1": fenced(plan_id="old")})[0] == RUNNING


def test_a_failed_rank_still_spends_the_budget_and_an_old_agents_fence_is_a_failure():
    crash = {"n1": rank("exited", code=137, detail="exit code 137\nKilled"), "n2": rank("running")}
    assert next_state(record(RUNNING, fences=5), crash)[0] == RESTART
    assert next_state(record(RUNNING, failures=3, fences=5), crash) == (
        GIVE_UP, "gave up after 3 restarts: n1: exit code 137 (signal 9): Killed")
    # An agent before the exit cause reports the same exit without it: it means what it meant,
    # a failure of the job's own processes.
    old = {"n1": rank("exited", code=143, detail=FENCE_DETAIL), "n2": rank("running")}
    assert next_state(record(RUNNING), old)[0] == RESTART
    assert next_state(record(RUNNING, failures=3), old)[0] == GIVE_UP
    assert next_state(record(RUNNING), {"n1": rank("exited", detail=FENCE_DETAIL),
                                        "n2": rank("exited")})[0] == SUCCEEDED


def test_the_fenced_cause_and_turn_say_it_is_not_counted():
    assert rank_cause("n1", fenced()) == FENCE_CAUSE
    assert rank_cause("n1", RankState("exited", "a", "p1", -9, "", exit_cause=FENCED)) == (
        "n1: fenced: the node's lease lapsed")
    assert not RankState("running", exit_cause=FENCED).fenced      # a cause counts when exited
    rec = record(RUNNING, failures=2)
    assert restart_turn(rec) == "restart 3/3"
    assert restart_turn(rec, fenced=True) == "fenced restart (not counted, 2/3 spent)"


def test_a_fenced_restart_waits_the_first_back_off_whatever_the_failures():
    rec = record(RUNNING, failures=2)                   # its own next restart: 20 s
    heard = {"n1": 20_000, "n2": 20_000}
    turn = "fenced restart (not counted, 2/3 spent)"
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=14_999, last_seen_ms=heard,
                        fenced=True) == f"{turn} after a 5 s back-off: c"
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=15_000, last_seen_ms=heard,
                        fenced=True) is None
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=15_000,
                        last_seen_ms=heard) == "restart 3/3 after a 20 s back-off: c"
    quiet = {"n1": 20_000, "n2": 9_000}                 # still waits to hear from every node
    assert restart_wait(rec, "c", failed_at_ms=10_000, now_ms=30_000, last_seen_ms=quiet,
                        fenced=True) == f"{turn} waits to hear from n2: c"


def test_a_spent_budget_fails_the_job_once_every_node_is_heard_from_since():
    # No back-off, but a peer's rank may have exited because another rank was fenced: that
    # node's report, a heartbeat later, restarts the job instead.
    rec = record(RUNNING, failures=3)
    cause = "gave up after 3 restarts: n1: exit code 1"
    assert give_up_wait(rec, cause, failed_at_ms=10_000, now_ms=10_000,
                        last_seen_ms={"n1": 10_000, "n2": 10_000}) is None
    assert give_up_wait(rec, cause, failed_at_ms=10_000, now_ms=12_000,
                        last_seen_ms={"n1": 10_000, "n2": 9_000}) == (
        "fails once it hears from n2: gave up after 3 restarts: n1: exit code 1")


def test_a_job_runs_from_when_its_last_rank_began_running():
    from planner.core.lifecycle import running_since_ms

    job = record()

    def rank(changed_ms, state="running", plan_id="p1"):
        return RankState(state=state, job="a", plan_id=plan_id, changed_ms=changed_ms)

    assert running_since_ms(job, {"n1": rank(5000), "n2": rank(7000)}) == 7000
    assert running_since_ms(job, {"n1": rank(5000), "n2": rank(0)}) is None      # unknown
    assert running_since_ms(job, {"n1": rank(5000), "n2": rank(9000, plan_id="p0")}) == 5000
    assert running_since_ms(job, {"n1": rank(5000, state="exited")}) is None
