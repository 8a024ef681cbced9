"""The pieces of flight monitoring's count of one 1,000-row block (issue 51), timed alone, one
thread: the block counter with and without the score's bins, the score's bins the scalar way
(numpy's searchsorted and bincount, the same answer), and the worker's per-feature missing
counts native and numpy's. bench/monitoring_cost.py's model and rows (bench/e2e.py's).

    python bench/monitor_micro.py
    python bench/ab.py --a 7e75329 --b . --runs 3 -- python bench/monitor_micro.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, ".")  # the working directory's worker (bench/ab.py runs in a side's tree)


def per_call_us(f, n: int = 5000, rounds: int = 7) -> float:
    f()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> int:
    import worker  # noqa: I001 (first: bench/e2e.py puts this checkout first on sys.path)
    from worker import _monitor

    import e2e
    import monitoring_cost

    _, art = e2e.model_files()
    m = worker.load_model(monitoring_cost.profiled(art))
    t = e2e.table(0, 1000, np.random.default_rng(1))
    X = np.ascontiguousarray(np.column_stack([t.column(f).to_numpy(zero_copy_only=False)
                                              for f in e2e.FEATURES]), np.float32)
    score = m.score_batch(X, n_threads=1).score
    p = m.reference
    counts, bins = p.new_counts(), np.zeros(len(p.score_edges) + 1, np.int64)
    rows = [
        ("block count, rows only", per_call_us(lambda: p.plan.count(X, counts))),
        ("block count, rows and the score's bins",
         per_call_us(lambda: p.plan.count(X, counts, score, bins))),
        ("the score's bins by numpy (searchsorted, bincount)", per_call_us(
            lambda: np.bincount(np.searchsorted(p.score_edges, score, side="right"),
                                minlength=len(p.score_edges) + 1))),
        ("missing counts, numpy count_nonzero(isnan(X), axis=0)",
         per_call_us(lambda: np.count_nonzero(np.isnan(X), axis=0))),
    ]
    if hasattr(_monitor, "missing_counts"):  # (bench/ab.py: a side from before it)
        rows.append(("missing counts, native", per_call_us(lambda: _monitor.missing_counts(X))))
    print(f"{X.shape[0]:,} rows x {X.shape[1]} features, {len(p.score_edges)} score edges, "
          "best of 7 rounds of 5,000 calls:")
    for name, us in rows:
        print(f"  {name:<56} {us:8.2f} us")
    for name, us in rows:  # (bench/ab.py's form)
        key = "".join(c if c.isalnum() else "_" for c in name.split(" (")[0].lower())
        print(f"{key.replace('__', '_').strip('_')}_us {us:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
