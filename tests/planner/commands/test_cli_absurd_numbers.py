"""Every numeric field of jobs.yaml and of a fleet file, given an absurd but well-formed number
(0, negative, 1e-300, 1e300, infinity, NaN, an integer of hundreds of digits), ends
`hulk-planner plan` with exit 2 and one stderr line naming the field: never exit 1, never a
traceback. The cases are a fixed list plus a seeded random draw of magnitudes."""

from __future__ import annotations

import json
import math
import random

import pytest

from planner import cli
from planner.core.fleet import FLEET_BOUNDS
from planner.core.jobs import JOB_BOUNDS
from planner.files.fleet import load_fleet
from planner.files.jobs import load_jobs

JOB = {"name": "tiny", "params": 124.0e6, "layers": 12, "hidden": 768, "seq_len": 1024,
       "global_batch": 256, "micro_batch": 8, "steps": 20}
NODE = {"id": "a", "city": "Paris", "site": "par", "gpus": 8, "gpu_name": "A100-SXM4-80GB",
        "compute_capability": 8.0, "memory_gb": 640.0, "latitude": 48.8, "longitude": 2.3}
LINK = {"src": "a", "dst": "b", "rtt_ms": 1.0, "bandwidth_gbps": 10.0, "loss": 0.0, "samples": 5}
FLEET = {"name": "f", "sites": [{"id": "par", "lat": 48.8, "lon": 2.3}],
         "nodes": [NODE, dict(NODE, id="b")], "links": [LINK],
         "site_links": [dict(LINK, src="par", dst="par")]}
ANGLES = {"latitude": (-90, 90), "longitude": (-180, 180), "lat": (-90, 90), "lon": (-180, 180)}

# (section, index, key) of every number a fleet file holds.
FLEET_FIELDS = ([("nodes", 0, key) for key in ("gpus", "compute_capability", "memory_gb",
                                                "latitude", "longitude")]
                + [("links", 0, key) for key in ("rtt_ms", "bandwidth_gbps", "loss", "samples")]
                + [("sites", 0, key) for key in ("lat", "lon")]
                + [("site_links", 0, key) for key in ("rtt_ms", "bandwidth_gbps", "loss",
                                                      "samples")])

FIXED = [0, -1, -0.5, 1e-300, -1e-300, 1e300, -1e300, math.inf, -math.inf, math.nan, 2 ** 64,
         10 ** 400, 0.5, 1e15]


def drawn(seed: int = 25, count: int = 8) -> list:
    """Seeded random magnitudes: tiny and huge floats of either sign, and long integers."""
    rng = random.Random(seed)
    out: list = []
    for _ in range(count):
        out.append(rng.choice((-1, 1)) * 10 ** rng.uniform(-320, 308))
        out.append(rng.choice((-1, 1)) * 2 ** rng.randint(54, 1500))
    return out


ABSURD = FIXED + drawn()


def outside(value, low: float, high: float, integer: bool) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return True
    if not low <= value <= high:
        return True
    return integer and isinstance(value, float) and not value.is_integer()


def bounds_of(key: str):
    if key in ANGLES:
        return (*ANGLES[key], False)
    bound = JOB_BOUNDS.get(key) or FLEET_BOUNDS[key]
    return bound.low, bound.high, bound.integer


def yaml_number(value) -> str:
    if isinstance(value, float) and math.isnan(value):
        return ".nan"
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def write_jobs(path, key: str | None = None, value=None):
    lines = ["jobs:", "  - name: tiny"]
    for field, default in JOB.items():
        if field != "name":
            lines.append(f"    {field}: {yaml_number(value) if field == key else default}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_fleet(path, where=None, value=None):
    doc = json.loads(json.dumps(FLEET))
    if where is not None:
        section, index, key = where
        doc[section][index][key] = value
    path.write_text(json.dumps(doc, indent=1))
    return path


def plan(capsys, jobs, fleet) -> tuple[int, list[str]]:
    code = cli.main(["plan", str(jobs), "--fleet", str(fleet), "--no-compare"])
    return code, capsys.readouterr().err.splitlines()


def test_the_untouched_files_are_valid(tmp_path):
    assert [job.params for job in load_jobs(write_jobs(tmp_path / "jobs.yaml"))] == [124.0e6]
    assert len(load_fleet(write_fleet(tmp_path / "fleet.json")).nodes) == 2


def test_the_draw_is_fixed():
    assert drawn() == drawn() and drawn() != drawn(seed=26) and len(ABSURD) == len(FIXED) + 16


@pytest.mark.parametrize("key", [k for k in JOB if k != "name"])
def test_an_absurd_job_number_is_one_line_naming_the_field(key, tmp_path, capsys):
    fleet = write_fleet(tmp_path / "fleet.json")
    tried = 0
    for value in ABSURD:
        if not outside(value, *bounds_of(key)):
            continue
        tried += 1
        code, err = plan(capsys, write_jobs(tmp_path / "jobs.yaml", key, value), fleet)
        assert code == 2 and len(err) == 1, (key, value, err)
        assert err[0].startswith("hulk-planner: ") and f" {key}: job 'tiny': expected " in err[0]
    assert tried >= 10


@pytest.mark.parametrize("where", FLEET_FIELDS, ids=lambda w: f"{w[0]}.{w[2]}")
def test_an_absurd_fleet_number_is_one_line_naming_the_field(where, tmp_path, capsys):
    jobs = write_jobs(tmp_path / "jobs.yaml")
    section, index, key = where
    tried = 0
    for value in ABSURD:
        if not outside(value, *bounds_of(key)):
            continue
        tried += 1
        code, err = plan(capsys, jobs, write_fleet(tmp_path / "fleet.json", where, value))
        assert code == 2 and len(err) == 1, (where, value, err)
        assert err[0].startswith("hulk-planner: ") and f"{section}[{index}].{key}: expected " \
            in err[0], (where, value, err)
    assert tried >= 8


AT_BOUNDS = {
    "all highest": {key: bound.high for key, bound in JOB_BOUNDS.items()},
    "all lowest": {key: bound.low for key, bound in JOB_BOUNDS.items()},
    "highest but params": {**{key: bound.high for key, bound in JOB_BOUNDS.items()},
                           "params": 1e9},
}


@pytest.mark.parametrize("fields", AT_BOUNDS.values(), ids=AT_BOUNDS.keys())
def test_numbers_at_their_bounds_plan_or_say_why(fields, tmp_path, capsys):
    lines = ["jobs:", "  - name: edge"] + [f"    {key}: {value!r}" for key, value in fields.items()]
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("\n".join(lines) + "\n")
    code = cli.main(["plan", str(jobs), "--fleet", str(write_fleet(tmp_path / "fleet.json")),
                     "--no-compare", "--time-budget", "1", "--workers", "1"])
    err = capsys.readouterr().err.splitlines()
    assert code in (0, 2) and "internal error" not in " ".join(err), err
    assert code == 0 or (len(err) == 1 and "edge" in err[0]), err
