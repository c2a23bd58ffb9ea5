"""What bench/diloco_lab_bench.py prints and draws from its result: the summary lines and the
picture of both loss curves."""

from __future__ import annotations

from pathlib import Path


def picture(result: dict, path: Path) -> None:
    """Both runs' loss against the tokens processed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, style in (("step", "-"), ("diloco", "-")):
        r = result["runs"][name]
        tokens = r["tokens_per_step"]
        ax.plot([tokens * (i + 1) for i in range(len(r["loss"]))], r["loss"], style,
                label=f"sync: {name} ({r['tokens_per_s']:.0f} tokens/s, {len(r['hosts'])} hosts)")
    ax.set_xlabel("tokens processed")
    ax.set_ylabel("training loss (mean over replicas)")
    wan = result["lab"]["wan"]
    ax.set_title(f"two lab continents, {wan['rtt_ms']:.0f} ms / {wan['mbit_s']:.0f} Mbit/s "
                 "between them")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarize(r: dict) -> str:
    """The result as the lines the bench prints, each target met or MISSED."""
    s, d = r["runs"]["step"], r["runs"]["diloco"]
    en, ef = r["estimates"]["nominal"]["diloco"], r["estimates"]["fitted_on_step_run"]["diloco"]
    ec = r["estimates"]["calibrated"]["diloco"]
    fitted = r["calibration"]["fitted"]
    compute = ", ".join(f"{k} {v['value']:.3g}x" for k, v in fitted["compute"].items())
    met = {k: "met" if v else "MISSED" for k, v in r["met"].items()}
    return "\n".join([
        f"{r['command']} ({r['date']}), {r['job']['steps']} steps of {r['job']['tokens_per_step']} tokens:",
        f"- sync: step (Hulk's plan {s['placement']['stages']}): {s['iteration_s']:.3f} s/step, "
        f"{s['tokens_per_s']:.0f} tokens/s, final loss {s['final_loss']:.4f}",
        f"- sync: diloco (islands {d['placement']['islands']}, H={d['placement']['outer']['inner_steps']}, "
        f"{d['placement']['outer']['compression']}): {d['iteration_s']:.3f} s/step, "
        f"{d['tokens_per_s']:.0f} tokens/s, final loss {d['final_loss']:.4f}",
        f"- tokens/s ratio {r['tokens_per_s_ratio']:.2f}x (target >= 3x: {met['tokens_per_s_ratio']}); "
        f"loss difference {r['loss_rel_diff']:+.1%} (target within 5%: {met['loss_rel_diff']})",
        f"- estimate of the diloco iteration: nominal {en['iteration_s']:.3f} s "
        f"({en['rel_error']:.0%} off, {met['estimate_nominal']}); throughput fitted on the step run "
        f"{ef['iteration_s']:.3f} s ({ef['rel_error']:.0%} off, {met['estimate_fitted']}); "
        f"estimated outer all-reduce {en['outer_sync_s']:.2f} s",
        f"- calibrated (compute {compute}, step overhead "
        f"{fitted['step_overhead_s']['value']:.3f} s, fitted: "
        f"{fitted['step_overhead_s']['fitted']}, communication "
        f"{fitted['communication']['value']:.2f}x, fitted: {fitted['communication']['fitted']}, "
        f"outer sync {fitted['outer_sync']['value']:.2f}x, fitted: {fitted['outer_sync']['fitted']}): "
        f"{ec['iteration_s']:.3f} s "
        f"({ec['rel_error']:.0%} off; the 15% target, judged here: {met['estimate_calibrated']})",
        *[f"- calibrated without the DiLoCo calibration runs: {e['diloco']['iteration_s']:.3f} s "
          f"({e['diloco']['rel_error']:.0%} off)"
          for e in [r["estimates"].get("calibrated_without_diloco_runs")] if e],
        *every_host_lines(r),
    ]) + "\n"


def every_host_lines(r: dict) -> list[str]:
    """The step job over all four hosts, where it ran: its iteration, DiLoCo's tokens/s against
    it, and each estimate of it."""
    w = r["runs"].get("step_every_host")
    if w is None:
        return []
    est = ", ".join(f"{label} {e['step_every_host']['iteration_s']:.2f} s "
                    f"({e['step_every_host']['rel_error']:.0%} off)"
                    for label, e in r["estimates"].items())
    return [f"- sync: step over all four hosts ({len(w['loss'])} steps): {w['iteration_s']:.3f} "
            f"s/step, {w['tokens_per_s']:.0f} tokens/s; diloco "
            f"{r['tokens_per_s_ratio_vs_step_every_host']:.1f}x that; estimates: {est}"]
