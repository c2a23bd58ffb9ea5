"""examples/diloco.py's pure parts: int8 pseudo-gradients, the outer Nesterov step, islands."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.helpers.examples import EXAMPLES, load_example

diloco = load_example("diloco")


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


gpt_parts = load_example("gpt_parts")


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


def test_int8_values_and_scales_cross_in_one_all_gather(monkeypatch):
    # Each collective over the slow link pays its round trips: the scales ride with the values.
    calls = []

    def fake_all_gather(parts, tensor, group=None):
        calls.append(tensor.dtype)
        for i, part in enumerate(parts):   # the other island sent the same values, doubled scales
            part.copy_(tensor)
            if i == 1:
                n = tensor.numel() - 8
                part[n:] = (tensor[n:].clone().view(torch.float32) * 2).view(torch.int8)

    monkeypatch.setattr(diloco.dist, "all_gather", fake_all_gather)
    g = torch.Generator().manual_seed(5)
    flat = torch.randn(30, generator=g)
    got = diloco.average(flat, [10, 20], "int8", group=None, size=2)
    assert calls == [torch.int8]
    values, scales = diloco.quantise_int8(flat, [10, 20])
    mine = diloco.dequantise_int8(values, scales, [10, 20])
    assert torch.allclose(got, 1.5 * mine)


def test_the_outer_step_takes_the_learning_rate_and_momentum_it_is_given():
    # One island: the averaged pseudo-gradient is its own, g = anchor - parameters.
    def after_one_sync(**outer):
        p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
        sync = diloco.OuterSync([p], "none", None, 1, **outer)
        with torch.no_grad():
            p -= torch.tensor([0.1, -0.2])
        sync.sync()
        assert set(sync.phases) == {"enter", "exchange_s", "broadcast_s"}
        return p.detach()

    # lr 1, no momentum: plain averaging, the parameters stay where the inner steps left them.
    assert torch.allclose(after_one_sync(lr=1.0, mu=0.0), torch.tensor([0.9, 2.2]))
    # The defaults (0.7, 0.9): the first step moves by lr (1 + mu) g.
    assert torch.allclose(after_one_sync(), torch.tensor([1.0 - 0.133, 2.0 + 0.266]))


def test_outer_flags_out_of_range_are_refused(capsys):
    sys.path.insert(0, str(EXAMPLES))
    try:
        load_example("gpt_parts")
        train_gpt = load_example("train_gpt")
        with pytest.raises(SystemExit) as stop:
            train_gpt.main(["--outer-momentum", "1.0"])
    finally:
        sys.path.remove(str(EXAMPLES))
    assert stop.value.code == 2 and "--outer-momentum in [0, 1)" in capsys.readouterr().err
