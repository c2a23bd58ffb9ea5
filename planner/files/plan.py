"""Plan JSON, format ``hulk-plan/1`` exactly as docs/DESIGN.md gives it.

``plan_to_json`` / ``write_plan`` write the document with node ids; ``read_plan`` /
``parse_plan`` validate a document (structure, contiguous layer ranges, equal replicas per stage,
known node ids, disjoint nodes per phase) and raise ``InputError`` naming the file and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hulk.errors import InputError
from planner.core.costmodel import Placement, Stage
from planner.core.evaluate import PlanReport, evaluate
from planner.core.fleet import Network
from planner.core.jobs import Job
from planner.core.plan import Plan, Unplaced
from planner.files.atomic import write_text_atomic

FORMAT = "hulk-plan/1"
TOP_KEYS = ("format", "method", "fleet", "jobs", "totals", "unplaced")
JOB_KEYS = ("name", "phase", "micro_batch", "stages", "estimate")
ESTIMATE_KEYS = ("iteration_s", "compute_s", "communication_s", "job_s")
TOTAL_KEYS = ("makespan_s", "sum_jct_s")


def _num(x: float) -> float | None:
    """JSON has no infinity or NaN: those become null."""
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def plan_to_json(plan: Plan, net: Network, report: PlanReport | None = None) -> dict[str, Any]:
    """The ``hulk-plan/1`` document. Jobs without stages (System C) cannot be written."""
    if plan.job_s_override:
        raise InputError(f"method {plan.method}: tensor-parallel jobs cannot be written as "
                         "pipeline stages (hulk-plan/1)", field="--out")
    report = report or evaluate(plan, net)
    ids = net.ids
    jobs = []
    for r in report.jobs:
        p = r.placement
        jobs.append({
            "name": r.name,
            "phase": r.phase,
            "micro_batch": p.micro_batch,
            "stages": [{"layers": [st.lo, st.hi], "nodes": [ids[i] for i in st.nodes]}
                       for st in p.stages],
            "estimate": {k: _num(getattr(r.estimate, k)) for k in ESTIMATE_KEYS},
        })
    return {
        "format": FORMAT,
        "method": plan.method,
        "fleet": {"nodes": net.n},
        "jobs": jobs,
        "totals": {"makespan_s": _num(report.makespan_s), "sum_jct_s": _num(report.sum_jct_s)},
        "unplaced": [{"name": u.name, "reason": u.reason} for u in plan.unplaced],
    }


def write_plan(plan: Plan, net: Network, path: str | Path, report: PlanReport | None = None) -> dict:
    doc = plan_to_json(plan, net, report)
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n", "plan")
    return doc


# ----------------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class StageDoc:
    lo: int
    hi: int
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class JobDoc:
    name: str
    phase: int
    micro_batch: int
    stages: tuple[StageDoc, ...]
    estimate: dict[str, float | None]


@dataclass(frozen=True)
class PlanDoc:
    method: str
    fleet_nodes: int
    jobs: tuple[JobDoc, ...]
    totals: dict[str, float | None]
    unplaced: tuple[Unplaced, ...]

    def placements(self, jobs: list[Job], net: Network) -> list[Placement]:
        """Rebuild Placements (node indices) to re-estimate the document with the cost model."""
        by_name = {j.name: j for j in jobs}
        out = []
        for jd in self.jobs:
            if jd.name not in by_name:
                raise InputError(f"job {jd.name!r} is not among the given jobs", field="jobs")
            stages = tuple(Stage(s.lo, s.hi, tuple(net.index[i] for i in s.nodes)) for s in jd.stages)
            out.append(Placement(by_name[jd.name], stages, jd.micro_batch, jd.phase))
        return out


def read_plan(path: str | Path, node_ids: list[str] | None = None) -> PlanDoc:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("no such file", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", path=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", path=str(path), line=exc.lineno) from None
    return parse_plan(data, str(path), node_ids)


def parse_plan(data: Any, path: str = "<plan>", node_ids: list[str] | None = None) -> PlanDoc:
    """Validate a ``hulk-plan/1`` document; with ``node_ids``, also that every node is known."""
    def fail(where: str, message: str) -> InputError:
        return InputError(message, path=path, field=where)

    def number(value, where: str, *, integer=False, minimum=0, nullable=False):
        if value is None and nullable:
            return None
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value < minimum:
            kind = "an integer" if integer else "a number"
            raise fail(where, f"expected {kind} >= {minimum}, got {value!r}")
        return value

    if not isinstance(data, dict):
        raise fail("", "expected a JSON object")
    for key in TOP_KEYS:
        if key not in data:
            raise fail(key, "missing")
    extra = set(data) - set(TOP_KEYS)
    if extra:
        raise fail(sorted(extra)[0], "unknown key")
    if data["format"] != FORMAT:
        raise fail("format", f"expected {FORMAT!r}, got {data['format']!r}")
    if not isinstance(data["method"], str) or not data["method"]:
        raise fail("method", "expected a method name")
    fleet = data["fleet"]
    if not isinstance(fleet, dict) or "nodes" not in fleet:
        raise fail("fleet", "expected {\"nodes\": N}")
    fleet_nodes = number(fleet["nodes"], "fleet.nodes", integer=True)
    known = set(node_ids) if node_ids is not None else None
    if known is not None and fleet_nodes != len(known):
        raise fail("fleet.nodes", f"plan is for {fleet_nodes} nodes, the fleet has {len(known)}")
    if not isinstance(data["jobs"], list):
        raise fail("jobs", "expected a list")
    jobs: list[JobDoc] = []
    names: set[str] = set()
    used_by_phase: dict[int, dict[str, str]] = {}
    for n, job in enumerate(data["jobs"]):
        where = f"jobs[{n}]"
        if not isinstance(job, dict):
            raise fail(where, "expected an object")
        for key in JOB_KEYS:
            if key not in job:
                raise fail(f"{where}.{key}", "missing")
        if set(job) - set(JOB_KEYS):
            raise fail(f"{where}.{sorted(set(job) - set(JOB_KEYS))[0]}", "unknown key")
        name = job["name"]
        if not isinstance(name, str) or not name:
            raise fail(f"{where}.name", "expected a job name")
        if name in names:
            raise fail(f"{where}.name", f"duplicate job {name!r}")
        names.add(name)
        phase = number(job["phase"], f"{where}.phase", integer=True)
        micro = number(job["micro_batch"], f"{where}.micro_batch", integer=True, minimum=1)
        if not isinstance(job["stages"], list) or not job["stages"]:
            raise fail(f"{where}.stages", "expected a non-empty list of stages")
        stages: list[StageDoc] = []
        width = None
        for k, st in enumerate(job["stages"]):
            sw = f"{where}.stages[{k}]"
            if not isinstance(st, dict) or set(st) != {"layers", "nodes"}:
                raise fail(sw, "expected {\"layers\": [lo, hi], \"nodes\": [ids]}")
            layers = st["layers"]
            if (not isinstance(layers, list) or len(layers) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
                raise fail(f"{sw}.layers", "expected [lo, hi] integers")
            lo, hi = layers
            expected_lo = stages[-1].hi if stages else 0
            if lo != expected_lo or hi <= lo:
                raise fail(f"{sw}.layers", f"expected [{expected_lo}, hi) with hi > {expected_lo}, "
                                           f"got [{lo}, {hi}] (ranges must be contiguous)")
            nodes = st["nodes"]
            if not isinstance(nodes, list) or not nodes or not all(isinstance(x, str) for x in nodes):
                raise fail(f"{sw}.nodes", "expected a non-empty list of node ids")
            if width is None:
                width = len(nodes)
            elif len(nodes) != width:
                raise fail(f"{sw}.nodes", f"every stage must list {width} nodes (one per replica), "
                                          f"got {len(nodes)}")
            for node in nodes:
                if known is not None and node not in known:
                    raise fail(f"{sw}.nodes", f"unknown node {node!r}")
                other = used_by_phase.setdefault(phase, {}).get(node)
                if other is not None:
                    raise fail(f"{sw}.nodes", f"node {node!r} is used by {other!r} in the same phase")
                used_by_phase[phase][node] = name
            stages.append(StageDoc(lo, hi, tuple(nodes)))
        est = job["estimate"]
        if not isinstance(est, dict) or set(est) != set(ESTIMATE_KEYS):
            raise fail(f"{where}.estimate", f"expected keys {', '.join(ESTIMATE_KEYS)}")
        for key in ESTIMATE_KEYS:
            number(est[key], f"{where}.estimate.{key}", nullable=True)
        jobs.append(JobDoc(name, phase, micro, tuple(stages), dict(est)))
    totals = data["totals"]
    if not isinstance(totals, dict) or set(totals) != set(TOTAL_KEYS):
        raise fail("totals", f"expected keys {', '.join(TOTAL_KEYS)}")
    for key in TOTAL_KEYS:
        number(totals[key], f"totals.{key}", nullable=True)
    if not isinstance(data["unplaced"], list):
        raise fail("unplaced", "expected a list")
    unplaced = []
    for n, u in enumerate(data["unplaced"]):
        if (not isinstance(u, dict) or set(u) != {"name", "reason"}
                or not all(isinstance(u[k], str) for k in ("name", "reason"))):
            raise fail(f"unplaced[{n}]", "expected {\"name\": ..., \"reason\": ...}")
        unplaced.append(Unplaced(u["name"], u["reason"]))
    return PlanDoc(data["method"], fleet_nodes, tuple(jobs), dict(totals), tuple(unplaced))
