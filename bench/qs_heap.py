"""QuickScorer's speed against where the heap puts things (bench/NOTES.md, issue 36): the
ONNX export of bench/onnx_speed.py's LightGBM model (500 trees x 63 leaves), compiled with
QuickScorer forced, scored on 50,000 rows at one thread, in fresh processes that differ
only by a few arrays allocated before the model (``--pads``: their sizes, in float64s).

    python bench/qs_heap.py [--pads 0 1000 100000 7] [--repeats 5]

Prints rows/s a process: the spread is what the same kernel and model give with nothing
changed but the heap's state, which is why an A/B of two builds on this model can differ
by as much with neither's kernels changed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys, time
import numpy as np
pad = [np.empty(int(sys.argv[2])) for _ in range(1 if int(sys.argv[2]) else 0)]
import worker
X = np.random.default_rng(7).normal(size=(50000, 30)).astype(np.float32)
m = worker.compile_model(sys.argv[1], layout="compact", kernel="quickscorer")
ts = []
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); m.predict_proba(X, n_threads=1); ts.append(time.perf_counter() - t0)
print(f"{50000 / float(np.median(ts)):.0f}")
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pads", type=int, nargs="+", default=[0, 1000, 100000, 7])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(HERE.parent))
    import onnx_speed

    with tempfile.TemporaryDirectory() as tmp:
        path = onnx_speed.exports(Path(tmp))["lightgbm 500 trees x 63 leaves"]
        print("| heap pad (float64s) | rows/s, 1 thread |\n|---:|---:|")
        for pad in args.pads:
            out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(pad),
                                  str(args.repeats)], capture_output=True, text=True,
                                 check=True, cwd=HERE.parent)
            print(f"| {pad} | {int(out.stdout.split()[-1]):,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
