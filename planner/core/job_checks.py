"""Whether a submitted job can ever run: the checks ``jobs submit`` makes before it queues a job.

Pure: values in, a list of one-line problems out (empty when the job can run). Each problem
starts with the jobs.yaml field it is about (``command: ...``), so the command prints it after
the job's name. A job that passes may still wait for free nodes; one that fails would only hold
nodes (no command), be refused by every agent (a command longer than agents parse, or one no
agent's ``allowed_commands`` names), or fail every planning round (a field outside its bound,
memory beyond the whole fleet's).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from hulk.plural import count
from hulk.validate import Invalid
from hulk.wire.placement import MAX_COMMAND_WORDS, command_allowed
from planner.core.costmodel import max_replicas
from planner.core.jobs import JOB_BOUNDS, Job, check_job_field

NO_COMMAND = ("command: missing; agents launch a job's command, so a job without one would hold "
              "its nodes and never run (add a command, or check it with --plan-only and plan it "
              "with `hulk-planner plan`)")


def submit_problems(job: Job, command: tuple[str, ...] | None, *,
                    fleet_gpu_bytes: float | None, plan_only: bool = False,
                    agent_commands: Mapping[str, tuple[tuple[str, ...], ...]] | None = None
                    ) -> list[str]:
    """Why ``job`` (launching ``command``) cannot run on a fleet of ``fleet_gpu_bytes`` bytes of
    GPU memory in all (None: the fleet is not known, memory is not checked). ``plan_only``:
    the job is only planned, so it needs no command. ``agent_commands``: node id -> the argv
    prefixes its agent runs, for the agents that reported them (none: not checked)."""
    problems: list[str] = []
    if command is None:
        if not plan_only:
            problems.append(NO_COMMAND)
    elif not command or not command[0]:
        problems.append("command: must name a program")
    elif len(command) > MAX_COMMAND_WORDS:
        problems.append(f"command: {len(command)} words, agents accept at most {MAX_COMMAND_WORDS}")
    elif agent_commands and not any(command_allowed(command, p) for p in agent_commands.values()):
        shown = shlex.join(command)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        problems.append(f"command: {shown!r} is not in the allowed_commands of any of the "
                        f"{count(len(agent_commands), 'agent')} that reported theirs, so every agent "
                        "would refuse it (add its argv prefix to the agents' allowed_commands)")
    in_bounds = True
    for key in JOB_BOUNDS:
        try:
            check_job_field(key, getattr(job, key))
        except Invalid as bad:
            problems.append(f"{key}: {bad.expected}")
            in_bounds = False
    if in_bounds and job.micro_batch > job.global_batch:
        problems.append(f"micro_batch: {job.micro_batch} is larger than global_batch "
                        f"{job.global_batch}")
    if in_bounds and fleet_gpu_bytes is not None and max_replicas(job, fleet_gpu_bytes) < 1:
        problems.append(f"params: {job.params:.3g} parameters need {job.state_bytes / 1e9:,.0f} "
                        f"GB of training state, more than the whole fleet's "
                        f"{fleet_gpu_bytes / 1e9:,.0f} GB of GPU memory")
    return problems
