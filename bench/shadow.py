"""Shadow scoring cost: a batch through Pipeline.process with and without a challenger, against
the challenger's own score_batch on the same rows (target: the added time at most the
challenger's kernel time plus 10%; the gather is shared).

    .venv/bin/python bench/shadow.py [--messages 200] [--rows 50] [--repeat 30]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import kafka_util as K  # noqa: E402
from tests import models as M  # noqa: E402
from worker import compile_model  # noqa: E402
from worker.config import load_settings  # noqa: E402
from worker.io.records import Record  # noqa: E402
from worker.pipeline import Pipeline  # noqa: E402


def best(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out), float(np.median(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    xgb = M.xgboost_models()
    live, chal = (compile_model(xgb["xgb-binary-logistic"]),
                  compile_model(xgb["xgb-parallel-tree"]))
    settings = load_settings(None, model={"path": "unused"},
                             source={"type": "kafka", "topic": "in"},
                             sink={"type": "kafka", "topic": "out"},
                             scoring={"id_column": "txn_id", "threads": 1})
    recs = [Record("in", 0, i, None, K.arrow_bytes(K.input_table(i * a.rows, a.rows, i)), 1)
            for i in range(a.messages)]
    plain, shadowed = Pipeline(live, settings, "out"), Pipeline(live, settings, "out")
    shadowed.set_shadow(chal, "out-shadow")
    items_p = [(r, plain.decode(r)) for r in recs]
    items_s = [(r, shadowed.decode(r)) for r in recs]
    table = pa.concat_batches([d.data for _r, d in items_p])
    cols = chal.columns(table)
    t_plain = best(lambda: plain.process(items_p), a.repeat)
    t_shadow = best(lambda: shadowed.process(items_s), a.repeat)
    t_kernel = best(lambda: chal.score_batch(cols, thresholds=(0.5,), n_threads=1), a.repeat)
    added = t_shadow[0] - t_plain[0]
    print(f"{a.messages} messages x {a.rows} rows, 1 thread, best of {a.repeat} (median):")
    print(f"  process without shadow  {t_plain[0] * 1e3:8.3f} ms ({t_plain[1] * 1e3:.3f})")
    print(f"  process with shadow     {t_shadow[0] * 1e3:8.3f} ms ({t_shadow[1] * 1e3:.3f})")
    print(f"  challenger score_batch  {t_kernel[0] * 1e3:8.3f} ms ({t_kernel[1] * 1e3:.3f})")
    print(f"  added by the shadow     {added * 1e3:8.3f} ms = {added / t_kernel[0]:.2f}x the "
          f"challenger's kernel time (target <= 1.10x)")


if __name__ == "__main__":
    main()
