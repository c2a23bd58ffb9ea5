"""A job rank's step progress as the heartbeat carries it (hulk.v1.StepProgress).

The agent folds the rank's progress file (``HULK_PROGRESS_FILE``, JSON lines; docs/JOBS.md) into
one ``StepProgress``; the planner stores it per job and rank. Both sides check it with
``check``: every number finite, non-negative and under its bound, else a one-line InputError
naming the field (the planner answers INVALID_ARGUMENT and stores nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hulk.errors import InputError
from hulk.v1 import hulk_pb2

ENV_VAR = "HULK_PROGRESS_FILE"
WINDOW_STEPS = 50                  # the medians cover at most this many of the newest steps
MAX_STEPS = 10**12
MAX_STEP_S = 1e6                   # about 11.6 days: no real step is slower
MAX_SAMPLES = 10_000
MAX_UPDATED_MS = 10**14            # unix ms, year 5138

# field -> its upper bound (inclusive); every field's lower bound is 0.
BOUNDS: dict[str, float] = {
    "steps": MAX_STEPS, "total_steps": MAX_STEPS, "iteration_s": MAX_STEP_S,
    "iteration_p90_s": MAX_STEP_S, "compute_s": MAX_STEP_S, "communication_s": MAX_STEP_S,
    "samples": MAX_SAMPLES, "updated_ms": MAX_UPDATED_MS,
    "wall_iteration_s": MAX_STEP_S, "wall_steps": MAX_STEPS,
}


@dataclass(frozen=True)
class StepProgress:
    """A bounded summary of one rank's progress file."""

    steps: int                     # steps completed (the last step number seen)
    total_steps: int = 0           # 0 if unknown
    iteration_s: float = 0.0       # median wall time a step, last <= 50 steps, warm-up excluded
    iteration_p90_s: float = 0.0
    compute_s: float = 0.0         # median compute time a step, 0 if the trainer does not say
    communication_s: float = 0.0   # median, 0 if unknown
    samples: int = 0               # steps the medians are over
    updated_ms: int = 0            # unix ms of the newest line read
    # Wall seconds a step from the run's first timed step after warm-up to its newest, outer
    # syncs included (a DiLoCo job's median step is an inner step); 0: unknown.
    wall_iteration_s: float = 0.0
    wall_steps: int = 0            # steps behind wall_iteration_s

    def check(self, where: str = "progress") -> StepProgress:
        """This record, or InputError naming ``where.field`` for a value that cannot be true."""
        for name, high in BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InputError(f"expected a number, got {type(value).__name__}",
                                 field=f"{where}.{name}")
            if not (math.isfinite(value) and 0 <= value <= high):
                raise InputError(f"expected a finite number in [0, {high:g}], got {value!r}",
                                 field=f"{where}.{name}")
        return self

    def to_proto(self) -> hulk_pb2.StepProgress:
        return hulk_pb2.StepProgress(
            steps=self.steps, total_steps=self.total_steps, iteration_s=self.iteration_s,
            iteration_p90_s=self.iteration_p90_s, compute_s=self.compute_s,
            communication_s=self.communication_s, samples=self.samples,
            updated_ms=self.updated_ms, wall_iteration_s=self.wall_iteration_s,
            wall_steps=self.wall_steps)

    @classmethod
    def from_proto(cls, msg: hulk_pb2.StepProgress, where: str = "launch.progress"
                   ) -> StepProgress:
        """The record, checked: InputError naming the field for a hostile value."""
        return cls(steps=msg.steps, total_steps=msg.total_steps, iteration_s=msg.iteration_s,
                   iteration_p90_s=msg.iteration_p90_s, compute_s=msg.compute_s,
                   communication_s=msg.communication_s, samples=msg.samples,
                   updated_ms=msg.updated_ms, wall_iteration_s=msg.wall_iteration_s,
                   wall_steps=msg.wall_steps).check(where)
