"""jobs.yaml: catalog defaults, overrides, and one-line errors naming file, line, job and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hulk.errors import InputError
from planner.core.jobs import MODEL_CATALOG
from planner.files.jobs import load_jobs


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_jobs(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_catalog_defaults_and_overrides(tmp_path):
    jobs = load_jobs(write(tmp_path, """
jobs:
  - name: a
    model: gpt2-xl
    steps: 10
    global_batch: 64
    command: "python train.py"
  - model: bert-large
"""))
    a, b = jobs
    assert (a.name, a.model, a.steps, a.global_batch, a.command) == ("a", "gpt2-xl", 10, 64, ("python", "train.py"))
    assert a.params == MODEL_CATALOG["gpt2-xl"]["params"] and a.layers == 48
    assert b.name == "bert-large" and b.global_batch == MODEL_CATALOG["bert-large"]["global_batch"]


def test_fully_described_model_and_unquoted_exponent(tmp_path):
    (job,) = load_jobs(write(tmp_path, """
jobs:
  - {name: custom, params: 124e6, layers: 12, hidden: 768, seq_len: 1024, global_batch: 64}
"""))
    assert job.params == 124e6 and job.micro_batch == 1 and job.steps == 1000 and job.model is None


def test_paper_job_sets_load(shared_dir):
    for name, count in (("paper-4-jobs.yaml", 4), ("paper-6-jobs.yaml", 6)):
        jobs = load_jobs(shared_dir / "bench" / name)
        assert len(jobs) == count and jobs[0].name == "opt-175b" and jobs[0].params == 175e9


@pytest.mark.parametrize("text, expected", [
    ("jobs: [\n  {name: a", "not valid YAML"),
    ("just a string\n", "expected a mapping with a 'jobs' list"),
    ("", "empty file"),
    ("jobs: []\n", "jobs: 'jobs' must be a non-empty list"),
    ("jobz:\n  - {model: gpt2-xl}\n", ":1: unknown key 'jobz'"),
    ("jobs:\n  - name: a\n    model: gpt2-xl\n    epochs: 3\n", ":4: epochs: job 'a': unknown key"),
    ("jobs:\n  - {name: a, model: gpt2-xl, steps: 0}\n", "steps: job 'a': expected a whole number of steps between 1 and 1,000,000,000, got 0"),
    ("jobs:\n  - {name: a, model: gpt2-xl, steps: -5}\n", "steps: job 'a': expected a whole number of steps between 1"),
    ("jobs:\n  - {name: a, model: gpt2-xl, layers: 12.5}\n", "layers: job 'a': expected a whole number of layers between 1 and 10,000, got 12.5"),
    ("jobs:\n  - {name: a, model: gpt2-xl, layers: many}\n", "layers: job 'a': expected a whole number of layers between 1 and 10,000, got 'many'"),
    ("jobs:\n  - {name: a, model: gpt2-xl, params: -1.0}\n", "params: job 'a': expected a parameter count between 1000 and 1e+13, got -1.0"),
    ("jobs:\n  - {name: a, model: gpt2-xl, params: lots}\n", "params: job 'a': expected a parameter count between"),
    ("jobs:\n  - {name: a, model: gpt2-xl, params: 1.0e-300}\n", "params: job 'a': expected a parameter count between 1000 and 1e+13, got 1e-300"),
    ("jobs:\n  - {name: a, model: gpt2-xl, hidden: .inf}\n", "hidden: job 'a': expected a whole number of hidden units between 1 and 1,048,576, got inf"),
    ("jobs:\n  - {name: a, model: gpt2-xl, global_batch: true}\n", "global_batch: job 'a': expected a whole number of sequences between 1 and 16,777,216, got True"),
    ("jobs:\n  - {name: a, model: gpt2-xl}\n  - {name: a, model: bert-large}\n", ":3: name: job 'a': duplicate name"),
    ("jobs:\n  - {name: a, model: gpt-9}\n", "job 'a': model 'gpt-9' is not in the catalog and the job does not describe it: missing params"),
    ("jobs:\n  - {name: a, params: 1e9, layers: 10}\n", "hidden: job 'a': no catalog model given"),
    ("jobs:\n  - {steps: 5}\n", "name: job #1: missing"),
    ("jobs:\n  - 42\n", "job #1: expected a mapping"),
    ("jobs:\n  - {name: a, model: gpt2-xl, micro_batch: 1024}\n", "micro_batch: job 'a': 1024 is larger than global_batch"),
    ("jobs:\n  - {name: a, model: gpt2-xl, command: [1, 2]}\n", "command: job 'a': must be a string or a list"),
    ("jobs:\n  - {name: a, model: gpt2-xl, command: []}\n", "command: job 'a': must name a program"),
    ("jobs:\n  - {name: a, model: gpt2-xl, command: 'python \"x'}\n", "command: job 'a': cannot split"),
    ("jobs:\n  - {name: ../x, model: gpt2-xl}\n", "name: job '../x': name must be 1-64 letters"),
    ("jobs:\n  - {name: '..', model: gpt2-xl}\n", "name: job '..': name must be 1-64"),
    ("jobs:\n  - {name: " + "x" * 65 + ", model: gpt2-xl}\n", "name must be 1-64"),
    ("jobs:\n  - {name: a, model: gpt2-xl, steps: 1, steps: 2}\n", ":2: not valid YAML: duplicate key 'steps'"),
])
def test_bad_input(tmp_path, text, expected):
    message = error_of(tmp_path, text)
    assert expected in message, message


def test_a_command_list_is_kept_as_argv(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - {name: a.b_c-1, model: gpt2-xl, command: [python, 'my script.py', --x]}\n")
    (job,) = load_jobs(path)
    assert job.name == "a.b_c-1" and job.command == ("python", "my script.py", "--x")


def test_not_yaml_names_the_line(tmp_path):
    message = error_of(tmp_path, "jobs:\n  - name: a\n   model: [unclosed\n")
    assert message.startswith(f"{tmp_path / 'jobs.yaml'}:") and "not valid YAML" in message


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_jobs(tmp_path / "nope.yaml")
    binary = tmp_path / "jobs.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(InputError, match="not a text file"):
        load_jobs(binary)
