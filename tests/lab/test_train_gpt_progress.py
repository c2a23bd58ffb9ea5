"""examples/train_gpt.py writes one JSON line a step to each rank's HULK_PROGRESS_FILE, which the
agent's reader folds into a summary: two data-parallel replicas on loopback (real torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.progress import read_progress
from lab.train import EXAMPLE, REPO
from tests.helpers.ports import free_port

pytestmark = pytest.mark.process

STEPS = 5


def test_each_rank_reports_its_steps_with_compute_and_all_reduce_time(tmp_path):
    port = free_port()
    base = {key: os.environ[key] for key in ("PATH", "HOME", "LANG") if key in os.environ}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", WORLD_SIZE="2", LOCAL_RANK="0",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HULK_STAGE="0",
                HULK_NUM_STAGES="1", HULK_LAYER_LO="0", HULK_LAYER_HI="2", HULK_NUM_REPLICAS="2",
                HULK_MICRO_BATCH="2", HULK_JOB="progress", HULK_PLAN_ID="lab")
    procs = []
    for rank in range(2):
        env = dict(base, RANK=str(rank), HULK_REPLICA=str(rank),
                   HULK_PROGRESS_FILE=str(tmp_path / f"progress-{rank}.jsonl"))
        procs.append(subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--layers", "2"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for rank in range(2):
        path = tmp_path / f"progress-{rank}.jsonl"
        lines = [json.loads(t) for t in path.read_text().splitlines()]
        assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
        for line in lines:
            assert line["total_steps"] == STEPS and line["step_s"] > 0
            assert line["compute_s"] > 0 and line["communication_s"] > 0
            assert line["compute_s"] + line["communication_s"] == pytest.approx(line["step_s"],
                                                                                abs=1e-5)
        summary = read_progress(path)
        assert (summary.steps, summary.total_steps, summary.samples) == (STEPS, STEPS, STEPS - 1)
        assert 0 < summary.iteration_s <= summary.iteration_p90_s
        assert summary.compute_s > 0 and summary.communication_s > 0
