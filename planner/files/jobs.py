"""jobs.yaml (docs/DESIGN.md) -> list[Job], validated: one-line errors name file, line, job, field."""

from __future__ import annotations

import shlex
from pathlib import Path

from hulk.errors import InputError
from hulk.userfile import line_of, load_yaml, read_user_file
from hulk.wire.placement import MAX_COMMAND_WORDS, MAX_PATH, valid_job_name
from hulk.validate import Invalid
from planner.core.jobs import (DTYPE_FIELDS, MODEL_CATALOG, SYNC_FIELDS, Job, check_dtype,
                               check_job_field, parse_sync)

INT_FIELDS = ("layers", "hidden", "seq_len", "global_batch", "micro_batch", "steps",
              "max_restarts")
NUMBER_FIELDS = ("params",) + INT_FIELDS
# What a model outside the catalog must give; micro_batch and steps have defaults.
REQUIRED_WITHOUT_CATALOG = ("params", "layers", "hidden", "seq_len", "global_batch")
JOB_KEYS = frozenset({"name", "model", "command", "checkpoint_dir", "sync", *SYNC_FIELDS,
                      *DTYPE_FIELDS, *NUMBER_FIELDS})
TOP_KEYS = frozenset({"jobs"})
MAX_MODEL_CHARS = 128
MAX_JOBS_FILE_BYTES = 16 << 20    # thousands of jobs; a larger file is no jobs.yaml
# A command's words, all together: with JSON's escapes it still fits a placement message.
MAX_COMMAND_CHARS = 16_384


_line = line_of    # the line of a key of a mapping load_yaml made (hulk/userfile.py)


def parse_jobs(text: str, path: str = "<jobs>") -> list[Job]:
    """Parse and validate jobs.yaml text; ``path`` only names the source in errors."""
    data = load_yaml(text, path, "a jobs file")
    if data is None:
        raise InputError("empty file: expected a mapping with a 'jobs' list", path=path)
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping with a 'jobs' list, got {type(data).__name__}",
                         path=path)
    for key in data:
        if key not in TOP_KEYS:
            raise InputError(f"unknown key {key!r} (expected: jobs)", path=path,
                             line=_line(data, key))
    entries = data.get("jobs")
    if not isinstance(entries, list) or not entries:
        raise InputError("'jobs' must be a non-empty list of jobs", path=path,
                         line=_line(data, "jobs"), field="jobs")
    jobs: list[Job] = []
    lines: dict[str, int | None] = {}
    for index, entry in enumerate(entries):
        job = _parse_job(entry, index, path)
        if job.name in lines:
            where = f" (first at line {lines[job.name]})" if lines[job.name] else ""
            raise InputError(f"job {job.name!r}: duplicate name{where}", path=path,
                             line=_line(entry, "name"), field="name")
        lines[job.name] = _line(entry, "name")
        jobs.append(job)
    return jobs


def load_jobs(path: str | Path) -> list[Job]:
    """Read and validate a jobs.yaml file."""
    data = read_user_file(path, "a jobs.yaml file", MAX_JOBS_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not a text file (expected UTF-8 YAML)", path=str(path)) from None
    return parse_jobs(text, str(path))


def _parse_job(entry, index: int, path: str) -> Job:
    name = _job_name(entry, index, path)
    label = f"job {name!r}"

    def fail(field: str, message: str) -> InputError:
        return InputError(f"{label}: {message}", path=path, line=_line(entry, field), field=field)

    for key in entry:
        if key not in JOB_KEYS:
            raise fail(str(key), f"unknown key (expected one of: {', '.join(sorted(JOB_KEYS))})")
    model, fields = _model_fields(entry.get("model"), entry, fail)
    fields.update(_numbers(entry, fail))
    command = _command(entry.get("command"), fail)
    checkpoint_dir = _checkpoint_dir(entry.get("checkpoint_dir"), fail)
    fields.setdefault("micro_batch", 1)
    fields.setdefault("steps", 1000)
    if fields["micro_batch"] > fields["global_batch"]:
        raise fail("micro_batch", f"{fields['micro_batch']} is larger than global_batch "
                                  f"{fields['global_batch']}")
    try:
        sync = parse_sync(entry.get("sync"), layers=fields["layers"],
                          **{key: entry.get(key) for key in SYNC_FIELDS})
        dtypes = {key: check_dtype(key, entry.get(key)) for key in DTYPE_FIELDS}
    except Invalid as bad:
        raise fail(bad.field, bad.expected) from None
    return Job(name=name, model=model, command=command, checkpoint_dir=checkpoint_dir,
               sync=sync, **dtypes, **fields)


def _job_name(entry, index: int, path: str) -> str:
    """The job's name: its own, else its catalog model's; a valid folder name on every node."""
    label = f"job #{index + 1}"
    if not isinstance(entry, dict):
        raise InputError(f"{label}: expected a mapping of job fields, got {type(entry).__name__}",
                         path=path)
    if "name" in entry:
        name = entry["name"]
        if not isinstance(name, (str, int)) or isinstance(name, bool) or not str(name).strip():
            raise InputError(f"{label}: name must be a non-empty string", path=path,
                             line=_line(entry, "name"), field="name")
        name = str(name).strip()
    elif "model" in entry and isinstance(entry["model"], str):
        name = entry["model"].strip()
    else:
        raise InputError(f"{label}: missing (each job needs a name or a catalog model)",
                         path=path, line=_line(entry), field="name")
    if not valid_job_name(name):
        raise InputError(f"job {name!r}: name must be 1-64 letters, digits, '.', '_' or '-' "
                         "(it names the job's folder on each node)", path=path,
                         line=_line(entry, "name" if "name" in entry else "model"), field="name")
    return name


def _model_fields(model, entry, fail) -> tuple[str | None, dict]:
    """The catalog model's name and fields; a job outside the catalog must describe itself."""
    if model is not None:
        if not isinstance(model, str) or not model.strip():
            raise fail("model", "must be a model name")
        if len(model) > MAX_MODEL_CHARS or not model.isprintable():
            raise fail("model", f"must be a model name of at most {MAX_MODEL_CHARS} printable "
                                "characters")
        model = model.strip()
    if model is not None and model.casefold() in MODEL_CATALOG:
        return model.casefold(), dict(MODEL_CATALOG[model.casefold()])
    absent = [f for f in REQUIRED_WITHOUT_CATALOG if f not in entry]
    if absent:
        what = (f"model {model!r} is not in the catalog" if model is not None
                else "no catalog model given")
        raise fail(absent[0], f"{what} and the job does not describe it: missing "
                              f"{', '.join(absent)} (catalog: {', '.join(sorted(MODEL_CATALOG))})")
    return model, {}


def _numbers(entry, fail) -> dict:
    """The job's numbers, each within its bound (planner.core.jobs.JOB_BOUNDS)."""
    fields = {}
    for key in NUMBER_FIELDS:
        if key in entry:
            try:
                fields[key] = check_job_field(key, entry[key])
            except Invalid as bad:
                raise fail(key, bad.expected) from None
    return fields


def _checkpoint_dir(value, fail) -> str | None:
    """Where every rank keeps its checkpoints: an absolute path, or a relative one that the job's
    working directory on each node (``state_dir/jobs/<job>/``) resolves and that stays inside it."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise fail("checkpoint_dir", "must be a path (absolute, or relative to the job's folder)")
    if "\0" in value or len(value) > MAX_PATH:
        raise fail("checkpoint_dir", f"must be a path of at most {MAX_PATH} characters")
    if not value.startswith("/") and ".." in value.split("/"):
        raise fail("checkpoint_dir", "a relative path must stay inside the job's folder (no '..')")
    return value


def _command(value, fail) -> tuple[str, ...] | None:
    """The argv agents launch: a list of strings, or a string split as a shell would (no shell
    runs it: no pipes, variables or globs)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise fail("command", f"cannot split {value!r} into words ({exc})") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise fail("command", "must be a string or a list of strings (the argv agents launch)")
    if not argv or not argv[0] or any("\0" in a for a in argv):
        raise fail("command", "must name a program")
    if len(argv) > MAX_COMMAND_WORDS or sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise fail("command", f"must have at most {MAX_COMMAND_WORDS} words and "
                              f"{MAX_COMMAND_CHARS:,} characters (agents refuse longer ones), "
                              f"got {len(argv)} words")
    return tuple(argv)
