"""The search's options as values: how hard the per-group solver looks (:class:`Effort`) and what
one run of the search does (:class:`SearchOptions`). A run carries them down to every step, so
two runs with different options can share a process and never see each other's settings."""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class EffortParams:
    """How hard the per-group solver looks. ``replica_options``: how many values of D it tries;
    ``prune_passes``: rounds of dropping stage groups; ``keep``: configurations refined;
    ``seeds``: seed clusters grown into candidate sets; ``finalists``: sets given every (D, b);
    ``screen_only``: finalists keep only the screening (D, b) values (used inside moves);
    ``patience``: growth steps without a better screening result before a seed stops growing."""

    replica_options: int
    prune_passes: int
    keep: int
    seeds: int
    finalists: int
    screen_only: bool = False
    patience: int = 3


class Effort(enum.Enum):
    """The solver's efforts, cheapest first: FAST inside the moves of nodes between groups,
    NORMAL for a job's group on its own, FULL where a few groups are placed once."""

    FAST = EffortParams(replica_options=5, prune_passes=2, keep=1, seeds=1, finalists=1,
                        screen_only=True)
    NORMAL = EffortParams(replica_options=8, prune_passes=4, keep=2, seeds=3, finalists=2)
    FULL = EffortParams(replica_options=14, prune_passes=8, keep=3, seeds=5, finalists=4)

    @property
    def params(self) -> EffortParams:
        return self.value


@dataclass(frozen=True)
class SearchOptions:
    """What one search run does.

    ``stage_order``: put the best configurations' stage groups in a better pipeline order
    (planner.search.groups.reorder_stages); ``chains``: try chains of relocations
    (planner.search.chain). Both off give the search without those two steps, the baseline the
    portfolio benchmark measures the default against. ``max_rounds``: moves of nodes between
    groups (None: 12 + 6 per job). ``budget_s``: a wall-clock safety cap only; a run stopped by
    it returns a valid plan that may differ between runs (``PlanFacts.cut_short``)."""

    stage_order: bool = True
    chains: bool = True
    max_rounds: int | None = None
    budget_s: float | None = None
