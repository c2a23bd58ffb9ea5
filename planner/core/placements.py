"""A plan, spelled out per node: the placement messages and the plan summary built from a Plan.

Pure: a Plan over a Network (node indices) in, one ``NodePlacement`` per node that has work out
(``build_node_placements``), plus the plan summary document (``build_summary``) and the way back
from a parsed summary to a Plan (``plan_from_summary``, used by recovery), and a placement's
stages as a job record keeps them (``stages_doc``, ``placement_from_stages``). The message formats
themselves are the wire contract, ``hulk.wire.placement``.

Every job gets its own rendezvous port, ``base_port + (index of its name among the plan's sorted
job names)``, so re-planning one job leaves the others' ports alone.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from typing import Any

from hulk.errors import InputError
from hulk.validate import Invalid
from hulk.wire.placement import SUMMARY_FORMAT, NodePlacement, PlanSummary, Role
from planner.core.costmodel import OuterSync, Placement, Stage, micro_batches
from planner.core.fleet import Network
from planner.core.jobs import (COMPRESSION_BYTES, DEFAULT_MAX_RESTARTS, DTYPE_FIELDS, SYNC_FIELDS,
                               Job, check_dtype, check_job_field, dtype_fields, parse_sync,
                               sync_fields)
from planner.core.plan import Plan

DEFAULT_BASE_PORT = 29500


def command_argv(command: Any) -> tuple[str, ...] | None:
    """A job's command as the argv placements carry (a string is split as a shell would)."""
    if command is None:
        return None
    argv = tuple(shlex.split(command)) if isinstance(command, str) else tuple(command)
    if not argv or not all(isinstance(a, str) for a in argv):
        raise InputError(f"expected a command (argv list of strings), got {command!r}", field="command")
    return argv


# ----------------------------------------------------------------------------------- building

def job_ports(job_names: list[str] | set[str], base_port: int = DEFAULT_BASE_PORT) -> dict[str, int]:
    """One rendezvous port per job: stable for a given set of job names."""
    return {name: base_port + i for i, name in enumerate(sorted(set(job_names)))}


def placement_roles(placement: Placement, node_ids: list[str], *, plan_id: str, port: int,
                    addresses: Mapping[str, str], restart_count: int = 0) -> dict[str, Role]:
    """node id -> Role for one job's placement (node indices resolved through ``node_ids``).

    ``restart_count``: how many times the job has been placed again (0 the first time)."""
    d = placement.replicas
    m = micro_batches(placement.job, d, placement.micro_batch)
    k_stages = placement.num_stages
    first = node_ids[placement.stages[0].nodes[0]]
    address = addresses.get(first) or first
    island_of = [i for i, size in enumerate(placement.island_sizes()) for _ in range(size)]
    outer = placement.outer
    sync = {} if outer is None else dict(
        sync="diloco", inner_steps=outer.inner_steps, outer_compression=outer.compression,
        streaming_fragments=outer.streaming_fragments,
        num_islands=len(placement.island_sizes()))
    roles: dict[str, Role] = {}
    for k, stage in enumerate(placement.stages):
        for p, index in enumerate(stage.nodes):
            node = node_ids[index]
            island = {"island": island_of[p]} if outer is not None else {}
            roles[node] = Role(
                plan_id=plan_id, job=placement.job.name, phase=placement.phase, stage=k,
                num_stages=k_stages, layer_lo=stage.lo, layer_hi=stage.hi, replica=p,
                num_replicas=d, rank=k * d + p, world_size=k_stages * d,
                rendezvous_address=address, rendezvous_port=port,
                micro_batch=placement.micro_batch, command=command_argv(placement.job.command),
                micro_batches=m, checkpoint_dir=placement.job.checkpoint_dir,
                restart_count=restart_count, **sync, **island)
    return roles


def build_node_placements(plan: Plan, net: Network, *, fleet: str, plan_id: str,
                          addresses: Mapping[str, str] | None = None,
                          base_port: int = DEFAULT_BASE_PORT,
                          job_plan_ids: Mapping[str, str] | None = None,
                          extra_job_names: list[str] | tuple[str, ...] = (),
                          restart_counts: Mapping[str, int] | None = None) -> dict[str, NodePlacement]:
    """node id -> NodePlacement for every node with at least one role.

    ``addresses``: node id -> the address peers reach it at (the rank-0 node's becomes the
    rendezvous address); a node without one is addressed by its id (a host name).
    ``job_plan_ids``: plan id per job where it differs from ``plan_id`` (jobs a re-plan kept).
    ``extra_job_names``: names that take part in port numbering though not placed (unplaced jobs).
    ``restart_counts``: per job, how many times it has been placed again (absent: 0).
    """
    addresses = addresses or {}
    restart_counts = restart_counts or {}
    job_plan_ids = job_plan_ids or {}
    names = [p.job.name for p in plan.placements] + [u.name for u in plan.unplaced]
    ports = job_ports(names + list(extra_job_names), base_port)
    per_node: dict[str, list[Role]] = {}
    for placement in plan.placements:
        roles = placement_roles(placement, net.ids, plan_id=job_plan_ids.get(placement.job.name, plan_id),
                                port=ports[placement.job.name], addresses=addresses,
                                restart_count=restart_counts.get(placement.job.name, 0))
        for node, role in roles.items():
            per_node.setdefault(node, []).append(role)
    return {node: NodePlacement(fleet=fleet, node=node, plan_id=plan_id,
                                roles=tuple(sorted(roles, key=lambda r: (r.phase, r.job))))
            for node, roles in per_node.items()}


def job_spec(job: Job) -> dict[str, Any]:
    return {"model": job.model, "params": job.params, "layers": job.layers, "hidden": job.hidden,
            "seq_len": job.seq_len, "global_batch": job.global_batch, "micro_batch": job.micro_batch,
            "steps": job.steps,
            "command": list(argv) if (argv := command_argv(job.command)) is not None else None,
            **({"checkpoint_dir": job.checkpoint_dir} if job.checkpoint_dir is not None else {}),
            **({"max_restarts": job.max_restarts}
               if job.max_restarts != DEFAULT_MAX_RESTARTS else {}),
            **sync_fields(job.sync), **dtype_fields(job)}


def build_summary(plan: Plan, net: Network, *, fleet: str, plan_id: str, issued_at_ms: int,
                  node_placements: Mapping[str, NodePlacement], expires_at_ms: int = 0,
                  job_plan_ids: Mapping[str, str] | None = None,
                  jobs: list[Job] | None = None) -> dict[str, Any]:
    """The retained plan summary: jobs with stages as node ids, their specs, and each node's jobs."""
    job_plan_ids = job_plan_ids or {}
    specs = {j.name: j for j in (jobs or [])}
    out_jobs = []
    for placement in plan.placements:
        specs.setdefault(placement.job.name, placement.job)
        rank0_node = node_placements.get(net.ids[placement.stages[0].nodes[0]])
        rank0 = [r for r in rank0_node.roles if r.job == placement.job.name] if rank0_node else []
        out_jobs.append({
            "name": placement.job.name,
            "plan_id": job_plan_ids.get(placement.job.name, plan_id),
            "phase": placement.phase,
            "micro_batch": placement.micro_batch,
            "stages": [{"layers": [st.lo, st.hi], "nodes": [net.ids[i] for i in st.nodes]}
                       for st in placement.stages],
            "rendezvous": ({"address": rank0[0].rendezvous_address, "port": rank0[0].rendezvous_port}
                           if rank0 else None),
            "spec": job_spec(placement.job),
            **({"islands": list(placement.island_sizes()),
                "outer": {"inner_steps": placement.outer.inner_steps,
                          "compression": placement.outer.compression,
                          "streaming_fragments": placement.outer.streaming_fragments}}
               if placement.outer is not None else {}),
        })
    return {
        "format": SUMMARY_FORMAT,
        "fleet": fleet,
        "plan_id": plan_id,
        "method": plan.method,
        "issued_at_ms": issued_at_ms,
        "expires_at_ms": expires_at_ms,
        "jobs": out_jobs,
        "unplaced": [{"name": u.name, "reason": u.reason,
                      **({"spec": job_spec(specs[u.name])} if u.name in specs else {})}
                     for u in plan.unplaced],
        "nodes": {node: [r.job for r in np_.roles] for node, np_ in sorted(node_placements.items())},
    }


def job_from_spec(name: str, spec: Mapping[str, Any]) -> Job:
    """Rebuild a Job from a summary's spec (a job record's too); one stored before the dtype
    fields existed has none and is fp16, the default."""
    try:
        params = float(spec["params"])
        if not math.isfinite(params) or params <= 0:
            raise ValueError
        return Job(name=name, params=params, layers=int(spec["layers"]), hidden=int(spec["hidden"]),
                   seq_len=int(spec["seq_len"]), global_batch=int(spec["global_batch"]),
                   micro_batch=int(spec.get("micro_batch") or 1), steps=int(spec.get("steps") or 1),
                   model=spec.get("model"), command=command_argv(spec.get("command")),
                   checkpoint_dir=_spec_path(spec.get("checkpoint_dir")),
                   max_restarts=spec_max_restarts(spec), sync=_spec_sync(spec),
                   **{key: check_dtype(key, spec.get(key)) for key in DTYPE_FIELDS})
    except Invalid as bad:
        raise InputError(bad.expected, path="plan summary", field=f"{name}.spec.{bad.field}") from None
    except (KeyError, TypeError, ValueError, InputError):
        raise InputError("expected params, layers, hidden, seq_len, global_batch",
                         path="plan summary", field=f"{name}.spec") from None


def _spec_sync(spec: Mapping[str, Any]):
    """A spec's Sync (``step`` when it gives none); Invalid naming the field when bad."""
    return parse_sync(spec.get("sync"), layers=int(spec["layers"]),
                      **{key: spec.get(key) for key in SYNC_FIELDS})


def spec_max_restarts(spec: Mapping[str, Any]) -> int:
    """A spec's max_restarts (the default when absent); ValueError when out of its bound."""
    value = spec.get("max_restarts", DEFAULT_MAX_RESTARTS)
    try:
        return int(check_job_field("max_restarts", value))
    except Invalid:
        raise ValueError(value) from None


def _spec_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise ValueError(value)
    return value


def plan_from_summary(summary: PlanSummary, net: Network) -> tuple[Plan, dict[str, str], list[str]]:
    """(Plan over ``net``'s indices, plan id per job, names of jobs whose nodes ``net`` lacks).

    Jobs with a node missing from ``net`` are left out of the plan and named in the third item:
    they are exactly the jobs a recovery must re-plan.
    """
    placements, plan_ids, missing = [], {}, []
    for job in summary.jobs:
        if any(n not in net.index for n in job.node_ids):
            missing.append(job.name)
            continue
        stages = tuple(Stage(lo, hi, tuple(net.index[n] for n in nodes)) for lo, hi, nodes in job.stages)
        outer = OuterSync(*job.outer) if job.outer is not None else None
        placements.append(Placement(job=job_from_spec(job.name, job.spec), stages=stages,
                                    micro_batch=job.micro_batch, phase=job.phase,
                                    islands=job.islands, outer=outer))
        plan_ids[job.name] = job.plan_id
    return Plan(method=summary.method, placements=placements), plan_ids, missing



def stages_doc(placement: Placement, net: Network) -> dict[str, Any]:
    """A placement's stages as a job record keeps them: ``{"micro_batch": b, "stages":
    [[first_layer, last_layer, [node ids]], ...]}``, layers inclusive, stages in pipeline order,
    each stage's nodes replica by replica."""
    doc = {"micro_batch": placement.micro_batch,
           "stages": [[st.lo, st.hi - 1, [net.ids[i] for i in st.nodes]]
                      for st in placement.stages]}
    if placement.outer is not None:   # a low-communication job: its islands and outer sync
        o = placement.outer
        doc.update(islands=list(placement.island_sizes()),
                   outer=[o.inner_steps, o.compression, o.streaming_fragments])
    return doc


def placement_from_stages(job: Job, doc: Mapping[str, Any], net: Network) -> Placement:
    """The placement ``stages_doc`` kept for ``job``, on ``net``'s indices; InputError naming
    the field when the document does not hold one (or names a node ``net`` lacks)."""
    where = f"{job.name}.stages"
    micro_batch, stages = doc.get("micro_batch"), doc.get("stages")
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise InputError(f"expected a whole number >= 1, got {micro_batch!r}",
                         field=f"{job.name}.micro_batch")
    if not isinstance(stages, list) or not stages:
        raise InputError("expected a list of [first_layer, last_layer, [node ids]]", field=where)
    out, next_layer = [], 0
    for k, stage in enumerate(stages):
        ok = (isinstance(stage, list) and len(stage) == 3 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in stage[:2])
            and isinstance(stage[2], list) and stage[2]
            and all(isinstance(n, str) for n in stage[2]))
        if not ok or stage[0] != next_layer or stage[1] < stage[0] \
                or len(stage[2]) != len(stages[0][2]):
            raise InputError(f"expected layers from {next_layer} on and as many nodes as stage 0",
                             field=f"{where}[{k}]")
        missing = [n for n in stage[2] if n not in net.index]
        if missing:
            raise InputError(f"node {missing[0]} is not in the fleet", field=f"{where}[{k}]")
        out.append(Stage(stage[0], stage[1] + 1, tuple(net.index[n] for n in stage[2])))
        next_layer = stage[1] + 1
    if next_layer != job.layers:
        raise InputError(f"expected the stages to cover the job's {job.layers} layers, got "
                         f"{next_layer}", field=where)
    islands, outer = _stages_outer(doc, len(out[0].nodes), where)
    return Placement(job=job, stages=tuple(out), micro_batch=micro_batch, islands=islands,
                     outer=outer)


def _stages_outer(doc: Mapping[str, Any], replicas: int,
                  where: str) -> tuple[tuple[int, ...], OuterSync | None]:
    """The islands and outer sync ``stages_doc`` kept (none for a job of ``sync: step``)."""
    if "outer" not in doc:
        return (), None
    islands, outer = doc.get("islands"), doc.get("outer")
    ok = (isinstance(islands, list) and islands and sum(islands) == replicas
          and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in islands)
          and isinstance(outer, list) and len(outer) == 3
          and isinstance(outer[0], int) and outer[0] >= 1 and outer[1] in COMPRESSION_BYTES
          and isinstance(outer[2], int) and outer[2] >= 0)
    if not ok:
        raise InputError(f"expected islands summing to {replicas} and outer [H, compression, "
                         "fragments]", field=f"{where}.outer")
    return tuple(islands), OuterSync(*outer)
