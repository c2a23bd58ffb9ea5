"""The paper's figures 8 and 10: per job and per system, compute and communication time as stacked
bars (log scale when the times span more than two orders of magnitude). matplotlib, Agg backend."""

from __future__ import annotations

import math
from pathlib import Path

from hulk.errors import InputError
from planner.methods import label as method_label

COMPUTE_HATCH = ""
COMMUNICATION_HATCH = "///"


def _job_parts(report) -> dict[str, tuple[float, float]]:
    """job -> (compute seconds, communication seconds) over the whole job (steps x iteration)."""
    parts = {}
    for jr in report.jobs:
        e = jr.estimate
        if not math.isfinite(e.job_s) or e.iteration_s <= 0:
            continue
        steps = e.job_s / e.iteration_s
        compute = e.compute_s * steps if math.isfinite(e.compute_s) else e.job_s
        parts[jr.name] = (compute, max(0.0, e.job_s - compute))
    return parts


def plot_reports(reports: dict, path: str | Path, *, title: str = "",
                 log: bool | None = None) -> list[str]:
    """Grouped stacked bars: x = jobs, one bar per method (method name -> PlanReport, labelled
    as planner.methods labels it), compute at the bottom (solid), communication on top
    (hatched); a job a method could not place is marked. Returns the bars' labels in order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from planner.plots.output import plot_path, save_figure

    out = plot_path(path)
    if not reports:
        raise InputError("nothing to plot", field="--plot")
    names = list(reports)
    labels = [method_label(name) for name in names]
    parts = {name: _job_parts(r) for name, r in reports.items()}
    jobs: list[str] = []
    for r in reports.values():
        for jr in r.jobs:
            if jr.name not in jobs:
                jobs.append(jr.name)
        for u in r.unplaced:
            if u.name not in jobs:
                jobs.append(u.name)
    values = [c + m for p in parts.values() for c, m in p.values() if c + m > 0]
    smallest = [v for p in parts.values() for pair in p.values() for v in pair if v > 0]
    if log is None:
        log = bool(values) and max(values) / max(min(values), 1e-12) > 100

    width = 0.8 / len(labels)
    fig_w = max(8.0, 1.2 + len(jobs) * (0.45 + 0.32 * len(labels)))
    fig, ax = plt.subplots(figsize=(fig_w, 6.0), dpi=110)
    colors = plt.get_cmap("tab10").colors
    floor = min(smallest) / 3 if (log and smallest) else 0.0
    for k, name in enumerate(names):
        xs, comp, comm, missing = [], [], [], []
        for j, job in enumerate(jobs):
            x = j - 0.4 + width * (k + 0.5)
            if job in parts[name]:
                c, m = parts[name][job]
                xs.append(x)
                comp.append(max(c, floor) if log else c)
                comm.append(m)
            else:
                missing.append(x)
        color = colors[k % len(colors)]
        ax.bar(xs, comp, width, color=color, edgecolor="black", linewidth=0.5)
        ax.bar(xs, comm, width, bottom=comp, color=color, alpha=0.45, hatch=COMMUNICATION_HATCH,
               edgecolor="black", linewidth=0.5)
        for x in missing:
            ax.text(x, 0.02, "infeasible", rotation=90, ha="center", va="bottom", fontsize=7,
                    transform=ax.get_xaxis_transform(), color=color)
    ax.set_xticks(range(len(jobs)))
    ax.set_xticklabels(jobs, rotation=20 if len(jobs) > 4 else 0, ha="right" if len(jobs) > 4 else "center")
    if log:
        ax.set_yscale("log")
        if floor > 0:
            ax.set_ylim(bottom=floor)
    ax.set_ylabel("job time (s)" + (", log scale" if log else ""))
    ax.set_title(title or "compute and communication time per job and system")
    ax.grid(axis="y", which="major", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colors[k % len(colors)], edgecolor="black", label=label)
               for k, label in enumerate(labels)]
    handles += [Patch(facecolor="white", edgecolor="black", label="compute (solid)"),
                Patch(facecolor="white", edgecolor="black", hatch=COMMUNICATION_HATCH,
                      label="communication (hatched)")]
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              ncol=min(4, len(handles)), frameon=False)
    fig.tight_layout()
    save_figure(fig, out)
    return labels
