"""The committed gRPC stubs are what protoc makes of protos/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
GENERATED = ["hulk_pb2.py", "hulk_pb2.pyi", "hulk_pb2_grpc.py"]


@pytest.mark.process
def test_generated_stubs_are_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'protos'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
         str(REPO / "protos" / "hulk" / "v1" / "hulk.proto")],
        check=True)
    for name in GENERATED:
        fresh = (tmp_path / "hulk" / "v1" / name).read_text()
        committed = (REPO / "hulk" / "v1" / name).read_text()
        assert fresh == committed, f"hulk/v1/{name} is stale: run `make protos`"


def test_settings_lists_every_hulk_variable_read() -> None:
    """Every HULK_* name that the code reads is listed in hulk.settings (one place)."""
    import re

    from hulk.settings import ENV_VARS

    pattern = re.compile(r"""["'](HULK_[A-Z_]+)["']""")
    seen: set[str] = set()
    for folder in ("hulk", "agent", "planner"):
        for path in (REPO / folder).rglob("*.py"):
            seen.update(pattern.findall(path.read_text()))
    missing = sorted(seen - set(ENV_VARS))
    assert not missing, f"HULK_* variables used but not listed in hulk/settings.py: {missing}"
