"""`hulk-planner train`: (re)train the GNN on generated fleets labelled by the best of several
refined search starts."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from hulk.errors import InputError
from planner.settings import PlannerSettings

log = logging.getLogger(__name__)

DEFAULT_FLEETS = 160
DEFAULT_EPOCHS = 40
DEFAULT_MAX_NODES = 48
DEFAULT_OUT = "planner/gnn/hulk-gnn.pt"


def register(subparsers: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    p = subparsers.add_parser(
        "train", help="train the GNN on generated fleets labelled by the search planner",
        description="Generate fleets and job sets, label each with the best plan the search "
                    "reaches from the heuristic and from seeded random starts (cached), train "
                    "the GNN (same-group loss) and write a checkpoint plus a loss/accuracy plot.")
    p.add_argument("--fleets", type=int, default=DEFAULT_FLEETS,
                   help=f"generated fleets to train and validate on (default {DEFAULT_FLEETS})")
    p.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS, help=f"default {DEFAULT_EPOCHS}")
    p.add_argument("--seed", type=int, default=7, help="data and training seed (default 7)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"checkpoint path (default {DEFAULT_OUT})")
    p.add_argument("--cache", default=None,
                   help="label cache directory (default ~/.cache/hulk/gnn-labels)")
    p.add_argument("--plot", default=None,
                   help="loss/accuracy PNG (default: the checkpoint path with .png)")
    p.add_argument("--teacher-budget", type=float, default=None,
                   help="seconds the search planner gets per fleet when labelling")
    p.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES,
                   help=f"largest generated fleet (default {DEFAULT_MAX_NODES})")
    p.add_argument("--workers", type=int, default=2, help="labelling processes (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1: the graphs are small, and spinning "
                        "threads slow down badly when labelling processes share the cores)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.gnn import checkpoint as ckpt
    from planner.gnn import data as gdata
    from planner.gnn.train import TrainConfig, fit, plot_history

    import torch

    torch.set_num_threads(max(1, args.threads))
    if args.fleets < 2:
        raise InputError(f"--fleets: expected at least 2, got {args.fleets}")
    if args.epochs < 1:
        raise InputError(f"--epochs: expected at least 1, got {args.epochs}")
    if not 8 <= args.max_nodes:
        raise InputError(f"--max-nodes: expected at least 8, got {args.max_nodes}")
    budget = args.teacher_budget if args.teacher_budget is not None else gdata.DEFAULT_TEACHER_BUDGET_S
    cache = Path(args.cache) if args.cache else gdata.default_cache_dir()
    out = Path(args.out)
    plot = Path(args.plot) if args.plot else out.with_suffix(".png")
    config = TrainConfig(epochs=args.epochs, seed=args.seed)
    if args.lr is not None:
        config.lr = args.lr
    if args.hidden is not None:
        config.hidden = args.hidden

    import sys

    # On a terminal a live bar; otherwise (logs, CI) one line per epoch instead.
    live = sys.stderr.isatty()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), disable=not live) as bar:
        label_task = bar.add_task("labelling (teacher)", total=args.fleets, info="")
        examples = gdata.load_examples(
            args.seed, args.fleets, cache=cache, budget_s=budget, workers=args.workers,
            max_nodes=args.max_nodes,
            progress=lambda done, total: bar.update(label_task, completed=done, total=total))
        epoch_task = bar.add_task("training", total=config.epochs, info="")

        def on_epoch(epoch, history):
            info = (f"loss {history.train_loss[-1]:.3f}  train acc {history.train_acc[-1]:.3f}  "
                    f"val acc {history.val_acc[-1]:.3f}")
            bar.update(epoch_task, completed=epoch + 1, info=info)
            if not live:
                print(f"epoch {epoch + 1}/{config.epochs}: {info}", flush=True)
        model, stats, history, metrics = fit(examples, config, on_epoch=on_epoch)

    meta = {"train_config": config.__dict__, "fleets": args.fleets, "data_seed": args.seed,
            "data_version": gdata.DATA_VERSION, "teacher_budget_s": budget,
            "max_nodes": args.max_nodes, "history": history.to_dict()}
    ckpt.save(out, model, stats, metrics=metrics, meta=meta)
    plot_history(history, plot)
    size_kb = out.stat().st_size / 1024
    print(f"wrote {out} ({size_kb:.0f} KB): validation accuracy {metrics['val_acc']:.3f} "
          f"(balanced same-group pair accuracy; always-idle 0.5) on "
          f"{metrics['val_examples']} fleets ({metrics['train_examples']} for training); plot {plot}")
    return 0
