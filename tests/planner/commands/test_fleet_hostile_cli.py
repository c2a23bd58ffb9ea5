"""The CLI on hostile fleet inputs: a FIFO or a device as --fleet or jobs.yaml, plot outputs it
cannot write, hostile `fleet import`s, and a store holding rows from before the rules. Each ends
with exit 2 and one stderr line (or plans with a warning), never a traceback, a hang or a file
written somewhere else than the message says."""

from __future__ import annotations

import json
import logging
import os

import pytest

from planner import cli
from planner.core.fleet import Fleet, Link, Node
from planner.service.store import Store

NODE = {"id": "a", "city": "Paris", "gpus": 8, "gpu_name": "A100-SXM4-80GB", "memory_gb": 640.0}
FLEET = {"name": "f", "nodes": [NODE, dict(NODE, id="b")],
         "links": [{"src": "a", "dst": "b", "rtt_ms": 1.0}]}
JOBS = ("jobs:\n  - name: tiny\n    params: 124.0e6\n    layers: 12\n    hidden: 768\n"
        "    seq_len: 1024\n    global_batch: 256\n    micro_batch: 8\n    steps: 20\n")


@pytest.fixture
def files(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(FLEET))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    return fleet, jobs


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, err.splitlines(), out


def one_line_exit_2(code: int, err: list[str]) -> str:
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("hulk-planner: ") and "internal error" not in err[0]
    return err[0]


@pytest.mark.timeout(60)   # a FIFO opened for reading blocks until a writer comes: never here
@pytest.mark.parametrize("which", ["--fleet", "jobs.yaml"])
def test_a_fifo_is_refused_before_it_is_opened(tmp_path, files, capsys, which):
    fleet, jobs = files
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    argv = ["plan", str(fifo if which == "jobs.yaml" else jobs), "--fleet",
            str(fifo if which == "--fleet" else fleet), "--no-compare"]
    line = one_line_exit_2(*run(capsys, *argv)[:2])
    assert f"{fifo}: not a regular file (a device, FIFO or socket)" in line


@pytest.fixture
def memory_cap():
    """A cap on this process's address space 4 GiB above its present size: should the reader
    read the device after all, the test fails with a MemoryError instead of taking the host."""
    import resource

    size = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
                if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size + (4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.timeout(60)
def test_a_device_as_fleet_is_refused_not_read_until_memory_runs_out(files, capsys, memory_cap):
    _, jobs = files
    line = one_line_exit_2(*run(capsys, "plan", str(jobs), "--fleet", "/dev/zero",
                                "--no-compare")[:2])
    assert "/dev/zero: not a regular file" in line and "expected a fleet file" in line


def test_a_plot_suffix_matplotlib_cannot_write_names_the_supported_ones(tmp_path, files, capsys):
    fleet, _ = files
    out = tmp_path / "plot.xyz"
    line = one_line_exit_2(*run(capsys, "fleet", "plot", "--fleet", str(fleet), "--out",
                                str(out))[:2])
    assert ".png, .pdf, .svg" in line and "got '.xyz'" in line and not out.exists()


def test_a_directory_as_plot_output_is_refused_and_nothing_is_written_beside_it(tmp_path, files,
                                                                                capsys):
    fleet, _ = files
    folder = tmp_path / "plots"
    folder.mkdir()
    line = one_line_exit_2(*run(capsys, "fleet", "plot", "--fleet", str(fleet), "--out",
                                str(folder))[:2])
    assert f"{folder}: is a directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.json", "jobs.yaml", "plots"]


@pytest.mark.process   # matplotlib may run fc-list to build its font cache
def test_the_plot_message_names_the_file_written(tmp_path, files, capsys):
    fleet, _ = files
    out = tmp_path / "fleet.svg"
    code, err, stdout = run(capsys, "fleet", "plot", "--fleet", str(fleet), "--out", str(out))
    assert code == 0 and stdout.strip() == f"wrote {out}" and out.read_text().startswith("<?xml")


@pytest.mark.parametrize("node_id", ["a/b", "#", "a\x00b", "\x1b[2J", "<img src=x>",
                                     "x" * 100_000])
def test_fleet_import_refuses_a_node_id_and_leaves_no_store(tmp_path, capsys, node_id):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"nodes": [dict(NODE, id=node_id)]}))
    db = tmp_path / "hulk.sqlite"
    line = one_line_exit_2(*run(capsys, "fleet", "import", str(path), "--db", str(db))[:2])
    assert f"{path}:" in line and "nodes[0].id: expected a node id" in line
    assert "\x1b" not in line and "\x00" not in line and len(line) < 400 and not db.exists()


@pytest.mark.parametrize("node, link", [
    (Node(id="c", gpus=8, gpu_name="A100-SXM4-80GB", memory_gb=1e300), None),
    (Node(id="c", gpus=2 ** 53, gpu_name="A100-SXM4-80GB", memory_gb=640.0), None),
    (Node(id="c/\x1b[2J", gpus=8, gpu_name="A100-SXM4-80GB", memory_gb=640.0), None),
    (None, Link("a", "b", rtt_ms=1e300)),
], ids=["memory", "gpus", "id", "rtt"])
def test_rows_an_older_import_left_in_the_store_do_not_break_plan_db(tmp_path, files, capsys,
                                                                     caplog, node, link):
    _, jobs = files
    nodes = [Node(id=n["id"], city="Paris", gpus=8, gpu_name="A100-SXM4-80GB", memory_gb=640.0)
             for n in FLEET["nodes"]]
    db = tmp_path / "hulk.sqlite"
    with Store(str(db)) as store:   # written as a version without the file rules would have
        store.import_fleet(Fleet(tuple(nodes + ([node] if node else [])),
                                 (link,) if link else ()))
    with caplog.at_level(logging.WARNING, logger="planner.service.graph"):
        code, err, out = run(capsys, "plan", str(jobs), "--db", str(db), "--no-compare",
                             "--time-budget", "1", "--workers", "1")
    assert code == 0, err
    bound = out.split("compute bound: ")[-1].splitlines()[0]   # 0.0 us, or 1e+300x of it
    assert "makespan" in out and not bound.startswith("0.0 ") and "e+" not in bound, out
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "in the store left out: " in warning and "\x1b" not in warning
