"""submit_problems: what `jobs submit` refuses before a job is queued (pure)."""

from __future__ import annotations

import random
from dataclasses import replace

from hulk.wire.placement import MAX_COMMAND_WORDS
from planner.core.costmodel import max_replicas
from planner.core.job_checks import submit_problems
from planner.core.jobs import catalog_job

JOB = catalog_job("gpt2-xl", name="gpt", command=("python", "train.py"))
GB = 1e9


def test_a_sound_job_has_no_problem():
    assert submit_problems(JOB, JOB.command, fleet_gpu_bytes=None) == []
    assert submit_problems(JOB, JOB.command, fleet_gpu_bytes=8 * 80 * GB) == []


def test_no_command_is_refused_unless_plan_only():
    problems = submit_problems(JOB, None, fleet_gpu_bytes=None)
    assert len(problems) == 1 and problems[0].startswith("command: missing")
    assert "--plan-only" in problems[0]
    assert submit_problems(JOB, None, fleet_gpu_bytes=None, plan_only=True) == []


def test_commands_longer_than_agents_parse_are_refused():
    at_limit = ("python",) + ("x",) * (MAX_COMMAND_WORDS - 1)
    assert submit_problems(JOB, at_limit, fleet_gpu_bytes=None) == []
    over = at_limit + ("y",)
    [problem] = submit_problems(JOB, over, fleet_gpu_bytes=None)
    assert problem == f"command: {MAX_COMMAND_WORDS + 1} words, agents accept at most {MAX_COMMAND_WORDS}"
    assert submit_problems(JOB, ("",), fleet_gpu_bytes=None) == ["command: must name a program"]


def test_fields_outside_their_bounds_are_named():
    for field, value in (("params", 1e-300), ("params", 1.0e15), ("params", float("inf")),
                         ("layers", 0), ("steps", 0), ("hidden", 10**9)):
        problems = submit_problems(replace(JOB, **{field: value}), JOB.command,
                                   fleet_gpu_bytes=80 * GB)
        assert len(problems) == 1 and problems[0].startswith(f"{field}: "), (field, problems)
    problems = submit_problems(replace(JOB, micro_batch=64, global_batch=8), JOB.command,
                               fleet_gpu_bytes=None)
    assert problems == ["micro_batch: 64 is larger than global_batch 8"]


def test_memory_beyond_the_whole_fleet_follows_the_cost_model():
    big = replace(JOB, params=1e12)             # 16 TB of training state
    [problem] = submit_problems(big, JOB.command, fleet_gpu_bytes=100 * 80 * GB)
    assert problem.startswith("params: ") and "8,000 GB of GPU memory" in problem
    assert submit_problems(big, JOB.command, fleet_gpu_bytes=None) == []   # fleet unknown
    rng = random.Random(27)
    for _ in range(200):
        job = replace(JOB, params=10 ** rng.uniform(6, 12.5))
        fleet = 10 ** rng.uniform(9, 14)
        refused = bool(submit_problems(job, JOB.command, fleet_gpu_bytes=fleet))
        assert refused == (max_replicas(job, fleet) < 1)


def test_a_command_is_checked_against_the_agents_allowed_prefixes_word_by_word():
    job = catalog_job("gpt2-xl", "j")
    agents = {"a": (("python", "train.py"),), "b": (("torchrun",), ("bash", "-c"))}
    ok = ("python", "train.py", "--steps", "5")
    assert submit_problems(job, ok, fleet_gpu_bytes=None, agent_commands=agents) == []
    assert submit_problems(job, ("bash", "-c", "x"), fleet_gpu_bytes=None, agent_commands=agents) == []
    # A prefix matches whole words: "train.py.evil" is not "train.py".
    bad = submit_problems(job, ("python", "train.py.evil"), fleet_gpu_bytes=None,
                          agent_commands=agents)
    assert len(bad) == 1 and bad[0].startswith("command: ") and "2 agents that" in bad[0]
    # No agent reported its prefixes: nothing to check against.
    assert submit_problems(job, ("python", "x.py"), fleet_gpu_bytes=None, agent_commands={}) == []
