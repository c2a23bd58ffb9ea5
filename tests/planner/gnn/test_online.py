from dataclasses import replace

import pytest

from planner.core.generate import generate_fleet
from planner.gnn import checkpoint as ckpt
from planner.gnn.online import ChangeThresholds, RetrainConfig, Retrainer, fleet_changed


def test_fleet_changed_thresholds():
    fleet = generate_fleet(40, seed=1)
    assert not fleet_changed(fleet, fleet)
    assert fleet_changed(None, fleet)
    fewer = replace(fleet, nodes=fleet.nodes[:-3])
    assert fleet_changed(fleet, fewer)                                   # 3 of 40 left
    assert not fleet_changed(fleet, fewer, ChangeThresholds(node_fraction=0.2))
    drifted = replace(fleet, links=tuple(replace(l, rtt_ms=l.rtt_ms * 1.5) for l in fleet.links))
    assert fleet_changed(fleet, drifted)
    slight = replace(fleet, links=tuple(replace(l, rtt_ms=l.rtt_ms * 1.05) for l in fleet.links))
    assert not fleet_changed(fleet, slight)


@pytest.mark.slow   # fine-tunes the GNN on freshly labelled fleets
def test_retrainer_runs_in_the_background_and_keeps_the_previous_model(tiny_checkpoint, tmp_path):
    active = tmp_path / "active.pt"
    active.write_bytes(tiny_checkpoint.read_bytes())
    before = active.read_bytes()
    results = []
    retrainer = Retrainer(active, config=RetrainConfig(job_sets=4, epochs=2, teacher_budget_s=20),
                          on_result=results.append)
    retrainer.submit(generate_fleet(16, seed=4))
    assert retrainer.wait(timeout=120)
    assert len(results) == 1 and results[0].error is None, results
    r = results[0]
    assert r.examples >= 2
    assert r.held_out >= 1 and r.examples + r.held_out <= 4
    if r.switched:
        assert r.new_held_out_s < r.old_held_out_s
        assert (tmp_path / "active.prev.pt").read_bytes() == before
        assert ckpt.load(active).meta["fine_tuned_on"]["nodes"] == 16
    else:
        assert active.read_bytes() == before


def test_job_sets_split_seeded_into_training_and_held_out():
    from planner.gnn.online import split_job_sets

    train, held = split_job_sets(12, 1 / 3, seed=0)
    assert len(held) == 4 and sorted(train + held) == list(range(12))
    assert split_job_sets(12, 1 / 3, seed=0) == (train, held)
    assert split_job_sets(12, 1 / 3, seed=1) != (train, held)
    assert [len(part) for part in split_job_sets(3, 0.9, seed=0)] == [2, 1]
    with pytest.raises(ValueError, match="at least 3"):
        split_job_sets(2, 0.5, seed=0)


def _quick_teacher(jobs, net, seed, budget_s):
    from planner.search import plan_search

    return plan_search(jobs, net)


def _bad_candidate(examples, train_config, current):
    """A deliberately bad candidate: the active model with its weights replaced by noise, which
    also scores better pair accuracy than nothing (so accuracy could not be what keeps it out)."""
    import copy

    import torch

    model = copy.deepcopy(current.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 5.0)
    return model, current.stats, {"val_acc": 1.0}


@pytest.mark.slow   # refines the held-out sets' starts with the search
def test_a_bad_candidate_is_not_adopted_however_its_pair_accuracy(shipped_checkpoint, tmp_path):
    active = tmp_path / "active.pt"
    active.write_bytes(shipped_checkpoint.read_bytes())
    before = active.read_bytes()
    retrainer = Retrainer(active, config=RetrainConfig(job_sets=4, epochs=1),
                          teacher=_quick_teacher, fine_tune=_bad_candidate)
    result = retrainer.retrain(generate_fleet(16, seed=4, n_cities=3))
    assert result.held_out >= 1 and result.examples >= 2
    assert not result.switched
    assert result.new_held_out_s >= result.old_held_out_s
    assert active.read_bytes() == before and not (tmp_path / "active.prev.pt").exists()


def test_the_candidate_is_adopted_only_with_a_lower_held_out_makespan(tiny_checkpoint, tmp_path):
    """The switch follows the held-out makespans, never pair accuracy: a candidate whose start
    ties the active model's is kept out, one whose start shortens the held-out plans gets in."""
    def candidate(examples, train_config, current):
        return current.model, current.stats, {"val_acc": 1.0}

    for shorter in (False, True):
        active = tmp_path / f"active-{shorter}.pt"
        active.write_bytes(tiny_checkpoint.read_bytes())
        before = active.read_bytes()
        seen = []

        def judge(model, jobs, net):
            seen.append(model)
            if model is seen[0] or not shorter:   # the active model is judged first
                return 1e9                        # no shorter than the teacher's plan
            return 1.0

        retrainer = Retrainer(active, config=RetrainConfig(job_sets=4, epochs=1),
                              teacher=_quick_teacher, fine_tune=candidate, judge=judge)
        result = retrainer.retrain(generate_fleet(12, seed=2, n_cities=3))
        assert result.switched is shorter
        assert (result.new_held_out_s < result.old_held_out_s) is shorter
        assert (active.read_bytes() != before) is shorter


class RecordingRetrainer:
    """Stands in for Retrainer in a pure-logic test of RetrainWatch."""

    def __init__(self):
        self.submitted = []

    def submit(self, fleet):
        self.submitted.append(fleet)


def test_retrain_watch_submits_only_on_change():
    from planner.gnn.online import RetrainWatch

    rec = RecordingRetrainer()
    watch = RetrainWatch(rec)
    fleet = generate_fleet(20, seed=2)
    assert watch.check(fleet)
    assert not watch.check(fleet)
    grown = generate_fleet(24, seed=2)
    assert watch.check(grown)
    assert rec.submitted == [fleet, grown]


def test_retrain_on_change_reads_the_fleet_each_check_and_submits_only_changes():
    from planner.gnn.online import retrain_on_change

    rec = RecordingRetrainer()
    fleets = [generate_fleet(20, seed=2), generate_fleet(20, seed=2), generate_fleet(24, seed=2)]
    reads = iter(fleets)
    check = retrain_on_change(lambda: next(reads), rec)
    assert [check(), check(), check()] == [True, False, True]
    assert rec.submitted == [fleets[0], fleets[2]]


@pytest.mark.slow   # plans with the portfolio, its GNN start and a damaged checkpoint
def test_serve_planner_adds_the_gnn_start_and_is_never_longer_than_the_search(
        shipped_checkpoint, tmp_path, caplog):
    """serve's planner: the portfolio, the GNN's scores one more start; a damaged checkpoint
    leaves that start out (with a warning) and the portfolio still plans."""
    import logging

    from planner.core.costmodel import estimate_plan, problems
    from planner.core.fleet import complete
    from planner.core.generate import generate_jobs
    from planner.methods import gnn_starts, serve_planner
    from planner.search import plan_search

    net = complete(generate_fleet(14, seed=5, n_cities=3))
    jobs = generate_jobs(3, seed=5, max_params=float(net.mem.sum()) / 16 / 3)
    search_s = estimate_plan(plan_search(jobs, net).placements, net).makespan_s
    (name, scores), = gnn_starts(jobs, net, shipped_checkpoint)
    assert name == "gnn" and scores.shape == (net.n, len(jobs) + 1)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with caplog.at_level(logging.WARNING, logger="planner.methods"):
        assert gnn_starts(jobs, net, corrupt) == []
    assert any("GNN start left out" in r.getMessage() for r in caplog.records)
    for checkpoint in (shipped_checkpoint, corrupt):
        plan = serve_planner(budget_s=2.0, checkpoint=checkpoint)(jobs, net, seed=0)
        assert plan.method == "portfolio" and not plan.unplaced
        assert {p.job.name for p in plan.placements} == {j.name for j in jobs}
        assert all(problems(p, net) == [] for p in plan.placements)
        assert estimate_plan(plan.placements, net).makespan_s <= search_s * (1 + 1e-12)
