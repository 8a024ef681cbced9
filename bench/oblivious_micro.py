"""Where the oblivious kernel's time goes (bench/NOTES.md, issue 36).

    python bench/oblivious_micro.py

1. bench/oblivious_micro.c (gcc -O3): the kernel's loop over one 64-row block in the ways it
   was tried, ns a tree and row, three rounds; then bench/oblivious_bins.c: the features
   binned once a block (CatBoost's way) against the kernel, at 500 and 100 trees; then
   bench/oblivious_words.c: the bins as kept (sw_obl_bins512, sw_obl_sum512_w) against the
   halves and the forms tried on the way, at 500, 200 and 100 trees; then
   bench/oblivious_cols.c: staging a block's columns a value at a time and by tiles.
2. A few rows from Python: the walks against the oblivious kernel on a CatBoost model of 500
   trees x depth 6 (30 numeric features), p50 of 2,000 ``predict_proba`` calls for 1 to 16
   rows, each kernel forced (``OBL_MIN_ROWS`` in cyext/kernels.pyx: under it the oblivious
   kernel hands its rows to the walks, so its figures there are the walks').
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "oblivious_micro"
        subprocess.run(["gcc", "-O3", str(HERE / "oblivious_micro.c"), "-o", str(exe)],
                       check=True)
        print(subprocess.run([str(exe)], check=True, capture_output=True,
                             text=True).stdout)
        # binning the features once a block (bench/oblivious_bins.c): 500 and 100 trees
        bins = Path(tmp) / "oblivious_bins"
        subprocess.run(["gcc", "-O3", f"-I{HERE.parent / 'cyext'}",
                        str(HERE / "oblivious_bins.c"), "-o", str(bins)], check=True)
        for trees in ("500", "100"):
            print(f"oblivious_bins, {trees} trees")
            print(subprocess.run([str(bins), trees], check=True, capture_output=True,
                                 text=True).stdout)
        # the bins as kept, and the forms tried on the way (bench/oblivious_words.c)
        words = Path(tmp) / "oblivious_words"
        subprocess.run(["gcc", "-O3", f"-I{HERE.parent / 'cyext'}",
                        str(HERE / "oblivious_words.c"), "-o", str(words)], check=True)
        for trees in ("500", "200", "100"):
            print(f"oblivious_words, {trees} trees")
            print(subprocess.run([str(words), trees], check=True, capture_output=True,
                                 text=True).stdout)
        # staging a block's columns (bench/oblivious_cols.c)
        stage = Path(tmp) / "oblivious_cols"
        subprocess.run(["gcc", "-O3", f"-I{HERE.parent / 'cyext'}",
                        str(HERE / "oblivious_cols.c"), "-o", str(stage)], check=True)
        print("oblivious_cols")
        print(subprocess.run([str(stage)], check=True, capture_output=True,
                             text=True).stdout)
    import catboost

    from worker.model.catboost_loader import to_ir
    from worker.model.compile import chosen

    rng = np.random.default_rng(0)
    X = rng.normal(size=(20000, 30)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).astype(int)
    model = catboost.CatBoostClassifier(iterations=500, depth=6, verbose=0, thread_count=1,
                                        random_seed=0, allow_writing_files=False).fit(X, y)
    ens = to_ir(model)
    print("rows | walk p50 (us) | oblivious p50 (us)")
    kernels = {k: chosen(ens, "padded", k) for k in ("walk", "oblivious")}
    for n in (1, 2, 3, 4, 5, 8, 16):
        rows = X[:n].copy()
        p50 = {}
        for k, m in kernels.items():
            for _ in range(200):
                m.predict_proba(rows)
            ts = []
            for _ in range(2000):
                t0 = time.perf_counter_ns()
                m.predict_proba(rows)
                ts.append(time.perf_counter_ns() - t0)
            p50[k] = np.percentile(ts, 50) / 1000
        print(f"{n} | {p50['walk']:.1f} | {p50['oblivious']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
