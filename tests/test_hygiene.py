"""The tests' own rules (pure: reads files only): a test module imports no other test module, only
tests.helpers, and only the benchmarks' tests import `bench`; set-ups tests share live in
tests/helpers."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Test modules that may import `bench` for a set-up, each with why.
BENCH_SET_UPS = {
    "planner/search/test_chain.py": "bench.regions.region_network builds the real-region fleets "
                                    "the chains are tested on; a fleet generator to move beside "
                                    "planner.core.generate",
    "planner/security/test_call_slots.py": "bench.call_holder holds the calls "
                                           "bench.grpc_slots_bench measures, so the test and "
                                           "the benchmark hold the same ones",
}


def imported_modules(text: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``text``, the source of ``path`` under the repository;
    relative imports are resolved against ``path``'s package."""
    package = path.relative_to(TESTS.parent).parent.parts
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            out.append((node.lineno, ".".join(p for p in (base, node.module or "") if p)))
    return out


@functools.cache
def python_files() -> tuple[Path, ...]:
    found = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(found) > 100, "the scan found too few test files: it is broken"
    return tuple(found)


@functools.cache
def imports_of(path: Path) -> list[tuple[int, str]]:
    return imported_modules(path.read_text(encoding="utf-8"), path)


def test_the_scan_reads_absolute_and_relative_imports() -> None:
    text = "import bench.regions\nfrom tests.planner.search import test_search\nfrom . import x\n"
    found = imported_modules(text, TESTS / "planner" / "search" / "test_probe.py")
    assert found == [(1, "bench.regions"), (2, "tests.planner.search"),
                     (3, "tests.planner.search")]


def test_tests_import_no_other_test_module_only_helpers() -> None:
    wrong = [f"{path.relative_to(TESTS)}:{line}: {module}"
             for path in python_files() for line, module in imports_of(path)
             if module.split(".")[0] == "tests" and module.split(".")[1:2] != ["helpers"]]
    assert not wrong, "move what tests share to tests/helpers:\n" + "\n".join(wrong)


def test_only_the_benchmarks_tests_import_bench() -> None:
    importers = {}
    for path in python_files():
        name = path.relative_to(TESTS).as_posix()
        lines = [line for line, module in imports_of(path) if module.split(".")[0] == "bench"]
        if lines and not name.startswith("bench/"):
            importers[name] = lines[0]
    unexplained = sorted(set(importers) - set(BENCH_SET_UPS))
    assert not unexplained, "tests outside tests/bench import bench (take the set-up from " \
        "tests/helpers or the planner): " + ", ".join(f"{n}:{importers[n]}" for n in unexplained)
    stale = sorted(set(BENCH_SET_UPS) - set(importers))
    assert not stale, f"BENCH_SET_UPS names tests that no longer import bench: {stale}"
