"""bench.run keeps the latest section of every benchmark in SUMMARY.md."""

from __future__ import annotations

from bench.run import MODULES, merged_sections, summary_sections

OLD = """# Benchmark summary

intro

## plan_bench (63 s, 2026-11-22 00:58 UTC, --quick)

| a | b |
### a sub-heading stays inside its section

## ingest (30 s)

- samples/s: 99325
## retired_bench (5 s)

gone from MODULES
"""


def test_sections_are_split_at_second_level_headings_only():
    sections = summary_sections(OLD)
    assert list(sections) == ["plan_bench", "ingest", "retired_bench"]
    assert "### a sub-heading" in sections["plan_bench"]
    assert sections["ingest"].startswith("## ingest (30 s)") and "99325" in sections["ingest"]


def test_a_run_with_only_replaces_its_sections_and_keeps_the_others():
    new = {"ingest": "## ingest (31 s, 2026-11-23 09:00 UTC)\n\n- samples/s: 101000\n",
           "scale_bench": "## scale_bench (90 s, 2026-11-23 09:00 UTC)\n\n| x |\n"}
    merged = merged_sections(summary_sections(OLD), new)
    names = [s.split()[1] for s in merged]
    assert names == ["plan_bench", "ingest", "scale_bench", "retired_bench"]
    assert names[:3] == [m for m in MODULES if m in names]
    assert "101000" in merged[1] and "99325" not in "".join(merged)
    assert "### a sub-heading" in merged[0]
