"""The agent runs on GPU servers without the planner: it loads no planner, numpy or torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

FORBIDDEN = ("planner", "numpy", "torch")


def agent_modules() -> list[str]:
    return sorted(f"agent.{path.stem}" for path in (REPO / "agent").glob("*.py")
                  if path.stem not in ("__init__", "__main__"))


@pytest.mark.process
def test_every_agent_module_imports_without_the_planner_numpy_or_torch():
    modules = agent_modules()
    assert {"agent.cli", "agent.runtime", "agent.reporter", "agent.placement"} <= set(modules)
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))\n"
    )
    # A fresh interpreter: this test process has long imported the planner.
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
