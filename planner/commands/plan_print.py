"""What `hulk-planner plan` prints for the chosen plan: each job's estimate, stages and nodes,
and for a low-communication job its islands and each stage's outer group."""

from __future__ import annotations

from hulk.plural import count as _count
from planner.commands.plan import fmt_s
from planner.core.costmodel_sync import outer_group
from planner.methods import label

MAX_LISTED_NODES = 8


def islands_text(p, e, ids: list[str]) -> str:
    """The lines a job with an outer sync adds (empty for a job that syncs every step): H,
    compression, fragments, the islands' replica blocks and who all-reduces across them."""
    if p.outer is None:
        return ""
    o = p.outer
    sizes = p.island_sizes()
    streaming = (f", streaming in {_count(o.streaming_fragments, 'fragment')}"
                 if o.streaming_fragments else "")
    blocks = ", ".join(f"{lo}-{hi - 1}" if hi - lo > 1 else str(lo)
                       for lo, hi in p.island_columns())
    groups = "; ".join(f"stage {k}: {_listing([ids[i] for i in row])}"
                       for k, row in enumerate(outer_group(p).tolist()))
    return (f"\n  sync: diloco, every {_count(o.inner_steps, 'inner step')} an outer all-reduce "
            f"at {o.compression} ({fmt_s(e.outer_sync_s)}){streaming}"
            f"\n  {_count(len(sizes), 'island')} of {'/'.join(map(str, sizes))} "
            f"{'replica' if list(sizes) == [1] else 'replicas'} "
            f"(replicas {blocks}); outer group {groups}")


def _listing(values: list[str]) -> str:
    if len(values) <= MAX_LISTED_NODES:
        return ", ".join(values)
    return ", ".join(values[:MAX_LISTED_NODES - 2]) + f", ... ({len(values)} nodes)"


def print_plan(console, result, net) -> None:
    """The chosen plan (a planner.commands.plan.MethodResult), job by job."""
    from rich.table import Table

    report = result.report
    console.print(f"[bold]{label(result.method)}[/bold]: planned in "
                  f"{result.seconds:.2f} s on {_count(net.n, 'node')}", highlight=False)
    for jr in report.jobs:
        e = jr.estimate
        head = (f"[bold]{jr.name}[/bold]  phase {jr.phase}  starts {fmt_s(jr.start_s)}  "
                f"job {fmt_s(e.job_s)}  iteration {fmt_s(e.iteration_s)} = compute "
                f"{fmt_s(e.compute_s)} + communication {fmt_s(e.communication_s)}")
        p = jr.placement
        if p is None:
            console.print(head + "  (tensor parallel over all nodes)", highlight=False)
            continue
        ids = net.ids
        cities = sorted({net.nodes[i].city_key or "?" for i in p.nodes})
        # b (sequences per micro-batch) and M (micro-batches per replica per step): what the
        # placement hands the program as HULK_MICRO_BATCH and HULK_MICRO_BATCHES.
        chosen = ("" if p.micro_batch == p.job.micro_batch else
                  f" (the job's micro_batch is {p.job.micro_batch}; this plan uses "
                  f"{p.micro_batch})")
        head += (f"\n  {_count(p.num_stages, 'stage')} x {_count(p.replicas, 'replica')}, "
                 f"{_count(len(p.nodes), 'node')} in {_count(len(cities), 'city', 'cities')}: "
                 f"{_listing(cities)}"
                 f"\n  each replica, each step: "
                 f"{_count(e.micro_batches, 'micro-batch', 'micro-batches')} of "
                 f"{_count(p.micro_batch, 'sequence')}{chosen}"
                 f"{islands_text(p, e, ids)}")
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        table.add_column("stage", justify="right")
        table.add_column("layers")
        table.add_column("nodes (replica 0, 1, ...)")
        table.add_column("cities")
        for k, st in enumerate(p.stages):
            table.add_row(str(k), f"[{st.lo}, {st.hi})", _listing([ids[i] for i in st.nodes]),
                          _listing(sorted({net.nodes[i].city_key or "?" for i in st.nodes})))
        console.print(head, highlight=False)
        console.print(table)
    for u in report.unplaced:
        console.print(f"[red]not placed[/red] {u.name}: {u.reason}", highlight=False)
    from planner.search.exact import NOTE_PREFIX

    for note in getattr(result.plan, "notes", []):
        if not note.startswith(NOTE_PREFIX):   # print_optimality prints it
            console.print(f"[dim]note: {note}[/dim]", highlight=False)
    console.print(f"makespan {fmt_s(report.makespan_s)}, sum of job completion times "
                  f"{fmt_s(report.sum_jct_s)}", highlight=False)
