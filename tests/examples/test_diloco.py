"""examples/diloco.py's pure parts: int8 pseudo-gradients, the outer Nesterov step, islands."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


diloco = _load("diloco")


def test_int8_round_trip_is_within_half_a_step_of_each_tensors_scale():
    g = torch.Generator().manual_seed(3)
    sizes = [7, 1000, 1, 33]
    flat = torch.cat([torch.randn(n, generator=g) * s for n, s in zip(sizes, (1e-4, 3.0, 0.5, 20.0))])
    flat[1007] = 0.0  # an all-zero tensor keeps a usable scale
    values, scales = diloco.quantise_int8(flat, sizes)
    assert values.dtype == torch.int8 and scales.shape == (4,)
    back = diloco.dequantise_int8(values, scales, sizes)
    for chunk, orig, scale in zip(back.split(sizes), flat.split(sizes), scales):
        assert float((chunk - orig).abs().max()) <= float(scale) / 2 + 1e-7
        assert float(scale) == pytest.approx(float(orig.abs().max()) / 127 or 1.0)
    assert float(back[1007]) == 0.0


def test_outer_nesterov_matches_the_formula_and_torch_sgd():
    anchor, momentum = torch.tensor([1.0, -2.0]), torch.zeros(2)
    g1, g2 = torch.tensor([0.1, 0.2]), torch.tensor([-0.3, 0.0])
    diloco.outer_nesterov(anchor, momentum, g1)
    # m = g1; anchor -= 0.7 * (g1 + 0.9 * g1) = 0.7 * 1.9 * g1
    assert torch.allclose(momentum, g1)
    assert torch.allclose(anchor, torch.tensor([1.0 - 0.133, -2.0 - 0.266]))
    diloco.outer_nesterov(anchor, momentum, g2)
    m2 = 0.9 * g1 + g2
    assert torch.allclose(momentum, m2)
    assert torch.allclose(anchor, torch.tensor([1.0 - 0.133, -2.0 - 0.266]) - 0.7 * (g2 + 0.9 * m2))
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    sgd = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    for g in (g1, g2):
        p.grad = g.clone()
        sgd.step()
    assert torch.allclose(p.detach(), anchor)


def test_islands_are_read_from_every_ranks_role_and_give_the_inner_groups():
    # 2 stages x 4 replicas; replicas 0-2 in island 0, replica 3 in island 1.
    where = {(s, r): s * 4 + r for s in range(2) for r in range(4)}
    roles = [(r, 0 if r < 3 else 1, 2) for s in range(2) for r in range(4)]
    island_of = diloco.islands_of_replicas(roles, 4)
    assert island_of == [0, 0, 0, 1]
    assert diloco.island_groups(where, island_of, 2) == {
        (0, 0): [0, 1, 2], (1, 0): [4, 5, 6], (0, 1): [3], (1, 1): [7]}


@pytest.mark.parametrize("roles, problem", [
    ([(0, 1, 2), (1, 0, 2)], "not contiguous"),
    ([(0, 0, 2), (1, 0, 2)], "not contiguous"),
    ([(0, 0, 2), (1, 2, 2)], "not in 0..1"),
    ([(0, 0, 2), (1, 1, 1)], "disagree"),
    ([(0, 0, 1), (0, 1, 1), (1, 0, 1)], "not in 0..0"),
    ([(0, 0, 3), (1, 1, 3)], "1..2"),
])
def test_islands_that_are_not_contiguous_blocks_are_refused(roles, problem):
    with pytest.raises(diloco.IslandError, match=problem):
        diloco.islands_of_replicas(roles, 2)


gpt_parts = _load("gpt_parts")


def test_a_diloco_role_is_read_from_the_environment(monkeypatch):
    for name, value in {"HULK_SYNC": "diloco", "HULK_INNER_STEPS": "20", "HULK_OUTER_COMPRESSION": "bf16",
                        "HULK_ISLAND": "1", "HULK_NUM_ISLANDS": "2"}.items():
        monkeypatch.setenv(name, value)
    role = gpt_parts.role_from_env(4, 2)
    assert (role.sync, role.inner_steps, role.outer_compression, role.island, role.num_islands) == \
        ("diloco", 20, "bf16", 1, 2)


@pytest.mark.parametrize("name, value, problem", [
    ("HULK_STREAMING_FRAGMENTS", "2", "HULK_STREAMING_FRAGMENTS is 2: .*not implemented"),
    ("HULK_SYNC", "sometimes", "HULK_SYNC must be step or diloco"),
    ("HULK_OUTER_COMPRESSION", "fp8", "HULK_OUTER_COMPRESSION must be none, bf16 or int8"),
    ("HULK_INNER_STEPS", "0", "HULK_INNER_STEPS must be at least 1"),
])
def test_a_sync_the_trainer_cannot_run_is_a_role_error(monkeypatch, name, value, problem):
    monkeypatch.setenv(name, value)
    with pytest.raises(gpt_parts.RoleError, match=problem):
        gpt_parts.role_from_env(4, 2)


def test_the_first_replica_of_each_island_carries_the_outer_sync():
    where = {(s, r): s * 4 + r for s in range(2) for r in range(4)}
    assert diloco.outer_leaders(where, [0, 0, 0, 1], 2) == {0: [0, 3], 1: [4, 7]}
    assert diloco.outer_leaders(where, [0, 0, 0, 0], 2) == {0: [0], 1: [4]}
