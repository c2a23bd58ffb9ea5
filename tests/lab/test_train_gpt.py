"""examples/train_gpt.py as two pipeline stages in two processes: on loopback, then across the lab."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from lab.train import EXAMPLE, run_placement

pytestmark = pytest.mark.process


def assert_learns(run):
    assert run.ok, run.failure()
    loss = run.loss
    assert len(loss) == 4 and all(math.isfinite(v) for v in loss)
    assert loss[-1] < loss[0], f"loss did not decrease: {loss}"
    assert all(len(n.step_s) == 4 for n in run.nodes)


def test_two_stages_on_loopback_train():
    run = run_placement([["a"], ["b"]], steps=4, layers=4)
    assert_learns(run)
    assert [(n.stage, n.replica) for n in run.nodes] == [(0, 0), (1, 0)]
    # Every step ends with the node's wall clock: increasing, one per step, and the job's pace
    # from them is about its steps' own times (the two only differ by untimed work between steps).
    for n in run.nodes:
        assert len(n.end_s) == 4 and n.end_s == sorted(n.end_s)
    wall, per_step = run.wall_iteration_s(1), run.mean_iteration_s(1)
    assert per_step * 0.8 <= wall <= per_step + 0.5


def test_two_stages_two_replicas_with_ranks_out_of_stage_order():
    """Whatever rank order the launcher picks, the stages find each other by their HULK_* role."""
    run = run_placement([["a", "b"], ["c", "d"]], steps=4, layers=4, reverse_ranks=True)
    assert_learns(run)
    assert [n.rank for n in run.nodes] == [3, 2, 1, 0]
    # Replicas of a stage average their gradients, so both replicas' losses move together.
    last = [n for n in run.nodes if n.stage == 1]
    assert all(n.loss and math.isfinite(n.loss[-1]) for n in last)


def test_an_inconsistent_role_is_one_line_and_exit_2():
    env = {"RANK": "0", "WORLD_SIZE": "1", "HULK_STAGE": "zero", "HULK_NUM_STAGES": "1",
           "HULK_LAYER_LO": "0", "HULK_LAYER_HI": "4", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "train_gpt: HULK_STAGE must be an integer, got 'zero'"


@pytest.mark.parametrize("args, message", [
    (["--seq-len", "4096"], "--seq-len must be 1.."),
    (["--dim", "64", "--heads", "5"], "--dim (64) must be a multiple of --heads (5)"),
])
def test_sizes_the_model_cannot_take_are_one_line_and_exit_2(args, message):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "1", *args],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr


def test_cuda_without_a_gpu_per_process_is_one_line_and_exit_2():
    """NCCL would fail only after the rendezvous, with a traceback from every rank."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": str(gpus + 1), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "1", "--device", "cuda"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("train_gpt: --device cuda: "), line
    assert "Traceback" not in proc.stderr
    if gpus:
        assert f"{gpus + 1} processes on this host but {gpus} GPU(s)" in line


@pytest.mark.root
def test_two_stages_across_two_lab_namespaces(wan_lab):
    beijing, neimeng = wan_lab.hosts[0], wan_lab.hosts[1]
    run = run_placement([[beijing], [neimeng]], lab=wan_lab, steps=4, layers=4)
    assert_learns(run)
    # Every step crosses the link at least once each way per micro-batch: it cannot beat the RTT.
    rtt_s = wan_lab.configured_rtt_ms(beijing, neimeng) / 1000
    assert min(min(n.step_s) for n in run.nodes) > rtt_s
    assert wan_lab.switch_stats()["pairs"]["0->1"]["packets"] > 0
