"""Where one row's `predict_proba` goes on model A (issue 56, item 4: at most 1.2 us): the
whole call, the kernels' fast path alone (`Forest.small`), the input checks it skips for numpy
rows (`hashed_rows`), and an empty Python call for scale. Median of CALLS calls, one thread.

    python bench/one_row.py              # KEYS=D for model D; CALLS=200000

Prints NAME VALUE lines (bench/ab.py reads them).
"""

import os
import sys
import time

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import worker  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402


def p50_us(fn, calls: int) -> float:
    for _ in range(1000):
        fn()
    t = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t0 = clock()
        fn()
        t.append(clock() - t0)
    return float(np.median(t)) / 1000


def main() -> None:
    calls = int(os.environ.get("CALLS", "100000"))
    for key in os.environ.get("KEYS", "A"):
        model = worker.compile_model(M.load(key).source)
        one = M.data(10, seed=7)[0][:1].astype(np.float32).copy()
        link = model._link_code()
        forest = model.forest
        timed = {"predict_proba": lambda m=model, x=one: m.predict_proba(x),
                 "forest_small": lambda f=forest, x=one, k=link: f.small(x, k),
                 "hashed_rows": lambda m=model, x=one: m.hashed_rows(x),
                 "empty_call": lambda: None}
        for name, fn in timed.items():
            print(f"{key}.{name}_us {p50_us(fn, calls):.3f}", flush=True)


if __name__ == "__main__":
    main()
