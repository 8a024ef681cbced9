"""The pair walk (cyext/walk.h sw_pair_*) on and off, in one process: model B (XGBoost 500
trees x depth 8, the padded walks), one thread, 50,000 rows dense and with 2% missing values,
`predict_proba` with `Forest.pair_walk(True)` and `(False)` alternated call by call (median of
ROUNDS); the two give the same bits (checked first). Prints NAME VALUE lines (bench/ab.py
reads them).

    python bench/pair_walk.py            # KEYS=B (or any padded model of bench/models.py)
"""

import os
import sys
import time

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import worker  # noqa: E402

sys.path.insert(0, "bench")
import models as M  # noqa: E402
import numpy as np  # noqa: E402

N = 50_000


def main() -> None:
    rounds = int(os.environ.get("ROUNDS", "15"))
    for key in os.environ.get("KEYS", "B"):
        model = worker.compile_model(M.load(key).source, kernel="walk")
        forest = model.forest
        if forest.pair_walk() is None:
            print(f"{key}: the pair walk does not apply", flush=True)
            continue
        dense = M.data(N, seed=7)[0].astype(np.float32)
        for name, X in (("dense", dense), ("missing", M.with_missing(dense, seed=8))):
            got = {}
            for on in (True, False):
                forest.pair_walk(on)
                got[on] = model.predict_proba(X, n_threads=1)
            assert np.array_equal(got[True], got[False]), "the two walks' answers differ"
            times = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    forest.pair_walk(on)
                    t0 = time.perf_counter()
                    model.predict_proba(X, n_threads=1)
                    times[on].append(time.perf_counter() - t0)
            forest.pair_walk(True)
            pairs, one = N / np.median(times[True]), N / np.median(times[False])
            print(f"{key}.{name}.pairs_rows_per_s {pairs:.0f}\n{key}.{name}.one_row_rows_per_s "
                  f"{one:.0f}\n{key}.{name}.ratio {pairs / one:.3f}", flush=True)


if __name__ == "__main__":
    main()
