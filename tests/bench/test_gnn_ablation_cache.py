"""bench.gnn_ablation's cache of non-learned starts is keyed by the code they depend on."""

from __future__ import annotations

import shutil

from bench.gnn_ablation import REPO, code_key


def _copy(root):
    for folder in ("planner/search", "planner/core"):
        shutil.copytree(REPO / folder, root / folder)
    for path in ("planner/gnn/starts.py", "bench/gnn_ablation.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)


def test_the_key_follows_the_search_code(tmp_path):
    _copy(tmp_path)
    assert code_key(tmp_path) == code_key(REPO)
    chain = tmp_path / "planner" / "search" / "chain.py"
    chain.write_text(chain.read_text() + "\n# changed\n")
    assert code_key(tmp_path) != code_key(REPO)


def test_the_key_ignores_code_the_starts_do_not_use(tmp_path):
    _copy(tmp_path)
    (tmp_path / "planner" / "service").mkdir(parents=True)
    (tmp_path / "planner" / "service" / "server.py").write_text("# not read\n")
    assert code_key(tmp_path) == code_key(REPO)
