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
    assert headings == set(range(1, 10)), f"docs/COSTMODEL.md sections: {sorted(headings)}"
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


# -- the README as a user's guide, the benchmarks' figures with their command and date ---------------

README_MAX_LINES = 300
README_SECTIONS = ("Two commands on a fresh machine", "Quick tour", "The command line",
                   "Running a real fleet", "Where to read more")
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
BENCH_COMMAND = re.compile(r"python -m bench\.\w+")


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def sections(markdown: str, level: str = "## ") -> dict[str, str]:
    """Heading text -> the text under it, for the headings of one level."""
    out: dict[str, str] = {}
    title = None
    for line in markdown.splitlines():
        if line.startswith(level):
            title = line[len(level):].strip()
            out[title] = ""
        elif title is not None:
            out[title] += line + "\n"
    return out


def test_the_readme_is_a_short_guide_with_its_sections() -> None:
    text = readme()
    assert text.count("\n") <= README_MAX_LINES, f"README.md has {text.count(chr(10))} lines"
    missing = [s for s in README_SECTIONS if s not in sections(text)]
    assert not missing, f"README.md lacks the sections {missing}"


def test_the_readme_shows_the_demo_as_the_makefile_runs_it() -> None:
    makefile = (ROOT / "Makefile").read_text()
    (recipe,) = re.findall(r"^demo:.*\n\t(.+)$", makefile, re.MULTILINE)
    command = recipe.replace("$(BIN)", ".venv/bin")
    assert command.startswith(".venv/bin/hulk-planner plan "), command
    assert command in readme(), f"README.md does not show `make demo`'s command: {command}"
    for target in ("make demo", "make test", "make test-fast"):
        assert target in readme(), target


def test_every_relative_link_of_the_readme_and_docs_names_a_file() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    links = [(doc, target) for doc in documents
             for target in MARKDOWN_LINK.findall(doc.read_text(encoding="utf-8"))
             if "://" not in target]
    assert links, "no relative link found: the scan is broken"
    broken = [f"{doc.relative_to(ROOT)}: {target}" for doc, target in links
              if not (doc.parent / target).exists()]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_every_benchmark_figure_names_its_command_and_date() -> None:
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    found = sections(text)
    assert len(found) >= 5, f"docs/BENCHMARKS.md sections: {sorted(found)}"
    for title, body in found.items():
        assert "|---" in body, f"docs/BENCHMARKS.md, {title!r}: no table"
        assert BENCH_COMMAND.search(body), f"docs/BENCHMARKS.md, {title!r}: no command"
        assert DATE.search(body), f"docs/BENCHMARKS.md, {title!r}: no date"


def test_the_bounds_document_is_current() -> None:
    """docs/BOUNDS.md is what planner/bounds.py renders from the checks' own tables."""
    from planner import bounds

    text = (ROOT / "docs" / "BOUNDS.md").read_text(encoding="utf-8")
    assert text == bounds.render(), ("docs/BOUNDS.md is not current: run "
                                     "python -m planner.bounds --write docs/BOUNDS.md")
    assert bounds.main(["--check", str(ROOT / "docs" / "BOUNDS.md")]) == 0
    undescribed = [f"{t.name}: {field}" for t in bounds.TABLES for field, limit in t.rows
                   if "not described" in getattr(limit, "why", "")]
    assert not undescribed, "settings planner/bounds.py does not describe: " + ", ".join(undescribed)
