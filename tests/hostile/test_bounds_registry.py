"""The bounds registry is whole: every numeric flag of serve has its row and is checked against
it, every row's limit is a real one, and the reproductions of findings about inputs without a
bound (jobs.yaml commands and model names, plan JSON, the calibration file) stay refused."""

from __future__ import annotations

import argparse

import pytest

from hulk.bounds import Rule, Table, Text, Unbounded
from hulk.errors import ConfigError, InputError
from hulk.validate import Bound
from planner import bounds
from planner.cli import build_parser
from planner.commands.serve import FLAG_BOUNDS, check_flags
from planner.files.jobs import MAX_COMMAND_CHARS, parse_jobs
from planner.settings import PlannerSettings
from tests.helpers.hostile import above, below


def serve_args(*flags: str) -> argparse.Namespace:
    return build_parser(PlannerSettings(), "serve").parse_args(
        ["serve", "--db", "x.sqlite", "--insecure", *flags])


def numeric_flags() -> set[str]:
    parser = build_parser(PlannerSettings(), "serve")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt for action in sub.choices["serve"]._actions if action.type in (int, float)
            for opt in action.option_strings}


def test_every_numeric_serve_flag_has_a_bound():
    missing = numeric_flags() - set(FLAG_BOUNDS)
    assert not missing, f"serve flags without a row in FLAG_BOUNDS: {sorted(missing)}"
    assert not set(FLAG_BOUNDS) - numeric_flags(), "FLAG_BOUNDS names flags serve has not"


@pytest.mark.parametrize("flag", sorted(FLAG_BOUNDS))
def test_each_serve_flag_is_checked_against_its_row(flag, tmp_path):
    bound = FLAG_BOUNDS[flag]
    extra = ["--model-dir", str(tmp_path)] if flag.startswith("--retrain-") else []
    top = int(bound.high) if bound.integer else bound.high
    check_flags(serve_args(*extra, f"{flag}={top}"))
    for value in (above(bound), below(bound), "nan", "inf"):
        if value in ("nan", "inf") and bound.integer:
            continue   # argparse's int() refuses them before the check
        with pytest.raises(ConfigError) as err:
            check_flags(serve_args(*extra, f"{flag}={value}"))
        assert err.value.field == flag


def test_every_table_row_has_a_real_limit():
    assert len(bounds.TABLES) >= 15
    for table in bounds.TABLES:
        assert isinstance(table, Table) and table.rows, table.name
        for field, limit in table.rows:
            assert isinstance(limit, (Bound, Text, Rule, Unbounded)), (table.name, field)
            if isinstance(limit, Bound):
                assert limit.low <= limit.high and limit.unit, (table.name, field)
            if isinstance(limit, Text):
                assert 0 <= limit.min_chars <= limit.max_chars, (table.name, field)


def test_the_rendered_document_lists_every_table_and_the_unbounded_rows():
    text = bounds.render()
    for table in bounds.TABLES:
        assert f"## {table.name}\n" in text
    unbounded = [f for t in bounds.TABLES for f, limit in t.rows if isinstance(limit, Unbounded)]
    assert text.count("| **unbounded** |") == len(unbounded)
    assert "tests/hostile/" in text


# ------------------------------------------------------------------------------ jobs.yaml

def job_file(**fields) -> str:
    import yaml

    return yaml.safe_dump({"jobs": [{"name": "j", "model": "opt-175b", **fields}]})


def test_a_command_agents_cannot_take_is_refused_in_jobs_yaml():
    with pytest.raises(InputError, match="command.*256 words"):
        parse_jobs(job_file(command=["python"] + ["x"] * 300), "jobs.yaml")
    with pytest.raises(InputError, match="command"):
        parse_jobs(job_file(command=["python", "a" * (MAX_COMMAND_CHARS + 1)]), "jobs.yaml")
    assert parse_jobs(job_file(command=["python"] + ["x"] * 255), "jobs.yaml")[0].command


@pytest.mark.parametrize("model", ["m" * 129, "bad\x1b[2Jmodel"])
def test_a_model_name_past_its_bound_is_refused(model):
    with pytest.raises(InputError, match="model"):
        parse_jobs(job_file(model=model, params=1e9, layers=2, hidden=64, seq_len=16,
                            global_batch=4), "jobs.yaml")
