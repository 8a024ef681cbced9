"""Regenerate the golden replay files: `make golden` (never run by the tests).

Writes, next to this file: fraud-xgb.model (a small XGBoost model trained on the demo
generator, compiled), input.arrows (a recorded topic of 60 messages, 3 of them malformed) and
scores.arrows / scores-dlq.arrows (that topic replayed through the worker with config.yaml).
Regenerate after a deliberate change of scores or of the artifact format, then review the diff
of `scoring-worker replay ... --expect` before committing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    import worker
    from worker import demo
    from worker.io.records import write_records

    train = demo.generate(20_000, seed=11)
    booster = demo.train_xgboost(train, rounds=60, max_depth=4, seed=0, n_threads=1)
    worker.compile_model(booster).save(HERE / "fraud-xgb.model")
    write_records(HERE / "input.arrows", demo.demo_messages(60, 20, seed=12))
    for name in ("scores.arrows", "scores-dlq.arrows"):
        (HERE / name).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "worker.cli", "replay", str(HERE / "input.arrows"),
           "--config", str(HERE / "config.yaml"), "--model", str(HERE / "fraud-xgb.model"),
           "--output", str(HERE / "scores.arrows")]
    subprocess.run(cmd, check=True)
    (HERE / "scores.png").unlink(missing_ok=True)  # the run summary's chart, not golden
    print(f"golden files written to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
