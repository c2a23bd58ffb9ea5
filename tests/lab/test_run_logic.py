"""lab.run's pure helpers: reading the learned fleet and the speed-of-light check."""

from __future__ import annotations

from lab import matrix as lm
from lab.run import cities_plausible, learned_rtts, report_rtts


def test_learned_rtts_pool_both_directions_and_wait_for_enough_samples():
    fleet = {"links": [
        {"src": "a", "dst": "b", "rtt_ms": 10.0, "samples": 4},
        {"src": "b", "dst": "a", "rtt_ms": 12.0, "samples": 4},
        {"src": "a", "dst": "c", "rtt_ms": 30.0, "samples": 3},
        {"src": "b", "dst": "c", "rtt_ms": 99.0, "samples": 50, "imputed": True},
    ]}
    got = learned_rtts(fleet, min_samples=5)
    assert got == {frozenset(("a", "b")): 11.0}
    assert learned_rtts(fleet, min_samples=1)[frozenset(("a", "c"))] == 30.0
    m = lm.LatencyMatrix((lm.Host("a", None), lm.Host("b", None), lm.Host("c", None)),
                         ((0, 11, 30), (11, 0, 20), (30, 20, 0)))
    rows = report_rtts(m, got)
    assert [(r["a"], r["b"], r["learned_ms"]) for r in rows] == [
        ("a", "b", 11.0), ("a", "c", None), ("b", "c", None)]


def test_a_scaled_down_matrix_breaks_the_speed_of_light_bound():
    full = lm.table1(4)
    assert cities_plausible(full)
    assert not cities_plausible(full.scaled(0.25))


def test_the_lab_signs_placements_and_allows_only_the_example_trainer(tmp_path):
    from agent.config import load_config
    from hulk.wire.signing import Signer
    from lab.run import EXAMPLE, placement_security_env, resolve_example_paths

    env = placement_security_env(tmp_path)
    assert placement_security_env(tmp_path) == env                 # the key is made once
    assert Signer.from_file(env["HULK_SIGNING_KEY"]).public_text() == env["HULK_PLACEMENT_KEY"]
    config = load_config({"planner": "h:1", "node_id": "n"}, env_reader=env.get)
    assert config.allowed_commands == (("python", str(EXAMPLE)),)
    assert "PYTHONPATH" in config.pass_env
    jobs = tmp_path / "in.yaml"
    jobs.write_text('jobs:\n  - {name: t, command: "python examples/train_gpt.py --steps 2"}\n')
    resolved = resolve_example_paths(jobs, tmp_path / "out.yaml")
    assert f"python {EXAMPLE} --steps 2" in resolved.read_text()


def test_the_rtt_summary_counts_pairs_as_people_read_them(capsys):
    from lab.run import print_rtts

    print_rtts([{"a": "x", "b": "y", "configured_ms": 2.0, "learned_ms": 2.1}])
    assert "1 of 1 pair learned;" in capsys.readouterr().out
    print_rtts([{"a": "x", "b": "y", "configured_ms": 2.0, "learned_ms": 2.1},
                {"a": "x", "b": "z", "configured_ms": 3.0, "learned_ms": None}])
    assert "1 of 2 pairs learned;" in capsys.readouterr().out
