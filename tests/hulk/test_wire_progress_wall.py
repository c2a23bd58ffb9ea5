"""StepProgress's wall-clock figure (wall seconds a step over the run, outer syncs included, and
the steps behind it) travels through hulk.v1.StepProgress unchanged, defaults to 0 (an older
agent) and is refused with one line naming the field when it cannot be true."""

from __future__ import annotations

import pytest

from hulk.errors import InputError
from hulk.v1 import hulk_pb2
from hulk.wire.progress import BOUNDS, MAX_STEP_S, MAX_STEPS, StepProgress


def test_the_wall_figures_round_trip_and_default_to_zero():
    p = StepProgress(steps=400, total_steps=1000, iteration_s=0.2, iteration_p90_s=0.25,
                     samples=50, updated_ms=1_790_000_000_000, wall_iteration_s=0.31,
                     wall_steps=398)
    assert StepProgress.from_proto(hulk_pb2.StepProgress.FromString(
        p.to_proto().SerializeToString())) == p
    older = hulk_pb2.StepProgress(steps=3, iteration_s=0.2, samples=2)   # an older agent's
    got = StepProgress.from_proto(older)
    assert (got.wall_iteration_s, got.wall_steps) == (0.0, 0)
    assert (BOUNDS["wall_iteration_s"], BOUNDS["wall_steps"]) == (MAX_STEP_S, MAX_STEPS)


@pytest.mark.parametrize("field, value", [
    ("wall_iteration_s", float("nan")), ("wall_iteration_s", float("inf")),
    ("wall_iteration_s", -0.1), ("wall_iteration_s", 2 * MAX_STEP_S),
    ("wall_steps", -1), ("wall_steps", MAX_STEPS + 1), ("wall_steps", 1.5e300)])
def test_a_wall_figure_that_cannot_be_true_is_one_line_naming_it(field, value):
    with pytest.raises(InputError) as err:
        StepProgress(steps=3, **{field: value}).check("launch.progress")
    assert err.value.field == f"launch.progress.{field}"
    assert "\n" not in str(err.value)


def test_a_hostile_wall_figure_on_the_wire_is_refused():
    for msg in (hulk_pb2.StepProgress(steps=3, wall_iteration_s=float("nan")),
                hulk_pb2.StepProgress(steps=3, wall_iteration_s=-1.0),
                hulk_pb2.StepProgress(steps=3, wall_steps=2**63)):
        with pytest.raises(InputError) as err:
            StepProgress.from_proto(msg)
        assert err.value.field.startswith("launch.progress.wall_")
