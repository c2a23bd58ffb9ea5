"""A plan's evaluation by the reference cost model: per-job estimates and the plan's totals.

``evaluate(plan, net)``: phases for staged jobs (docs/COSTMODEL.md section 5); jobs given only as
times (System C, tensor parallel) run after them one after another, shortest first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.core.costmodel import Estimate, Placement, estimate_plan
from planner.core.fleet import Network
from planner.core.plan import Plan, Unplaced


@dataclass(frozen=True)
class JobReport:
    name: str
    phase: int
    estimate: Estimate
    start_s: float
    end_s: float
    placement: Placement | None   # None for jobs given only as times (System C)


@dataclass(frozen=True)
class PlanReport:
    method: str
    jobs: list[JobReport]
    makespan_s: float
    sum_jct_s: float
    unplaced: list[Unplaced] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every job placed: only then are totals comparable across methods."""
        return not self.unplaced

    def job(self, name: str) -> JobReport:
        return next(j for j in self.jobs if j.name == name)


def evaluate(plan: Plan, net: Network) -> PlanReport:
    """Estimates and totals of a plan by the reference cost model."""
    est = estimate_plan(plan.placements, net) if plan.placements else None
    reports: list[JobReport] = []
    t_end = est.makespan_s if est else 0.0
    for p in sorted(plan.placements, key=lambda p: (p.phase, est.start_s[p.job.name], p.job.name)):
        reports.append(JobReport(p.job.name, p.phase, est.estimates[p.job.name],
                                 est.start_s[p.job.name], est.end_s[p.job.name], p))
    next_phase = max((p.phase for p in plan.placements), default=-1) + 1
    t = t_end
    for k, (name, job_s) in enumerate(sorted(plan.job_s_override.items(), key=lambda kv: (kv[1], kv[0]))):
        e = plan.estimate_override.get(name) or Estimate(job_s, math.nan, math.nan, job_s, 0,
                                                         math.nan, math.nan, True, math.nan)
        reports.append(JobReport(name, next_phase + k, e, t, t + job_s, None))
        t += job_s
    makespan = max((r.end_s for r in reports), default=0.0)
    return PlanReport(plan.method, reports, makespan, sum(r.end_s for r in reports),
                      list(plan.unplaced))
