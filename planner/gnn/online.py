"""Keeping the GNN current in ``serve``: detect fleet change, fine-tune in the background.

``fleet_changed`` is pure: it compares two fleet snapshots against thresholds. ``Retrainer`` runs
fine-tuning on the current fleet's teacher labels in a worker thread, so ingestion is never
blocked: ``submit`` returns at once (a snapshot submitted while a run is in progress replaces any
waiting one; the latest fleet wins).

Which model plans is decided by plans, not by pair accuracy: the run's job sets are split (seeded)
into those that train the candidate and choose its epoch, and held-out ones it never sees. On each
held-out set the plan with a model's start is the better of the teacher's plan (the search from
the heuristic start, the portfolio's first start) and that model's start refined by the search
(:func:`start_makespan`). The candidate replaces the active checkpoint only when its mean
makespan over the held-out sets is lower than the active model's; on a tie or worse the active
one stays. The previous checkpoint is kept beside it as ``<name>.prev.pt``.

``hulk-planner serve --model-dir`` schedules :func:`retrain_on_change`'s check as a background
task and re-plans with planner.methods.serve_planner, the GNN's scores one more start of the
portfolio; this module knows neither the serve runtime nor its flags (planner/commands/serve.py
does).
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from hulk.atomic import write_atomic
from hulk.errors import StoreError
from planner.core.fleet import Fleet, Network
from planner.core.jobs import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChangeThresholds:
    """When a fleet has changed enough to retrain."""

    node_fraction: float = 0.05     # joined + lost nodes, as a fraction of the old fleet
    min_nodes: int = 1              # ... and at least this many
    rtt_drift: float = 0.25         # relative RTT change of a link that counts as drift
    drifted_fraction: float = 0.10  # fraction of common links that drifted


def _link_rtts(fleet: Fleet) -> dict[tuple[str, str], float]:
    sums: dict[tuple[str, str], list[float]] = {}
    for link in fleet.links:
        if link.imputed or link.src == link.dst:
            continue
        key = (link.src, link.dst) if link.src < link.dst else (link.dst, link.src)
        sums.setdefault(key, []).append(float(link.rtt_ms))
    return {k: float(np.mean(v)) for k, v in sums.items()}


def fleet_changed(old_fleet: Fleet | None, new_fleet: Fleet,
                  thresholds: ChangeThresholds = ChangeThresholds()) -> bool:
    """True when nodes joined or left beyond the threshold, or enough common links' RTT drifted."""
    if old_fleet is None:
        return True
    old_ids, new_ids = set(old_fleet.node_ids()), set(new_fleet.node_ids())
    changed_nodes = len(old_ids ^ new_ids)
    if changed_nodes >= max(thresholds.min_nodes,
                            thresholds.node_fraction * max(len(old_ids), 1)):
        return True
    old_rtt, new_rtt = _link_rtts(old_fleet), _link_rtts(new_fleet)
    common = [k for k in old_rtt if k in new_rtt]
    if not common:
        return bool(new_rtt) and not old_rtt
    old = np.array([old_rtt[k] for k in common])
    new = np.array([new_rtt[k] for k in common])
    drift = np.abs(new - old) / np.maximum(old, 1e-3)
    return float((drift > thresholds.rtt_drift).mean()) > thresholds.drifted_fraction


@dataclass
class RetrainResult:
    """One fine-tuning run: the mean held-out makespans (seconds) of the plans with the active
    model's and the candidate's start, the sets used to train and choose the epoch
    (``examples``) and those held out, and the candidate's pair accuracy (reported, never
    used to choose)."""

    fleet_name: str
    switched: bool
    old_held_out_s: float
    new_held_out_s: float
    examples: int
    held_out: int = 0
    new_val_acc: float = float("nan")
    error: str | None = None
    path: Path | None = None


@dataclass
class RetrainConfig:
    job_sets: int = 12            # job sets on the current fleet, training and held-out together
    epochs: int = 15
    lr: float = 1e-3
    teacher_budget_s: float = 60.0
    seed: int = 0
    held_out_fraction: float = 1 / 3   # of the labelled sets; at least 1, and 2 left to train


def split_job_sets(count: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(indices that train and choose the epoch, held-out indices) of ``count`` job sets, a
    seeded permutation: at least one held out and two left to train (ValueError when
    ``count`` < 3)."""
    if count < 3:
        raise ValueError(f"need at least 3 labelled job sets to hold some out, got {count}")
    order = np.random.default_rng([seed, 30]).permutation(count)
    held = min(count - 2, max(1, int(round(fraction * count))))
    return sorted(int(i) for i in order[held:]), sorted(int(i) for i in order[:held])


def start_makespan(model, jobs: list[Job], net: Network) -> float:
    """Makespan (s) of ``model``'s start (its class scores) refined by the search, as the
    portfolio refines an extra start."""
    from planner.gnn.infer import node_scores
    from planner.search.options import SearchOptions
    from planner.search.portfolio_run import Start, run_start

    scores = node_scores(list(jobs), net, model)
    return float(run_start(Start(1, "gnn", scores), list(jobs), net, SearchOptions(),
                           None).makespan_s)


def held_out_makespan(model, held_out: list[tuple[list[Job], float]], net: Network,
                      judge: Callable = start_makespan) -> float:
    """Mean over ``held_out`` (job set, makespan of the plan without the GNN) of the makespan
    of the plan with ``model``'s start: the start only adds, so the better of the two."""
    return float(np.mean([min(base, judge(model, jobs, net)) for jobs, base in held_out]))


def default_job_sets(net: Network, count: int, seed: int) -> list[list[Job]]:
    """``count`` random catalog job sets that fit ``net`` (1..MAX_TRAIN_JOBS jobs each)."""
    from planner.core.generate import generate_jobs
    from planner.gnn.data import MAX_TRAIN_JOBS

    rng = np.random.default_rng(seed)
    max_params = float(net.mem.sum()) / 16.0 / 3.0
    return [generate_jobs(int(rng.integers(1, MAX_TRAIN_JOBS + 1)), seed=int(rng.integers(2**31)),
                          max_params=max_params) for _ in range(count)]


class Retrainer:
    """Fine-tunes the checkpoint at ``checkpoint_path`` on fleet snapshots, one run at a time.

    ``teacher(jobs, net, seed, budget_s) -> Plan`` labels job sets (by default the search from the
    heuristic start alone, planner.gnn.data.quick_teacher, to keep fine-tuning cheap);
    ``on_result`` is called from the worker thread after every run (switched or not).
    ``judge(model, jobs, net) -> makespan`` of a model's start (default :func:`start_makespan`);
    ``fine_tune(examples, train_config, current) -> (model, stats, metrics)`` makes the
    candidate (default: planner.gnn.train.fit from the active model).
    """

    def __init__(self, checkpoint_path: str | Path, *, config: RetrainConfig = RetrainConfig(),
                 teacher: Callable | None = None,
                 on_result: Callable[[RetrainResult], None] | None = None,
                 judge: Callable = start_makespan, fine_tune: Callable | None = None) -> None:
        from planner.gnn.data import quick_teacher

        self.path = Path(checkpoint_path)
        self.config = config
        self.teacher = teacher or quick_teacher
        self.on_result = on_result
        self.judge = judge
        self.fine_tune = fine_tune or _fit_from
        self.results: list[RetrainResult] = []
        self._lock = threading.Lock()
        self._pending: Fleet | None = None
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, fleet: Fleet) -> None:
        """Queue a fleet snapshot for fine-tuning; returns immediately."""
        with self._lock:
            self._pending = fleet
            if self._thread is None or not self._thread.is_alive():
                self._idle.clear()
                self._thread = threading.Thread(target=self._worker, name="hulk-gnn-retrain",
                                                daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is in progress (for tests and shutdown); True if idle."""
        return self._idle.wait(timeout)

    def _worker(self) -> None:
        while True:
            with self._lock:
                fleet, self._pending = self._pending, None
                if fleet is None:
                    self._idle.set()
                    return
            try:
                result = self.retrain(fleet)
            except Exception as exc:  # a failed run is logged and reported; serve goes on
                log.exception("GNN fine-tuning failed")
                result = RetrainResult(fleet.name, False, float("nan"), float("nan"), 0,
                                       error=str(exc))
            self.results.append(result)
            if self.on_result:
                try:
                    self.on_result(result)
                except Exception:
                    log.exception("retrain result callback failed")

    def retrain(self, fleet: Fleet) -> RetrainResult:
        """One synchronous fine-tuning run on ``fleet`` (what the worker thread does)."""
        from planner.core.costmodel import estimate_plan
        from planner.core.fleet import complete
        from planner.gnn import checkpoint as ckpt
        from planner.gnn import data as gdata
        from planner.gnn import features as F
        from planner.gnn.train import TrainConfig

        cfg = self.config
        current = ckpt.load(self.path)
        net = complete(fleet)
        labelled = []   # (index, jobs, teacher's plan, its makespan)
        for k, jobs in enumerate(default_job_sets(net, cfg.job_sets, cfg.seed)):
            try:
                plan = self.teacher(jobs, net, cfg.seed + k, cfg.teacher_budget_s)
            except Exception as exc:
                log.info("teacher could not plan job set %d on %s: %s", k, fleet.name, exc)
                continue
            labelled.append((k, jobs, plan, float(estimate_plan(plan.placements, net).makespan_s)))
        if len(labelled) < 3:
            raise RuntimeError(f"only {len(labelled)} labelled job sets on {fleet.name}")
        train_idx, held_idx = split_job_sets(len(labelled), cfg.held_out_fraction, cfg.seed)
        examples = []
        for k, jobs, plan, makespan in (labelled[i] for i in train_idx):
            groups, shares = gdata.labels_from_plan(plan, jobs, net)
            spec = gdata.InstanceSpec(cfg.seed, k, net.n, -1, 0.0, len(jobs), -1)
            examples.append(gdata.Example(spec, F.featurize(jobs, net), groups, shares, makespan))
        held_out = [(labelled[i][1], labelled[i][3]) for i in held_idx]
        train_cfg = TrainConfig(epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed, val_fraction=0.25)
        model, stats, metrics = self.fine_tune(examples, train_cfg, current)
        candidate = ckpt.Checkpoint(model, stats, metrics)
        old_s = held_out_makespan(current, held_out, net, self.judge)
        new_s = held_out_makespan(candidate, held_out, net, self.judge)
        switched = new_s < old_s
        acc = metrics.get("val_acc")
        new_acc = float(acc) if acc is not None else float("nan")
        if switched:
            prev = self.path.with_name(self.path.stem + ".prev.pt")
            shutil.copy2(self.path, prev)
            meta = dict(current.meta)
            meta.pop("versions", None)
            meta["fine_tuned_on"] = {"fleet": fleet.name, "nodes": net.n, "job_sets": len(examples),
                                     "held_out_sets": len(held_out), "old_held_out_s": old_s,
                                     "new_held_out_s": new_s}
            ckpt.save(self.path, model, stats, metrics={**current.metrics, "fine_tune": metrics},
                      meta=meta)
        log.info("GNN fine-tuned on %s: mean held-out makespan with its start %.1f s -> %.1f s "
                 "(%d sets); %s", fleet.name, old_s, new_s, len(held_out),
                 "switched" if switched else "kept the active model")
        return RetrainResult(fleet.name, switched, old_s, new_s, len(examples), len(held_out),
                             new_acc, path=self.path)


def _fit_from(examples, train_config, current):
    """The candidate: planner.gnn.train.fit on ``examples``, starting from ``current``."""
    import torch

    from planner.gnn.train import fit

    with torch.enable_grad():
        model, stats, _, metrics = fit(examples, train_config, init=current)
    return model, stats, metrics


class RetrainWatch:
    """Remembers the fleet the model was last tuned for and submits a snapshot to ``retrainer``
    when :func:`fleet_changed` says the fleet moved on. ``check`` returns at once."""

    def __init__(self, retrainer, thresholds: ChangeThresholds = ChangeThresholds()) -> None:
        self.retrainer = retrainer
        self.thresholds = thresholds
        self.last: Fleet | None = None

    def check(self, fleet: Fleet) -> bool:
        """True when ``fleet`` was submitted for fine-tuning."""
        if not fleet.nodes or not fleet_changed(self.last, fleet, self.thresholds):
            return False
        self.retrainer.submit(fleet)
        self.last = fleet
        return True


def retrain_on_change(read_fleet: Callable[[], Fleet], retrainer: Retrainer,
                      thresholds: ChangeThresholds = ChangeThresholds()) -> Callable[[], bool]:
    """The fleet-change check ``hulk-planner serve`` runs periodically.

    Each call reads the fleet with ``read_fleet`` (the caller runs it where that read may happen:
    serve's store thread) and, when the fleet has changed beyond ``thresholds``, hands it to
    ``retrainer``; it returns at once, True when fine-tuning started. Re-planning then uses the
    retrainer's checkpoint (planner.methods.serve_planner); the loader notices a switched file by
    its mtime.
    """
    watch = RetrainWatch(retrainer, thresholds)

    def check() -> bool:
        # Only the fleet read happens in the caller's thread; fine-tuning runs on the
        # retrainer's own thread, so serve's ingestion never waits for it.
        fleet = read_fleet()
        submitted = watch.check(fleet)
        if submitted:
            log.info("fleet %s changed (%d nodes): GNN fine-tuning started in the background",
                     fleet.name, len(fleet.nodes))
        return submitted

    return check


ACTIVE_NAME = "hulk-gnn.pt"
RESULTS_NAME = "retrain.jsonl"


def seed_active_checkpoint(active_path: str | Path) -> Path:
    """The active checkpoint, first copied from the shipped / HULK_MODEL one when absent."""
    from planner.gnn import checkpoint as ckpt

    active = Path(active_path)
    if not active.is_file():
        source = ckpt.default_path()
        try:
            active.parent.mkdir(parents=True, exist_ok=True)
            # Atomic: a copy cut short (a full disk) must not be taken for the checkpoint later.
            write_atomic(active, Path(source).read_bytes())
        except OSError as exc:
            raise StoreError(f"{active}: cannot seed the active GNN checkpoint from {source}: "
                             f"{exc.strerror or exc}") from None
    return active


def append_result(path: Path, result: RetrainResult) -> None:
    """One JSON line per fine-tuning run (what operators and tests read)."""
    import json
    import time

    row = {"time_ms": int(time.time() * 1000), "fleet": result.fleet_name,
           "switched": result.switched, "old_held_out_s": result.old_held_out_s,
           "new_held_out_s": result.new_held_out_s, "held_out": result.held_out,
           "new_val_acc": result.new_val_acc, "examples": result.examples, "error": result.error,
           "checkpoint": str(result.path) if result.path else None}
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
