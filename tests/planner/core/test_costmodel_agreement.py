"""The cost model's building blocks against estimate(), and every fast screen built from them
against estimate() where its docstring says they agree: exactly, up to rounding, or as a bound.

Random jobs, networks and placements from fixed seeds (numpy's default_rng); each property is
checked on a few hundred cases. REL is the rounding allowed where two sides add the same terms
in another order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.core import costmodel as cm
from planner.core.costmodel import Placement, Stage, estimate
from planner.core.fleet import Network, Node
from planner.core.generate import generate_jobs, generate_network
from planner.core.jobs import Job

REL = 1e-12
CASES = 300


def _networks() -> list[Network]:
    nets = [generate_network(n, seed=s) for n, s in ((10, 1), (24, 2), (40, 3))]
    # Two components: the links between them have bw 0 and RTT inf.
    nodes = [Node(id=f"x{i}", city=None, gpus=1 + i % 4, gpu_name="NVIDIA A100-SXM4-40GB",
                  memory_gb=40.0 * (1 + i % 4)) for i in range(8)]
    rtt = np.full((8, 8), math.inf)
    rtt[:4, :4] = 2.0
    rtt[4:, 4:] = 30.0
    np.fill_diagonal(rtt, 0.0)
    nets.append(Network.from_matrix(nodes, rtt))
    return nets


NETS = _networks()
JOBS = generate_jobs(40, seed=5, max_params=14e9)


def _split(rng: np.random.Generator, total: int, parts: int) -> list[int]:
    """``parts`` positive integers summing to ``total``, uniformly among compositions."""
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
    return np.diff(np.concatenate(([0], cuts, [total]))).tolist()


def _micro_batch(rng: np.random.Generator, job: Job, d: int) -> int:
    per_replica = cm.micro_batches(job, d, 1)
    return int(rng.choice([b for b in (1, 2, 4, 8, job.micro_batch) if b <= per_replica]))


def _grid(rng: np.random.Generator, net: Network, job: Job) -> np.ndarray:
    d = int(rng.integers(1, min(5, net.n) + 1))
    k = int(rng.integers(1, min(net.n // d, job.layers, 8) + 1))
    return rng.permutation(net.n)[:k * d].reshape(k, d)


def _placement(rng: np.random.Generator, net: Network, job: Job, grid: np.ndarray) -> Placement:
    k, d = grid.shape
    bounds = np.cumsum([0] + _split(rng, job.layers, k)).tolist()
    stages = tuple(Stage(bounds[s], bounds[s + 1], tuple(grid[s].tolist())) for s in range(k))
    return Placement(job, stages, _micro_batch(rng, job, d))


def _pick(rng: np.random.Generator) -> tuple[Network, Job]:
    """A random fleet and job of the fixed sets."""
    return NETS[int(rng.integers(len(NETS)))], JOBS[int(rng.integers(len(JOBS)))]


def _cases(seed: int, count: int = CASES):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        net, job = _pick(rng)
        yield rng, net, job, _placement(rng, net, job, _grid(rng, net, job))


def _by_hand(p: Placement, net: Network) -> tuple[float, float, float]:
    """(pipeline_s, allreduce_s, peak memory fraction) of docs/COSTMODEL.md section 4, one
    replica and one stage at a time in plain Python."""
    job, b = p.job, p.micro_batch
    grid = p.node_matrix()
    k, d = grid.shape
    m = math.ceil(job.global_batch / d / b)
    f, act = job.flops_per_layer(b), job.activation_bytes(b)
    pipes = []
    for r in range(d):
        c = [f * st.layers / net.thr[grid[s, r]] for s, st in enumerate(p.stages)]
        hops = [(grid[s, r], grid[s + 1, r]) for s in range(k - 1)]
        x = [2 * (net.rtt_ms[i, j] / 2000 + act / net.bw[i, j]) for i, j in hops]
        pipes.append(sum(c) + sum(x) + (m - 1) * max(c + x))
    rings = [0.0]
    for s, st in enumerate(p.stages):
        if d > 1:
            pairs = [(grid[s, r], grid[s, (r + 1) % d]) for r in range(d)]
            a = max(net.rtt_ms[i, j] / 2000 for i, j in pairs)
            bw = min(net.bw[i, j] for i, j in pairs)
            grad = 2 * job.params * st.layers / job.layers
            rings.append(2 * (d - 1) * (a + grad / (d * bw)))
    need = [16 * job.params * st.layers / job.layers + act * st.layers * min(m, k)
            for st in p.stages]
    peak = max(need[s] / net.mem[grid[s, r]] for s in range(k) for r in range(d))
    return max(pipes), max(rings), peak


def _close(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= REL * abs(b))


@pytest.fixture(autouse=True)
def _quiet_inf():
    with np.errstate(divide="ignore", invalid="ignore"):
        yield


def test_estimate_is_the_document_formula():
    for _, net, job, p in _cases(7):
        e = estimate(p, net)
        pipe, ring, peak = _by_hand(p, net)
        assert e.micro_batches == cm.micro_batches(job, p.replicas, p.micro_batch)
        assert _close(e.pipeline_s, pipe) and _close(e.allreduce_s, ring)
        assert _close(e.peak_memory_fraction, peak)
        assert e.iteration_s == e.pipeline_s + e.allreduce_s


def test_each_block_is_the_matching_field_of_estimate():
    for _, net, job, p in _cases(8):
        e = estimate(p, net)
        grid, b = p.node_matrix(), p.micro_batch
        k, d = grid.shape
        m = cm.micro_batches(job, d, b)
        layers = np.array([st.layers for st in p.stages], dtype=float)
        compute = job.flops_per_layer(b) * layers[:, None] / net.thr[grid]
        hops = cm.transfer_s(net, grid[:-1], grid[1:], job.activation_bytes(b))
        assert float(cm.pipeline_s(compute, hops, m).max()) == e.pipeline_s
        assert float(cm.pipeline_s(compute, None, m).max()) == e.compute_s
        if d > 1:
            a_max, bw_min = cm.ring_links(net, grid)
            ring = cm.allreduce_s(d, a_max, cm.gradient_bytes(job, layers), bw_min)
            assert float(ring.max()) == e.allreduce_s
            # The split the screens use: the same time up to rounding.
            base, per_layer = cm.allreduce_terms(d, a_max, cm.gradient_bytes(job, 1), bw_min)
            assert _close(float((base + per_layer * layers).max()), e.allreduce_s)
        else:
            assert e.allreduce_s == 0.0
        need = [cm.stage_memory_bytes(job, st.layers, b, m, k) for st in p.stages]
        peak = max(need[s] / net.mem[i] for s in range(k) for i in grid[s])
        assert peak == e.peak_memory_fraction
        assert e.memory_ok == all(need[s] <= net.mem[i] for s in range(k) for i in grid[s])
        per_layer_bytes = cm.layer_memory_bytes(job, b, m, k)
        assert all(_close(per_layer_bytes * st.layers, need[s]) for s, st in enumerate(p.stages))


def test_whole_model_is_one_stage_of_every_layer():
    for job in JOBS:
        m = cm.micro_batches(job, 1, job.micro_batch)
        whole = cm.stage_memory_bytes(job, job.layers, job.micro_batch, m, 1)
        assert _close(cm.whole_model_bytes(job), whole)


def test_compute_floor_and_max_replicas_bound_every_placement():
    feasible = 0
    for _, net, job, p in _cases(9):
        e = estimate(p, net)
        nodes = np.array(p.nodes)
        floor = cm.compute_floor_s(job.total_flops, float(net.thr[nodes].sum()))
        assert floor <= e.job_s * (1 + REL)
        if e.memory_ok:
            feasible += 1
            assert p.replicas <= cm.max_replicas(job, float(net.mem[nodes].sum()) * (1 + REL))
    assert feasible > 20


def test_algorithm1_memory_rule():
    from planner.search import algorithm1 as alg1

    rng = np.random.default_rng(10)
    fitting = 0
    for _ in range(CASES):
        net, job = _pick(rng)
        k = int(rng.integers(1, min(job.layers, 12) + 1))
        m = cm.micro_batches(job, 1, job.micro_batch)
        total = sum(cm.stage_memory_bytes(job, lay, job.micro_batch, m, k)
                    for lay in _split(rng, job.layers, k))
        assert _close(alg1.memory_threshold(job, k), total)
        # fits() promises a valid one-replica pipeline, one stage per node that holds a layer.
        nodes = rng.permutation(net.n)[:int(rng.integers(1, net.n + 1))]
        if not alg1.fits(job, net, nodes):
            continue
        fitting += 1
        u = cm.layer_memory_bytes(job, job.micro_batch, m, max(1, min(nodes.size, job.layers)))
        caps = np.floor(net.mem[nodes] / u).astype(int)
        stages, lo = [], 0
        for i in np.argsort(-caps, kind="stable"):
            if lo == job.layers:
                break
            take = min(int(caps[i]), job.layers - lo)
            stages.append(Stage(lo, lo + take, (int(nodes[i]),)))
            lo += take
        e = estimate(Placement(job, tuple(stages), job.micro_batch), net)
        assert lo == job.layers and e.peak_memory_fraction <= 1 + REL
    assert fitting > 20


def test_search_screens_against_estimate():
    from planner.search.arrangement import balance_layers, placement_from_grid
    from planner.search.groups import approx_time, evaluate_grid

    rng = np.random.default_rng(11)
    finite = 0
    for _ in range(CASES):
        net, job = _pick(rng)
        grid = _grid(rng, net, job)
        k, d = grid.shape
        b = _micro_batch(rng, job, d)
        t, _ = approx_time(job, net, grid, b)
        # approx_time: the grid as it stands, layers balanced by throughput within memory,
        # every stage timed as its slowest replica (exact for D = 1, else an upper bound).
        u = cm.layer_memory_bytes(job, b, cm.micro_batches(job, d, b), min(k, job.layers))
        caps = np.floor(net.mem[grid].min(axis=1) / u).astype(np.int64)
        layers = balance_layers(job, net.thr[grid].min(axis=1), caps)
        if layers is None:
            assert t == math.inf
        else:
            bounds = np.cumsum([0] + layers.tolist()).tolist()
            p = Placement(job, tuple(Stage(bounds[s], bounds[s + 1], tuple(grid[s].tolist()))
                                     for s in range(k)), b)
            e = estimate(p, net)
            assert e.peak_memory_fraction <= 1 + REL
            assert e.iteration_s <= t * (1 + REL) or t == e.iteration_s == math.inf
            if d == 1:
                assert _close(t, e.iteration_s)
            finite += math.isfinite(t)
        # With trim: the best of the grid and of its fastest rows, as approx_time of those rows.
        t_trim, rows = approx_time(job, net, grid, b, trim=True)
        assert t_trim <= t
        if rows is not None:
            assert t_trim == approx_time(job, net, grid[rows], b)[0]
        # placement_from_grid and evaluate_grid give valid placements judged by estimate.
        p = placement_from_grid(job, net, grid, b)
        if p is not None:
            assert not [x for x in cm.problems(p, net) if " needs " not in x]
            assert estimate(p, net).peak_memory_fraction <= 1 + REL
        placed, est = evaluate_grid(job, net, grid, b)
        if placed is not None:
            assert est == estimate(placed, net) and est.feasible
    assert finite > 50


def test_approx_time_is_exact_on_one_replica_with_overheads():
    """A calibrated network's per-micro-batch and per-hop overheads reach approx_time and
    estimate() alike: still equal for D = 1, still an upper bound for D > 1."""
    import copy

    from planner.search.arrangement import balance_layers
    from planner.search.groups import approx_time

    rng = np.random.default_rng(13)
    exact = 0
    for _ in range(CASES):
        base, job = _pick(rng)
        net = copy.copy(base)
        net.micro_batch_overhead_s = float(rng.uniform(1e-4, 0.05))
        net.hop_overhead_s = float(rng.uniform(0.0, 0.01))
        grid = _grid(rng, net, job)
        k, d = grid.shape
        b = _micro_batch(rng, job, d)
        t, _ = approx_time(job, net, grid, b)
        u = cm.layer_memory_bytes(job, b, cm.micro_batches(job, d, b), min(k, job.layers))
        caps = np.floor(net.mem[grid].min(axis=1) / u).astype(np.int64)
        layers = balance_layers(job, net.thr[grid].min(axis=1), caps)
        if layers is None:
            continue
        bounds = np.cumsum([0] + layers.tolist()).tolist()
        p = Placement(job, tuple(Stage(bounds[s], bounds[s + 1], tuple(grid[s].tolist()))
                                 for s in range(k)), b)
        e = estimate(p, net)
        # Each of the K + M - 1 slots of the compute pipeline pays the overhead once.
        slots = k + cm.micro_batches(job, d, b) - 1
        added = slots * net.micro_batch_overhead_s
        assert e.compute_s == pytest.approx(estimate(p, base).compute_s + added, rel=1e-9)
        assert e.iteration_s <= t * (1 + REL) or t == e.iteration_s == math.inf
        if d == 1 and math.isfinite(t):
            assert _close(t, e.iteration_s)
            exact += 1
    assert exact > 20


def test_baselines_against_estimate():
    from planner.baselines import dtfm, systems

    rng = np.random.default_rng(12)
    for net in NETS:
        for job in JOBS[:12]:
            a = systems.system_a_placement(job, net)
            if isinstance(a, Placement):
                assert all(net.mem[i] >= cm.whole_model_bytes(job) for i in a.nodes)
                assert estimate(a, net).memory_ok
            bp = systems.system_b_placement(job, net)
            if isinstance(bp, Placement):
                assert estimate(bp, net).peak_memory_fraction <= 1 + REL
            c = systems.system_c_estimate(job, net)
            if not isinstance(c, cm.Estimate):
                continue
            assert c.micro_batches == cm.micro_batches(job, 1, job.micro_batch)
            # System C's ring is the cost model's all-reduce: a one-stage placement on the
            # ring's nodes all-reduces its gradients in the same time.
            ring = systems.nearest_neighbour_chain(net, range(net.n))
            one_stage = Placement(job, (Stage(0, job.layers, tuple(ring)),), job.micro_batch)
            grad = cm.gradient_bytes(job, float(job.layers))
            assert systems.ring_allreduce_s(net, ring, grad) == estimate(one_stage, net).allreduce_s
    for _ in range(60):
        net, job = _pick(rng)
        grid = _grid(rng, net, job)
        p, e = dtfm._score(job, net, grid, _micro_batch(rng, job, grid.shape[1]))
        if p is not None:
            assert e == estimate(p, net) and e.feasible


def test_gnn_memory_features_are_the_memory_rule():
    pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    from planner.gnn.features import featurize

    for net in NETS:
        jobs = JOBS[:6]
        pair = featurize(jobs, net).pair_x.reshape(net.n, len(jobs), -1)
        for k, job in enumerate(jobs):
            whole = cm.stage_memory_bytes(job, job.layers, job.micro_batch, 1, 1)
            per_layer = cm.layer_memory_bytes(job, job.micro_batch, 1, 1)
            for i in range(net.n):
                share = net.mem[i] / whole
                if abs(share - 1) > 1e-9:
                    assert pair[i, k, 1] == float(share >= 1)
                if net.mem[i] / per_layer >= 1e-3:
                    fit = math.log2(net.mem[i] / per_layer / job.layers)
                    assert pair[i, k, 0] == pytest.approx(fit, rel=1e-9, abs=1e-9)
