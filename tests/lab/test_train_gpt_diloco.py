"""examples/train_gpt.py with HULK_SYNC=diloco, two replicas in two processes on loopback, with
the variables an agent gives each rank (role_env): islands, the outer sync and resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.launcher import role_env
from hulk.wire.placement import Role
from lab.train import EXAMPLE, free_port

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]


def run(tmp: Path, name: str, *, steps: int, islands: int = 2, inner_steps: int = 3,
        checkpoint_dir: Path | None = None) -> list[subprocess.CompletedProcess]:
    """One stage x two replicas; replica r in island r (or both in island 0)."""
    port, procs = free_port(), []
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    base.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for replica in range(2):
        role = Role(plan_id="p1", job="gpt", phase=0, stage=0, num_stages=1, layer_lo=0, layer_hi=2,
                    replica=replica, num_replicas=2, rank=replica, world_size=2,
                    rendezvous_address="127.0.0.1", rendezvous_port=port, micro_batch=2,
                    micro_batches=2, checkpoint_dir=str(checkpoint_dir or ""), sync="diloco",
                    inner_steps=inner_steps, outer_compression="int8", island=replica if islands == 2 else 0, num_islands=islands)
        env = dict(base, **role_env(role), RANK=str(replica), LOCAL_RANK="0", WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        argv = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--layers", "2", "--dim", "32",
                "--checkpoint-every", "2", "--summary", str(tmp / f"{name}-{{replica}}.json")]
        procs.append(subprocess.Popen(argv, env=env, cwd=tmp, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    out = []
    for proc in procs:
        try:
            stdout, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            stdout, _ = proc.communicate()
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout))
    return out


def summaries(tmp: Path, name: str) -> list[dict]:
    return [json.loads((tmp / f"{name}-{r}.json").read_text()) for r in range(2)]


def shard(folder: Path, step: int, replica: int) -> dict:
    return torch.load(folder / f"step-{step:08d}" / f"shard-L0-2-of2-r{replica}.pt", weights_only=True)


def test_islands_train_apart_meet_at_outer_steps_and_resume_from_one(tmp_path):
    ckpt = tmp_path / "ckpt"
    first = run(tmp_path, "a", steps=6, checkpoint_dir=ckpt)
    assert [p.returncode for p in first] == [0, 0], first[0].stdout[-2000:] + first[1].stdout[-2000:]
    a = summaries(tmp_path, "a")
    # Outer steps after steps 3 and 6; each island trained on its own data in between, so the
    # two replicas' pseudo-gradients differ.
    assert [len(s["outer_s"]) for s in a] == [2, 2]
    assert all(x != y for x, y in zip(a[0]["pseudo_gradient_norms"], a[1]["pseudo_gradient_norms"]))
    # Checkpoints only right after outer steps (--checkpoint-every 2 rounds up to H = 3), where
    # both replicas hold the same anchor, with the outer momentum beside it.
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000003", "step-00000006"]
    s0, s1 = shard(ckpt, 6, 0), shard(ckpt, 6, 1)
    assert all(torch.equal(s0["model"][n], s1["model"][n]) for n in s0["model"])
    assert set(s0["outer"]["momentum"]) == set(s0["model"]) and s0["outer"]["syncs"] == 2

    resumed = run(tmp_path, "b", steps=9, checkpoint_dir=ckpt)
    assert all("resumed from step 6" in p.stdout for p in resumed)
    straight = run(tmp_path, "c", steps=9, checkpoint_dir=tmp_path / "ckpt-c")
    assert all(p.returncode == 0 for p in resumed + straight)
    # The resumed run continues exactly where the uninterrupted one is at step 6.
    b, c = shard(ckpt, 9, 0), shard(tmp_path / "ckpt-c", 9, 0)
    assert all(torch.equal(b["model"][n], c["model"][n]) for n in b["model"])
    assert torch.equal(b["outer"]["momentum"]["head.weight"], c["outer"]["momentum"]["head.weight"])
    assert summaries(tmp_path, "b")[0]["loss"] == summaries(tmp_path, "c")[0]["loss"][6:]


def test_one_island_averages_every_step_so_its_replicas_move_together(tmp_path):
    done = run(tmp_path, "one", steps=3, islands=1)
    assert [p.returncode for p in done] == [0, 0], done[0].stdout[-2000:]
    one = summaries(tmp_path, "one")
    assert one[0]["pseudo_gradient_norms"] == one[1]["pseudo_gradient_norms"]

