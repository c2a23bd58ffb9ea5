"""A plan: what every planner returns (baselines, DT-FM-style peer, search, GNN)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.costmodel import Estimate, Placement


@dataclass(frozen=True)
class Unplaced:
    name: str
    reason: str


@dataclass(frozen=True)
class PlanFacts:
    """What code may decide on about how a plan was made (the notes are for people).

    ``cut_short``: a safety cap or a stop request ended the search early, so the plan is valid
    but may differ between runs; ``winner``: the portfolio start whose plan this is;
    ``unscored_jobs``: jobs Algorithm 1's class scores gave no node (they grew from nothing)."""

    cut_short: bool = False
    winner: str | None = None
    unscored_jobs: tuple[str, ...] = ()


@dataclass
class Plan:
    """Placements of jobs on a Network (node indices), phases as in docs/COSTMODEL.md section 5.

    ``job_s_override`` carries per-job times for plans that cannot be written as stages
    (System C, tensor parallel); such jobs have no placement and their times come from there.
    ``estimate_override`` optionally gives those jobs' full breakdown (iteration, compute,
    communication); its ``job_s`` equals ``job_s_override``. ``facts``: how the plan was made,
    for code to read (:class:`PlanFacts`).
    """

    method: str
    placements: list[Placement]
    unplaced: list[Unplaced] = field(default_factory=list)
    job_s_override: dict[str, float] = field(default_factory=dict)
    estimate_override: dict[str, Estimate] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    facts: PlanFacts = PlanFacts()
