"""jobs.yaml's gradient_dtype and activation_dtype (docs/DESIGN.md, jobs.yaml): fp16 when absent,
each of fp16, bf16, fp32 read as given, anything else one line naming file, line, job and field."""

from __future__ import annotations

import json

import pytest

from hulk.errors import InputError
from planner import cli
from planner.files.jobs import parse_jobs


def one(extra: str) -> str:
    return f"jobs:\n  - name: a\n    model: gpt2-xl\n{extra}"


@pytest.mark.parametrize("extra, gradient, activation", [
    ("", "fp16", "fp16"),
    ("    gradient_dtype: fp32\n", "fp32", "fp16"),
    ("    activation_dtype: fp32\n", "fp16", "fp32"),
    ("    gradient_dtype: bf16\n    activation_dtype: fp16\n", "bf16", "fp16"),
    ("    sync: diloco\n    outer_compression: int8\n    gradient_dtype: fp32\n", "fp32", "fp16"),
])
def test_good_dtype_fields(extra, gradient, activation):
    [job] = parse_jobs(one(extra))
    assert (job.gradient_dtype, job.activation_dtype) == (gradient, activation)


@pytest.mark.parametrize("extra, field, got", [
    ("    gradient_dtype: fp64\n", "gradient_dtype", "got 'fp64'"),
    ("    gradient_dtype: FP32\n", "gradient_dtype", "got 'FP32'"),
    ("    activation_dtype: 4\n", "activation_dtype", "got 4"),
    ("    activation_dtype: [fp32]\n", "activation_dtype", "got ['fp32']"),
    ("    activation_dtype:\n      - fp16\n", "activation_dtype", "got ['fp16']"),
    ("    gradient_dtype: ''\n", "gradient_dtype", "got ''"),
])
def test_a_bad_dtype_is_one_line_naming_the_field_and_the_choices(extra, field, got):
    with pytest.raises(InputError) as err:
        parse_jobs(one(extra), "jobs.yaml")
    text = str(err.value)
    assert text.startswith("jobs.yaml:4: ") and f" {field}: job 'a': " in text, text
    assert "expected one of fp16, bf16, fp32 (default fp16)" in text and got in text, text
    assert "\n" not in text


def test_the_cli_exits_2_on_a_bad_dtype(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(one("    gradient_dtype: double\n"))
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"name": "f", "nodes": [{"id": "a", "gpus": 8}]}))
    code = cli.main(["plan", str(jobs), "--fleet", str(fleet), "--no-compare"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "gradient_dtype: job 'a'" in err[0], err


def test_jobs_submit_stores_the_dtypes_and_serve_reads_them_back(tmp_path, capsys):
    from planner.service.store import Store

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - name: a\n    model: gpt2-xl\n    command: python train.py\n"
                    "    gradient_dtype: fp32\n    activation_dtype: bf16\n"
                    "  - name: b\n    model: gpt2-xl\n    command: python train.py\n")
    db = tmp_path / "planner.sqlite"
    assert cli.main(["jobs", "submit", str(jobs), "--db", str(db)]) == 0, capsys.readouterr().err
    store = Store(db)
    a, b = store.job_by_name("a"), store.job_by_name("b")
    assert a.spec["gradient_dtype"] == "fp32" and a.spec["activation_dtype"] == "bf16"
    assert (a.job.gradient_dtype, a.job.activation_dtype) == ("fp32", "bf16")
    assert "gradient_dtype" not in b.spec and (b.job.gradient_dtype, b.job.activation_dtype) == \
        ("fp16", "fp16")
