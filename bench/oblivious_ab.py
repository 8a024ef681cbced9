"""The oblivious kernel on bench/catboost_speed.py's numeric model, for bench/ab.py.

    python bench/ab.py --a REV --b . --runs 5 -- python bench/oblivious_ab.py

500 trees x depth 6, 30 numeric features (the same training data and seed as
bench/catboost_speed.py); one thread, 50,000 dense rows, ``predict_proba`` alternated with
CatBoost's own ``predict_proba`` call by call, median of 7 each. Prints ``ours_rows_per_s``,
``catboost_rows_per_s`` and their ratio ``ratio``, and ``few_trees_rows_per_s``: a model of 4
trees on the same data (median of 15 calls), whose time is mostly the staging of the rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())


def main() -> int:
    import catboost

    import worker
    from bench.catboost_speed import _label, _numeric

    rng = np.random.default_rng(0)
    kw = dict(iterations=500, depth=6, verbose=0, thread_count=os.cpu_count() or 1,
              allow_writing_files=False, random_seed=0)
    Xn = _numeric(rng, 20000, 0.05)
    model = catboost.CatBoostClassifier(**kw).fit(Xn, _label(rng, Xn))
    ours = worker.compile_model(model)
    X = _numeric(rng, 50000, 0.0)
    ours.predict_proba(X[:1000], n_threads=1)
    model.predict_proba(X[:1000], thread_count=1)
    t_ours, t_cb = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        ours.predict_proba(X, n_threads=1)
        t_ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.predict_proba(X, thread_count=1)
        t_cb.append(time.perf_counter() - t0)
    a, b = len(X) / statistics.median(t_ours), len(X) / statistics.median(t_cb)
    # a 4-tree model of the same data: its time is mostly staging the rows (the columns of
    # doubled order keys) and the link, not trees
    few = worker.compile_model(catboost.CatBoostClassifier(**{**kw, "iterations": 4}).fit(
        Xn, _label(rng, Xn)), kernel="oblivious")
    few.predict_proba(X[:1000], n_threads=1)
    t_few = []
    for _ in range(15):
        t0 = time.perf_counter()
        few.predict_proba(X, n_threads=1)
        t_few.append(time.perf_counter() - t0)
    print(f"few_trees_rows_per_s {len(X) / statistics.median(t_few):.0f}")
    print(f"ours_rows_per_s {a:.0f}")
    print(f"catboost_rows_per_s {b:.0f}")
    print(f"ratio {a / b:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
