"""examples/train_gpt.py as an agent launches it (role_env of each rank's Role), on loopback:
the plan's micro-batches, mixed precision, checkpoints and resume."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.launcher import role_env
from hulk.wire.placement import Role
from lab.train import EXAMPLE, free_port, split_layers

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^step (\d+)/\d+ stage (\d+) replica (\d+) time [0-9.]+s(?: loss (\S+))?(?: at [0-9.]+)?$", re.M)
RESUMED = re.compile(r"^resumed from step (\d+) \(restart (\d+)\)", re.M)


@dataclass
class Rank:
    role: Role
    returncode: int
    output: str

    @property
    def steps(self) -> list[int]:
        return [int(m.group(1)) for m in STEP.finditer(self.output)]

    @property
    def loss(self) -> dict[int, float]:
        return {int(m.group(1)): float(m.group(4)) for m in STEP.finditer(self.output) if m.group(4)}

    @property
    def resumed(self) -> tuple[int, int] | None:
        m = RESUMED.search(self.output)
        return (int(m.group(1)), int(m.group(2))) if m else None


def launch(tmp: Path, stages: int, replicas: int, *, steps: int, layers: int = 4, micro_batches: int = 2,
           checkpoint_dir: str | None = None, restart_count: int = 0, args: list[str] = (),
           expect: int = 0) -> list[Rank]:
    """One process per rank, with the variables an agent gives each (role_env) plus torchrun's."""
    port, procs = free_port(), []
    ranges = split_layers(layers, stages)
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for k in range(stages):
        for p in range(replicas):
            role = Role(plan_id="p1", job="gpt", phase=0, stage=k, num_stages=stages,
                        layer_lo=ranges[k][0], layer_hi=ranges[k][1], replica=p, num_replicas=replicas,
                        rank=k * replicas + p, world_size=stages * replicas,
                        rendezvous_address="127.0.0.1", rendezvous_port=port, micro_batch=2,
                        micro_batches=micro_batches, checkpoint_dir=checkpoint_dir,
                        restart_count=restart_count)
            env = dict(base, **role_env(role), RANK=str(role.rank), LOCAL_RANK="0",
                       WORLD_SIZE=str(role.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            log = open(tmp / f"rank{role.rank}-{restart_count}.log", "w+")
            argv = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--layers", str(layers),
                    "--summary", str(tmp / f"summary-{{stage}}-{restart_count}.json"), *args]
            procs.append((role, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                 cwd=tmp), log))
    ranks = []
    for role, proc, log in procs:
        try:
            code = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            for _, other, _ in procs:
                other.kill()
            code = proc.wait()
        log.seek(0)
        ranks.append(Rank(role, code, log.read()))
        log.close()
    for rank in ranks:
        assert rank.returncode == expect, f"rank {rank.role.rank}:\n{rank.output[-3000:]}"
    return ranks


def steps_in(ckpt: Path) -> list[str]:
    return sorted(n for n in os.listdir(ckpt) if n.startswith("step-"))


def files_in(ckpt: Path) -> dict[str, int]:
    return {str(p.relative_to(ckpt)): p.stat().st_mtime_ns for p in ckpt.rglob("*") if p.is_file()}


def last_stage_loss(ranks: list[Rank]) -> dict[int, float]:
    return next(r.loss for r in ranks if r.role.stage == r.role.num_stages - 1 and r.role.replica == 0)


def test_loss_falls_with_the_plans_micro_batches_in_bf16(tmp_path):
    ranks = launch(tmp_path, 2, 2, steps=10, micro_batches=3, args=["--precision", "bf16"])
    loss = last_stage_loss(ranks)
    assert sorted(loss) == list(range(1, 11)) and all(math.isfinite(v) for v in loss.values())
    assert loss[10] < loss[1] - 0.5, loss
    summary = json.loads((tmp_path / "summary-1-0.json").read_text())
    assert summary["role"]["micro_batches"] == 3 and summary["precision"] == "bf16"
    assert summary["start_step"] == 0


def test_fp16_with_the_agreed_loss_scale_learns(tmp_path):
    ranks = launch(tmp_path, 2, 1, steps=10, args=["--precision", "fp16"])
    loss = last_stage_loss(ranks)
    finite = [loss[s] for s in sorted(loss) if math.isfinite(loss[s])]
    assert len(finite) >= 8 and finite[-1] < finite[0] - 0.5, loss
    # A skipped step is skipped by every rank: both stages report the same count.
    skipped = {json.loads((tmp_path / f"summary-{k}-0.json").read_text())["skipped_steps"] for k in (0, 1)}
    assert len(skipped) == 1


def test_a_resumed_run_continues_exactly_where_the_checkpoint_left_off(tmp_path):
    (tmp_path / "straight").mkdir()
    straight = last_stage_loss(launch(tmp_path / "straight", 2, 1, steps=6))
    ckpt = tmp_path / "ckpt"
    first = launch(tmp_path, 2, 1, steps=3, checkpoint_dir=str(ckpt), args=["--checkpoint-every", "2"])
    assert all(r.resumed is None and r.steps == [1, 2, 3] for r in first)
    assert steps_in(ckpt) == ["step-00000002", "step-00000003"]
    again = launch(tmp_path, 2, 1, steps=6, checkpoint_dir=str(ckpt), restart_count=1,
                   args=["--checkpoint-every", "2"])
    assert all(r.resumed == (3, 1) and r.steps == [4, 5, 6] for r in again)
    resumed = last_stage_loss(again)
    for step in (4, 5, 6):   # model, optimizer and data position all restored
        assert resumed[step] == pytest.approx(straight[step], abs=1e-4), (resumed, straight)
    assert steps_in(ckpt) == ["step-00000004", "step-00000006"]    # --keep 2


def test_ranks_agree_on_the_latest_step_all_of_them_hold(tmp_path):
    """A crash while writing step 6 left one rank's shard and a temporary file: all resume from 4."""
    ckpt = tmp_path / "ckpt"
    launch(tmp_path, 2, 2, steps=4, checkpoint_dir="ckpt", args=["--checkpoint-every", "2"])
    assert (tmp_path / "ckpt" / "step-00000004").is_dir()    # relative: the job's working directory
    partial = ckpt / "step-00000006"
    partial.mkdir()
    shutil.copy(ckpt / "step-00000004" / "shard-L0-2-of4-r0.pt", partial / "shard-L0-2-of4-r0.pt")
    (partial / "shard-L2-4-of4-r0.pt.tmp123").write_bytes(b"half a shard")
    again = launch(tmp_path, 2, 2, steps=6, checkpoint_dir="ckpt", restart_count=1,
                   args=["--checkpoint-every", "2"])
    assert all(r.resumed == (4, 1) and r.steps == [5, 6] for r in again)
    loss = last_stage_loss(again)
    assert all(math.isfinite(v) for v in loss.values())


def test_a_job_replanned_with_another_stage_split_resumes_from_the_shards_by_layer(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    before = last_stage_loss(launch(tmp_path, 2, 1, steps=4, checkpoint_dir=ckpt))
    after = launch(tmp_path, 1, 2, steps=8, checkpoint_dir=ckpt, restart_count=1)
    assert all(r.resumed == (4, 1) and r.steps == [5, 6, 7, 8] for r in after)
    loss = last_stage_loss(after)
    assert loss[8] < before[1] - 0.5, (before, loss)


def test_an_old_copy_never_writes_over_a_newer_epoch_and_resume_takes_the_newest(tmp_path):
    """Epoch fencing: epoch 1 resumes from epoch 0's step 4 and writes ``-e1`` shards; a copy of
    epoch 0 still running (a partition) finds epoch 1 claimed, writes nothing and exits 3; epoch
    2 resumes from epoch 1's latest step even where epoch 0 left a later one."""
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-every", "2", "--keep", "8"]
    launch(tmp_path, 2, 1, steps=4, checkpoint_dir=str(ckpt), args=every)
    newer = launch(tmp_path, 2, 1, steps=8, checkpoint_dir=str(ckpt), restart_count=1, args=every)
    assert all(r.resumed == (4, 1) and r.steps == [5, 6, 7, 8] for r in newer)
    assert (ckpt / "epoch").read_text() == "1"
    assert sorted(p.name for p in (ckpt / "step-00000008").iterdir()) == [
        "shard-L0-2-of4-r0-e1.pt", "shard-L2-4-of4-r0-e1.pt"]

    before = files_in(ckpt)
    old = launch(tmp_path, 2, 1, steps=12, checkpoint_dir=str(ckpt), restart_count=0,
                 args=every, expect=3)
    assert all("fenced: epoch 1 of this job has started" in r.output and r.steps == []
               for r in old), old[0].output
    assert files_in(ckpt) == before            # nothing written, nothing removed

    late = ckpt / "step-00000020"     # a later step epoch 0 wrote before epoch 1 claimed the folder
    late.mkdir()
    for shard in (ckpt / "step-00000004").glob("shard-*.pt"):
        shutil.copy(shard, late / shard.name)
    again = launch(tmp_path, 2, 1, steps=10, checkpoint_dir=str(ckpt), restart_count=2,
                   args=every)
    assert all(r.resumed == (8, 2) and r.steps == [9, 10] for r in again)
    assert all("replica 0 epoch 1" in r.output for r in again), again[0].output
