"""Keeping the GNN current in ``serve``: detect fleet change, fine-tune in the background.

``fleet_changed`` is pure: it compares two fleet snapshots against thresholds. ``Retrainer`` runs
fine-tuning on the current fleet's teacher labels in a worker thread, so ingestion is never
blocked: ``submit`` returns at once (a snapshot submitted while a run is in progress replaces any
waiting one; the latest fleet wins). The fine-tuned model replaces the active checkpoint only if
its validation accuracy on held-out job sets of the current fleet beats the active model's; the
previous checkpoint is kept beside it as ``<name>.prev.pt``.

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
    fleet_name: str
    switched: bool
    old_val_acc: float
    new_val_acc: float
    examples: int
    error: str | None = None
    path: Path | None = None


@dataclass
class RetrainConfig:
    job_sets: int = 12            # labelled job sets on the current fleet
    epochs: int = 15
    lr: float = 1e-3
    teacher_budget_s: float = 60.0
    seed: int = 0


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
    """

    def __init__(self, checkpoint_path: str | Path, *, config: RetrainConfig = RetrainConfig(),
                 teacher: Callable | None = None,
                 on_result: Callable[[RetrainResult], None] | None = None) -> None:
        from planner.gnn.data import quick_teacher

        self.path = Path(checkpoint_path)
        self.config = config
        self.teacher = teacher or quick_teacher
        self.on_result = on_result
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
                result = RetrainResult(fleet.name, False, float("nan"), float("nan"), 0, error=str(exc))
            self.results.append(result)
            if self.on_result:
                try:
                    self.on_result(result)
                except Exception:
                    log.exception("retrain result callback failed")

    def retrain(self, fleet: Fleet) -> RetrainResult:
        """One synchronous fine-tuning run on ``fleet`` (what the worker thread does)."""
        import torch
        from torch_geometric.loader import DataLoader

        from planner.core.costmodel import estimate_plan
        from planner.core.fleet import complete
        from planner.gnn import checkpoint as ckpt
        from planner.gnn import data as gdata
        from planner.gnn import features as F
        from planner.gnn.train import TrainConfig, evaluate, fit, split, to_data

        cfg = self.config
        current = ckpt.load(self.path)
        net = complete(fleet)
        examples = []
        for k, jobs in enumerate(default_job_sets(net, cfg.job_sets, cfg.seed)):
            try:
                plan = self.teacher(jobs, net, cfg.seed + k, cfg.teacher_budget_s)
            except Exception as exc:
                log.info("teacher could not plan job set %d on %s: %s", k, fleet.name, exc)
                continue
            feats = F.featurize(jobs, net)
            groups, shares = gdata.labels_from_plan(plan, jobs, net)
            spec = gdata.InstanceSpec(cfg.seed, k, net.n, -1, 0.0, len(jobs), -1)
            examples.append(gdata.Example(spec, feats, groups, shares,
                                          float(estimate_plan(plan.placements, net).makespan_s)))
        if len(examples) < 2:
            raise RuntimeError(f"only {len(examples)} labelled job sets on {fleet.name}")
        train_cfg = TrainConfig(epochs=cfg.epochs, lr=cfg.lr, seed=cfg.seed, val_fraction=0.25)
        _, val = split(examples, train_cfg.val_fraction, train_cfg.seed)
        old_loader = DataLoader([to_data(e, current.stats) for e in val], batch_size=8)
        _, old_acc = evaluate(current.model, old_loader)
        with torch.enable_grad():
            model, stats, history, metrics = fit(examples, train_cfg, init=current)
        new_acc = float(metrics["val_acc"])
        switched = new_acc > old_acc
        if switched:
            prev = self.path.with_name(self.path.stem + ".prev.pt")
            shutil.copy2(self.path, prev)
            meta = dict(current.meta)
            meta.pop("versions", None)
            meta["fine_tuned_on"] = {"fleet": fleet.name, "nodes": net.n, "job_sets": len(examples),
                                     "old_val_acc": old_acc, "new_val_acc": new_acc}
            ckpt.save(self.path, model, stats, metrics={**current.metrics, "fine_tune": metrics},
                      meta=meta)
            log.info("GNN fine-tuned on %s: validation accuracy %.3f -> %.3f; switched",
                     fleet.name, old_acc, new_acc)
        else:
            log.info("GNN fine-tuned on %s: validation accuracy %.3f -> %.3f; kept the previous model",
                     fleet.name, old_acc, new_acc)
        return RetrainResult(fleet.name, switched, float(old_acc), new_acc, len(examples),
                             path=self.path)


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
        active.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ckpt.default_path(), active)
    return active


def append_result(path: Path, result: RetrainResult) -> None:
    """One JSON line per fine-tuning run (what operators and tests read)."""
    import json
    import time

    row = {"time_ms": int(time.time() * 1000), "fleet": result.fleet_name,
           "switched": result.switched, "old_val_acc": result.old_val_acc,
           "new_val_acc": result.new_val_acc, "examples": result.examples, "error": result.error,
           "checkpoint": str(result.path) if result.path else None}
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
