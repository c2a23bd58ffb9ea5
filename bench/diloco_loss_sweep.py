"""The loss of examples/train_gpt.py's DiLoCo under outer settings, without a lab.

    python -m bench.diloco_loss_sweep [--steps N] [--corpus builtin|markov] step|H,LR,MU[,full] ...

Loss does not depend on the network, so each setting trains the lab bench's job
(bench/diloco_lab_bench.py: 4 blocks of width 128, 64-token sequences, global batch 16) on
127.0.0.1 as four replicas in two islands of two, int8 outer exchange, every H steps an outer
step of learning rate LR and Nesterov momentum MU. ``full``: each island takes the whole batch
every inner step and trains N / 2 steps, the same tokens. ``step``: the same four replicas
synchronised every step (the baseline). ``--corpus`` is train_gpt.py's. Prints the mean loss over the last
tenth of the steps, the figure the lab bench compares with ``sync: step``'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

from bench.calibration_lab_bench import DIM, GLOBAL_BATCH, LAYERS, SEQ_LEN
from lab.train import run_placement

HOSTS, ISLANDS = ("a", "b", "c", "d"), 2


@dataclass(frozen=True)
class Setting:
    inner_steps: int
    outer_lr: float
    outer_momentum: float
    full_batch: bool = False
    step_sync: bool = False

    @classmethod
    def parse(cls, text: str) -> "Setting":
        if text == "step":
            return cls(1, 1.0, 0.0, step_sync=True)
        parts = text.split(",")
        problem = ValueError(f"setting {text!r}: expected H,LR,MU, H,LR,MU,full or step "
                             "(H a whole number, LR and MU numbers)")
        if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "full"):
            raise problem
        try:
            return cls(int(parts[0]), float(parts[1]), float(parts[2]), len(parts) == 4)
        except ValueError:
            raise problem from None

    def env(self, stage: int, replica: int) -> dict[str, str]:
        per_island = len(HOSTS) // ISLANDS
        return {"HULK_SYNC": "diloco", "HULK_INNER_STEPS": str(self.inner_steps),
                "HULK_OUTER_COMPRESSION": "int8", "HULK_ISLAND": str(replica // per_island),
                "HULK_NUM_ISLANDS": str(ISLANDS)}

    def steps_and_micro_batches(self, steps: int) -> tuple[int, int]:
        """(steps, micro-batches of one sample per replica) for the tokens of ``steps`` steps of
        the global batch."""
        split = GLOBAL_BATCH // len(HOSTS)
        return (steps // ISLANDS, split * ISLANDS) if self.full_batch else (steps, split)


def final_loss(setting: Setting, steps: int, corpus: str = "builtin") -> float:
    n, m = setting.steps_and_micro_batches(steps)
    done = run_placement([list(HOSTS)], lab=None, layers=LAYERS, steps=n, micro_batch=1,
                         timeout_s=1800, env_for=None if setting.step_sync else setting.env,
                         args=["--micro-batches", str(m), "--dim", str(DIM), "--seq-len", str(SEQ_LEN),
                               "--corpus", corpus,
                               "--outer-lr", str(setting.outer_lr),
                               "--outer-momentum", str(setting.outer_momentum)])
    if not done.ok:
        raise RuntimeError(done.failure())
    loss = done.mean_loss()
    return statistics.fmean(loss[-max(1, len(loss) // 10):])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.diloco_loss_sweep")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--corpus", choices=["builtin", "markov"], default="builtin",
                   help="train_gpt.py's --corpus")
    p.add_argument("settings", nargs="+", help="step, H,LR,MU or H,LR,MU,full")
    a = p.parse_args(argv)
    try:
        settings = [Setting.parse(s) for s in a.settings]
    except ValueError as err:
        print(f"diloco_loss_sweep: {err}", file=sys.stderr)
        return 2
    for s in settings:
        t0 = time.monotonic()
        loss = final_loss(s, a.steps, a.corpus)
        print(f"{s} corpus {a.corpus} steps {a.steps}: loss {loss:.4f} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
