"""The project's documents that code and docs cite exist: every docs/<name>.md reference names a
file in docs/, every "COSTMODEL.md section N" names a "## N." heading of docs/COSTMODEL.md, and
nothing cites the cost model or design documents outside the repository (pure: reads files only).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "build", "dist", "__pycache__"}

DOC_REFERENCE = re.compile(r"(?<![\w./-])docs/([A-Za-z0-9_-]+\.md)")
SECTION_REFERENCE = re.compile(
    r"COSTMODEL\.md`?\)?,?\s+\(?sections?\s+(\d+(?:\s*(?:-|,|and)\s*\d+)*)")
OUTSIDE_REFERENCE = re.compile(r"shared/(?:COSTMODEL|DESIGN)\.md")
HEADING = re.compile(r"^## (\d+)\.", re.MULTILINE)


@functools.cache
def project_files() -> tuple[Path, ...]:
    """The repository's .py and .md files, outside virtual environments and build output (the
    walk never enters those folders: .venv alone holds tens of thousands of files)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        found.extend(Path(folder, name) for name in files if name.endswith((".py", ".md")))
    return tuple(sorted(found))


def section_numbers(spec: str) -> list[int]:
    """'4' -> [4]; '3-5, 7' -> [3, 4, 5, 7]; '4 and 5' -> [4, 5]."""
    numbers: list[int] = []
    for part in re.split(r"\s*(?:,|and)\s*", spec.strip()):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            numbers.extend(range(lo, hi + 1))
        elif part:
            numbers.append(int(part))
    return numbers


def references(pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    """(file, line, first group or whole match) for every match in the project's files."""
    out = []
    for path in project_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            out.append((str(path.relative_to(ROOT)), line,
                        match.group(1) if pattern.groups else match.group(0)))
    return out


def test_section_numbers_reads_ranges_and_lists() -> None:
    assert section_numbers("4") == [4]
    assert section_numbers("3-5, 7") == [3, 4, 5, 7]
    assert section_numbers("4 and 5") == [4, 5]


def test_the_project_documents_exist() -> None:
    for name in ("COSTMODEL.md", "DESIGN.md"):
        assert (ROOT / "docs" / name).is_file(), f"docs/{name} is missing"


def test_every_docs_reference_names_an_existing_file() -> None:
    found = references(DOC_REFERENCE)
    assert found, "no docs/<name>.md reference found: the scan is broken"
    missing = [f"{path}:{line}: docs/{name}" for path, line, name in found
               if not (ROOT / "docs" / name).is_file()]
    assert not missing, "references to missing documents:\n" + "\n".join(missing)


def test_every_cost_model_section_reference_names_a_heading() -> None:
    headings = {int(n) for n in HEADING.findall((ROOT / "docs" / "COSTMODEL.md").read_text())}
    assert headings == set(range(1, 8)), f"docs/COSTMODEL.md sections: {sorted(headings)}"
    found = references(SECTION_REFERENCE)
    assert found, "no 'COSTMODEL.md section N' reference found: the scan is broken"
    wrong = [f"{path}:{line}: section {spec}" for path, line, spec in found
             if not set(section_numbers(spec)) <= headings]
    assert not wrong, "references to sections docs/COSTMODEL.md lacks:\n" + "\n".join(wrong)


@pytest.mark.parametrize("name", ["COSTMODEL", "DESIGN"])
def test_nothing_cites_the_documents_outside_the_repository(name: str) -> None:
    outside = [f"{path}:{line}" for path, line, text in references(OUTSIDE_REFERENCE)
               if name in text]
    assert not outside, f"cite docs/{name}.md, not the copy outside the repository:\n" + \
        "\n".join(outside)
