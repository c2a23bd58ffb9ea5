"""The agent's wall-clock figure of a rank's progress file: wall seconds a step from the run's
first timed step after warm-up (found in the file's bounded head) to its newest line, outer
syncs included, which the median step of a DiLoCo job leaves out (real files, nothing patched)."""

from __future__ import annotations

import json

import pytest

from agent.progress import HEAD_BYTES, MAX_LINE_BYTES, read_progress


def line(step: int, step_s: float, **extra) -> str:
    return json.dumps({"step": step, "step_s": step_s, **extra}) + "\n"


def diloco_lines(first: int, last: int, h: int = 10, t0: float = 1000.0) -> str:
    """Steps first..last of a job syncing every ``h`` steps: 0.2 s inner steps, each h-th step
    2.2 s (its outer sync); ``time`` is when each step ended."""
    out, t = [], t0
    for step in range(first, last + 1):
        s = 2.2 if step % h == 0 else 0.2
        t += s
        out.append(line(step, s, time=round(t, 6)))
    return "".join(out)


def test_the_wall_figure_covers_the_outer_syncs_the_median_leaves_out(tmp_path):
    path = tmp_path / "p.jsonl"
    # The first line (step 0) is warm-up: 40 s of compilation, left out of both figures.
    path.write_text(line(0, 40.0, time=960.0) + diloco_lines(1, 200))
    p = read_progress(path)
    assert p.iteration_s == pytest.approx(0.2)            # an inner step
    assert p.wall_steps == 199                              # step 1 to step 200
    # Steps 2..200 take 199 * 0.2 s plus 20 outer syncs of 2 s each.
    assert p.wall_iteration_s == pytest.approx((199 * 0.2 + 20 * 2.0) / 199)
    assert p.check() is p


def test_a_resumed_runs_first_line_is_warm_up_even_past_step_0(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(line(500, 30.0, time=100.0) + line(501, 1.0, time=101.0)
                    + line(502, 1.0, time=103.0) + line(511, 1.0, time=121.0))
    p = read_progress(path)
    assert (p.wall_iteration_s, p.wall_steps) == (pytest.approx(2.0), 10)   # 501 -> 511


def test_lines_without_time_and_garbage_in_the_head_are_passed_over(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("not json at all\n"                    # the file's first line: warm-up
                    + line(0, 3.0, time=90.0) + line(1, 0.5) + '{"step": 2, "step_s": NaN}\n'
                    + line(3, 0.5) + line(4, 0.5, time=104.0) + line(5, 0.5)
                    + line(24, 0.5, time=124.0))
    p = read_progress(path)
    assert (p.wall_iteration_s, p.wall_steps) == (pytest.approx(1.0), 20)    # 4 -> 24


@pytest.mark.parametrize("text", [
    line(0, 3.0, time=90.0) + line(1, 0.5, time=91.0),            # one timed line past warm-up
    line(1, 3.0, time=90.0) + line(2, 0.5, time=92.0),            # the same, warm-up at step 1
    line(0, 3.0, time=90.0) + line(1, 0.5) + line(2, 0.5) + line(3, 0.5, time=99.0),
    line(0, 3.0, time=90.0) + line(1, 0.5, time=91.0) + line(9, 0.5),   # newest has no time
    line(0, 3.0) + line(1, 0.5) + line(2, 0.5),                          # no time at all
    line(0, 3.0, time=90.0) + line(5, 0.5, time=200.0) + line(9, 0.5, time=100.0),  # clock back
    line(0, 3.0, time=0.0) + line(1, 0.5, time=0.0) + line(2, 0.5, time=5e9),  # past the bound
])
def test_without_two_timed_steps_past_warm_up_the_figure_is_zero(tmp_path, text):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    p = read_progress(path)
    assert p is not None and p.check() is p
    assert (p.wall_iteration_s, p.wall_steps) == (0.0, 0)


def test_a_huge_file_is_read_only_at_its_head_and_tail(tmp_path):
    path = tmp_path / "p.jsonl"
    with open(path, "w") as f:
        f.write(line(0, 30.0, time=0.0))
        f.writelines(line(s, 0.5, time=10.0 + 0.5 * s) for s in range(1, 300_000))
    assert path.stat().st_size > 8_000_000
    p = read_progress(path, max_bytes=4096)
    assert p.steps == 299_999 and p.samples == 50
    assert (p.wall_iteration_s, p.wall_steps) == (pytest.approx(0.5), 299_998)
    # Timed lines only past the head: the head is all the agent looks at for the first one.
    untimed = "".join(line(s, 0.5) for s in range(1, 400))
    assert len(untimed) > HEAD_BYTES >= 2 * MAX_LINE_BYTES
    with open(path, "w") as f:
        f.write(line(0, 30.0, time=0.0) + untimed)
        f.writelines(line(s, 0.5, time=10.0 + 0.5 * s) for s in range(400, 300_000))
    p = read_progress(path, max_bytes=4096)
    assert p.steps == 299_999 and (p.wall_iteration_s, p.wall_steps) == (0.0, 0)
    # A file smaller than the tail read: the head is its start, read once.
    path.write_text(line(0, 30.0, time=0.0) + line(1, 0.5, time=10.0)
                    + "".join(line(s, 0.5) for s in range(2, 401)) + line(401, 0.5, time=210.0))
    p = read_progress(path)
    assert (p.wall_iteration_s, p.wall_steps) == (pytest.approx(0.5), 400)
