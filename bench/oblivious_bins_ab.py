"""The oblivious kernel's bins (cyext/oblivious.h sw_obl_bins512, sw_obl_sum512_w) on and off,
in one process: CatBoost models of bench/catboost_speed.py's numeric data (30 features, depth
6) of 500, 200 and 100 trees, one thread, 50,000 rows dense and with 5% missing values,
`predict_proba` with `Forest.oblivious_bins(True)` and `(False)` (the halves) alternated call
by call, median of ROUNDS; the two give the same bits (checked first). Whether the kernel
built the bins itself (`built`: trees enough to pay for binning, cyext/kernels.pyx
OBL_BINS_TREES_*) is printed beside each model's figures; where it did not, `on` is the bins
built on request. Prints NAME VALUE lines (bench/ab.py reads them).

    python bench/oblivious_bins_ab.py          # TREES=500,200,100 ROUNDS=15
"""

import os
import sys
import time

sys.path.insert(0, ".")  # this checkout's `worker` first (bench/ab.py runs it in a worktree)
import numpy as np  # noqa: E402

from bench.catboost_speed import _label, _numeric  # noqa: E402

N = 50_000


def main() -> None:
    import catboost

    from worker.model.compile import chosen, to_ir

    rounds = int(os.environ.get("ROUNDS", "15"))
    rng = np.random.default_rng(0)
    Xtrain = _numeric(rng, 20000, 0.05)
    y = _label(rng, Xtrain)
    dense = _numeric(rng, N, 0.0)
    missing = _numeric(rng, N, 0.05)
    for trees in (int(t) for t in os.environ.get("TREES", "500,200,100").split(",")):
        model = catboost.CatBoostClassifier(iterations=trees, depth=6, verbose=0,
                                            thread_count=os.cpu_count() or 1, random_seed=0,
                                            allow_writing_files=False).fit(Xtrain, y)
        ours = chosen(to_ir(model), "padded", "oblivious")
        forest = ours.forest
        built = forest.oblivious_bins()
        if not forest.oblivious_bins(True):
            print(f"t{trees}: the bins do not apply on this CPU or model", flush=True)
            continue
        print(f"t{trees}.built {int(built)}", flush=True)
        for name, X in (("dense", dense), ("missing", missing)):
            got = {}
            for on in (True, False):
                forest.oblivious_bins(on)
                got[on] = ours.predict_proba(X, n_threads=1)
            assert np.array_equal(got[True], got[False]), "the bins' and halves' answers differ"
            times = {True: [], False: []}
            for _ in range(rounds):
                for on in (True, False):
                    forest.oblivious_bins(on)
                    t0 = time.perf_counter()
                    ours.predict_proba(X, n_threads=1)
                    times[on].append(time.perf_counter() - t0)
            on, off = N / np.median(times[True]), N / np.median(times[False])
            print(f"t{trees}.{name}.bins_rows_per_s {on:.0f}\nt{trees}.{name}.halves_rows_per_s "
                  f"{off:.0f}\nt{trees}.{name}.ratio {on / off:.3f}", flush=True)


if __name__ == "__main__":
    main()
