"""A model's `predict_proba` on 50,000 rows in a loop, one thread, for perf's cpu-clock samples
(bench/NOTES.md "The pair walk", "The oblivious kernel's bound"):

    taskset -c 0 perf record -F 4000 -D 15000 -o perf.data python bench/profile_kernel.py B 30
    perf report -i perf.data --no-children --stdio | head -30

(-D: perf waits 15 s, past the training and the compile.) PAIRS=0 switches the pair walk off
(Forest.pair_walk(False): the one-row walk, as before it).

MODEL: a key of bench/models.py (A, B, ...) or `catboost` (bench/catboost_speed.py's numeric
model, 500 x depth 6, dense rows). The model is compiled and scored once before the loop; the
loop's rows/s is printed at the end.
"""

import os
import sys
import time

sys.path.insert(0, ".")
import worker  # noqa: E402

sys.path.insert(0, "bench")
import numpy as np  # noqa: E402


def main() -> int:
    key = sys.argv[1] if len(sys.argv) > 1 else "B"
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    if key == "catboost":
        import catboost
        import catboost_speed as cs

        rng = np.random.default_rng(0)
        Xn = cs._numeric(rng, 20000, 0.05)
        source = catboost.CatBoostClassifier(
            iterations=500, depth=6, verbose=0, thread_count=2, allow_writing_files=False,
            random_seed=0).fit(Xn, cs._label(rng, Xn))
        X = cs._numeric(np.random.default_rng(1), 50000, 0.0)
    else:
        import models as M

        source = M.load(key).source
        X = M.data(50000, seed=7)[0].astype(np.float32)
    model = worker.compile_model(source)
    if os.environ.get("PAIRS") == "0":
        model.forest.pair_walk(False)
    model.predict_proba(X, n_threads=1)
    time.sleep(0.5)
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        model.predict_proba(X, n_threads=1)
        k += 1
    print(f"{key}: {k * X.shape[0] / (time.perf_counter() - t0):.0f} rows/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
