"""The cause of a failed job: the exception line of its last traceback, past torchrun's report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.joblog import root_cause
from agent.launcher import exit_detail

FAILING = '''import torch


def make(lr):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def train(lr):
    return make(lr)


if __name__ == "__main__":
    train(-1.0)
'''
CHILD_FAILED = ["Traceback (most recent call last):", '  File "/x/bin/torchrun", line 6, in <module>',
                "    sys.exit(main())",
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "=" * 60, "train.py FAILED", "Root Cause (first observed failure):", "[0]:",
                "  exitcode  : 1 (pid: 12870)", "=" * 60]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.process
def test_a_real_torchrun_failure_names_its_python_cause(tmp_path: Path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is installed with torch (the planner extra)")
    (tmp_path / "fail.py").write_text(FAILING)
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        done = subprocess.run([torchrun, "--nproc-per-node", "1", "fail.py"], cwd=tmp_path,
                              stdout=out, stderr=subprocess.STDOUT, timeout=120)
    assert done.returncode != 0
    number, text = root_cause(log)
    assert text == "ValueError: Invalid learning rate: -1.0"
    assert log.read_text().splitlines()[number - 1] == text
    detail = exit_detail(done.returncode, log)
    assert f"cause (line {number}): ValueError: Invalid learning rate: -1.0" in detail.splitlines()
    # torchrun's own report is in the log's last lines; the first-error window stops in frames
    assert "ChildFailedError" in log.read_text()


def test_the_cause_skips_frames_chained_exceptions_and_rank_prefixes(tmp_path: Path):
    lines = ["step 1", "[default0]:Traceback (most recent call last):",
             '[default0]:  File "train.py", line 3, in <module>', "[default0]:    boom()",
             "[default0]:KeyError: 'weight'", "[default0]:",
             "[default0]:During handling of the above exception, another exception occurred:",
             "[default0]:", "[default0]:Traceback (most recent call last):",
             '[default0]:  File "train.py", line 5, in <module>', "[default0]:    load()",
             "[default0]:RuntimeError: checkpoint step-00000300 is not readable", *CHILD_FAILED]
    assert root_cause(write(tmp_path / "job.log", lines)) == (
        12, "RuntimeError: checkpoint step-00000300 is not readable")


def test_only_torchrun_report_or_no_traceback(tmp_path: Path):
    only = write(tmp_path / "only.log", ["killed by the OOM killer", *CHILD_FAILED])
    assert root_cause(only) == (5, "torch.distributed.elastic.multiprocessing.errors."
                                   "ChildFailedError: ")
    assert root_cause(write(tmp_path / "none.log", ["error rate 0.1", "done"])) is None
    assert root_cause(tmp_path / "missing.log") is None and root_cause(None) is None


def test_a_cause_inside_the_first_error_window_is_not_repeated(tmp_path: Path):
    log = write(tmp_path / "job.log", ["Traceback (most recent call last):",
                                       '  File "t.py", line 1, in <module>',
                                       "ValueError: bad"])
    detail = exit_detail(1, log).splitlines()
    assert not any(line.startswith("cause (") for line in detail)
    assert detail.count("ValueError: bad") == 2     # in the window and in the last lines
