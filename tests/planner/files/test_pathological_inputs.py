"""Hostile fleet and job files: one-line InputError (exit code 2 in the CLI), bounded memory, no hang.

Each case is a file that could crash a reader, exhaust its memory or hang it.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hulk.errors import InputError
from planner.files import paper as paper_files
from planner.files.fleet import load_fleet, load_fleet_with_report
from planner.files.jobs import parse_jobs
from tests.helpers.paths import REPO

NODE = {"id": "a", "gpus": 8, "gpu_name": "A100-SXM4-80GB", "memory_gb": 640}


def write_fleet(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, expected", [
    ('{"nodes": [{"id": "a", "gpus": ' + "9" * 5000 + "}]}", "digits"),
    ('{"nodes": [{"id": "a", "gpus": ' + "9" * 4000 + "}]}", "nodes[0].gpus: expected a whole number of GPUs"),
    ('{"nodes": [{"id": "a", "gpus": 8, "memory_gb": ' + "9" * 400 + "}]}", "nodes[0].memory_gb"),
    ('{"nodes": [{"id": "\\ud800", "gpus": 8, "memory_gb": 1}]}', "valid Unicode"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_hostile_fleet_json_is_one_line(tmp_path, text, expected):
    path = write_fleet(tmp_path, text)
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    message = str(caught.value)
    assert expected in message and "\n" not in message and str(path) in message


def test_errors_and_flaws_still_name_their_line(tmp_path):
    doc = {"nodes": [NODE, dict(NODE, id="b")],
           "links": [{"src": "a", "dst": "b", "rtt_ms": 1.0}, {"src": "a", "dst": "b", "rtt_ms": 3.0}]}
    text = json.dumps(doc, indent=1)
    second_link_line = [i + 1 for i, line in enumerate(text.splitlines())
                        if '"rtt_ms": 3.0' in line][0]
    with pytest.raises(InputError) as conflict:
        load_fleet_with_report(write_fleet(tmp_path, text))
    assert "conflicting duplicate of the link a -> b" in str(conflict.value)
    assert conflict.value.line is not None and conflict.value.line < second_link_line   # its opening line
    doc["links"][1]["rtt_ms"] = 1.0
    text = json.dumps(doc, indent=1)
    fleet, issues = load_fleet_with_report(write_fleet(tmp_path, text))
    assert fleet.links[0].rtt_ms == 1.0
    (issue,) = issues
    assert "duplicate of the link a -> b" in issue.message and issue.line is not None
    doc["nodes"][1]["gpus"] = -1
    text = json.dumps(doc, indent=1)
    with pytest.raises(InputError) as caught:
        load_fleet(write_fleet(tmp_path, text))
    node_b_line = [i + 1 for i, line in enumerate(text.splitlines()) if '"id": "b"' in line][0]
    assert caught.value.line == node_b_line - 1 and caught.value.field == "nodes[1].gpus"


def test_a_zip_bomb_is_refused_before_it_is_unpacked(tmp_path, monkeypatch):
    monkeypatch.setattr(paper_files, "MAX_MEMBER_BYTES", 1 << 20)  # a 1 MiB cap keeps the test small
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("node_feature.csv", "node,City,Capability,Memory\n" + "a" * (8 << 20))
        archive.writestr("edge.txt", "")
    assert path.stat().st_size < 64 << 10
    with pytest.raises(InputError, match="unpacks to 8388636 bytes; expected at most 1048576"):
        load_fleet(path)


def test_a_zip_whose_header_understates_its_size_is_cut_off(tmp_path, monkeypatch):
    monkeypatch.setattr(paper_files, "MAX_MEMBER_BYTES", 1 << 20)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("node_feature.csv", "x" * (2 << 20))
        archive.writestr("edge.txt", "")
    data = bytearray(buffer.getvalue())
    # Rewrite the central directory's uncompressed size of the first member to 100 bytes.
    central = data.find(b"PK\x01\x02")
    data[central + 24:central + 28] = (100).to_bytes(4, "little")
    path = tmp_path / "liar.zip"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError) as caught:
        load_fleet(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_csv_field_over_the_csv_limit_is_one_line(tmp_path):
    folder = tmp_path / "paper"
    folder.mkdir()
    (folder / "node_feature.csv").write_text('node,City,Capability,Memory\n"' + "a" * 200_000 + '"\n')
    (folder / "edge.txt").write_text("")
    with pytest.raises(InputError, match="not a CSV table"):
        load_fleet(folder)


@pytest.mark.parametrize("row, edge, field", [
    ("1,Paris,8.0,1e300", "", ":2: Memory: expected GB of GPU memory between 0 and 100000"),
    ("1,Paris,inf,640", "", ":2: Capability: expected a CUDA compute capability between 0 and"),
    ("1,Paris,-1e-300,640", "", ":2: Capability: expected"),
    ("1,Paris,8.0,640", "1 2 nan", ":1: weight: expected milliseconds of RTT between 0 and"),
    ("1,Paris,8.0,640", "1 2 -3", ":1: weight: expected milliseconds of RTT between 0 and"),
])
def test_absurd_numbers_of_the_papers_format_name_their_column(tmp_path, row, edge, field):
    folder = tmp_path / "paper"
    folder.mkdir()
    (folder / "node_feature.csv").write_text(f"node,City,Capability,Memory\n{row}\n"
                                             "2,Paris,8.0,640\n")
    (folder / "edge.txt").write_text(edge + "\n")
    with pytest.raises(InputError) as caught:
        load_fleet(folder)
    assert field in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("text, expected", [
    ("jobs: " + "[" * 3_000 + "]" * 3_000 + "\n", "nested too deeply"),
    ("jobs:\n  - name: a\n    model: gpt2-xl\n    steps: " + "9" * 5000 + "\n", "digits"),
    ("jobs:\n  - name: a\n    model: gpt2-xl\n    steps: " + "9" * 4000 + "\n",
     "expected a whole number of steps between 1 and 1,000,000,000, got an integer of 4000 digits"),
    ("jobs:\n  - name: a\n    model: gpt2-xl\n    params: " + "9" * 400 + "\n",
     "expected a parameter count between 1000 and 1e+13, got an integer of 400 digits"),
])
def test_hostile_jobs_yaml_is_one_line(text, expected):
    with pytest.raises(InputError) as caught:
        parse_jobs(text, "jobs.yaml")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.process
def test_the_cli_exits_2_with_one_line(tmp_path):
    path = write_fleet(tmp_path, '{"nodes": [{"id": "a", "gpus": ' + "9" * 5000 + "}]}")
    proc = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(REPO / "examples" / "jobs.yaml"),
                           "--fleet", str(path), "--no-compare"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
