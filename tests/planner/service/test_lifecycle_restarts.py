"""The serve lifecycle's restarts and its robustness against an in-memory broker and a real store
(the decisions are tested in tests/planner/core/test_lifecycle.py): a rank whose own process
fails restarts the job on the same nodes, within its budget; a job that cannot be planned fails
alone, with its reason; a waiting job says why; a CLI cancel is counted once."""

from __future__ import annotations

from dataclasses import replace

from hulk.wire.broker import placement_topic
from hulk.wire.placement import parse_placement
from planner.core.fleet import Network, Node
from planner.cli import main
from planner.core.lifecycle import FAILED, FENCED, PLACED, QUEUED, RUNNING, SUCCEEDED, RankState
from planner.core.placements import job_spec
from planner.methods import planner_for
from planner.service.lifecycle import JobLifecycle
from planner.service.metrics import ServeEvents
from planner.service.publisher import InMemoryPublisher
from planner.service.store import Store
from tests.helpers.plans import job, two_city_net
from tests.helpers.serve import OPTIONS, FakeNodes, current_plan, store_jobs
from tests.helpers.signing import VERIFIER

NOW = 1_000_000
SEARCH = planner_for("search")
DETAIL = ("exit code 137\nfirst error (lines 40-41 of 41):\n  step 40 loss 2.1\n  Killed\n"
          "last lines:\n  Killed\nfull log: /var/lib/hulk/jobs/a/job.log")


class Moves(ServeEvents):
    """The lifecycle's state-change metric, as a list."""

    def __init__(self):
        self.moved: list[str] = []

    def job_moved(self, state: str) -> None:
        self.moved.append(state)


class World:
    """A lifecycle over a real store, fake nodes and an in-memory broker, with a clock the test
    moves (every node heard from at each tick unless told otherwise)."""

    def __init__(self, tmp_path, net: Network | None = None, options=OPTIONS):
        self.net = net or two_city_net(per_city=2)
        self.now = NOW
        self.store = Store(tmp_path / "s.sqlite")
        self.nodes = FakeNodes(self.net, {n: NOW for n in self.net.ids})
        self.broker = InMemoryPublisher()
        self.events = Moves()
        self.lifecycle = JobLifecycle(current_plan(self.broker), self.nodes, store_jobs(self.store),
                                      options=options, planner=SEARCH, clock_ms=lambda: self.now,
                                      events=self.events)

    async def tick(self, ms: int = 1000, quiet: tuple[str, ...] = ()):
        self.now += ms
        self.nodes.seen.update({n: self.now for n in self.net.ids if n not in quiet})
        return await self.lifecycle.run_once()

    def role(self, node: str):
        message = parse_placement(self.broker.retained[placement_topic("lab", node)],
                                  verifier=VERIFIER)
        return message.roles[0]


async def running_job(world: World, **spec_fields):
    spec = {**job_spec(job("a", "bert-large", ("python", "train.py"))), **spec_fields}
    world.store.submit_job("a", spec)
    await world.tick()
    a = world.store.job_by_name("a")
    world.nodes.report(a.nodes, "running", "a", a.plan_id)
    await world.tick()
    return world.store.job_by_name("a")


async def test_a_killed_rank_restarts_the_job_on_its_nodes_which_then_succeeds(tmp_path):
    world = World(tmp_path)
    a = await running_job(world)
    assert a.state == RUNNING and len(a.nodes) >= 1
    first = a.nodes[0]
    world.nodes.launch[first] = RankState("exited", "a", a.plan_id, 137, DETAIL)
    await world.tick()
    waiting = world.store.job_by_name("a")
    assert waiting.state == RUNNING and waiting.plan_id == a.plan_id and waiting.restarts == 0
    assert waiting.detail == f"restart 1/3 after a 5 s back-off: {first}: exit code 137 (signal 9): Killed"
    await world.tick(4000)                                   # 4 s after the failure: not yet
    assert world.store.job_by_name("a").restarts == 0
    report = await world.tick(1000)
    assert report.restarted == ["a"]
    again = world.store.job_by_name("a")
    assert (again.state, again.restarts, again.failures) == (PLACED, 1, 1)
    assert again.plan_id != a.plan_id and again.nodes == a.nodes
    for node in a.nodes:                                     # every rank starts again
        role = world.role(node)
        assert (role.plan_id, role.restart_count) == (again.plan_id, 1)
    cause = f"restart 1/3: {first}: exit code 137 (signal 9): Killed"
    assert again.detail == cause and (PLACED, cause) in [(s, d) for s, _, d in again.events]
    # The old failure names the old plan id: it is not read again.
    await world.tick()
    assert world.store.job_by_name("a").restarts == 1
    world.nodes.report(a.nodes, "exited", "a", again.plan_id)
    done = await world.tick()
    assert done.moved == {"a": SUCCEEDED} and world.store.job_by_name("a").failures == 1


async def test_a_job_whose_budget_is_spent_fails_with_its_cause(tmp_path):
    world = World(tmp_path)
    a = await running_job(world, max_restarts=1)
    world.nodes.report(a.nodes, "exited", "a", a.plan_id, code=1)
    await world.tick(1000)
    assert (await world.tick(5000)).restarted == ["a"]
    again = world.store.job_by_name("a")
    world.nodes.report(a.nodes, "exited", "a", again.plan_id, code=1)
    report = await world.tick()
    assert report.moved == {"a": FAILED} and report.retired == ["a"]
    done = world.store.job_by_name("a")
    assert done.detail == f"gave up after 1 restart: {sorted(a.nodes)[0]}: exit code 1"
    assert (done.restarts, done.failures) == (1, 1) and world.events.moved[-1] == FAILED


async def test_a_peer_that_goes_quiet_after_the_failure_is_left_to_recovery(tmp_path):
    world = World(tmp_path, options=replace(OPTIONS, node_timeout_s=30))
    world.store.submit_job("a", {**job_spec(job("a", "gpt2-xl", ("python", "train.py")))})
    await world.tick()
    a = world.store.job_by_name("a")
    assert len(a.nodes) >= 2, a.nodes
    dead, alive = a.nodes[0], a.nodes[1]
    world.nodes.report(a.nodes, "running", "a", a.plan_id)
    world.nodes.launch[alive] = RankState("exited", "a", a.plan_id, 1, "exit code 1")
    await world.tick(1000, quiet=(dead,))
    await world.tick(5000, quiet=(dead,))
    held = world.store.job_by_name("a")
    assert held.restarts == 0 and held.detail.startswith(f"restart 1/3 waits to hear from {dead}")
    await world.tick(30_000, quiet=(dead,))                    # silent past the node timeout
    assert world.store.job_by_name("a").restarts == 0          # recovery's, not a restart


async def test_a_poison_record_and_a_too_big_job_fail_alone_beside_a_good_one(tmp_path):
    world = World(tmp_path)
    good = job_spec(job("good", "bert-large", ("python", "train.py")))
    world.store.submit_job("poison", {**good, "params": 1e-300})   # a record no submit refuses
    world.store.submit_job("big", {**good, "params": 1.0e15})
    world.store.submit_job("junk", {"params": "many"})
    world.store.submit_job("good", good)
    report = await world.tick()
    assert list(report.placed) == ["good"] and world.store.job_by_name("good").state == PLACED
    for name in ("poison", "big", "junk"):
        record = world.store.job_by_name(name)
        assert record.state == FAILED and record.retired_ms is not None, record
        assert record.detail.startswith("cannot be planned: "), record.detail
        assert "\n" not in record.detail
    assert "params: expected a parameter count" in world.store.job_by_name("poison").detail
    assert "its spec is not a job" in world.store.job_by_name("junk").detail
    assert await world.tick() is not None                      # later rounds go on


async def test_a_job_the_planner_crashes_on_fails_alone(tmp_path):
    def crashing(jobs, net, *, seed=0, **kw):
        if any(j.name == "crash" for j in jobs):
            raise OverflowError("cannot convert float infinity to integer")
        return SEARCH(jobs, net, seed=seed, **kw)
    world = World(tmp_path)
    world.lifecycle._planner = crashing
    spec = job_spec(job("x", "bert-large", ("python", "train.py")))
    world.store.submit_job("crash", spec)
    world.store.submit_job("good", spec)
    report = await world.tick()
    assert list(report.placed) == ["good"]
    assert world.store.job_by_name("crash").detail == (
        "cannot be planned: OverflowError: cannot convert float infinity to integer")


async def test_a_waiting_job_says_why_and_a_fleet_without_gpu_memory_too(tmp_path):
    world = World(tmp_path)
    world.nodes.seen.clear()                                   # no agent heard from
    world.nodes.seen.update({n: None for n in world.net.ids})
    world.store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    assert (await world.lifecycle.run_once()).placed == {}
    a = world.store.job_by_name("a")
    assert (a.state, a.detail) == (QUEUED, "waiting: no node heard from in the last 3 s")
    bare = Network.from_matrix([Node(id=f"z{i}", city="X", gpus=0, memory_gb=0) for i in range(2)],
                               [[0.0, 1.0], [1.0, 0.0]])
    (tmp_path / "bare").mkdir()
    empty = World(tmp_path / "bare", bare)
    empty.store.submit_job("a", job_spec(job("a", "bert-large", ("python", "train.py"))))
    assert (await empty.tick()).placed == {}
    assert empty.store.job_by_name("a").detail == (
        "waiting: none of the 2 node(s) has GPU memory (no agent declares GPUs)")


async def test_a_cancel_from_the_cli_is_counted_once_when_retired(tmp_path):
    world = World(tmp_path)
    a = await running_job(world)
    before = list(world.events.moved)
    world.store.update_job(a.id, state="cancelled", detail="cancelled by an operator")
    assert (await world.tick()).retired == ["a"]
    await world.tick()
    assert world.events.moved[len(before):] == ["cancelled"]


# ---------------------------------------------------------------------------------- fencing

FENCE = ("fenced: the node's lease lapsed 0.4 s ago: SIGTERM to the job, SIGKILL 2.9 s later\n"
         "exit code 143\nlast lines:\n  step 40\nfull log: /var/lib/hulk/jobs/a/job.log")
WHY = "fenced: the node's lease lapsed 0.4 s ago: SIGTERM to the job, SIGKILL 2.9 s later"


def fenced(plan_id: str, code: int = 143) -> RankState:
    """A rank its wrapper stopped when the node's lease lapsed, as the agent reports it."""
    return RankState("exited", "a", plan_id, code, FENCE, exit_cause=FENCED)


def epochs(world: World, nodes) -> set[int]:
    return {world.role(n).restart_count for n in nodes}


async def test_fenced_restarts_raise_the_epoch_but_spend_no_budget(tmp_path, capsys):
    world = World(tmp_path)
    a = await running_job(world, max_restarts=1)
    first = a.nodes[0]
    world.nodes.launch[first] = fenced(a.plan_id)
    await world.tick()
    waiting = world.store.job_by_name("a")
    assert waiting.detail == (f"fenced restart (not counted, 0/1 spent) after a 5 s back-off: "
                              f"{first}: {WHY}")
    assert (await world.tick(5000)).restarted == ["a"]
    once = world.store.job_by_name("a")
    assert (once.state, once.restarts, once.failures, once.fences) == (PLACED, 1, 0, 1)
    assert once.plan_id != a.plan_id and once.nodes == a.nodes
    assert epochs(world, a.nodes) == {1}                     # every rank starts epoch 1
    event = f"fenced restart (not counted, 0/1 spent): {first}: {WHY}"
    assert once.detail == event and (PLACED, event) in [(s, d) for s, _, d in once.events]
    # Fenced again, past what max_restarts 1 allows: the epoch grows, the budget is untouched.
    world.nodes.report(a.nodes, "running", "a", once.plan_id)
    await world.tick()
    world.nodes.launch[first] = fenced(once.plan_id, code=0)   # a trainer that exits 0 on TERM
    await world.tick()
    assert (await world.tick(5000)).restarted == ["a"]
    twice = world.store.job_by_name("a")
    assert (twice.state, twice.restarts, twice.failures, twice.fences) == (PLACED, 2, 0, 2)
    assert epochs(world, a.nodes) == {2}
    # `jobs show` says so.
    assert main(["jobs", "show", "a", "--db", str(tmp_path / "s.sqlite")]) == 0
    out = capsys.readouterr().out
    assert "restarts 2 (after its own failures 0 of at most 1)" in out
    assert "fenced    2 times: the node's lease lapsed" in out, out
    # Its own crash spends the budget: one restart (epoch 3), then the next fails the job.
    world.nodes.report(a.nodes, "exited", "a", twice.plan_id, code=1)
    await world.tick()
    assert (await world.tick(5000)).restarted == ["a"]
    third = world.store.job_by_name("a")
    assert (third.restarts, third.failures, third.fences) == (3, 1, 2)
    assert epochs(world, a.nodes) == {3}
    world.nodes.report(a.nodes, "exited", "a", third.plan_id, code=1)
    report = await world.tick()
    assert report.moved == {"a": FAILED}
    done = world.store.job_by_name("a")
    assert done.detail == f"gave up after 1 restart: {sorted(a.nodes)[0]}: exit code 1"
    assert (done.restarts, done.failures, done.fences) == (3, 1, 2)


async def test_a_peers_crash_seen_before_the_fence_restarts_as_fenced(tmp_path):
    # Serve is back: the peer's report (its rank exited 1 when the fenced rank stopped) can
    # arrive a heartbeat before the fenced node's own; the restart still spends no budget.
    world = World(tmp_path)
    world.store.submit_job("a", {**job_spec(job("a", "gpt2-xl", ("python", "train.py"))),
                                 "max_restarts": 0})
    await world.tick()
    a = world.store.job_by_name("a")
    assert len(a.nodes) >= 2, a.nodes
    gone, peer = a.nodes[0], a.nodes[1]
    world.nodes.report(a.nodes, "running", "a", a.plan_id)
    await world.tick()
    world.nodes.launch[peer] = RankState("exited", "a", a.plan_id, 1, "exit code 1")
    await world.tick(1000, quiet=(gone,))           # its budget is spent, but not heard from all
    held = world.store.job_by_name("a")
    assert held.state == RUNNING, held
    assert held.detail == (f"fails once it hears from {gone}: gave up after 0 restarts: "
                           f"{peer}: exit code 1")
    world.nodes.launch[gone] = fenced(a.plan_id)    # its heartbeat, a second later
    await world.tick(1000)
    assert world.store.job_by_name("a").detail.startswith(
        "fenced restart (not counted, 0/0 spent) after a 5 s back-off: ")
    report = await world.tick(4000)                 # the back-off counts from the first report
    assert report.restarted == ["a"], world.store.job_by_name("a")
    again = world.store.job_by_name("a")
    assert (again.state, again.restarts, again.failures, again.fences) == (PLACED, 1, 0, 1)
    assert again.detail == f"fenced restart (not counted, 0/0 spent): {gone}: {WHY}"
    assert epochs(world, a.nodes) == {1}


async def test_a_spent_budget_fails_the_job_once_every_node_is_heard_from(tmp_path):
    world = World(tmp_path)
    world.store.submit_job("a", {**job_spec(job("a", "gpt2-xl", ("python", "train.py"))),
                                 "max_restarts": 0})
    await world.tick()
    a = world.store.job_by_name("a")
    quiet, peer = a.nodes[0], a.nodes[1]
    world.nodes.report(a.nodes, "running", "a", a.plan_id)
    await world.tick()
    world.nodes.launch[peer] = RankState("exited", "a", a.plan_id, 1, "exit code 1")
    assert (await world.tick(1000, quiet=(quiet,))).moved == {}
    report = await world.tick(1000)                 # its next heartbeat: still running
    assert report.moved == {"a": FAILED}
    done = world.store.job_by_name("a")
    assert done.detail == f"gave up after 0 restarts: {peer}: exit code 1"
    assert (done.restarts, done.failures, done.fences) == (0, 0, 0)
