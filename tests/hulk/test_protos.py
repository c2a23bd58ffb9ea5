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


def _floor(requirements: list[str], name: str) -> str:
    """The version after ``name>=`` (or ``==``) in a list of requirement strings."""
    import re

    for req in requirements:
        m = re.fullmatch(rf"{re.escape(name)}\s*(?:>=|==)\s*([0-9.]+)(?:,.*)?", req.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{name} has no version floor in {requirements}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_the_declared_floors_are_what_the_generated_stubs_need() -> None:
    """The stubs refuse older runtimes at import (seen on a GPU server with grpcio 1.84: the
    agent ended with 'generated code ... depends on grpcio>=1.85.1'), so pip must never install
    one: pyproject's and the agent's requirement floors are at least the stubs' versions."""
    import re
    import tomllib

    grpc_needs = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'",
                           (REPO / "hulk" / "v1" / "hulk_pb2_grpc.py").read_text()).group(1)
    pb_needs = re.search(r"# Protobuf Python Version: ([0-9.]+)",
                         (REPO / "hulk" / "v1" / "hulk_pb2.py").read_text()).group(1)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    agent_in = [line for line in (REPO / "deploy" / "agent-requirements.in").read_text().splitlines()
                if line and not line.startswith("#")]
    for reqs in (project["dependencies"], agent_in):
        assert _version(_floor(reqs, "grpcio")) >= _version(grpc_needs)
        assert _version(_floor(reqs, "grpcio-health-checking")) >= _version(grpc_needs)
        assert _version(_floor(reqs, "protobuf")) >= _version(pb_needs)
        protobuf = next(r for r in reqs if r.strip().startswith("protobuf"))
        assert f"<{_version(pb_needs)[0] + 1}" in protobuf, "the stubs need the same major"
    # `make protos` must write exactly the committed stubs: the tool is pinned to their version.
    assert _floor(project["optional-dependencies"]["dev"], "grpcio-tools") == grpc_needs
    assert any(r.startswith("grpcio-tools==") for r in project["optional-dependencies"]["dev"])
