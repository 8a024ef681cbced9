"""The lanes kernel (cyext/lanes.h) against the walks on model A, one thread, by rows a call:
where a block of 16 lanes starts to pay (kernels.pyx LANES_MIN_ROWS), and what it gives on a
large batch. The kernel is switched on and off in one process (Forest.lanes), the two
alternated call by call; microseconds a call, median of ROUNDS.

    python bench/lanes_micro.py          # KEYS=D for model D; ROUNDS=2001

Prints NAME VALUE lines (bench/ab.py reads them): A.n<rows>.walk_us / .lanes_us, and
A.rows_per_s.walk / .lanes for 50,000 rows.
"""

import os
import sys
import time

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import worker  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 17, 22, 32, 64, 512)


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "1001"))
    for key in os.environ.get("KEYS", "A"):
        model = worker.compile_model(M.load(key).source, layout="padded", kernel="lanes")
        forest = model.forest
        X = M.data(50_000, seed=7)[0].astype(np.float32)
        for n in SIZES:
            x = np.ascontiguousarray(X[:n])
            t = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    forest.lanes(on)
                    t0 = time.perf_counter_ns()
                    model.raw(x, n_threads=1)
                    t[on].append(time.perf_counter_ns() - t0)
            print(f"{key}.n{n}.walk_us {np.median(t[False]) / 1000:.3f}\n"
                  f"{key}.n{n}.lanes_us {np.median(t[True]) / 1000:.3f}", flush=True)
        t = {True: [], False: []}
        for _ in range(9):
            for on in (True, False):
                forest.lanes(on)
                t0 = time.perf_counter()
                model.raw(X, n_threads=1)
                t[on].append(time.perf_counter() - t0)
        forest.lanes(True)
        print(f"{key}.rows_per_s.walk {X.shape[0] / np.median(t[False]):.0f}\n"
              f"{key}.rows_per_s.lanes {X.shape[0] / np.median(t[True]):.0f}", flush=True)


if __name__ == "__main__":
    main()
