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

from hulk.atomic import write_output
from hulk.errors import InputError
from hulk.plural import count as plural
from hulk.userfile import read_user_file
from hulk.validate import Invalid, shown
from hulk.wire.placement import MAX_TEXT_CHARS, valid_job_name
from planner.core.costmodel import OuterSync, Placement, Stage
from planner.core.evaluate import PlanReport, evaluate
from planner.core.fleet import Network
from planner.core.jobs import COMPRESSION_BYTES, JOB_BOUNDS, SYNC_BOUNDS, Job
from planner.core.plan import Plan, Unplaced

FORMAT = "hulk-plan/1"
TOP_KEYS = ("format", "method", "fleet", "jobs", "totals", "unplaced")
JOB_KEYS = ("name", "phase", "micro_batch", "stages", "estimate")
# Optional, only for a job whose islands sync every H steps (docs/COSTMODEL.md section 9).
SYNC_KEYS = ("mode", "inner_steps", "compression", "streaming_fragments")
ISLAND_KEYS = ("replicas", "outer_group")
ESTIMATE_KEYS = ("iteration_s", "compute_s", "communication_s", "job_s")
TOTAL_KEYS = ("makespan_s", "sum_jct_s")
LOWER_BOUND_KEYS = ("seconds", "binding", "gap")   # optional: planner.core.lower_bound's verdict
# Whole numbers a plan holds: phases and node counts as placements carry them (int32), micro-
# batches and layers as jobs.yaml bounds them; texts as placements bound them.
MAX_COUNT = 2 ** 31 - 1
MAX_REASON_CHARS = 4096
MAX_PLAN_FILE_BYTES = 256 << 20   # a plan grows with the fleet: as large as a fleet file


def _num(x: float) -> float | None:
    """JSON has no infinity or NaN: those become null."""
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


def plan_to_json(plan: Plan, net: Network, report: PlanReport | None = None,
                 cost_model: str | None = None, lower_bound=None) -> dict[str, Any]:
    """The ``hulk-plan/1`` document. Jobs without stages (System C) cannot be written.
    ``cost_model``: which model made the estimates ("reference", "calibrated (FILE)");
    ``lower_bound``: a planner.core.lower_bound.LowerBound, written with the plan's gap."""
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
            **(_sync_json(p, r.estimate, ids) if p.outer is not None else {}),
        })
    return {
        "format": FORMAT,
        "method": plan.method,
        "fleet": {"nodes": net.n},
        "jobs": jobs,
        "totals": {"makespan_s": _num(report.makespan_s), "sum_jct_s": _num(report.sum_jct_s)},
        "unplaced": [{"name": u.name, "reason": u.reason} for u in plan.unplaced],
        **({"cost_model": cost_model} if cost_model else {}),
        **({"lower_bound": {"seconds": _num(lower_bound.seconds),
                            "binding": lower_bound.binding[:MAX_TEXT_CHARS],
                            "gap": _num(g) if (g := lower_bound.gap(report.makespan_s))
                            is not None and report.complete else None}}
           if lower_bound is not None else {}),
    }


def _sync_json(p: Placement, estimate, ids: list[str]) -> dict[str, Any]:
    """A low-communication job's choices, its islands and each stage's outer group (the node of
    each island's first replica, planner.core.costmodel_sync.outer_group)."""
    columns = [lo for lo, _ in p.island_columns()]
    return {"sync": {"mode": "diloco", "inner_steps": p.outer.inner_steps,
                     "compression": p.outer.compression,
                     "streaming_fragments": p.outer.streaming_fragments,
                     "outer_sync_s": _num(estimate.outer_sync_s)},
            "islands": {"replicas": list(p.island_sizes()),
                        "outer_group": [[ids[st.nodes[c]] for c in columns] for st in p.stages]}}


def write_plan(plan: Plan, net: Network, path: str | Path, report: PlanReport | None = None,
               cost_model: str | None = None, lower_bound=None) -> dict:
    doc = plan_to_json(plan, net, report, cost_model, lower_bound)
    write_output(path, json.dumps(doc, indent=2) + "\n", "plan")
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
    outer: OuterSync | None = None      # the islands' outer sync; None: every step
    islands: tuple[int, ...] = ()       # replicas per island


@dataclass(frozen=True)
class PlanDoc:
    method: str
    fleet_nodes: int
    jobs: tuple[JobDoc, ...]
    totals: dict[str, float | None]
    unplaced: tuple[Unplaced, ...]
    lower_bound: dict[str, Any] | None = None   # LOWER_BOUND_KEYS, where the file has them

    def placements(self, jobs: list[Job], net: Network) -> list[Placement]:
        """Rebuild Placements (node indices) to re-estimate the document with the cost model."""
        by_name = {j.name: j for j in jobs}
        out = []
        for jd in self.jobs:
            if jd.name not in by_name:
                raise InputError(f"job {jd.name!r} is not among the given jobs", field="jobs")
            stages = tuple(Stage(s.lo, s.hi, tuple(net.index[i] for i in s.nodes)) for s in jd.stages)
            out.append(Placement(by_name[jd.name], stages, jd.micro_batch, jd.phase,
                                 islands=jd.islands, outer=jd.outer))
        return out


def read_plan(path: str | Path, node_ids: list[str] | None = None) -> PlanDoc:
    raw = read_user_file(path, "a plan JSON", MAX_PLAN_FILE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read: {exc}", path=str(path)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", path=str(path), line=exc.lineno) from None
    except RecursionError:
        raise InputError("not a plan: JSON nested too deeply", path=str(path)) from None
    except ValueError as exc:   # an integer of thousands of digits
        raise InputError(f"not valid JSON: {exc}".split(";")[0][:120], path=str(path)) from None
    return parse_plan(data, str(path), node_ids)


def parse_plan(data: Any, path: str = "<plan>", node_ids: list[str] | None = None) -> PlanDoc:
    """Validate a ``hulk-plan/1`` document; with ``node_ids``, also that every node is known."""
    try:
        return _plan_doc(data, None if node_ids is None else set(node_ids))
    except Invalid as bad:
        raise bad.error(path=path) from None


def _plan_doc(data: Any, known: set[str] | None) -> PlanDoc:
    if isinstance(data, dict) and "cost_model" in data:   # optional: which model estimated
        if not isinstance(data["cost_model"], str):
            raise Invalid("expected the cost model's name", field="cost_model")
        data = {k: v for k, v in data.items() if k != "cost_model"}
    lower = None
    if isinstance(data, dict) and "lower_bound" in data:   # optional: no plan can beat it
        lower = _lower_bound(data["lower_bound"])
        data = {k: v for k, v in data.items() if k != "lower_bound"}
    _object(data, TOP_KEYS, "", "expected a JSON object")
    if data["format"] != FORMAT:
        raise Invalid(f"expected {FORMAT!r}, got {shown(data['format'])}", field="format")
    if not isinstance(data["method"], str) or not 1 <= len(data["method"]) <= MAX_TEXT_CHARS:
        raise Invalid(f"expected a method name of 1-{MAX_TEXT_CHARS} characters", field="method")
    fleet_nodes = _fleet_nodes(data["fleet"], known)
    names: set[str] = set()
    used_by_phase: dict[int, dict[str, str]] = {}
    jobs = tuple(_job(job, f"jobs[{n}]", known, names, used_by_phase)
                 for n, job in enumerate(_list(data["jobs"], "jobs")))
    totals = _numbers(data["totals"], TOTAL_KEYS, "totals")
    unplaced = tuple(_unplaced(u, f"unplaced[{n}]")
                     for n, u in enumerate(_list(data["unplaced"], "unplaced")))
    return PlanDoc(data["method"], fleet_nodes, jobs, totals, unplaced, lower)


def _lower_bound(value: Any) -> dict[str, Any]:
    _object(value, LOWER_BOUND_KEYS, "lower_bound", "expected {\"seconds\", \"binding\", \"gap\"}")
    if not isinstance(value["binding"], str) or not 1 <= len(value["binding"]) <= MAX_TEXT_CHARS:
        raise Invalid(f"expected the binding part's name of 1-{MAX_TEXT_CHARS} characters",
                      field="lower_bound.binding")
    return {"seconds": _number(value["seconds"], "lower_bound.seconds", nullable=True),
            "binding": value["binding"],
            "gap": _number(value["gap"], "lower_bound.gap", nullable=True)}


def _object(value: Any, keys: tuple[str, ...], where: str, expected: str) -> None:
    """An object with exactly ``keys``."""
    if not isinstance(value, dict):
        raise Invalid(expected, field=where)
    prefix = f"{where}." if where else ""
    for key in keys:
        if key not in value:
            raise Invalid("missing", field=prefix + key)
    extra = set(value) - set(keys)
    if extra:
        raise Invalid("unknown key", field=prefix + sorted(extra)[0])


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise Invalid("expected a list", field=where)
    return value


def _number(value: Any, where: str, *, integer: bool = False, minimum: int = 0,
            maximum: float = math.inf, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if (isinstance(value, bool) or not ok or not minimum <= value < math.inf   # also NaN
            or value > maximum):
        kind = "an integer" if integer else "a number"
        top = f" and <= {maximum:,}" if maximum < math.inf else ""
        raise Invalid(f"expected {kind} >= {minimum}{top}, got {shown(value)}", field=where)
    return value


def _numbers(value: Any, keys: tuple[str, ...], where: str) -> dict[str, float | None]:
    """An object of exactly ``keys``, each a number >= 0 or null."""
    if not isinstance(value, dict) or set(value) != set(keys):
        raise Invalid(f"expected keys {', '.join(keys)}", field=where)
    return {key: _number(value[key], f"{where}.{key}", nullable=True) for key in keys}


def _fleet_nodes(fleet: Any, known: set[str] | None) -> int:
    if not isinstance(fleet, dict) or "nodes" not in fleet:
        raise Invalid("expected {\"nodes\": N}", field="fleet")
    count = _number(fleet["nodes"], "fleet.nodes", integer=True, maximum=MAX_COUNT)
    if known is not None and count != len(known):
        raise Invalid(f"plan is for {plural(count, 'node')}, the fleet has {len(known)}",
                      field="fleet.nodes")
    return count


def _job(job: Any, where: str, known: set[str] | None, names: set[str],
         used_by_phase: dict[int, dict[str, str]]) -> JobDoc:
    """One job; ``names`` and ``used_by_phase`` gather what later jobs may not repeat."""
    sync = islands = None
    if isinstance(job, dict) and ("sync" in job or "islands" in job):
        sync, islands = job.get("sync"), job.get("islands")
        job = {k: v for k, v in job.items() if k not in ("sync", "islands")}
    _object(job, JOB_KEYS, where, "expected an object")
    name = job["name"]
    if not valid_job_name(name):
        raise Invalid(f"expected a job name of 1-64 letters, digits, '.', '_' or '-', got "
                      f"{shown(name)}", field=f"{where}.name")
    if name in names:
        raise Invalid(f"duplicate job {name!r}", field=f"{where}.name")
    names.add(name)
    phase = _number(job["phase"], f"{where}.phase", integer=True, maximum=MAX_COUNT)
    micro = _number(job["micro_batch"], f"{where}.micro_batch", integer=True, minimum=1,
                    maximum=JOB_BOUNDS["micro_batch"].high)
    stages = _stages(job["stages"], f"{where}.stages")
    _claim_nodes(stages, f"{where}.stages", name, known, used_by_phase.setdefault(phase, {}))
    estimate = _numbers(job["estimate"], ESTIMATE_KEYS, f"{where}.estimate")
    if sync is None and islands is None:
        return JobDoc(name, phase, micro, stages, estimate)
    outer = _outer(sync, f"{where}.sync", stages[-1].hi)
    sizes = _islands(islands, f"{where}.islands", stages)
    return JobDoc(name, phase, micro, stages, estimate, outer, sizes)


def _outer(value: Any, where: str, layers: int) -> OuterSync:
    if not isinstance(value, dict):
        raise Invalid("expected {\"mode\": \"diloco\", \"inner_steps\", \"compression\", "
                      "\"streaming_fragments\"} beside \"islands\"", field=where)
    value = {k: v for k, v in value.items() if k != "outer_sync_s"}   # an estimate, re-made
    _object(value, SYNC_KEYS, where, "expected an object")
    if value["mode"] != "diloco":
        raise Invalid(f"expected 'diloco', got {shown(value['mode'])}", field=f"{where}.mode")
    bound = SYNC_BOUNDS["inner_steps"]
    h = _number(value["inner_steps"], f"{where}.inner_steps", integer=True,
                minimum=int(bound.low), maximum=bound.high)
    if value["compression"] not in COMPRESSION_BYTES:
        raise Invalid(f"expected one of {', '.join(COMPRESSION_BYTES)}, got "
                      f"{shown(value['compression'])}", field=f"{where}.compression")
    fragments = _number(value["streaming_fragments"], f"{where}.streaming_fragments",
                        integer=True, maximum=layers)
    return OuterSync(h, value["compression"], fragments)


def _islands(value: Any, where: str, stages: tuple[StageDoc, ...]) -> tuple[int, ...]:
    """Replicas per island summing to the stages' width, and each stage's outer group the node
    of each island's first replica."""
    _object(value, ISLAND_KEYS, where, "expected {\"replicas\": [...], \"outer_group\": [...]}")
    width = len(stages[0].nodes)
    sizes = _list(value["replicas"], f"{where}.replicas")
    if not sizes or sum(_number(x, f"{where}.replicas", integer=True, minimum=1)
                        for x in sizes) != width:
        raise Invalid(f"expected whole numbers >= 1 summing to the {plural(width, 'replica')}, got "
                      f"{shown(sizes)}", field=f"{where}.replicas")
    firsts = [sum(sizes[:i]) for i in range(len(sizes))]
    expected = [[st.nodes[c] for c in firsts] for st in stages]
    if value["outer_group"] != expected:
        raise Invalid(f"expected each stage's first node of each island, {shown(expected, 80)}",
                      field=f"{where}.outer_group")
    return tuple(sizes)


def _stages(value: Any, where: str) -> tuple[StageDoc, ...]:
    """Contiguous layer ranges from 0, each stage with as many nodes as the first."""
    if not isinstance(value, list) or not value:
        raise Invalid("expected a non-empty list of stages", field=where)
    stages: list[StageDoc] = []
    for k, stage in enumerate(value):
        stages.append(_stage(stage, f"{where}[{k}]", stages[-1].hi if stages else 0,
                             len(stages[0].nodes) if stages else None))
    return tuple(stages)


def _stage(stage: Any, where: str, expected_lo: int, width: int | None) -> StageDoc:
    if not isinstance(stage, dict) or set(stage) != {"layers", "nodes"}:
        raise Invalid("expected {\"layers\": [lo, hi], \"nodes\": [ids]}", field=where)
    layers = stage["layers"]
    if (not isinstance(layers, list) or len(layers) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
        raise Invalid("expected [lo, hi] integers", field=f"{where}.layers")
    lo, hi = layers
    if hi > JOB_BOUNDS["layers"].high:
        raise Invalid(f"expected at most {JOB_BOUNDS['layers'].high:,} layers, got {shown(hi)}",
                      field=f"{where}.layers")
    if lo != expected_lo or hi <= lo:
        raise Invalid(f"expected [{expected_lo}, hi) with hi > {expected_lo}, got [{lo}, {hi}] "
                      "(ranges must be contiguous)", field=f"{where}.layers")
    nodes = stage["nodes"]
    if not isinstance(nodes, list) or not nodes or not all(
            isinstance(x, str) and 0 < len(x) <= MAX_TEXT_CHARS for x in nodes):
        raise Invalid(f"expected a non-empty list of node ids of 1-{MAX_TEXT_CHARS} characters",
                      field=f"{where}.nodes")
    if width is not None and len(nodes) != width:
        raise Invalid(f"every stage must list {plural(width, 'node')} (one per replica), got "
                      f"{len(nodes)}",
                      field=f"{where}.nodes")
    return StageDoc(lo, hi, tuple(nodes))


def _claim_nodes(stages: tuple[StageDoc, ...], where: str, name: str, known: set[str] | None,
                 used: dict[str, str]) -> None:
    """Every node known, and used by no other stage or job of the same phase."""
    for k, stage in enumerate(stages):
        for node in stage.nodes:
            if known is not None and node not in known:
                raise Invalid(f"unknown node {node!r}", field=f"{where}[{k}].nodes")
            other = used.get(node)
            if other is not None:
                raise Invalid(f"node {node!r} is used by {other!r} in the same phase",
                              field=f"{where}[{k}].nodes")
            used[node] = name


def _unplaced(value: Any, where: str) -> Unplaced:
    if (not isinstance(value, dict) or set(value) != {"name", "reason"}
            or not all(isinstance(value[k], str) for k in ("name", "reason"))
            or len(value["name"]) > MAX_TEXT_CHARS or len(value["reason"]) > MAX_REASON_CHARS):
        raise Invalid(f"expected {{\"name\": ..., \"reason\": ...}} of at most "
                      f"{MAX_TEXT_CHARS} and {MAX_REASON_CHARS} characters", field=where)
    return Unplaced(value["name"], value["reason"])
