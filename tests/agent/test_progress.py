"""The agent reads a rank's progress file (HULK_PROGRESS_FILE): a bounded tail folded into medians,
garbage and half-written lines skipped, and the summary travels in the heartbeat's launch status
(real subprocess, real gRPC planner double)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time

import pytest

from agent.config import load_config
from agent.launcher import Launcher
from agent.progress import parse_line, read_progress, read_tail, summarize
from agent.reporter import GrpcPlannerClient
from agent.runtime import AgentRuntime
from agent.spool import Spool
from hulk.errors import InputError
from hulk.wire.progress import StepProgress
from hulk.wire.records import Inventory, LaunchState, LaunchStatus
from tests.helpers.launch import direct, placement
from tests.helpers.planner_double import PlannerDouble, start_server
from tests.helpers.waits import wait_until_async


def line(step: int, step_s: float, **extra) -> str:
    return json.dumps({"step": step, "step_s": step_s, **extra}) + "\n"


def test_summary_takes_medians_without_the_warm_up_step(tmp_path):
    path = tmp_path / "p.jsonl"
    # step 0 is slow (compilation, first allocation): left out of every figure.
    text = line(0, 30.0, compute_s=29.0, communication_s=1.0, time=1000.0)
    for step in range(1, 11):
        text += line(step, 0.1 * step, compute_s=0.05 * step, communication_s=0.01,
                     time=1000.0 + step, total_steps=100)
    path.write_text(text)
    p = read_progress(path)
    assert p == StepProgress(steps=10, total_steps=100, iteration_s=pytest.approx(0.55),
                             iteration_p90_s=pytest.approx(0.9),
                             compute_s=pytest.approx(0.275),
                             communication_s=pytest.approx(0.01), samples=10, updated_ms=1_010_000,
                             wall_iteration_s=pytest.approx(1.0), wall_steps=9)


def test_a_resumed_run_warms_up_on_its_first_line_and_only_the_last_50_count(tmp_path):
    path = tmp_path / "p.jsonl"
    slow_first = line(500, 9.0)
    path.write_text(slow_first + "".join(line(s, 1.0 if s < 540 else 2.0) for s in range(501, 600)))
    p = read_progress(path)
    assert p is not None and p.steps == 599 and p.samples == 50
    assert p.iteration_s == 2.0 and p.compute_s == 0.0 and p.communication_s == 0.0


def test_garbage_partial_and_hostile_lines_are_skipped(tmp_path):
    path = tmp_path / "p.jsonl"
    hostile = ['{"step": 3, "step_s": NaN}', '{"step": 3, "step_s": -1}',
               '{"step": 3, "step_s": 1e300}', '{"step": -3, "step_s": 0.5}',
               '{"step": true, "step_s": 0.5}', '{"step": 3, "step_s": "0.5"}',
               '{"step": 3, "step_s": 0.5, "compute_s": Infinity}', '[1, 2]', 'not json',
               '{"step": 3}', '\x00\xff' * 10, '{"step": 3, "step_s": 0.5, "time": -5}',
               '{"step": 3, "step_s": 0.5, "total_steps": 1e3}']
    good = [line(1, 0.2), line(2, 0.4)]
    path.write_text(line(0, 5.0) + good[0] + "\n".join(hostile) + "\n" + good[1]
                    + '{"step": 4, "step_s": 0.0')      # the trainer is writing this one
    p = read_progress(path)
    assert p is not None and p.steps == 2 and p.samples == 2
    assert p.iteration_s == pytest.approx(0.3) and p.iteration_p90_s == 0.4
    for text in hostile:
        assert parse_line(text) is None, text


def test_no_file_no_line_a_directory_or_a_fifo_give_no_progress(tmp_path):
    assert read_progress(tmp_path / "missing") is None and read_progress(None) is None
    (tmp_path / "empty").write_text("")
    assert read_progress(tmp_path / "empty") is None
    (tmp_path / "dir").mkdir()
    assert read_progress(tmp_path / "dir") is None
    os.mkfifo(tmp_path / "fifo")                 # opening it must not block the agent
    assert read_progress(tmp_path / "fifo") is None
    (tmp_path / "real").write_text(line(1, 0.5) + line(2, 0.5))
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert read_progress(tmp_path / "link") is None and read_progress(tmp_path / "real").steps == 2


def test_a_huge_file_is_read_only_at_its_end_and_a_shrunk_one_read_again(tmp_path):
    path = tmp_path / "p.jsonl"
    with open(path, "w") as f:
        f.writelines(line(s, 0.25 if s % 2 else 0.75) for s in range(300_000))
    assert path.stat().st_size > 8_000_000
    texts, from_start, _ = read_tail(path, max_bytes=4096)
    assert not from_start and sum(len(t) + 1 for t in texts) <= 4096
    assert json.loads(texts[-1])["step"] == 299_999 and json.loads(texts[0])   # no cut first line
    p = read_progress(path, max_bytes=4096)
    assert p.steps == 299_999 and p.samples == 50 and p.iteration_s == 0.5
    path.write_text(line(0, 3.0) + line(1, 1.5) + line(2, 1.5))    # replaced by a new run
    p = read_progress(path, max_bytes=4096)
    assert (p.steps, p.samples, p.iteration_s) == (2, 2, 1.5)


def test_seeded_random_files_summarise_within_bounds(tmp_path):
    rng = random.Random(26)
    path = tmp_path / "p.jsonl"
    for _ in range(40):
        chunks = []
        for step in range(rng.randrange(0, 120)):
            kind = rng.random()
            if kind < 0.7:
                chunks.append(line(step, rng.uniform(0, 5)))
            elif kind < 0.85:
                chunks.append(json.dumps({"step": step, "step_s": rng.choice(
                    [float("nan"), -1.0, 1e300, float("inf"), "x", None])}) + "\n")
            else:
                chunks.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80)))
                              .decode("latin-1") + "\n")
        path.write_text("".join(chunks), encoding="utf-8")
        p = read_progress(path, max_bytes=rng.choice([512, 4096, 65536]))
        if p is not None:
            assert p.check() is p and p.samples <= 50
            assert 0 <= p.iteration_s <= p.iteration_p90_s <= 5
            assert all(math.isfinite(v) for v in (p.iteration_s, p.iteration_p90_s))


def test_summary_of_nothing_measured_keeps_the_step_count():
    p = summarize([parse_line(line(0, 4.0))], first_is_warmup=True, updated_ms=7)
    assert p == StepProgress(steps=0, samples=0, updated_ms=7)
    assert summarize([], first_is_warmup=False) is None


@pytest.mark.parametrize("name, value", [("iteration_s", float("nan")), ("iteration_s", 1e300),
                                         ("compute_s", -0.5), ("communication_s", float("inf")),
                                         ("iteration_p90_s", 2e6)])
def test_hostile_progress_is_refused_at_the_wire_naming_its_field(name, value):
    message = LaunchStatus(state=LaunchState.RUNNING, job="a",
                           progress=StepProgress(steps=5, iteration_s=0.5)).to_proto()
    setattr(message.progress, name, value)
    with pytest.raises(InputError, match=f"^launch.progress.{name}: expected a finite number"):
        LaunchStatus.from_proto(message)


def test_progress_round_trips_and_its_absence_stays_absent():
    status = LaunchStatus(state=LaunchState.RUNNING, job="a", progress=StepProgress(
        steps=12, total_steps=100, iteration_s=0.25, iteration_p90_s=0.3, compute_s=0.2,
        communication_s=0.04, samples=11, updated_ms=1_764_150_000_120))
    assert LaunchStatus.from_proto(status.to_proto()) == status
    bare = LaunchStatus(state=LaunchState.RUNNING, job="a")
    assert not bare.to_proto().HasField("progress")
    assert LaunchStatus.from_proto(bare.to_proto()).progress is None


TRAINER = """
import json, os, time
path = os.environ["HULK_PROGRESS_FILE"]
assert os.path.isabs(path)
with open(path, "a") as f:
    for step in range(21):
        f.write(json.dumps({"step": step, "time": time.time(), "step_s": 9.0 if step == 0 else 0.2,
                            "compute_s": 0.15, "communication_s": 0.05}) + "\\n")
        f.flush()
time.sleep(120)
"""


@pytest.mark.process
async def test_the_heartbeat_carries_the_running_jobs_progress(tmp_path):
    planner = PlannerDouble()
    server, port = await start_server(planner)
    config = load_config({"planner": f"127.0.0.1:{port}", "node_id": "n1", "insecure": "1",
                          "address": "127.0.0.1", "state_dir": str(tmp_path)},
                         env_reader={}.get)
    runtime = AgentRuntime(
        config, client=GrpcPlannerClient.connect(config.planner, insecure=True),
        spool=Spool(config.spool_path, config.spool_max), pinger=None,
        inventory_reader=lambda: Inventory(unavailable_reason="test host"),
        heartbeat_interval_s=0.1, rng=random.Random(3))
    launcher = Launcher(command=direct, running_after_s=0.1, tail_every_s=0.1,
                        allowed_commands=[("python",)], jobs_dir=tmp_path / "jobs",
                        on_status=runtime.set_launch_status)
    task = asyncio.create_task(runtime.run())
    stale = tmp_path / "jobs" / "a" / "progress-0.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text(line(900, 50.0))                     # an earlier run's: removed at launch

    def carried():
        return [h.launch.progress for h in planner.seen.heartbeats
                if h.launch.HasField("progress") and h.launch.progress.steps == 20]

    try:
        await launcher.apply(placement(("python", "-c", TRAINER)))
        beats = await wait_until_async(carried, 30, "a heartbeat with 20 steps",
                                       detail=lambda: launcher.status)
    finally:
        await launcher.stop()
        runtime.request_stop()
        assert await asyncio.wait_for(task, timeout=20) == 0
        await server.stop(None)
    p = StepProgress.from_proto(beats[0])
    assert (p.samples, p.iteration_s, p.iteration_p90_s) == (20, 0.2, 0.2)
    assert (p.compute_s, p.communication_s) == (0.15, 0.05)
    assert abs(p.updated_ms / 1000 - time.time()) < 120      # the lines' own times
